//! A snapshot transfer broken midway (the link cut, the follower killed, the follower
//! frozen) resumes where it stopped, taking no byte twice.

use super::snapshots::behind_a_snapshot;
use super::*;

/// A snapshot transfer cut midway (`FENCED_FAULT_SNAPSHOT_CUT_AT`: the leader's first
/// transfer fails after 1 MiB, as a link cut would) resumes where it stopped: the
/// follower keeps what arrived, says how much when the leader asks, and takes the rest.
/// It catches up with every value, and its counters show one resumed transfer.
#[test]
fn a_snapshot_transfer_cut_midway_resumes_where_it_stopped() {
    let (mut c, l, f, value) = behind_a_snapshot("resume", ("FENCED_FAULT_SNAPSHOT_CUT_AT", (1u64 << 20).to_string()));
    c.spawn(f);
    c.caught_up(l, f, &value);
    let (resumed, received, kept) = c.transfers(f);
    assert!(resumed >= 1, "no transfer was resumed ({received} bytes received)");
    // The kept file is the snapshot's bytes and a small head: a transfer begun again
    // from its start would have received 1 MiB more than the bytes.
    assert!(received <= kept, "bytes crossed twice: {received} received for a snapshot file of {kept}");
}

/// A follower killed while it receives a snapshot (`FENCED_FAULT_SNAPSHOT_DIE_AT`: it
/// aborts, as kill -9 would, once 2 MiB arrived) keeps what arrived across its restart:
/// started again, it tells the leader how much it holds and takes only the rest.
#[test]
fn a_follower_killed_mid_transfer_resumes_it_after_its_restart() {
    let (mut c, l, f, value) = behind_a_snapshot("die-mid", ("FENCED_FAULT_SNAPSHOT_DIE_AT", (2u64 << 20).to_string()));
    c.spawn(f);
    let died = c.members[f].child.as_mut().map(|child| crate::support::wait_exit(child, Duration::from_secs(60)));
    assert!(died.is_some_and(|s| !s.success()), "the follower did not die mid-transfer: {died:?}");
    c.members[f].child = None;
    let incoming = c.members[f].dir.join("snapshot.incoming");
    let held = std::fs::metadata(&incoming).map(|m| m.len()).unwrap_or(0);
    assert!(held >= 2 << 20, "the follower kept {held} bytes of the transfer it died in");
    c.env.clear();
    c.spawn(f);
    c.caught_up(l, f, &value);
    let (resumed, received, kept) = c.transfers(f);
    assert!(resumed >= 1, "no transfer was resumed ({received} bytes received after the restart)");
    // Begun again from its start, the transfer would have brought the whole file again.
    assert!(received + (2 << 20) <= kept, "bytes crossed twice: {received} received after the restart, of {kept}");
    assert!(!incoming.exists(), "the received file stayed behind after its install");
}

/// A follower frozen while it receives a snapshot (`FENCED_FAULT_SNAPSHOT_STOP_AT`: it
/// stops itself, as SIGSTOP would, once 1 MiB arrived) for longer than an election
/// timeout: the leader keeps its term throughout (the frozen member, woken, asks a
/// pre-vote, not a vote), and the follower finishes the transfer without taking any
/// byte twice and catches up. (The rest of this small snapshot waits in the frozen
/// member's socket: woken, it takes the message whole after the leader gave up on it,
/// and the leader's next message, resuming at the end, brings no byte.)
#[test]
fn a_follower_frozen_mid_transfer_finishes_it_and_deposes_nobody() {
    let (mut c, l, f, value) =
        behind_a_snapshot("freeze-mid", ("FENCED_FAULT_SNAPSHOT_STOP_AT", (1u64 << 20).to_string()));
    let term = c.status(l).unwrap()["term"].as_u64().unwrap();
    c.spawn(f);
    let pid = c.members[f].child.as_ref().unwrap().id();
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
    };
    until(60, || state() == Some('T'));
    // Several election timeouts, and the leader's snapshot send times out.
    std::thread::sleep(Duration::from_secs(6));
    c.signal(f, "-CONT");
    c.caught_up(l, f, &value);
    let s = c.status(l).unwrap();
    assert_eq!((s["leader_id"].as_u64(), s["term"].as_u64()), (Some(c.members[l].id), Some(term)), "{s}");
    let (_, received, kept) = c.transfers(f);
    assert!(received <= kept, "bytes crossed twice: {received} received for a snapshot file of {kept}");
}
