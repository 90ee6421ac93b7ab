//! The client across a silent member: a member that holds a request and answers
//! nothing (SIGSTOP, a lost host) is left after the attempt time-out, while an acquire
//! parked in a live leader's queue is not cut; three real members with the leader
//! frozen, over HTTP and over the wire protocol.

use std::net::TcpListener;
use std::time::Duration;

use fenced_client::{Client, Error, LockGuard};
use tokio::time::{sleep, timeout, Instant};

use crate::support::{free_port, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A member that accepts connections and never answers (a process stopped with
/// SIGSTOP looks like this from outside): its `host:port`.
fn silent_member() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    addr
}

async fn left_silent_but_parked_stays(wire: bool) {
    let server = if wire { Server::start_wire(&[]).await } else { Server::start().await };
    let (scheme, live) = if wire { ("fenced", server.wire_endpoint()) } else { ("http", server.endpoint()) };
    let endpoints = format!("{scheme}://{},{live}", silent_member());
    let client = Client::builder()
        .endpoint(endpoints)
        .request_timeout(ms(20_000))
        .attempt_timeout(ms(400))
        .build()
        .expect("client");
    let t0 = Instant::now();
    let holder = client.lock("q").ttl(ms(10_000)).try_acquire().await.expect("granted past the silent member");
    let took = t0.elapsed();
    // The request timeout is 20 s: the call left the silent member long before it.
    assert!(took < ms(5_000), "{scheme}: {took:?} to leave a silent member (attempt time-out 400 ms)");
    assert_eq!(client.endpoint(), live);

    // B parks behind the holder on the live member, for several attempt time-outs; C
    // joins the queue after. A waiter cut and queued again would be behind C.
    let b = tokio::spawn({
        let client = client.clone();
        async move { client.lock("q").ttl(ms(5_000)).wait(ms(15_000)).acquire().await }
    });
    sleep(ms(1_500)).await;
    let other = Client::builder().endpoint(&live).build().expect("client");
    let c = tokio::spawn(async move { other.lock("q").ttl(ms(5_000)).wait(ms(15_000)).acquire().await });
    sleep(ms(1_000)).await;
    holder.release().await.expect("release");
    let gb = timeout(ms(5_000), b)
        .await
        .expect("B, first in the queue, was granted at the release: it kept its place")
        .expect("join")
        .expect("B granted");
    sleep(ms(200)).await;
    assert!(!c.is_finished(), "{scheme}: C was answered while B holds the lock");
    let b_token = gb.token();
    gb.release().await.expect("release B");
    let gc = timeout(ms(5_000), c).await.expect("C granted after B").expect("join").expect("C granted");
    assert!(gc.token() > b_token);
    gc.release().await.expect("release C");
}

#[tokio::test]
async fn a_silent_member_is_left_and_a_parked_waiter_is_not_cut_over_http() {
    left_silent_but_parked_stays(false).await;
}

#[tokio::test]
async fn a_silent_member_is_left_and_a_parked_waiter_is_not_cut_over_the_wire() {
    left_silent_but_parked_stays(true).await;
}

/// Three members, each with the HTTP API and the wire protocol.
pub(crate) struct Cluster {
    pub(crate) members: Vec<Server>,
    pub(crate) http: Vec<String>,
    pub(crate) wire: Vec<String>,
}

impl Cluster {
    pub(crate) async fn start() -> Cluster {
        Cluster::start_with(&[]).await
    }

    /// Three members, each also given `extra` flags.
    pub(crate) async fn start_with(extra: &[String]) -> Cluster {
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let peers: Vec<String> =
            ports.iter().enumerate().map(|(i, (h, _))| format!("{}=http://127.0.0.1:{h}", i + 1)).collect();
        let peers = peers.join(",");
        let mut members = Vec::new();
        for (i, (h, w)) in ports.iter().enumerate() {
            let args = [
                "--node-id".to_owned(),
                (i + 1).to_string(),
                "--peers".to_owned(),
                peers.clone(),
                "--insecure-peers".to_owned(),
                "--wire-listen".to_owned(),
                format!("127.0.0.1:{w}"),
            ];
            let args: Vec<String> = args.into_iter().chain(extra.iter().cloned()).collect();
            members.push(Server::start_on(*h, &args).await);
        }
        let http = ports.iter().map(|(h, _)| format!("http://127.0.0.1:{h}")).collect();
        let wire = ports.iter().map(|(_, w)| format!("fenced://127.0.0.1:{w}")).collect();
        Cluster { members, http, wire }
    }

    /// The member that says it leads, within 20 s.
    pub(crate) async fn leader(&self) -> usize {
        let deadline = Instant::now() + ms(20_000);
        loop {
            for (i, url) in self.http.iter().enumerate() {
                let c = Client::builder().endpoint(url).request_timeout(ms(500)).build().expect("client");
                if let Ok(v) = c.cluster().await {
                    if v["leader_id"].as_u64().is_some() && v["leader_id"] == v["id"] {
                        return i;
                    }
                }
            }
            assert!(Instant::now() < deadline, "no leader within 20 s");
            sleep(ms(50)).await;
        }
    }
}

/// Whenever the guard still says valid after the new leader answered, that answer
/// must have said the lock is still this guard's.
async fn assert_valid_means_held(client: &Client, guard: &LockGuard) {
    if !guard.is_valid() {
        return;
    }
    let answer = client.check(guard.name().as_str(), guard.token()).await;
    if guard.is_valid() {
        let (current, _) = answer.expect("check");
        assert!(current, "the guard says valid, the service says {} is no longer its", guard.name());
    }
}

async fn a_frozen_leader_is_left(wire: bool) {
    let c = Cluster::start().await;
    let l = c.leader().await;
    let endpoints = if wire { &c.wire } else { &c.http };
    let client = Client::builder().endpoint(endpoints.join(",")).request_timeout(ms(30_000)).build().expect("client");
    let held = client.lock("held").ttl(ms(4_000)).try_acquire().await.expect("held");
    assert_eq!(client.endpoint(), endpoints[l], "the client settled on the leader");
    // A guard whose holder stops renewing at the freeze: its lost signal must come no
    // later than the service lets its lock go.
    let idle = client.lock("idle").ttl(ms(3_000)).try_acquire().await.expect("idle");
    // A waiter parked in the leader's queue behind `held`.
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.lock("held").ttl(ms(4_000)).wait(ms(25_000)).acquire().await }
    });
    sleep(ms(300)).await;

    idle.pause_keepalive(true);
    c.members[l].signal(libc::SIGSTOP);
    let frozen_at = Instant::now();
    let after = client.lock("after").ttl(ms(3_000)).try_acquire().await.expect("granted by the new leader");
    let took = frozen_at.elapsed();
    println!("{}: first grant {} ms after SIGSTOP of the leader", if wire { "wire" } else { "http" }, took.as_millis());
    // The request timeout is 30 s and the leader stays frozen: the answer came from
    // another member, within the attempt time-out (750 ms) plus an election.
    assert!(took < ms(5_000), "{took:?} to leave a frozen leader");
    assert_ne!(client.endpoint(), endpoints[l]);
    assert!(after.token() > held.token(), "a token went back across the failover");

    // For two TTLs of `held`: its keepalives reach the new leader, and whenever a guard
    // says valid, the new leader agrees.
    let mut idle_lost_at = None;
    let mut idle_freed_at = None;
    while frozen_at.elapsed() < ms(8_000) {
        assert_valid_means_held(&client, &held).await;
        assert_valid_means_held(&client, &idle).await;
        if idle_lost_at.is_none() && idle.lost_reason().is_some() {
            idle_lost_at = Some(Instant::now());
        }
        if idle_freed_at.is_none() && !client.check("idle", idle.token()).await.expect("check").0 {
            idle_freed_at = Some(Instant::now());
        }
        sleep(ms(100)).await;
    }
    assert_eq!(held.lost_reason(), None, "the renewed guard was lost across the failover");
    let lost_at = idle_lost_at.expect("the idle guard was never reported lost");
    assert!(matches!(idle.lost_reason(), Some(fenced_client::LostReason::Expired)));
    if let Some(freed) = idle_freed_at {
        assert!(lost_at <= freed, "the service let the idle lock go before its guard said lost");
    }

    // The parked waiter moved to the new leader: releasing `held` hands it the lock.
    let held_token = held.token();
    held.release().await.expect("release on the new leader");
    let next = timeout(ms(10_000), waiter)
        .await
        .expect("the parked waiter followed the failover")
        .expect("join")
        .expect("waiter granted");
    assert!(next.token() > after.token() && after.token() > held_token, "tokens out of grant order");

    // The old leader wakes and grants nothing of its own: it no longer leads. It
    // refuses `not_leader` until it hears from the new leader; then it forwards, and
    // the grant is the new leader's, above every token before it.
    c.members[l].signal(libc::SIGCONT);
    let old = Client::builder().endpoint(&endpoints[l]).request_timeout(ms(3_000)).build().expect("client");
    let deadline = Instant::now() + ms(10_000);
    loop {
        match old.lock("woken").ttl(ms(1_000)).try_acquire().await {
            Err(Error::Refused(fenced_core::Error::NotLeader { .. })) => break,
            Err(Error::Unavailable { .. }) if Instant::now() < deadline => sleep(ms(100)).await,
            Ok(forwarded) => {
                assert!(forwarded.token() > next.token(), "the woken old leader granted a token of its own");
                let (current, _) = client.check("woken", forwarded.token()).await.expect("check");
                assert!(current, "the new leader does not know the grant the old one relayed");
                forwarded.release().await.expect("release through the old leader");
                break;
            }
            other => panic!("the woken old leader answered {other:?}"),
        }
    }
    next.release().await.expect("release");
    after.release().await.expect("release");
}

#[tokio::test]
async fn a_frozen_leader_is_left_within_the_attempt_time_out_over_http() {
    a_frozen_leader_is_left(false).await;
}

#[tokio::test]
async fn a_frozen_leader_is_left_within_the_attempt_time_out_over_the_wire() {
    a_frozen_leader_is_left(true).await;
}

#[test]
fn an_attempt_time_out_below_the_minimum_is_refused() {
    let build = |d| Client::builder().endpoint("http://127.0.0.1:1,http://127.0.0.1:2").attempt_timeout(d).build();
    assert!(matches!(build(ms(5)), Err(Error::BadRequest(m)) if m.contains("at least 20 ms")));
    assert!(build(fenced_client::ATTEMPT_TIMEOUT_MIN).is_ok());
}

/// `POST {base}{path}` with a JSON body, straight over TCP (a frozen member is never
/// asked): the status and the JSON answer, or `None` when nothing came within 2 s.
fn post(base: &str, path: &str, body: &str) -> Option<(u16, serde_json::Value)> {
    use std::io::{Read, Write};
    let addr = base.strip_prefix("http://").expect("an http:// endpoint");
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(ms(2_000))).ok()?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.get(9..12)?.parse().ok()?;
    let json = &answer[answer.find('{')?..=answer.rfind('}')?];
    Some((status, serde_json::from_str(json).ok()?))
}

/// The leader grants an acquire under an implicit lease the caller named, and freezes
/// before the caller hears of it. The retry under the same id on the next leader gets
/// that grant and token, not a second lease with the lock held by the first (what a
/// retry under a fresh id gets: 409 `lock_held`).
#[tokio::test]
async fn a_grant_lost_with_its_leader_is_the_grant_of_the_retry() {
    let c = Cluster::start().await;
    let l = c.leader().await;
    let id = "5eed00c0ffee00000000000000000001";
    let body = format!(r#"{{"lease_id":"{id}","ttl_ms":10000}}"#);
    // Right after its election the leader may still be taking office (503).
    let deadline = Instant::now() + ms(10_000);
    let first = loop {
        match post(&c.http[l], "/v1/locks/lost/acquire", &body) {
            Some((200, first)) => break first,
            other => assert!(Instant::now() < deadline, "the leader answered {other:?}"),
        }
        sleep(ms(100)).await;
    };
    // The answer above is the one the caller never saw: its leader froze.
    c.members[l].signal(libc::SIGSTOP);
    let deadline = Instant::now() + ms(20_000);
    let (leader, st, retry) = 'retry: loop {
        for (_, url) in c.http.iter().enumerate().filter(|&(i, _)| i != l) {
            match post(url, "/v1/locks/lost/acquire", &body) {
                // No leader yet, or this member follows: ask the next.
                Some((503, _)) | None => {}
                Some((st, answer)) => break 'retry (url.clone(), st, answer),
            }
        }
        assert!(Instant::now() < deadline, "no new leader took the retry within 20 s");
        sleep(ms(100)).await;
    };
    assert_eq!(st, 200, "the retry: {retry}");
    assert_eq!((&retry["token"], &retry["lease_id"]), (&first["token"], &first["lease_id"]), "{first} then {retry}");
    // A retry under a fresh id is what an orphan grant looks like.
    let fresh = r#"{"lease_id":"5eed00c0ffee00000000000000000002","ttl_ms":10000}"#;
    let (st, other) = post(&leader, "/v1/locks/lost/acquire", fresh).expect("the new leader answers");
    assert_eq!(
        (st, &other["error"]["code"], &other["error"]["holder_token"]),
        (409, &"lock_held".into(), &first["token"]),
        "{other}"
    );
    c.members[l].signal(libc::SIGCONT);
}
