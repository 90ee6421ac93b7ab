//! End-to-end tests of `fenced demo`: real server and worker processes, a real SIGSTOP
//! past the lease. Fencing on refuses the zombie write and loses nothing; fencing off
//! lets it through and loses B's increment; an interrupted run leaves no process and no
//! directory behind; bad arguments exit 2.
#![cfg(all(feature = "client", feature = "server"))]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_fenced");
/// Short enough to keep the suite fast, long enough for a loaded machine.
const QUICK: [&str; 4] = ["--ttl", "1s", "--pause", "1500ms"];

/// What the demo left in its private `$TMPDIR`.
fn entries(tmp: &TempDir) -> Vec<String> {
    std::fs::read_dir(&tmp.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

fn demo(tmp: &TempDir, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("demo").args(args).env("TMPDIR", &tmp.0).env_remove("FENCED_ENDPOINT");
    c
}

fn run_json(tag: &str, extra: &[&str]) -> Value {
    let tmp = TempDir::new("demo-it", tag);
    let mut args = QUICK.to_vec();
    args.extend_from_slice(extra);
    args.push("--json");
    let o: Output = demo(&tmp, &args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}\nstdout: {}", String::from_utf8_lossy(&o.stdout));
    assert!(entries(&tmp).is_empty(), "the demo left {:?} behind", entries(&tmp));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

#[test]
fn fencing_on_refuses_the_zombie_write_and_loses_nothing() {
    let v = run_json("on", &[]);
    assert_eq!(v["fencing"], "on");
    assert_eq!((v["ttl_ms"].as_u64(), v["pause_ms"].as_u64()), (Some(1000), Some(1500)));
    assert!(v["paused_ms"].as_u64().unwrap() >= 1500, "{v}");
    let (a, b) = (v["token_a"].as_u64().unwrap(), v["token_b"].as_u64().unwrap());
    assert!(b > a, "B's token {b} must be above A's {a}");
    assert_eq!(v["write_a_accepted"], false);
    assert_eq!((v["zombie_writes"].as_u64(), v["lost_updates"].as_u64()), (Some(0), Some(0)));
    assert_eq!((v["stale_writes_rejected"].as_u64(), v["final_value"].as_u64()), (Some(1), Some(2)));
    assert_eq!(v["as_designed"], true);
    // The order of the story: A frozen, B granted and writing, A's write after SIGCONT.
    let steps = v["steps"].as_array().unwrap();
    let at = |actor: &str, event: &str| {
        steps
            .iter()
            .position(|s| s["actor"] == actor && s["event"] == event)
            .unwrap_or_else(|| panic!("no step {actor} {event}"))
    };
    assert!(at("A", "read") < at("demo", "sigstop"));
    assert!(at("demo", "sigstop") < at("B", "granted"));
    assert!(at("B", "write") < at("demo", "sigcont"));
    assert!(at("demo", "sigcont") < at("A", "write"));
    let times: Vec<u64> = steps.iter().map(|s| s["t_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "steps in time order: {times:?}");
}

#[test]
fn fencing_off_lets_the_zombie_write_through_and_loses_an_update() {
    let v = run_json("off", &["--fencing", "off"]);
    assert_eq!(v["fencing"], "off");
    assert_eq!(v["write_a_accepted"], true);
    assert_eq!((v["zombie_writes"].as_u64(), v["lost_updates"].as_u64()), (Some(1), Some(1)));
    assert_eq!((v["stale_writes_rejected"].as_u64(), v["final_value"].as_u64()), (Some(0), Some(1)));
    assert_eq!(v["increments_acknowledged"].as_u64(), Some(2));
}

#[test]
fn text_output_narrates_and_draws_the_sequence() {
    let tmp = TempDir::new("demo-it", "text");
    let o = demo(&tmp, &QUICK).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    for needle in [
        "SIGSTOP worker A",
        "state T",
        "REFUSED, 409 stale_token",
        "worker A              lock service          worker B              store",
        "✗ REJECTED: stale token",
        "verdict: SAFE",
    ] {
        assert!(out.contains(needle), "no '{needle}' in:\n{out}");
    }
}

#[test]
fn an_interrupted_run_leaves_no_process_and_no_directory() {
    let tmp = TempDir::new("demo-it", "sigint");
    let mut child = demo(&tmp, &["--ttl", "1s", "--pause", "20s"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait until A is frozen and B is waiting or done: every child is alive then.
    let deadline = Instant::now() + Duration::from_secs(30);
    for line in lines.by_ref() {
        if line.unwrap().contains("released lock") {
            break;
        }
        assert!(Instant::now() < deadline, "the demo did not get that far");
    }
    let children = descendants(child.id());
    assert!(children.len() >= 2, "server and worker A at least: {children:?}");
    assert!(children.iter().any(|p| state(*p) == Some('T')), "worker A is stopped");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    for pid in children {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} outlived the demo");
    }
    assert!(entries(&tmp).is_empty(), "the demo left {:?} behind", entries(&tmp));
}

#[test]
fn bad_arguments_exit_2_with_one_line_naming_the_argument() {
    let tmp = TempDir::new("demo-it", "bad");
    for (args, needle) in [
        (&["--ttl", "1s", "--pause", "500ms"][..], "--pause"),
        (&["--ttl", "10ms"][..], "--ttl"),
        (&["--fencing", "maybe"][..], "--fencing"),
        (&["--pause", "3x"][..], "--pause"),
    ] {
        let o = demo(&tmp, args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        let first = err.lines().next().unwrap_or_default();
        assert!(first.starts_with("error: ") && first.contains(needle), "{args:?}: {err}");
    }
    assert!(entries(&tmp).is_empty(), "nothing started for bad arguments");
}

/// Every process whose parent chain leads to `root`.
fn descendants(root: u32) -> Vec<u32> {
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            if ppid(pid) == Some(parent) && !found.contains(&pid) {
                found.push(pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().map(String::from).collect())
}

fn state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

fn ppid(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}
