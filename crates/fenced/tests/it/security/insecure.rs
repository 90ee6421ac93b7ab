//! The negative control: without peer authentication (`--insecure-peers`) the same
//! forged append is taken; what refuses it elsewhere is the authentication.

use super::*;

/// Three members on loopback without peer authentication (`--insecure-peers`): their
/// ids, client addresses and data directories, and the `--peers` they share.
pub(super) struct Insecure {
    pub(super) members: Vec<(u64, SocketAddr, PathBuf)>,
    pub(super) peers: String,
}

impl Insecure {
    pub(super) fn new(name: &str) -> Insecure {
        let members: Vec<(u64, SocketAddr, PathBuf)> =
            (1..=3).map(|id| (id, free_addr(), scratch(&format!("{name}-{id}")))).collect();
        let peers = members.iter().map(|(id, a, _)| format!("{id}=http://{a}")).collect::<Vec<_>>().join(",");
        Insecure { members, peers }
    }

    /// Starts member `i` (0-based) with `extra` flags.
    pub(super) fn start(&self, i: usize, extra: &[&str]) -> Killed {
        let (id, addr, dir) = &self.members[i];
        Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--node-id", &id.to_string(), "--peers", &self.peers])
            .arg("--insecure-peers")
            .args(extra)
            .arg("--data-dir")
            .arg(dir)
            .env("FENCED_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .map(Killed)
            .unwrap()
    }

    pub(super) fn start_all(&self) -> Vec<Killed> {
        (0..self.members.len()).map(|i| self.start(i, &[])).collect()
    }

    pub(super) fn status(&self, i: usize) -> Option<Value> {
        call(self.members[i].1, "GET", "/v1/cluster", "", &[]).ok().map(|(_, v)| v)
    }

    /// The index of the member that leads, once one does (within 20 s).
    pub(super) fn leader(&self) -> usize {
        let mut found = None;
        until(20, || {
            found = (0..self.members.len())
                .find(|i| self.status(*i).is_some_and(|s| s["leader_id"].as_u64() == Some(self.members[*i].0)));
            found.is_some()
        });
        found.unwrap()
    }
}

impl Drop for Insecure {
    fn drop(&mut self) {
        for (_, _, dir) in &self.members {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The negative control of the tests above: the same forged append on a cluster that
/// runs without peer authentication (`--insecure-peers`) is taken, and moves the
/// follower's term. What refuses it above is the peer authentication, not the message.
#[test]
fn without_peer_authentication_the_same_forged_append_is_taken() {
    let c = Insecure::new("insecure-append");
    let _children = c.start_all();
    let l = c.leader();
    let fi = (l + 1) % 3;
    let f = c.members[fi].1;
    let term = c.status(fi).unwrap()["term"].as_u64().unwrap();
    let (st, v) = call(f, "POST", "/raft/append", &forged("append", term + 100), &[]).unwrap();
    assert_eq!((st, &v["Ok"]), (200, &Value::from("Success")), "{v}");
    let after = c.status(fi).unwrap()["term"].as_u64().unwrap();
    assert!(after >= term + 100, "the forged append was not taken (term {term} -> {after}): {v}");
    // A snapshot that does not decode is refused before openraft sees it (its install
    // would stop the log, and the server with it): the member serves on.
    let meta = r#"{"last_log_id":null,"last_membership":{"log_id":null,"membership":{"configs":[],"nodes":{}}},"snapshot_id":"forged"}"#;
    let vote = r#"{"leader_id":{"term":100000,"node_id":9},"committed":true}"#;
    let (st, v) = call(f, "POST", "/raft/snapshot", &format!("[{vote},{meta},[1,2,3]]"), &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_snapshot")), "{v}");
    // One that decodes but whose table breaks an invariant the table relies on (a held
    // lock whose lease is gone: the next release or expiry of it would panic) is
    // refused the same way, saying which.
    let data: Vec<Value> = broken_table_snapshot().into_iter().map(Value::from).collect();
    let body = format!("[{vote},{meta},{}]", Value::from(data));
    let (st, v) = call(f, "POST", "/raft/snapshot", &body, &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_snapshot")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not a live lease"), "{v}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(matches!(call(f, "GET", "/livez", "", &[]), Ok((200, _))), "the member serves on");
}

/// The JSON snapshot (as a release before the binary format sends it) of a table with
/// one held lock whose lease was taken out of the table.
pub(super) fn broken_table_snapshot() -> Vec<u8> {
    use fenced_core::{Acquire, Command, LeaseId, LeaseRef, Limits, LockName, LockTable, RequestId};
    let mut t = LockTable::new(Limits::default());
    let lease = LeaseId(7);
    t.apply(RequestId(1), Command::GrantLease { lease, ttl_ms: 60_000 }, 1);
    let name = LockName::new("held").unwrap();
    let acquire = Acquire { name, lease: LeaseRef::Existing(lease), wait_ms: 0, lock_delay_ms: 0, holder: None };
    t.apply(RequestId(2), Command::Acquire(acquire), 2);
    let mut table = serde_json::to_value(&t).unwrap();
    table["leases"] = serde_json::json!({});
    serde_json::to_vec(&serde_json::json!({ "table": table })).unwrap()
}
