//! Tests of `history`.

use super::*;

fn op(worker: u32, cycle: u64, kind: OpKind, start_us: u64, end_us: u64, token: u64, value: Option<u64>) -> Op {
    Op {
        worker,
        cycle,
        kind,
        start_us,
        end_us,
        result: OpResult::Ok,
        token: Some(token),
        value,
        error: None,
        promised_until_us: None,
        lost_signalled: None,
    }
}

/// Worker 0 reads 0 under token 1, pauses; worker 1 takes token 2, reads 0, writes 1;
/// worker 0 wakes and writes 1 with its stale token: accepted without fencing.
fn zombie_history(result: OpResult) -> Vec<Op> {
    let mut late = op(0, 0, OpKind::Write, 900, 910, 1, Some(1));
    late.result = result;
    vec![
        op(0, 0, OpKind::Acquire, 0, 10, 1, None),
        op(0, 0, OpKind::Read, 20, 30, 1, Some(0)),
        op(1, 0, OpKind::Acquire, 15, 500, 2, None),
        op(1, 0, OpKind::Read, 510, 520, 2, Some(0)),
        op(1, 0, OpKind::Write, 530, 540, 2, Some(1)),
        op(1, 0, OpKind::Release, 550, 560, 2, None),
        late,
    ]
}

#[test]
fn an_unfenced_stale_write_is_a_zombie_and_loses_an_update() {
    let a = analyse(&zombie_history(OpResult::Ok), &[], 1, true, false);
    assert_eq!((a.acknowledged, a.zombie_writes, a.lost_updates), (2, 1, 1));
    assert_eq!(a.token_regressions, Some(0));
    assert!(a.proofs.iter().any(|p| p.contains("zombie write: worker 0")), "{:?}", a.proofs);
}

#[test]
fn a_refused_stale_write_loses_nothing() {
    let a = analyse(&zombie_history(OpResult::Rejected), &[], 1, true, true);
    assert_eq!((a.acknowledged, a.zombie_writes, a.lost_updates, a.stale_writes_rejected), (1, 0, 0, 1));
}

#[test]
fn a_write_concurrent_with_the_newer_read_is_not_called_a_zombie() {
    // The newer read completes after the old write was sent: no certainty, no finding.
    let mut h = zombie_history(OpResult::Ok);
    h[6].start_us = 515;
    h[6].end_us = 600;
    let a = analyse(&h, &[], 2, true, false);
    assert_eq!(a.zombie_writes, 0);
}

#[test]
fn tokens_must_follow_real_time() {
    let grants = vec![op(0, 0, OpKind::Acquire, 0, 10, 5, None), op(1, 0, OpKind::Acquire, 20, 30, 4, None)];
    let a = analyse(&grants, &[], 0, true, true);
    assert_eq!(a.token_regressions, Some(1));
    // Overlapping requests may complete in either order.
    let grants = vec![op(0, 0, OpKind::Acquire, 0, 40, 5, None), op(1, 0, OpKind::Acquire, 20, 30, 4, None)];
    assert_eq!(analyse(&grants, &[], 0, true, true).token_regressions, Some(0));
    // One token for two grants is never right, even for overlapping requests.
    let grants = vec![op(0, 0, OpKind::Acquire, 0, 40, 5, None), op(1, 0, OpKind::Acquire, 20, 30, 5, None)];
    assert_eq!(analyse(&grants, &[], 0, true, true).token_regressions, Some(1));
}

#[test]
fn the_counters_store_history_is_checked_for_linearizability() {
    // Worker 0 writes 1 under token 1; worker 1, granted token 2 after that write was
    // answered, reads: 1 is linearizable, the absent value (0) is not.
    let good = vec![
        op(0, 1, OpKind::Read, 0, 10, 1, Some(0)),
        op(0, 1, OpKind::Write, 20, 30, 1, Some(1)),
        op(1, 1, OpKind::Read, 40, 50, 2, Some(1)),
        op(1, 1, OpKind::Write, 60, 70, 2, Some(2)),
    ];
    assert_eq!(store_linearizable(&good), (Some(true), None));
    let mut stale = good.clone();
    stale[2].value = Some(0);
    let (verdict, proof) = store_linearizable(&stale);
    assert_eq!(verdict, Some(false));
    assert!(proof.is_some_and(|p| p.contains("not linearizable: worker 1")));
    // Worker 0's late write under token 1, after token 2 was seen: refused, nothing
    // changed; accepted, no order of the gate explains it.
    let mut late = good.clone();
    let mut zombie = op(0, 1, OpKind::Write, 80, 90, 1, Some(5));
    zombie.result = OpResult::Rejected;
    late.push(zombie);
    assert_eq!(store_linearizable(&late).0, Some(true));
    late[4].result = OpResult::Ok;
    assert_eq!(store_linearizable(&late).0, Some(false));
}

#[test]
fn a_plain_read_that_misses_an_acknowledged_write_is_not_linearizable() {
    // Worker 0 writes 1, acknowledged at 30; a reader (worker 9, no token) asks at 40.
    let mut h = vec![
        op(0, 1, OpKind::Read, 0, 10, 1, Some(0)),
        op(0, 1, OpKind::Write, 20, 30, 1, Some(1)),
        op(9, 1, OpKind::Get, 40, 50, 0, Some(1)),
    ];
    h[2].token = None;
    assert_eq!(store_linearizable(&h).0, Some(true));
    // The same read answered from a replica that had not applied the write: stale.
    h[2].value = None;
    let (verdict, proof) = store_linearizable(&h);
    assert_eq!(verdict, Some(false));
    assert!(proof.is_some_and(|p| p.contains("worker 9")));
    // Sent before the write was acknowledged, the old value is fine.
    h[2].start_us = 25;
    assert_eq!(store_linearizable(&h).0, Some(true));
    // A read that got no answer (not_leader) is left out, whatever it carries.
    h[2].start_us = 40;
    h[2].result = OpResult::Failed;
    assert_eq!(store_linearizable(&h).0, Some(true));
    // Plain reads touch nothing else: no grant, no write, no zombie.
    let a = analyse(&h, &[], 1, true, true);
    assert_eq!((a.grants, a.acknowledged, a.zombie_writes), (0, 1, 0));
}

#[test]
fn duplicates_are_counted_apart() {
    let grants = vec![op(0, 0, OpKind::Acquire, 0, 40, 5, None), op(1, 0, OpKind::Acquire, 20, 30, 5, None)];
    let a = analyse(&grants, &[], 0, true, true);
    assert_eq!((a.token_regressions, a.duplicate_tokens), (Some(1), Some(1)));
    let grants = vec![op(0, 0, OpKind::Acquire, 0, 10, 5, None), op(1, 0, OpKind::Acquire, 20, 30, 4, None)];
    assert_eq!(analyse(&grants, &[], 0, true, true).duplicate_tokens, Some(0));
}

/// Worker 0 granted at 10 ms (asked at 0), TTL 1 s: promised until 900 ms unless it
/// releases earlier.
fn two_holders(second_granted_us: u64, first_release_us: Option<u64>) -> Vec<Op> {
    let mut h = vec![
        op(0, 1, OpKind::Acquire, 0, 10_000, 1, None),
        op(1, 1, OpKind::Acquire, 5_000, second_granted_us, 2, None),
        op(1, 1, OpKind::Release, second_granted_us + 1_000, second_granted_us + 2_000, 2, None),
    ];
    if let Some(r) = first_release_us {
        h.push(op(0, 1, OpKind::Release, r, r + 1_000, 1, None));
    }
    h
}

/// Worker 0 granted at 10 ms, frozen; worker 1 granted at 500 ms; worker 0 writes
/// at 700 ms with its library's signal `lost` as recorded.
fn zombie_write(lost: Option<bool>) -> Vec<Op> {
    let mut w = op(0, 1, OpKind::Write, 700_000, 710_000, 1, Some(1));
    w.lost_signalled = lost;
    vec![op(0, 1, OpKind::Acquire, 0, 10_000, 1, None), op(1, 1, OpKind::Acquire, 5_000, 500_000, 2, None), w]
}

#[test]
fn a_write_after_the_next_grant_without_the_lost_signal_is_caught() {
    let (n, proofs) = late_lost_signals(&zombie_write(Some(false)));
    assert_eq!(n, Some(1));
    assert!(proofs[0].contains("worker 0 (token 1) began a write"), "{proofs:?}");
    // Signalled before the write: what an honest library does.
    assert_eq!(late_lost_signals(&zombie_write(Some(true))).0, Some(0));
    // Not recorded (a client without the signal): no verdict at all.
    assert_eq!(late_lost_signals(&zombie_write(None)).0, None);
    // The write before the next grant: the lock may well have been held.
    let mut h = zombie_write(Some(false));
    h[2].start_us = 400_000;
    assert_eq!(late_lost_signals(&h).0, Some(0));
    // Its own later grant (a retried acquire) is not another holder's.
    h[1].worker = 0;
    h[1].cycle = 2;
    h[2].start_us = 700_000;
    assert_eq!(late_lost_signals(&h).0, Some(0));
    // A lower token whose answer reached its (slow) worker after the writer's grant
    // was issued before it: the writer's lock was not taken by it (seen in CI: token
    // 218's answer arrived after token 234's).
    let mut h = zombie_write(Some(false));
    h[1].token = None;
    assert_eq!(late_lost_signals(&h).0, Some(1), "without tokens the answers' order decides");
    let mut stale = zombie_write(Some(false));
    for o in &mut stale {
        o.token = Some(if o.worker == 0 { 234 } else { 218 });
    }
    assert_eq!(late_lost_signals(&stale).0, Some(0));
}

#[test]
fn a_grant_inside_anothers_promised_lease_is_an_overlap() {
    // Granted at 500 ms while worker 0 holds (no release, no expiry before 900 ms).
    let (n, proofs) = overlapping_holders(&two_holders(500_000, None), 1_000);
    assert_eq!(n, 1);
    assert!(proofs[0].contains("worker 1 was granted token 2"), "{proofs:?}");
    // The same grant after worker 0 asked to release: no overlap.
    assert_eq!(overlapping_holders(&two_holders(500_000, Some(400_000)), 1_000).0, 0);
    // After the promised deadline (send + TTL - margin): the lease may have expired.
    assert_eq!(overlapping_holders(&two_holders(950_000, None), 1_000).0, 0);
    // A write that recorded the library's later promise (a keepalive acknowledged)
    // holds the lock until then: the same late grant is now an overlap, and one
    // after that promise is not.
    let mut h = two_holders(950_000, None);
    h[1].start_us = 900_000;
    assert_eq!(overlapping_holders(&h, 1_000).0, 0);
    let mut write = op(0, 1, OpKind::Write, 600_000, 610_000, 1, Some(1));
    write.promised_until_us = Some(1_400_000);
    h.push(write);
    assert_eq!(overlapping_holders(&h, 1_000).0, 1);
    h[1].end_us = 1_450_000;
    h[2].start_us = 1_460_000;
    assert_eq!(overlapping_holders(&h, 1_000).0, 0);
    // An acquire request that failed holds nothing.
    let mut h = two_holders(500_000, None);
    h[0].result = OpResult::Unknown;
    assert_eq!(overlapping_holders(&h, 1_000).0, 0);
}

#[test]
fn a_long_window_is_remembered_past_shorter_ones() {
    // Worker 0 holds 0..900 ms; worker 1 a short grant inside it (an overlap), and
    // worker 2 granted at 700 ms, after worker 1 released but inside worker 0's lease.
    let h = vec![
        op(0, 1, OpKind::Acquire, 0, 10_000, 1, None),
        op(1, 1, OpKind::Acquire, 5_000, 20_000, 2, None),
        op(1, 1, OpKind::Release, 30_000, 31_000, 2, None),
        op(2, 1, OpKind::Acquire, 6_000, 700_000, 3, None),
        op(2, 1, OpKind::Release, 710_000, 711_000, 3, None),
    ];
    assert_eq!(overlapping_holders(&h, 1_000).0, 2);
}

#[test]
fn without_tokens_grants_are_ranked_by_completion() {
    let mut h = zombie_history(OpResult::Ok);
    h.iter_mut().for_each(|o| o.token = None);
    let a = analyse(&h, &[], 1, false, false);
    assert_eq!((a.zombie_writes, a.lost_updates, a.token_regressions), (1, 1, None));
}
