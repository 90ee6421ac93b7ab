//! Grants, try-locks and the FIFO queue of waiters: hand-off, time-outs, cancelled waiters.

use super::*;

#[test]
fn grant_and_try_lock() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    assert_eq!(granted_token(t.acquire(acq("a", 1, 0), 0).unwrap()), 1);
    assert_eq!(t.acquire(acq("a", 2, 0), 1).unwrap(), AcquireOutcome::NotGranted { holder: Token::new(1) });
    check(&mut t, &["0 granted a token=1 lease=1 waiter=-"]);
}

#[test]
fn reacquire_by_holder_is_idempotent() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    assert_eq!(granted_token(t.acquire(acq("a", 1, 0), 0).unwrap()), 1);
    match t.acquire(acq("a", 1, 500), 5).unwrap() {
        AcquireOutcome::Granted { grant } => {
            assert_eq!(grant.token.get(), 1);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.last_token(), Token::new(1));
}

#[test]
fn fifo_hand_off() {
    let mut t = table();
    for id in 1..=4 {
        t.grant_lease(LeaseId(id), TTL * 10, 0).unwrap();
    }
    t.acquire(acq("a", 1, 0), 0).unwrap();
    assert_eq!(t.acquire(acq("a", 3, 5_000), 1).unwrap(), AcquireOutcome::Queued(RequestId(6)));
    assert_eq!(t.acquire(acq("a", 2, 5_000), 2).unwrap(), AcquireOutcome::Queued(RequestId(7)));
    assert_eq!(t.acquire(acq("a", 4, 5_000), 3).unwrap(), AcquireOutcome::Queued(RequestId(8)));
    effects(&mut t);
    t.release(&name("a"), LeaseId(1), 10).unwrap();
    t.release(&name("a"), LeaseId(3), 11).unwrap();
    t.release(&name("a"), LeaseId(2), 12).unwrap();
    check(
        &mut t,
        &[
            "10 released a token=1 Released",
            "10 granted a token=2 lease=3 waiter=6",
            "11 released a token=2 Released",
            "11 granted a token=3 lease=2 waiter=7",
            "12 released a token=3 Released",
            "12 granted a token=4 lease=4 waiter=8",
        ],
    );
}

#[test]
fn wait_times_out_and_leaves_queue() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL * 10, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    t.acquire(acq("a", 2, 300), 0).unwrap();
    effects(&mut t);
    assert_eq!(t.poll_timeout(), Some(300));
    t.handle_timeout(300);
    check(&mut t, &["300 wait-ended a waiter=4 TimedOut"]);
    assert_eq!(t.lock(&name("a"), 300).unwrap().waiters, 0);
    t.release(&name("a"), LeaseId(1), 400).unwrap();
    check(&mut t, &["400 released a token=1 Released"]);
    assert_eq!(t.lock_count(), 0, "a free lock with no waiters is forgotten");
}

#[test]
fn cancelled_waiter_is_skipped() {
    let mut t = table();
    for id in 1..=3 {
        t.grant_lease(LeaseId(id), TTL * 10, 0).unwrap();
    }
    t.acquire(acq("a", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(w) = t.acquire(acq("a", 2, 5_000), 0).unwrap() else { panic!() };
    t.acquire(acq("a", 3, 5_000), 0).unwrap();
    effects(&mut t);
    assert!(t.cancel_wait(w, 1));
    assert!(!t.cancel_wait(w, 1), "a second cancel finds nothing");
    t.release(&name("a"), LeaseId(1), 2).unwrap();
    check(
        &mut t,
        &["1 wait-ended a waiter=5 Cancelled", "2 released a token=1 Released", "2 granted a token=2 lease=3 waiter=6"],
    );
}
