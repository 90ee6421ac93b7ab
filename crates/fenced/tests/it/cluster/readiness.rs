//! `/readyz` and `fenced_raft_has_leader` of a member cut off from its leader or its quorum.

use super::*;

/// `/readyz` and `fenced_raft_has_leader` of a member whose leader is known but silent:
/// a leader whose followers are gone, then a follower whose leader is gone (found by
/// the deployment kit's alert tests: both went on saying ready, naming that leader).
#[test]
fn a_member_cut_off_from_its_leader_or_its_quorum_is_not_ready() {
    let mut c = Cluster::start("cut-off", 3);
    let l = c.leader(20);
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    let ready = |c: &Cluster, i: usize| call(c.members[i].addr, "GET", "/readyz", "", &[]);
    let has_leader = |c: &Cluster, i: usize| -> Option<u64> {
        let (_, v) = call(c.members[i].addr, "GET", "/metrics", "", &[]).ok()?;
        let text = v.as_str()?.to_string();
        text.lines().find_map(|l| l.strip_prefix("fenced_raft_has_leader ")).and_then(|v| v.parse().ok())
    };
    assert_eq!(has_leader(&c, l), Some(1));
    // The leader's age of each follower's last acknowledgement: fresh while both live,
    // growing for the one killed, fresh still for the other.
    let ack_age = |c: &Cluster, peer: u64| -> Option<f64> {
        let (_, v) = call(c.members[l].addr, "GET", "/metrics", "", &[]).ok()?;
        let line = format!("fenced_raft_peer_ack_age_seconds{{peer=\"{peer}\"}} ");
        v.as_str()?.lines().find_map(|l| l.strip_prefix(line.as_str())).and_then(|v| v.parse().ok())
    };
    let (first, second) = (c.members[others[0]].id, c.members[others[1]].id);
    until(5, || ack_age(&c, first).is_some_and(|a| a < 1.0) && ack_age(&c, second).is_some_and(|a| a < 1.0));
    c.kill9(others[0]);
    until(10, || ack_age(&c, first).is_some_and(|a| a > 2.0));
    assert!(ack_age(&c, second).is_some_and(|a| a < 1.0), "a live follower's acknowledgements look old");
    c.kill9(others[1]);
    until(10, || ready(&c, l).is_ok_and(|(st, v)| st == 503 && v["status"] == "no_leader"));
    assert_eq!(has_leader(&c, l), Some(0), "a leader without its quorum says it has a leader");
    // A follower comes back: a quorum again, ready again.
    c.spawn(others[0]);
    until(20, || ready(&c, l).is_ok_and(|(st, _)| st == 200) || ready(&c, others[0]).is_ok_and(|(st, _)| st == 200));
    let l2 = c.leader(20);
    let f = if l2 == l { others[0] } else { l };
    until(10, || ready(&c, f).is_ok_and(|(st, _)| st == 200));
    assert_eq!(has_leader(&c, f), Some(1));
    // The leader goes: the follower alone cannot elect one, names the dead one, and
    // says it is not ready.
    c.kill9(l2);
    until(10, || ready(&c, f).is_ok_and(|(st, v)| st == 503 && v["status"] == "no_leader"));
    assert_eq!(has_leader(&c, f), Some(0), "a follower cut off from its leader says it has one");
}
