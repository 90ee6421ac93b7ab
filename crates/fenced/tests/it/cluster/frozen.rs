//! A frozen leader: past every TTL it grants nothing when it wakes; cut off from its
//! followers it keeps no lease alive (and the control without the quorum round is caught).

use super::*;

#[test]
fn a_leader_frozen_past_every_ttl_grants_nothing_when_it_wakes() {
    let c = Cluster::start("sigstop", 3);
    let l = c.leader(20);
    let old = c.members[l].addr;
    c.signal(l, "-STOP");
    // Longer than the election timeout and than the 1 s TTL below.
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let new_leader = loop {
        let s = c.status(others[0]).unwrap();
        if let Some(id) = s["leader_id"].as_u64().filter(|id| *id != c.members[l].id) {
            break id;
        }
        assert!(Instant::now() < deadline, "no new leader while the old one is frozen");
        std::thread::sleep(Duration::from_millis(20));
    };
    let ni = c.members.iter().position(|m| m.id == new_leader).unwrap();
    let mut g = Value::Null;
    until(10, || {
        let (st, v) = call(c.members[ni].addr, "POST", "/v1/locks/z/acquire", "{\"ttl_ms\":1000}", &[]).unwrap();
        g = v;
        st == 200
    });
    let token = g["token"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    c.signal(l, "-CONT");
    // The old leader grants nothing of its own: it tells a client talking only to it to
    // go elsewhere, or (once it follows) forwards to the new leader, whose answers come
    // after its grant of `token`. A check is never answered from the old table.
    let mut after = token;
    for _ in 0..20 {
        let (st, e) = call(old, "POST", "/v1/locks/z2/acquire", "{\"ttl_ms\":1000}", &[]).unwrap();
        match (st, e["error"]["code"].as_str()) {
            (503, Some("not_leader")) | (409, Some("lock_held")) => {}
            (200, None) => {
                let t = e["token"].as_u64().unwrap();
                assert!(t > after, "the woken leader granted {t}, not after {after}: {e}");
                after = t;
            }
            _ => panic!("the woken leader answered: {st} {e}"),
        }
        let (st, e) = call(old, "POST", "/v1/locks/z/check", &format!("{{\"token\":{token}}}"), &[]).unwrap();
        let stale = st == 200 && e["current"] == true;
        assert!(
            !stale && (st == 200 || e["error"]["code"] == "not_leader"),
            "a stale check from the old leader: {st} {e}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A cluster's leader answers a keepalive from memory once a quorum round begun after
/// it arrived confirms that it still leads: with its quorum, keepalives cost no log
/// entry each; with both followers frozen, none is answered (a new leader could have
/// taken office already, and expire the lease before the client's deadline).
#[test]
fn a_leader_cut_off_from_its_followers_keeps_no_lease_alive() {
    let (st, v) = keepalive_cut_off("ka-quorum", None);
    assert_eq!((st, v["error"]["code"].as_str()), (503, Some("not_leader")), "{v}");
}

/// The control: a leader that answers without the quorum round
/// (`keepalive-unconfirmed`) keeps the lease alive with its followers frozen.
#[test]
fn a_keepalive_answered_without_its_quorum_round_is_caught() {
    let (st, v) = keepalive_cut_off("ka-unconfirmed", Some("keepalive-unconfirmed"));
    assert_eq!(st, 200, "{v}");
}

/// Keepalives on a three-member cluster's leader with its quorum (checked: answered
/// from memory, the log not grown by one entry each), then one with both followers
/// frozen: its answer.
fn keepalive_cut_off(name: &str, breaks: Option<&'static str>) -> (u16, Value) {
    let c = Cluster::start_broken(name, 3, breaks);
    let l = c.leader(20);
    let addr = c.members[l].addr;
    let (st, v) = call(addr, "POST", "/v1/leases", "{\"ttl_ms\":30000}", &[]).unwrap();
    assert_eq!(st, 201, "{v}");
    let lease = v["lease_id"].as_str().unwrap().to_string();
    let keepalive = || call(addr, "POST", &format!("/v1/leases/{lease}/keepalive"), "", &[]).unwrap();
    let index = || c.status(l).unwrap()["last_log_index"].as_u64().unwrap();
    let (before, answered) = (index(), c.counter(l, "fenced_keepalives_from_memory_total"));
    for _ in 0..50 {
        let (st, v) = keepalive();
        assert_eq!(st, 200, "{v}");
    }
    assert_eq!(c.counter(l, "fenced_keepalives_from_memory_total") - answered, 50);
    let grown = index() - before;
    assert!(grown < 25, "50 keepalives from memory grew the log by {grown} entries");
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    for f in &others {
        c.signal(*f, "-STOP");
    }
    let answer = keepalive();
    for f in &others {
        c.signal(*f, "-CONT");
    }
    answer
}
