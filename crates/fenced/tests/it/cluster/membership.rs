//! Members joining and leaving under load, a member that never answers refused, and
//! the lowest-id member replaced on an empty directory with `--join`.

use super::*;

#[test]
fn members_join_and_leave_under_load() {
    let mut c = Cluster::start("membership", 3);
    // A fourth process, started with the cluster's peers and its own id: it waits to be
    // added (only the lowest id initialises).
    let spare = Member { id: 4, addr: free_addr(), dir: scratch("membership-4"), child: None };
    c.peers = format!("{},4=http://{}", c.peers, spare.addr);
    c.members.push(spare);
    c.spawn(3);
    let load = Load::start(&c, 3);
    let grants = load.grants.clone();
    until(30, || grants.lock().unwrap().tokens.len() >= 50);
    let url = format!("http://{}", c.members[3].addr);
    let (st, s) = c.any("POST", "/v1/cluster/members", &format!("{{\"id\":4,\"url\":\"{url}\"}}"));
    assert_eq!(st, 200, "{s}");
    let n = grants.lock().unwrap().tokens.len();
    until(30, || grants.lock().unwrap().tokens.len() >= n + 50);
    let (st, s) = c.any("DELETE", "/v1/cluster/members/3", "");
    assert_eq!(st, 200, "{s}");
    let n = grants.lock().unwrap().tokens.len();
    until(30, || grants.lock().unwrap().tokens.len() >= n + 50);
    load.finish();
    let l = c.leader(20);
    let ids: Vec<u64> =
        c.status(l).unwrap()["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 4]);
    let tokens = grants.lock().unwrap().tokens.clone();
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), tokens.len(), "a token was issued twice");
    // The new member holds the same table: it answers a linearizable view when it leads.
    let (_, v) = c.any("GET", "/v1/locks", "");
    assert!(v["locks"].is_array(), "{v}");
}

/// A member added at a URL where nothing answers (found by an API fuzzer): it is
/// refused after it failed to catch up as a learner, and never becomes a voter, whose
/// silence would take the single server's quorum with it.
#[test]
fn a_member_that_never_answers_is_refused_and_the_server_keeps_serving() {
    let c = Cluster::start("add-silent", 1);
    let (st, v) = c.any("POST", "/v1/cluster/members", "{\"id\":2,\"url\":\"http://127.0.0.1:1\"}");
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    let s = c.status(0).unwrap();
    let ids: Vec<u64> = s["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1], "{s}");
    let (st, g) = c.any("POST", "/v1/locks/after-add/acquire", "{\"ttl_ms\":2000}");
    assert_eq!(st, 200, "{g}");
}

/// Replacing the member with the lowest id: on an empty data directory it would
/// initialise a cluster of its own (the lowest id in `--peers` does, at a first start)
/// and could never be added; with `--join` it waits to be added, and catches up.
#[test]
fn the_lowest_id_member_replaced_on_an_empty_directory_joins_with_join() {
    let mut c = Cluster::start("join", 3);
    let (st, g) = c.any("POST", "/v1/locks/before/acquire", "{\"ttl_ms\":60000}");
    assert_eq!(st, 200, "{g}");
    // Member 1 is lost with its disk, and removed.
    c.kill9(0);
    let l = c.leader(20);
    let (st, v) = call(c.members[l].addr, "DELETE", "/v1/cluster/members/1", "", &[]).unwrap();
    assert_eq!(st, 200, "{v}");
    std::fs::remove_dir_all(&c.members[0].dir).unwrap();
    let add = format!("{{\"id\":1,\"url\":\"http://{}\"}}", c.members[0].addr);
    // Without --join: a cluster of its own, which the leader refuses to add.
    c.spawn(0);
    let (st, v) = call(c.members[l].addr, "POST", "/v1/cluster/members", &add, &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("already belongs to a cluster"), "{v}");
    c.kill9(0);
    std::fs::remove_dir_all(&c.members[0].dir).unwrap();
    // With --join: it waits, is added, and holds what the others hold.
    c.spawn_with(0, &["--join"]);
    let (st, v) = call(c.members[0].addr, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(st, 503, "a member waiting to be added says it is ready: {v}");
    let (st, v) = call(c.members[l].addr, "POST", "/v1/cluster/members", &add, &[]).unwrap();
    assert_eq!(st, 200, "{v}");
    until(20, || matches!(call(c.members[0].addr, "GET", "/readyz", "", &[]), Ok((200, _))));
    let (st, v) = call(c.members[0].addr, "GET", "/v1/locks/before", "", &[]).unwrap();
    assert_eq!((st, v["token"].as_u64()), (200, g["token"].as_u64()), "{v}");
    c.replicas_agree();
}
