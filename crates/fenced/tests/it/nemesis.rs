//! `fenced torture --target fenced-cluster`, the short variant CI runs: three members
//! under every nemesis (kill -9, SIGSTOP, partitions through the link proxies, held
//! bytes, a leader's clock off its rate) lose nothing, hand out no token twice and
//! never two holders at once; and the negative controls: a cluster broken on purpose
//! (test-only `FENCED_BREAK`, the `fault-injection` feature) is caught by the checkers.

use std::process::Command;
#[cfg(feature = "fault-injection")]
use std::process::Output;

/// `fenced torture ARGS --json` (`args` split at spaces) with `env`: its output and its
/// report.
#[cfg(feature = "fault-injection")]
fn torture(args: &str, env: &[(&str, &str)]) -> (Output, Option<serde_json::Value>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fenced"));
    cmd.arg("torture").args(args.split_whitespace()).arg("--json").env_remove("FENCED_BREAK");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run fenced torture");
    let report = serde_json::from_slice(&out.stdout).ok();
    (out, report)
}

#[cfg(feature = "fault-injection")]
use crate::support::num;

/// The run's safety figures, all zero.
#[cfg(feature = "fault-injection")]
fn assert_safe(r: &serde_json::Value) {
    for field in [
        "lost_updates",
        "zombie_writes",
        "token_regressions",
        "duplicate_tokens",
        "overlapping_holders",
        "late_lost_signals",
    ] {
        assert_eq!(num(r, field), 0, "{field}: {r}");
    }
    assert_ne!(r["replicas_agree"], false, "the replicas disagree: {r}");
    assert_ne!(r["linearizable"], false, "the counter's store history is not linearizable: {r}");
    assert_eq!(r["safe"], true, "{r}");
    assert!(r["proofs"].as_array().is_some_and(Vec::is_empty), "{r}");
}

#[cfg(feature = "fault-injection")]
#[test]
fn three_members_under_every_nemesis_lose_nothing() {
    let args = "--target fenced-cluster --nodes 3 --nemesis kill,pause,partition,delay,clock \
        --duration 35s --recovery 5s --ttl 1s --workers 3 --seed 1";
    let (out, r) = torture(args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fenced torture failed: {stderr}");
    let r = r.expect("a JSON report");
    assert_eq!((r["target"].as_str(), num(&r, "nodes")), (Some("fenced-cluster"), 3));
    for field in [
        "leader_changes",
        "failover_ms_p50",
        "failover_ms_p99",
        "unavailable_ms",
        "partitions_injected",
        "overlapping_holders",
        "duplicate_tokens",
        "linearizable",
        "replicas_agree",
        "schedule",
    ] {
        assert!(r.get(field).is_some(), "{field} missing: {r}");
    }
    // Every nemesis struck at least once, and each was announced as it started.
    let schedule = r["schedule"].as_array().expect("a schedule");
    for kind in ["kill", "pause", "partition", "delay", "clock"] {
        assert!(schedule.iter().any(|s| s["nemesis"] == kind), "no {kind} in {r}");
        assert!(stderr.contains(&format!(" {kind}: ")), "{kind} not announced: {stderr}");
    }
    assert!(num(&r, "partitions_injected") >= 1, "{r}");
    assert!(num(&r, "acknowledged") >= 30, "too little work to judge: {r}");
    assert!(num(&r, "final_value") >= num(&r, "acknowledged"), "{r}");
    assert_eq!(r["replicas_agree"], true, "{r}");
    assert_eq!(r["linearizable"], true, "{r}");
    assert!(num(&r, "plain_reads") >= 10, "the readers read nothing: {r}");
    assert_safe(&r);
}

/// A leader whose clock runs three times too fast expires a lease at a third of its TTL:
/// a waiter is granted while the holder, still inside its promised lease, works. The
/// same run with an honest clock has no overlap.
#[cfg(feature = "fault-injection")]
#[test]
fn a_leader_clock_three_times_too_fast_is_caught_as_overlapping_holders() {
    let args = "--target fenced-cluster --nemesis none --work 800ms --duration 8s --recovery 3s \
        --ttl 1s --workers 3 --seed 1";
    let (out, broken) = torture(args, &[("FENCED_BREAK", "clock-fast")]);
    let broken = broken.unwrap_or_else(|| panic!("no report: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(num(&broken, "overlapping_holders") >= 1, "the fast clock went unseen: {broken}");
    assert_eq!(broken["safe"], false, "{broken}");
    assert!(broken["proofs"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p.as_str().is_some_and(|p| p.starts_with("overlapping holders")))));
    assert_eq!(out.status.code(), Some(1), "an unsafe fenced run must fail");
    // The fence still held: the early grants' stale writes were refused.
    assert_eq!(num(&broken, "lost_updates"), 0, "{broken}");

    let (out, honest) = torture(args, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_safe(&honest.expect("a JSON report"));
}

/// A leader that, taking office, moves the timeline ahead (leases timed on its own
/// clock) expires the holder's lease at once: caught as overlapping holders. Here on a
/// single server, a cluster of one whose restart after kill -9 takes office through the
/// same code; on three members below.
#[cfg(feature = "fault-injection")]
#[test]
fn a_leader_that_expires_leases_on_its_own_clock_is_caught() {
    let args = "--target fenced --faults crash --work 2500ms --duration 14s --recovery 4s --ttl 3s \
        --workers 3 --seed 1";
    let (out, r) = torture(args, &[("FENCED_BREAK", "jump-on-failover")]);
    let r = r.unwrap_or_else(|| panic!("no report: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(num(&r, "restarts_injected") >= 1, "{r}");
    assert!(num(&r, "overlapping_holders") >= 1, "the early expiry went unseen: {r}");
    assert_eq!(r["safe"], false, "{r}");
}

#[cfg(feature = "fault-injection")]
/// [`broken_caught_honest_safe`] on three members under the partition nemesis, seed 1,
/// for `duration`; at least one partition struck.
fn partitioned_control(duration: &str, switch: &str) -> serde_json::Value {
    partitioned_control_seeded(duration, switch, "1")
}

#[cfg(feature = "fault-injection")]
fn partitioned_control_seeded(duration: &str, switch: &str, seed: &str) -> serde_json::Value {
    let args = format!("{CONTROL_BASE} --nemesis partition --duration {duration} --seed {seed}");
    let r = broken_caught_honest_safe(&args, switch);
    assert!(num(&r, "partitions_injected") >= 1, "{r}");
    r
}

/// Runs `args` on three members with `FENCED_BREAK=switch`, then the same run without
/// it. The broken run must be unsafe (exit 1, with proofs), the honest one safe; the
/// broken run's report is returned for the control's own assertions.
#[cfg(feature = "fault-injection")]
fn broken_caught_honest_safe(args: &str, switch: &str) -> serde_json::Value {
    let (out, broken) = torture(args, &[("FENCED_BREAK", switch)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let broken = broken.unwrap_or_else(|| panic!("{switch}: no report: {stderr}"));
    eprintln!("{switch}: {broken}");
    assert_eq!(broken["safe"], false, "{switch} went unseen: {broken}\n{stderr}");
    assert_eq!(out.status.code(), Some(1), "an unsafe fenced run must fail: {stderr}");
    assert!(broken["proofs"].as_array().is_some_and(|p| !p.is_empty()), "{broken}");

    let (out, honest) = torture(args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the honest run failed: {stderr}");
    let honest = honest.expect("a JSON report");
    assert_safe(&honest);
    assert_eq!(honest["linearizable"], true, "{honest}");
    assert!(num(&honest, "acknowledged") >= 5, "too little work to judge: {honest}");
    broken
}

#[cfg(feature = "fault-injection")]
const CONTROL_BASE: &str = "--target fenced-cluster --nodes 3 --recovery 4s --workers 3 --ttl 1s";

/// A leader that answers a batch before a quorum has it: cut off from the others, it
/// goes on granting and acknowledging writes that the new leader's log never holds.
/// Once the partition heals its entries are truncated: the tokens it handed out are
/// handed out again (duplicates, regressions) and its acknowledged increments are lost.
#[cfg(feature = "fault-injection")]
#[test]
fn a_leader_that_answers_before_commit_is_caught() {
    let r = partitioned_control("16s", "answer-before-commit");
    let found = num(&r, "duplicate_tokens") + num(&r, "token_regressions") + num(&r, "lost_updates");
    assert!(found >= 1, "no duplicate token, regression or lost update: {r}");
}

/// A member that does not lead and grants from its own table: a leader cut off and
/// deposed, or a follower the workers moved to, answers them from its table while the
/// leader hands out the same tokens again and never sees their writes.
#[cfg(feature = "fault-injection")]
#[test]
fn a_member_granting_without_leading_is_caught() {
    let r = partitioned_control("14s", "grant-deposed");
    let found = num(&r, "duplicate_tokens") + num(&r, "overlapping_holders") + num(&r, "lost_updates");
    assert!(found >= 1 || r["replicas_agree"] == false, "{r}");
}

/// Plain reads served from the local table on every member (no ReadIndex round): the
/// members' readers see a value older than a write acknowledged before they asked (a
/// follower that has not applied it yet, a member cut off by a partition), and the
/// counter's history is not linearizable. With ReadIndex, the followers say
/// `not_leader` and every answered read is linearizable.
#[cfg(feature = "fault-injection")]
#[test]
fn reads_served_without_a_quorum_round_are_caught() {
    // A stale read is seen only while a deposed leader is cut off longer than a failover
    // (about 1.2 to 1.5 s here) plus a write: seed 3 isolates the leader for 2.9 s and
    // 1.5 s (seed 1's isolations, 1.1 s and 2.0 s, were caught in only 1 of 3 runs).
    let r = partitioned_control_seeded("14s", "read-local", "3");
    assert_eq!(r["linearizable"], false, "{r}");
    assert!(r["proofs"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p.as_str().is_some_and(|p| p.starts_with("not linearizable")))));
    // The locks themselves were not touched by the switch.
    assert_eq!((num(&r, "duplicate_tokens"), num(&r, "lost_updates")), (0, 0), "{r}");
}

/// The same broken leader on three members: the leader killed just after a worker's
/// read, with a lease (8 s) long against the failover and the work (up to 6 s) and one
/// waiter (two workers), so that the waiter reaches the new leader while the holder is
/// still inside its promised lease. Seed 6 kills the leader in each of its first two
/// faults (one kill was caught in about three runs of four; two, in every run tried).
#[cfg(feature = "fault-injection")]
#[test]
fn a_new_leader_that_expires_inherited_leases_is_caught_on_three_members() {
    let args = "--target fenced-cluster --nodes 3 --nemesis kill --ttl 8s --work 6s --workers 2 \
        --duration 34s --recovery 6s --seed 6";
    let r = broken_caught_honest_safe(args, "jump-on-failover");
    assert!(r["schedule"]
        .as_array()
        .is_some_and(|s| s.iter().any(|f| f["what"].as_str().is_some_and(|w| w.starts_with("kill -9 the leader")))));
    assert!(num(&r, "overlapping_holders") >= 1, "the early expiry went unseen: {r}");
}

#[test]
fn cluster_arguments_are_checked_with_one_line() {
    for args in [
        &["torture", "--target", "fenced-cluster", "--nodes", "4"][..],
        &["torture", "--target", "fenced-cluster", "--nodes", "1"],
        &["torture", "--target", "fenced", "--nodes", "3"],
        &["torture", "--target", "fenced", "--nemesis", "kill"],
        &["torture", "--target", "fenced-cluster", "--faults", "crash"],
        &["torture", "--target", "fenced-cluster", "--nemesis", "clock", "--nodes", "5", "--ttl", "50ms"],
        &["torture", "--target", "fenced-cluster", "--nemesis", "kill,fire"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_fenced")).args(args).output().expect("run fenced");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
