//! Ensembles of each kind started, partitioned, frozen and restarted for real.

use std::net::TcpStream;

use super::etcd::router;
use super::*;

/// The ensemble, or `None` (the test skips) when its programs are missing outside CI.
fn started(e: Result<Ensemble>) -> Option<Ensemble> {
    match e {
        Err(e) if std::env::var_os("CI").is_none() && format!("{e:#}").contains("not found") => {
            eprintln!("skipping: {e:#}");
            None
        }
        e => Some(e.expect("the ensemble starts")),
    }
}

/// The member of `among` that says it leads in the highest term, if that term is
/// later than `after` (any, when `None`), and its term; waits up to `timeout` for
/// one, then panics with `what` and the members' logs. A leader that was frozen
/// and has just been thawed can still say it leads, in its old term, until it
/// notices it has lost its followers: only a later term shows a new leader.
fn leader_after(e: &Ensemble, among: &[usize], after: Option<u64>, timeout: Duration, what: &str) -> (u64, usize) {
    let deadline = Instant::now() + timeout;
    loop {
        let newest = among
            .iter()
            .filter(|&&i| e.running(i))
            .filter_map(|&i| Some((term_if_leader(e.kind, e.members[i].client)?, i)))
            .max();
        if let Some((term, i)) = newest.filter(|&(term, _)| after.is_none_or(|a| term > a)) {
            return (term, i);
        }
        assert!(Instant::now() < deadline, "{what} within {timeout:?}{}", e.tails());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long a test waits for a leader in a later term: ten election timeouts, and at
/// least 30 s. On a loaded two-core machine etcd's two live members split their
/// votes more than once (a CI-like run: elected in term 7, split in term 8, elected
/// in term 9 just past 10 s); a slow election is a liveness figure the nemesis
/// runs measure, not what this test asserts.
fn election_window(kind: Kind) -> Duration {
    (kind.election_timeout() * 10).max(Duration::from_secs(30))
}

/// The handle's faults on a live ensemble: one leader; kill -9 of it brings
/// another, in a later term; the killed member restarts and serves; a frozen leader
/// is replaced in a later term (when `freeze`); a leader cut off behind its link
/// proxies is replaced by one of the other two, in a later term. etcd and ZooKeeper
/// only: Fenced's `/readyz` has no term.
fn exercise(mut e: Ensemble, freeze: bool) {
    assert_eq!(e.len(), 3);
    let all = [0, 1, 2];
    let (term, first) = leader_after(&e, &all, None, Duration::from_secs(20), "no leader");
    let leaders = (0..3).filter(|&i| e.leads(i)).count();
    assert_eq!(leaders, 1, "one leader, not {leaders}");
    e.kill(first);
    assert!(!e.running(first));
    let (term, second) =
        leader_after(&e, &all, Some(term), Duration::from_secs(30), "no new leader after a kill -9 of the leader");
    assert_ne!(second, first, "a killed member cannot lead");
    e.restart(first).unwrap();
    e.quorum_write().unwrap();
    if freeze {
        e.pause(second).unwrap();
        let others: Vec<usize> = (0..3).filter(|&i| i != second).collect();
        let timeout = election_window(e.kind);
        let (_, third) = leader_after(&e, &others, Some(term), timeout, "a frozen leader was not replaced");
        assert_ne!(third, second);
        e.resume(second).unwrap();
        e.quorum_write().unwrap();
    }
    // Cut off behind its link proxies, a leader is replaced by the other two; once
    // healed, the ensemble takes writes again. The leader cut off is the one in the
    // highest term (a thawed one may still say it leads, in its old term).
    let (term, fourth) = leader_after(&e, &all, None, election_window(e.kind), "no leader");
    let rest: Vec<usize> = (0..3).filter(|&i| i != fourth).collect();
    let cut = e.cut(&[fourth], &rest, true);
    assert_eq!(cut.len(), 4, "{cut:?}");
    let probe = e.probe();
    let what =
        format!("the isolated leader {fourth} (term {term}) was not replaced by one of {rest:?} in a later term");
    let (_, fifth) = leader_after(&e, &rest, Some(term), election_window(e.kind), &what);
    assert!(probe.leader_term().is_some(), "the probe sees a leader");
    e.heal();
    let healed = Instant::now() + Duration::from_secs(30);
    while let Err(err) = e.quorum_write() {
        assert!(Instant::now() < healed, "no write after healing (leader {fifth}): {err:#}{}", e.tails());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_proc_net_tcp_line_names_its_socket() {
    let head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
    let line = "   3: 0100007F:A2F4 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 \
                    0000000000000000 20 4 30 10 -1";
    assert_eq!(router::socket_inode(line, 0xA2F4, 0x9C41), Some(4242));
    assert_eq!(router::socket_inode(line, 0x9C41, 0xA2F4), None, "the other end's socket");
    assert_eq!(router::socket_inode(head, 0xA2F4, 0x9C41), None);
    // This very process's own connection is found as its own.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_s, from) = l.accept().unwrap();
    assert_eq!(from, c.local_addr().unwrap());
    let me = Some(std::process::id());
    assert_eq!(router::owner(from.port(), l.local_addr().unwrap().port(), &[None, me]), Some(1));
    assert_eq!(router::owner(from.port(), l.local_addr().unwrap().port(), &[None]), None);
}

#[test]
fn an_etcd_cluster_elects_again_when_its_leader_is_killed_or_frozen() {
    if let Some(e) = started(Ensemble::etcd(3, Links::Proxied)) {
        exercise(e, true);
    }
}

// Behind the link proxies, ZooKeeper's two live servers used to elect no leader for
// 20 s and more, at times (2 of 5 runs after a frozen leader, 1 CI run after a
// killed one): a follower that reached its new leader's proxy before the leader had
// bound its quorum port saw its connection close, not refused, and ran a new
// election instead of trying again (`ZK_LINK_PATIENCE`; RELIABILITY.md). Run alone
// on a shared 2-core machine (2026-12-04): 5 of 6 failed without the patience; with
// it, 30 of 30 passed in three batches of 10 (with the later-term checks and the
// port retry in the last), 9 to 15 s each; in the whole suite, 19 of 20 (the other
// run's ensemble never started: a port taken, now retried).
#[test]
fn a_zookeeper_ensemble_elects_again_when_its_leader_is_killed_or_frozen() {
    if let Some(e) = started(Ensemble::zookeeper(3, Links::Proxied)) {
        exercise(e, true);
    }
}
