//! The peers as clusters (issue 15): `fenced torture` against three etcd members and a
//! three-server ZooKeeper ensemble under the cluster nemesis (kill -9 and SIGSTOP of the
//! leader, partitions between the members), each lock's own token checked by Fenced's
//! store as the gate; and `fenced bench` with three-member rows.
//!
//! Without etcd or ZooKeeper (and Java) a test skips with the reason, except under CI,
//! where it fails.

use serde_json::Value;

use crate::support::{fenced, installed, num};

fn have_etcd() -> bool {
    installed("etcd", None, "apt-get install -y etcd-server")
}

fn have_zookeeper() -> bool {
    installed("java", Some("/usr/share/java/zookeeper.jar"), "apt-get install -y zookeeper")
}

/// A short run of `target` under the cluster nemesis `nemesis`, its JSON.
fn nemesis_run(target: &str, nemesis: &str, seed: &str) -> Value {
    let args = [
        "torture",
        "--target",
        target,
        "--nemesis",
        nemesis,
        "--ttl",
        "2s",
        "--duration",
        "16s",
        "--recovery",
        "6s",
        "--workers",
        "3",
        "--seed",
        seed,
        "--json",
    ];
    let out = fenced(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fenced torture --target {target} --nemesis {nemesis} failed: {err}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["target"], target);
    assert_eq!(r["nemesis"], nemesis, "{r}");
    assert_eq!(r["nodes"], 3, "{r}");
    // The schedule printed as it strikes is the one in the JSON, fault by fault.
    let printed: Vec<&str> = err.lines().filter_map(|l| l.strip_prefix("nemesis +")?.split(' ').nth(1)).collect();
    let listed: Vec<String> = r["schedule"]
        .as_array()
        .expect("a schedule")
        .iter()
        .map(|s| format!("{}:", s["nemesis"].as_str().unwrap()))
        .collect();
    assert_eq!(printed, listed, "{err}");
    r
}

/// The gate's promise under any fault of the lock service: the lock's own token (etcd:
/// the key's create_revision; ZooKeeper: the node's czxid) never goes back, so no late
/// holder's write gets through and nothing acknowledged is lost.
fn assert_gate_held(r: &Value) {
    assert!(num(r, "acknowledged") >= 10, "too little work to judge: {r}");
    assert_eq!(r["fencing"], true, "{r}");
    assert_eq!(num(r, "token_regressions"), 0, "tokens went backwards: {r}");
    assert_eq!(num(r, "duplicate_tokens"), 0, "a token granted twice: {r}");
    assert_eq!(num(r, "zombie_writes"), 0, "the gate let a zombie write through: {r}");
    assert_eq!(num(r, "lost_updates"), 0, "the gate lost updates: {r}");
    assert!(num(r, "final_value") >= num(r, "acknowledged"), "{r}");
    assert_eq!(r["safe"], true, "{r}");
}

/// kill -9 and SIGSTOP of members, the leader among them; seed 3 puts a kill of every
/// member first (`fenced-lab`'s `nemesis.rs` tests check that plan).
fn leader_faults(target: &str) {
    let r = nemesis_run(target, "kill,pause", "3");
    assert!(num(&r, "leader_kills") >= 1, "the leader was never killed: {r}");
    assert!(num(&r, "restarts_injected") >= 1, "{r}");
    assert_gate_held(&r);
}

/// Partitions between the members, through the proxies on their links: every fault of
/// the run is one (leader isolated, majority/minority, bridge, one-way), and the
/// members elect across them.
fn partitions(target: &str) {
    let r = nemesis_run(target, "partition", "1");
    assert!(num(&r, "partitions_injected") >= 2, "too few partitions: {r}");
    assert_eq!(num(&r, "partitions_injected"), r["schedule"].as_array().unwrap().len() as u64, "{r}");
    assert_gate_held(&r);
}

#[test]
fn etcd_cluster_leader_killed_gated_loses_nothing() {
    if have_etcd() {
        leader_faults("etcd-cluster");
    }
}

#[test]
fn zookeeper_ensemble_leader_killed_gated_loses_nothing() {
    if have_zookeeper() {
        leader_faults("zookeeper-ensemble");
    }
}

#[test]
fn etcd_cluster_partitioned_gated_loses_nothing() {
    if have_etcd() {
        partitions("etcd-cluster");
    }
}

#[test]
fn zookeeper_ensemble_partitioned_gated_loses_nothing() {
    if have_zookeeper() {
        partitions("zookeeper-ensemble");
    }
}

/// The three-member rows of `fenced bench --compare`: each runs, states its
/// durability, queues its waiters fairly, and counts every member's CPU.
#[test]
fn three_member_bench_rows_report_figures() {
    let mut targets = vec!["fenced-3"];
    if have_etcd() {
        targets.push("etcd-3");
    }
    if have_zookeeper() {
        targets.push("zookeeper-3");
    }
    let list = targets.join(",");
    let args = ["bench", "--spawn", "--compare", &list, "--workload", "uncontended,contended"];
    let out = fenced(&[&args[..], &["--clients", "3", "--duration", "1s", "--json"]].concat());
    assert!(out.status.success(), "fenced bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let runs = v.as_array().expect("an array with --compare");
    assert_eq!(runs.len(), targets.len() * 2, "{v}");
    for (i, r) in runs.iter().enumerate() {
        let (target, workload) = (targets[i / 2], ["uncontended", "contended"][i % 2]);
        assert_eq!((r["target"].as_str(), r["workload"].as_str()), (Some(target), Some(workload)), "{r}");
        assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["durability"].as_str().unwrap().contains("majority of the 3"), "{r}");
        assert!(r["recipe"].as_str().unwrap().contains("3"), "{r}");
        assert!(r["server_cpu_s"].as_f64().is_some_and(|c| c > 0.0), "three members' CPU: {r}");
        if workload == "contended" {
            assert_eq!(r["starved_clients"], 0, "{r}");
        }
    }
    // The fenced store is in the replicated log: three members serve the store workload.
    let args = ["bench", "--spawn", "--target", "fenced-3", "--workload", "store", "--clients", "3"];
    let out = fenced(&[&args[..], &["--duration", "1s", "--json"]].concat());
    assert!(out.status.success(), "the store on three members: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["durability"].as_str().unwrap().contains("majority of the 3"), "{r}");
}

#[test]
fn cluster_arguments_are_checked_before_anything_starts() {
    for args in [
        &["torture", "--target", "etcd-cluster", "--ttl", "2500ms"][..],
        &["torture", "--target", "zookeeper-ensemble", "--ttl", "1s"],
        &["torture", "--target", "etcd-cluster", "--nemesis", "kill,thaw"],
        &["torture", "--target", "etcd-cluster", "--faults", "crash"],
        &["torture", "--target", "etcd-cluster", "--nemesis", "partition,clock"],
        &["torture", "--target", "zookeeper-ensemble", "--nemesis", "clock"],
        &["torture", "--target", "redis", "--nemesis", "partition"],
        &["bench", "--target", "etcd-3", "--ttl", "1500ms"],
        &["bench", "--target", "zookeeper-3", "--ttl", "2s"],
        &["bench", "--target", "fenced-3", "--workload", "keepalive"],
        &["bench", "--target", "redis-3"],
    ] {
        let out = fenced(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
