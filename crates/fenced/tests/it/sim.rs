//! End-to-end tests of `fenced sim` and `fenced sim sweep`: what a person types.

use std::process::Output;

use crate::support::fenced;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "fenced failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

#[test]
fn sim_json_has_the_design_fields_and_tells_the_story() {
    let d = json(&fenced(&["sim", "--scenario", "default", "--seed", "2", "--json"]));
    let f = json(&fenced(&["sim", "--scenario", "fencing", "--seed", "2", "--json"]));
    for k in fenced_sim::SUMMARY_FIELDS {
        assert!(d.get(k).is_some(), "summary lacks {k}");
    }
    assert!(d["zombie_writes"].as_u64().unwrap() > 0);
    assert_eq!(f["zombie_writes"], 0);
    assert_eq!(f["lost_updates"], 0);
    assert!(f["stale_writes_rejected"].as_u64().unwrap() > 0);
    assert_eq!(d["fencing"], false);
    assert_eq!(f["fencing"], true);
}

#[test]
fn flags_override_the_scenario() {
    let v = json(&fenced(&[
        "sim",
        "--scenario",
        "long-lease",
        "--lease",
        "750ms",
        "--clients",
        "6",
        "--duration",
        "90s",
        "--renew-at",
        "0.25",
        "--fencing",
        "on",
        "--pauses",
        "gc",
        "--json",
    ]));
    assert_eq!(v["lease_ms"], 3_000, "long-lease is four times the base lease");
    assert_eq!(v["clients"], 6);
    assert_eq!(v["duration_ms"], 90_000);
    assert_eq!(v["renew_fraction"], 0.25);
    assert_eq!(v["fencing"], true);
    assert_eq!(v["pause_model"], "gc");
}

#[test]
fn trace_files_are_identical_for_the_same_seed() {
    let dir = std::env::temp_dir().join(format!("fenced-sim-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
    for p in [&a, &b] {
        assert!(fenced(&["sim", "--seed", "9", "--trace", p.to_str().unwrap()]).status.success());
    }
    let (ta, tb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(!ta.is_empty());
    assert_eq!(ta, tb);
    let first: serde_json::Value = serde_json::from_slice(ta.split(|c| *c == b'\n').next().unwrap()).unwrap();
    for k in ["t_ms", "seq", "actor", "kind"] {
        assert!(first.get(k).is_some(), "trace line lacks {k}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn diagram_draws_the_zombie_write() {
    let o = fenced(&["sim", "--diagram"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.contains("ZOMBIE WRITE accepted"), "{out}");
    assert!(out.contains("lock service"), "{out}");
    let o = fenced(&["sim", "--scenario", "fencing", "--diagram"]);
    assert!(stdout(&o).contains("REJECTED"), "{}", stdout(&o));
}

#[test]
fn bad_arguments_exit_2_with_one_line_naming_the_argument() {
    for (args, needle) in [
        (&["sim", "--scenario", "nope"][..], "--scenario"),
        (&["sim", "--lease", "5d"][..], "--lease"),
        (&["sim", "--lease", "1ms"][..], "--lease"),
        (&["sim", "--clients", "0"][..], "--clients"),
        (&["sim", "--renew-at", "1.5"][..], "--renew-at"),
        (&["sim", "--fencing", "maybe"][..], "--fencing"),
        (&["sim", "--scenario", "occ", "--fencing", "on"][..], "--fencing"),
        (&["sim", "sweep", "--seeds", "9..1"][..], "--seeds"),
        (&["sim", "sweep", "--leases", "1,x"][..], "--leases"),
        (&["sim", "--replication", "majority"][..], "--replication"),
        (&["sim", "--scenario", "split-brain", "--replication", "raft"][..], "--replication"),
        (&["sim", "--clock", "sundial"][..], "--clock"),
        (&["sim", "--scenario", "partitioned", "--fencing", "on"][..], "--fencing"),
        (&["sim", "--scenario", "occ", "--lock-delay", "1s"][..], "--lock-delay"),
        (&["sim", "sweep", "--over", "moon"][..], "--over"),
        (&["sim", "sweep", "--over", "clock-step", "--values", "0"][..], "--values"),
    ] {
        let o = fenced(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn sweep_prints_json_csv_and_an_svg() {
    let dir = std::env::temp_dir().join(format!("fenced-sweep-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("s.svg");
    let v = json(&fenced(&[
        "sim",
        "sweep",
        "--seeds",
        "1..3",
        "--leases",
        "1,4",
        "--duration",
        "60s",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]));
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().filter(|r| r["fencing"] == "on").all(|r| r["zombie_writes"] == 0));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let o = fenced(&["sim", "sweep", "--seeds", "1..2", "--leases", "1", "--duration", "30s", "--csv"]);
    assert!(stdout(&o).starts_with("lease_multiple,"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_misconception_scenarios_and_their_flags() {
    let pb = json(&fenced(&["sim", "--scenario", "split-brain", "--fencing", "on", "--json"]));
    let maj = json(&fenced(&["sim", "--scenario", "split-brain", "--replication", "majority", "--json"]));
    assert_eq!(pb["replication"], "primary-backup");
    assert!(pb["duplicate_tokens"].as_u64().unwrap() > 0);
    assert!(pb["lost_updates"].as_u64().unwrap() > 0, "the gate cannot tell equal tokens apart");
    assert_eq!((maj["replication"].as_str(), maj["duplicate_tokens"].as_u64()), (Some("majority"), Some(0)));
    let wall = json(&fenced(&["sim", "--scenario", "clock-drift", "--json"]));
    let mono = json(&fenced(&["sim", "--scenario", "clock-drift", "--clock", "monotonic", "--json"]));
    assert!(wall["early_expiries"].as_u64().unwrap() > 0);
    assert_eq!(mono["early_expiries"], 0);
    let crash = json(&fenced(&["sim", "--scenario", "service-crash", "--json"]));
    let empty = json(&fenced(&["sim", "--scenario", "service-crash", "--service-restart", "empty", "--json"]));
    assert!(crash["service_crashes"].as_u64().unwrap() > 0);
    assert_eq!(crash["token_regressions"], 0);
    assert!(empty["token_regressions"].as_u64().unwrap() > 0);
    let p = json(&fenced(&["sim", "--scenario", "partitioned", "--clients", "6", "--json"]));
    assert_eq!((p["locks"].as_u64(), p["grants"].as_u64(), p["lost_updates"].as_u64()), (Some(6), Some(0), Some(0)));
    let text = stdout(&fenced(&["sim", "--scenario", "network-delay"]));
    assert!(text.contains("delayed messages"), "{text}");
    let o = fenced(&["sim", "sweep", "--over", "lock-delay", "--values", "0,1s", "--seeds", "1..3", "--csv"]);
    let csv = stdout(&o);
    assert!(csv.starts_with("lock_delay_ms,lease_ms,"), "{csv}");
    assert!(csv.contains("\n1000,1000,off,3,"), "{csv}");
}
