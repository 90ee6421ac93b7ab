//! issue 29: `Client::watch` misses nothing and repeats nothing across a `kill -9` of
//! its server and across the loss of the member it watched in a cluster; an operator's
//! `revoke_lock` reaches the old holder's guard as lost.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fenced_client::{Client, Error, EventKind, LostReason, Watch};
use tokio::time::{timeout, Instant};

use crate::failover::Cluster;
use crate::support::Server;

fn client(endpoints: &str) -> Client {
    Client::builder().endpoint(endpoints).request_timeout(Duration::from_secs(3)).build().expect("client")
}

/// Lock cycles on `w/{i}` until `stop`: the tokens of the grants the service answered.
fn load(c: Client, i: usize, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut granted = vec![];
        while !stop.load(Ordering::Relaxed) {
            match c.lock(format!("w/{i}")).ttl(Duration::from_secs(5)).wait(Duration::from_secs(2)).acquire().await {
                Ok(g) => {
                    granted.push(g.token().get());
                    let _ = g.release().await;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        granted
    })
}

/// What a watch saw: index to (type, name, token); a repeat or a step back fails.
async fn collect(w: &mut Watch, seen: &mut BTreeMap<u64, (String, String, u64)>, until: Instant) {
    while Instant::now() < until {
        let Ok(next) = timeout(until - Instant::now(), w.next()).await else { return };
        let e = next.expect("the watch goes on");
        let (kind, name, token) = match e.kind {
            EventKind::Granted { name, token, .. } => ("granted", name, token),
            EventKind::Released { name, token, .. } => ("released", name, token),
            EventKind::Expired { name, token } => ("expired", name, token),
            other => panic!("an event outside the prefix: {other:?}"),
        };
        assert!(name.starts_with("w/"), "{name}");
        if let Some((&last, _)) = seen.last_key_value() {
            assert!(e.index > last, "index {} after {last}: repeated or out of order", e.index);
        }
        seen.insert(e.index, (kind.into(), name, token));
    }
}

/// Every grant the load was answered appears once as granted.
fn assert_every_grant_seen(granted: &[u64], seen: &BTreeMap<u64, (String, String, u64)>) {
    for t in granted {
        let n = seen.values().filter(|(k, _, tok)| k == "granted" && tok == t).count();
        assert_eq!(n, 1, "grant {t} seen {n} times");
    }
}

#[tokio::test]
async fn a_watch_resumes_across_a_kill_9_of_its_server_with_nothing_lost_or_repeated() {
    let server = Server::start().await;
    let endpoint = server.endpoint();
    resumes_across_a_kill_9(server, &endpoint).await;
}

/// The same over the wire protocol (`fenced://`): the watch is a WATCH's frames.
#[tokio::test]
async fn a_watch_over_the_wire_protocol_resumes_across_a_kill_9_with_nothing_lost_or_repeated() {
    let server = Server::start_wire(&[]).await;
    let endpoint = server.wire_endpoint();
    resumes_across_a_kill_9(server, &endpoint).await;
}

/// Three holders cycle locks while a watch reads; the server is killed with SIGKILL
/// and started again mid-stream: every grant answered is seen exactly once.
async fn resumes_across_a_kill_9(mut server: Server, endpoint: &str) {
    let c = client(endpoint);
    // From the log's start, not from now: the watch opens at its first `next`, which
    // may come after the loads' first grants (a CI rehearsal missed grant 1 this way).
    let mut w = c.watch("w/", Some(0));
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = (0..3).map(|i| load(c.clone(), i, stop.clone())).collect();
    let mut seen = BTreeMap::new();
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(1500)).await;
    let before = seen.len();
    server.crash_and_restart().await;
    // Locks held at the kill stay held until their leases (5 s) run out.
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(7000)).await;
    stop.store(true, Ordering::Relaxed);
    let mut granted = vec![];
    for l in loads {
        granted.extend(l.await.unwrap());
    }
    // Whatever the load did last arrives too.
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(1500)).await;
    assert!(before >= 20 && seen.len() > before + 20, "too little load: {before} then {}", seen.len());
    assert_every_grant_seen(&granted, &seen);
}

#[tokio::test]
async fn a_watch_moves_to_another_member_when_its_member_dies_and_misses_nothing() {
    let mut cluster = Cluster::start().await;
    cluster.leader().await;
    let endpoints = cluster.http.join(",");
    let c = client(&endpoints);
    // From the log's start, not from now: the watch opens at its first `next`, which
    // may come after the loads' first grants (a run under load missed grant 1).
    let mut w = c.watch("w/", Some(0));
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = (0..3).map(|i| load(c.clone(), i, stop.clone())).collect();
    let mut seen = BTreeMap::new();
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(2000)).await;
    let before = seen.len();
    // The watch is on the first member that answered: the first endpoint.
    let gone = cluster.members.remove(0);
    drop(gone);
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(6000)).await;
    stop.store(true, Ordering::Relaxed);
    let mut granted = vec![];
    for l in loads {
        granted.extend(l.await.unwrap());
    }
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(2000)).await;
    assert!(before >= 10 && seen.len() > before + 10, "too little load: {before} then {}", seen.len());
    assert_every_grant_seen(&granted, &seen);
}

#[tokio::test]
async fn a_watch_from_a_position_no_longer_held_says_it_missed_events() {
    let cfg = crate::support::TempDir::new("events-cfg");
    let file = cfg.path().join("fenced.toml");
    std::fs::write(&file, "events_retained = 4\n").unwrap();
    let server = Server::start_wire(&["--config".into(), file.display().to_string()]).await;
    for endpoint in [server.endpoint(), server.wire_endpoint()] {
        let c = client(&endpoint);
        for _ in 0..5 {
            c.lock("w/x").try_acquire().await.unwrap().release().await.unwrap();
        }
        let mut w = c.watch("w/", Some(0));
        match timeout(Duration::from_secs(10), w.next()).await.unwrap() {
            Err(Error::Missed { oldest_index: Some(n), .. }) => assert!(n > 1, "{endpoint}"),
            other => panic!("{endpoint}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_revoked_lock_is_lost_to_its_guard_at_the_next_keepalive() {
    let server = Server::start().await;
    let c = client(&server.endpoint());
    let guard = c.lock("job").ttl(Duration::from_secs(3)).try_acquire().await.unwrap();
    let old = guard.token();
    let next = {
        let c = c.clone();
        tokio::spawn(async move { c.lock("job").wait(Duration::from_secs(10)).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.revoke_lock("job", None).await.unwrap(), old);
    let reason = timeout(Duration::from_secs(3), guard.lost()).await.expect("the guard heard within a keepalive");
    assert_eq!(reason, LostReason::LeaseNotFound);
    let next = next.await.unwrap().unwrap();
    assert!(next.token() > old);
    // Naming the old token again takes nothing from the new holder.
    match c.revoke_lock("job", Some(old)).await {
        Err(Error::Refused(fenced_core::Error::NotHolder { holder })) => assert_eq!(holder, Some(next.token())),
        other => panic!("{other:?}"),
    }
}

/// Election: a campaign waits through several rounds until the leader resigns, then
/// leads with a higher token; an observer sees each change, and `leader` names the
/// leader by its label.
#[tokio::test]
async fn a_campaign_outwaits_its_rounds_and_an_observer_sees_each_change() {
    use fenced_client::LeaderChange;
    let server = Server::start().await;
    let c = client(&server.endpoint());
    let mut observe = c.observe("election", None);
    observe.ready().await.unwrap();
    let first = c.lock("election").holder("a").ttl(Duration::from_secs(5)).wait(ms(300)).campaign().await.unwrap();
    assert_eq!(c.leader("election").await.unwrap().and_then(|l| l.holder), Some("a".into()));
    let second = {
        let c = c.clone();
        tokio::spawn(async move { c.lock("election").holder("b").wait(ms(300)).campaign().await })
    };
    tokio::time::sleep(ms(1200)).await; // four rounds of the second campaign
    assert!(!second.is_finished(), "elected while another led");
    let first_token = first.token().get();
    first.release().await.unwrap();
    let second = timeout(Duration::from_secs(5), second).await.unwrap().unwrap().unwrap();
    assert!(second.token().get() > first_token);
    let mut changes = vec![];
    while changes.len() < 3 {
        changes.push(timeout(Duration::from_secs(5), observe.next()).await.unwrap().unwrap());
    }
    let kinds: Vec<(&str, u64)> = changes
        .iter()
        .map(|c| match c {
            LeaderChange::Elected { token, .. } => ("elected", *token),
            LeaderChange::Vacated { token, .. } => ("vacated", *token),
        })
        .collect();
    assert_eq!(kinds, [("elected", first_token), ("vacated", first_token), ("elected", second.token().get())]);
    assert!(matches!(&changes[2], LeaderChange::Elected { holder: Some(h), .. } if h == "b"));
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A member that restarted holds its events only from its last snapshot on, and answers
/// a resume from before it 410 `compacted`; another member still holds them. The watch
/// asks each other member before it says it missed events: given the restarted member
/// first, it reads every event from the start on another.
#[tokio::test]
async fn a_watch_told_compacted_by_a_restarted_member_resumes_on_one_that_holds_the_events() {
    let cfg = crate::support::TempDir::new("events-snapshots");
    let file = cfg.path().join("fenced.toml");
    std::fs::write(&file, "snapshot_entries = 10\n").unwrap();
    let mut cluster = Cluster::start_with(&["--config".into(), file.display().to_string()]).await;
    let l = cluster.leader().await;
    let c = client(&cluster.http.join(","));
    let mut granted = vec![];
    for _ in 0..30 {
        let g = c.lock("w/x").ttl(Duration::from_secs(5)).try_acquire().await.expect("grant");
        granted.push(g.token().get());
        g.release().await.expect("release");
    }
    let f = (0..3).find(|i| *i != l).expect("a follower");
    cluster.members[f].crash_and_restart().await;
    // The restarted member alone: it no longer holds the first events (the premise).
    let alone = client(&cluster.http[f]);
    let mut w = alone.watch("w/", Some(0));
    match timeout(Duration::from_secs(10), w.next()).await.expect("an answer") {
        Err(Error::Missed { oldest_index: Some(n), .. }) => assert!(n > 1, "{n}"),
        other => panic!("the restarted member still held every event, so this proves nothing: {other:?}"),
    }
    // Given it first, then the others: every event from the start, once each.
    let others: Vec<&str> = (0..3).filter(|i| *i != f).map(|i| cluster.http[i].as_str()).collect();
    let endpoints = format!("{},{}", cluster.http[f], others.join(","));
    let mut w = client(&endpoints).watch("w/", Some(0));
    let mut seen = BTreeMap::new();
    collect(&mut w, &mut seen, Instant::now() + Duration::from_millis(3000)).await;
    assert_every_grant_seen(&granted, &seen);
}

/// A guard gives its lock back by ending its implicit lease (one command): the event
/// says `released`, as a release, for one lock and for a set, on both transports; an
/// operator's revoke of a lock still says `forced`.
#[tokio::test]
async fn a_guards_release_is_reported_as_released() {
    let server = Server::start_wire(&[]).await;
    let operator = client(&server.endpoint()); // an operator's revoke is served over HTTP
    for (endpoint, p) in [(server.endpoint(), "http/"), (server.wire_endpoint(), "wire/")] {
        let c = client(&endpoint);
        let mut w = c.watch(p, Some(0));
        let ttl = Duration::from_secs(5);
        let one = c.lock(format!("{p}one")).ttl(ttl).acquire().await.expect("acquired");
        let one_token = one.token().get();
        one.release().await.expect("released");
        let set = c.lock_all([format!("{p}a"), format!("{p}b")]).ttl(ttl).acquire().await.expect("acquired");
        set.release().await.expect("released");
        let taken = c.lock(format!("{p}taken")).ttl(ttl).acquire().await.expect("acquired");
        operator.revoke_lock(&format!("{p}taken"), Some(taken.token())).await.expect("an operator's revoke");
        let mut reasons = BTreeMap::new();
        while reasons.len() < 4 {
            let e = timeout(Duration::from_secs(3), w.next()).await.expect("in time").expect("the watch goes on");
            if let EventKind::Released { name, token, reason } = e.kind {
                if name.ends_with("one") {
                    assert_eq!(token, one_token);
                }
                reasons.insert(name.trim_start_matches(p).to_owned(), reason);
            }
        }
        let got: Vec<_> = reasons.iter().map(|(n, r)| (n.as_str(), r.as_str())).collect();
        let want = [("a", "released"), ("b", "released"), ("one", "released"), ("taken", "forced")];
        assert_eq!(got, want, "{endpoint}");
    }
}
