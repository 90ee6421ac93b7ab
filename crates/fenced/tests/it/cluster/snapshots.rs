//! A follower that missed more than the log keeps catches up from a snapshot; the
//! fixture the transfer-fault tests share.

use super::*;

#[test]
fn a_follower_that_missed_more_than_the_log_keeps_catches_up_from_a_snapshot() {
    let mut c = Cluster::start("snapshot", 3);
    let l = c.leader(20);
    let f = (l + 1) % 3;
    c.kill9(f);
    // Far more entries than the log keeps past a snapshot (50 per snapshot here).
    let mut last = 0;
    for i in 0..150 {
        let (st, g) = c.any("POST", &format!("/v1/locks/s{}/acquire", i % 7), "{\"ttl_ms\":60000}");
        if st == 200 {
            last = g["token"].as_u64().unwrap();
            // The fenced store travels in the snapshot too.
            let (st, v) =
                c.any_with("PUT", "/v1/store/snap", &last.to_string(), &[("fencing-token", last.to_string())]);
            assert_eq!(st, 200, "{v}");
        }
    }
    // openraft purges the log behind a snapshot only while no replication (the dead
    // follower's retries included) reads that range: wait until it has, so that the
    // follower can only catch up from the snapshot. Each try appends an entry: purges are
    // retried as replication progresses.
    until(30, || {
        c.any("POST", "/v1/locks/s0/acquire", "{\"ttl_ms\":60000}");
        c.status(l).is_some_and(|s| s["purged_index"].as_u64().unwrap_or(0) > 0)
    });
    c.spawn(f);
    let target = c.status(l).unwrap()["commit_index"].as_u64().unwrap();
    until(30, || c.status(f).is_some_and(|s| s["last_applied_index"].as_u64() >= Some(target)));
    let s = c.status(f).unwrap();
    assert!(s["snapshot_index"].as_u64().is_some(), "the follower caught up without a snapshot: {s}");
    // Counted where they happen: the leader built at least one, the follower installed one.
    assert!(c.counter(l, "fenced_raft_snapshots_total") >= 1);
    assert!(c.counter(f, "fenced_raft_snapshots_total") >= 1);
    c.replicas_agree();
    // The follower now holds what the leader holds: make it lead, and read through it.
    c.kill9(l);
    let (_, v) = c.any("GET", "/v1/locks/s0", "");
    assert_eq!(v["held"], true, "{v}");
    let (st, v) = c.any("GET", "/v1/store/snap", "");
    assert_eq!((st, v.as_u64()), (200, Some(last)), "{v}");
    let (st, g) = c.any("POST", "/v1/locks/fresh/acquire", "{\"ttl_ms\":1000}");
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > last);
}

/// A three-member cluster (`env` for every member) whose follower `f` was down while
/// about 3 MiB of store values were written and the leader `l` snapshotted and purged
/// its log: `f`, started again, can only catch up from a snapshot of several 1 MiB
/// chunks. Returns the cluster, `l`, `f` and the value written.
pub(super) fn behind_a_snapshot(name: &str, env: (&'static str, String)) -> (Cluster, usize, usize, String) {
    let mut c = Cluster::unstarted(name, 3, None);
    c.env.push(env);
    c.start_all();
    let l = c.leader(20);
    let f = (l + 1) % 3;
    c.kill9(f);
    let (st, g) = c.any("POST", "/v1/locks/writer/acquire", "{\"ttl_ms\":60000}");
    assert_eq!(st, 200, "{g}");
    let token = g["token"].as_u64().unwrap().to_string();
    let value = "v".repeat(16 << 10);
    for i in 0..200 {
        let (st, v) = c.any_with("PUT", &format!("/v1/store/big{i}"), &value, &[("fencing-token", token.clone())]);
        assert_eq!(st, 200, "{v}");
    }
    // Until the leader's snapshot holds every value (snapshots come after as many
    // entries as the table holds objects, here about 200) and its log is purged.
    let written = c.status(l).unwrap()["commit_index"].as_u64().unwrap();
    until(60, || {
        c.any("POST", "/v1/locks/s0/acquire", "{\"ttl_ms\":60000}");
        c.status(l).is_some_and(|s| {
            s["snapshot_index"].as_u64().unwrap_or(0) >= written && s["purged_index"].as_u64().unwrap_or(0) > 0
        })
    });
    (c, l, f, value)
}

impl Cluster {
    /// Member `f`'s snapshot transfers: how many resumed, the bytes received (since its
    /// last start), and the size of the snapshot file it keeps.
    pub(super) fn transfers(&self, f: usize) -> (u64, u64, u64) {
        let resumed = self.counter(f, "fenced_raft_snapshot_transfers_resumed_total");
        let received = self.counter(f, "fenced_raft_snapshot_received_bytes_total");
        let kept = std::fs::metadata(self.members[f].dir.join("snapshot")).unwrap().len();
        (resumed, received, kept)
    }

    /// Waits until member `f` applied what the leader `l` committed, then checks that
    /// the replicas agree and that `f` serves the last value [`behind_a_snapshot`] wrote.
    pub(super) fn caught_up(&self, l: usize, f: usize, value: &str) {
        let target = self.status(l).unwrap()["commit_index"].as_u64().unwrap();
        until(60, || self.status(f).is_some_and(|s| s["last_applied_index"].as_u64() >= Some(target)));
        self.replicas_agree();
        let (st, v) = self.any("GET", "/v1/store/big199", "");
        assert_eq!((st, v.as_str().map(str::len)), (200, Some(value.len())), "{v}");
    }
}
