//! End-to-end tests of `fenced bench`: short runs against a spawned Fenced and its
//! spawned peers. They check what the command reports, never how fast anything was.

use std::process::Output;

use serde_json::Value;

use crate::support::{fenced, installed};

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "fenced bench failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

fn have_redis() -> bool {
    installed("redis-server", None, "apt-get install -y redis-server")
}

/// `fenced bench --spawn --compare TARGETS --workload WORKLOADS`, 3 clients for 1 s, as JSON.
fn compare_json(targets: &str, workloads: &str) -> Value {
    let args = ["bench", "--spawn", "--compare", targets, "--workload", workloads];
    json(&fenced(&[&args[..], &["--clients", "3", "--duration", "1s", "--json"]].concat()))
}

/// The fields every report has, with ops done and percentiles in order.
fn check_report(r: &Value, target: &str, workload: &str) {
    for k in ["target", "workload", "clients", "durability", "ops_per_s", "p50_us", "p99_us", "p999_us", "max_us"] {
        assert!(r.get(k).is_some(), "{target} {workload}: the report lacks {k}: {r}");
    }
    assert_eq!(r["target"], target);
    assert_eq!(r["workload"], workload);
    assert!(!r["durability"].as_str().unwrap().is_empty(), "{r}");
    assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{target} {workload}: no operation: {r}");
    let p: Vec<u64> = ["p50_us", "p99_us", "p999_us", "max_us"].iter().map(|k| r[k].as_u64().unwrap()).collect();
    assert!(p[0] <= p[1] && p[1] <= p[2] && p[2] <= p[3], "{target} {workload}: percentiles out of order: {p:?}");
}

/// FIFO hand-off: every client got the lock.
fn check_fairness(r: &Value) {
    let (lo, hi) = (r["grants_per_client_min"].as_u64(), r["grants_per_client_max"].as_u64());
    assert!(lo.is_some() && hi.is_some() && lo <= hi, "fairness fields: {r}");
    assert_eq!(r["starved_clients"], 0, "{r}");
}

#[test]
fn fenced_lock_workloads_report_figures_and_fairness() {
    let v = json(&fenced(&[
        "bench",
        "--spawn",
        "--workload",
        "uncontended,contended",
        "--clients",
        "4",
        "--duration",
        "1s",
        "--json",
    ]));
    let runs = v.as_array().expect("an array for two workloads");
    assert_eq!(runs.len(), 2);
    check_report(&runs[0], "fenced", "uncontended");
    check_report(&runs[1], "fenced", "contended");
    assert_eq!(runs[0]["clients"], 4);
    check_fairness(&runs[1]);
    assert!(runs[0]["server_cpu_s"].is_number(), "a spawned server's CPU is measured: {}", runs[0]);
    // Beside the uncontended row, its log's zero-work ceiling with the same clients and
    // the row's share of it; the contended row is not what the ceiling models.
    let (ceiling, share) = (runs[0]["log_ceiling_ops_per_s"].as_f64(), runs[0]["of_log_ceiling"].as_f64());
    assert!(ceiling.is_some_and(|c| c > 0.0), "the ceiling is measured: {}", runs[0]);
    let expected = runs[0]["ops_per_s"].as_f64().unwrap() / ceiling.unwrap();
    assert!(share.is_some_and(|s| (s - expected).abs() < 1e-9), "the share is the row's over the ceiling: {}", runs[0]);
    assert!(runs[1]["log_ceiling_ops_per_s"].is_null(), "{}", runs[1]);
}

#[test]
fn fenced_store_and_keepalive_open_loop() {
    let store = json(&fenced(&[
        "bench",
        "--spawn",
        "--workload",
        "store",
        "--clients",
        "2",
        "--duration",
        "1s",
        "--rate",
        "200",
        "--json",
    ]));
    check_report(&store, "fenced", "store");
    assert_eq!(store["mode"], "open");
    // The pacer sent 200 a second for 1 s, no more: an open loop does not catch up early.
    let ops = store["ops"].as_u64().unwrap();
    assert!((150..=201).contains(&ops), "{ops} writes at 200/s for 1 s: {store}");
    let (lag, p50) = (store["send_lag_p50_us"].as_u64(), store["p50_us"].as_u64().unwrap());
    assert!(lag.is_some_and(|l| l <= p50), "the lateness is part of each latency: {store}");
    assert!(store["durability"].as_str().unwrap().contains("fsync"), "{store}");
    let ka = json(&fenced(&[
        "bench",
        "--spawn",
        "--workload",
        "keepalive",
        "--leases",
        "300",
        "--ttl",
        "1500ms",
        "--clients",
        "3",
        "--duration",
        "1s",
        "--json",
    ]));
    check_report(&ka, "fenced", "keepalive");
    assert_eq!(ka["leases"], 300);
    assert_eq!(ka["false_expiries"], 0, "leases kept alive at a third of their TTL must not expire: {ka}");
    assert!(ka["server_cpu_s"].is_number(), "{ka}");
}

#[test]
fn redis_both_durabilities_and_the_comparison_table() {
    if !have_redis() {
        return;
    }
    let v = compare_json("fenced,redis,redis-aof", "contended,store");
    let runs = v.as_array().expect("an array with --compare");
    let targets: Vec<(&str, &str)> =
        runs.iter().map(|r| (r["target"].as_str().unwrap(), r["workload"].as_str().unwrap())).collect();
    assert_eq!(
        targets,
        [
            ("fenced", "contended"),
            ("fenced", "store"),
            ("redis", "contended"),
            ("redis", "store"),
            ("redis-aof", "contended"),
            ("redis-aof", "store")
        ]
    );
    for r in runs {
        check_report(r, r["target"].as_str().unwrap(), r["workload"].as_str().unwrap());
    }
    assert!(runs[2]["grants_per_client_min"].is_u64(), "{}", runs[2]);
    assert_eq!(runs[2]["durability"], "none (no AOF, no RDB)");
    assert_eq!(runs[4]["durability"], "AOF, appendfsync always");

    let text = fenced(&["bench", "--spawn", "--compare", "fenced,redis", "--clients", "2", "--duration", "500ms"]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let table = String::from_utf8_lossy(&text.stdout);
    assert!(table.contains("fenced÷") && table.contains("redis") && table.contains("1.00×"), "{table}");
    assert!(table.contains("of its log's zero-work ceiling"), "the Fenced row's share of its ceiling: {table}");
}

#[test]
fn etcd_and_zookeeper_queue_their_waiters_fairly() {
    let zookeeper = std::path::Path::new("/usr/share/java/zookeeper.jar").exists();
    if !installed("etcd", None, "apt-get install -y etcd-server")
        || !installed("java", None, "apt-get install -y zookeeper")
    {
        return;
    }
    assert!(zookeeper || std::env::var_os("CI").is_none(), "ZooKeeper is needed (apt-get install -y zookeeper)");
    if !zookeeper {
        return;
    }
    let v = compare_json("etcd,zookeeper", "uncontended,contended,store");
    let runs = v.as_array().expect("an array with --compare");
    assert_eq!(runs.len(), 6, "{v}");
    for r in runs {
        check_report(r, r["target"].as_str().unwrap(), r["workload"].as_str().unwrap());
        assert_eq!(r["errors"], 0, "{r}");
    }
    // Both queue their waiters: nobody starves on one lock.
    check_fairness(&runs[1]);
    check_fairness(&runs[4]);
    assert_eq!(runs[3]["target"], "zookeeper");
    assert!(runs[3]["durability"].as_str().unwrap().contains("fsynced"), "{}", runs[3]);
    assert!(runs[3]["recipe"].as_str().unwrap().contains("InterProcessMutex"), "{}", runs[3]);
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    for args in [
        &["bench", "--target", "consul"][..],
        &["bench", "--target", "zookeeper", "--ttl", "2s"],
        &["bench", "--compare", "fenced,redis"],
        &["bench", "--contended", "--workload", "store"],
        &["bench", "--workload", "sideways"],
        &["bench", "--target", "etcd", "--workload", "keepalive"],
        &["bench", "--target", "etcd", "--ttl", "1500ms"],
        &["bench", "--clients", "0"],
        &["bench", "--rate", "0"],
        &["bench", "--duration", "soon"],
    ] {
        let o = fenced(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.starts_with("error:"), "{args:?}: {err}");
    }
}

#[test]
fn an_unreachable_endpoint_says_so() {
    let o = fenced(&["bench", "--endpoint", "http://127.0.0.1:1", "--duration", "1s"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot reach fenced at http://127.0.0.1:1"), "{err}");
}
