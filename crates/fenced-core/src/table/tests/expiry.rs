//! Lease expiry and lock-delay: expiry hands off, is seen without a timer call, and
//! starts a lock-delay a release does not; a grant lost in its own tick is not answered.

use super::*;

#[test]
fn expiry_releases_and_hands_off() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    t.acquire(acq("a", 2, 5_000), 0).unwrap();
    effects(&mut t);
    t.keepalive(LeaseId(1), 600).unwrap();
    assert_eq!(t.poll_timeout(), Some(1_000), "the timer re-arms lazily");
    t.handle_timeout(1_000);
    check(&mut t, &[]);
    t.handle_timeout(1_600);
    check(
        &mut t,
        &["1600 expired lease=1", "1600 released a token=1 Expired", "1600 granted a token=2 lease=2 waiter=4"],
    );
    assert_eq!(t.keepalive(LeaseId(1), 1_700), Err(Error::LeaseNotFound));
}

#[test]
fn expiry_is_seen_even_without_a_timer_call() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    // The driver woke late: the acquire at 5000 still sees the lease gone.
    assert_eq!(granted_token(t.acquire(acq("a", 2, 0), 5_000).unwrap()), 2);
    check(
        &mut t,
        &[
            "0 granted a token=1 lease=1 waiter=-",
            "1000 expired lease=1",
            "1000 released a token=1 Expired",
            "5000 granted a token=2 lease=2 waiter=-",
        ],
    );
}

#[test]
fn lock_delay_after_expiry_not_after_release() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    let mut req = acq("a", 1, 0);
    req.lock_delay_ms = 500;
    t.acquire(req.clone(), 0).unwrap();
    t.acquire(acq("a", 2, 5_000), 0).unwrap();
    effects(&mut t);
    t.handle_timeout(1_000);
    check(&mut t, &["1000 expired lease=1", "1000 released a token=1 Expired"]);
    assert_eq!(t.lock(&name("a"), 1_200).unwrap().blocked_until_ms, Some(1_500));
    assert_eq!(t.poll_timeout(), Some(1_500));
    t.handle_timeout(1_500);
    check(&mut t, &["1500 granted a token=2 lease=2 waiter=4"]);

    // An explicit release does not delay.
    t.grant_lease(LeaseId(3), TTL * 10, 1_500).unwrap();
    t.release(&name("a"), LeaseId(2), 1_600).unwrap();
    let mut req = acq("a", 3, 0);
    req.lock_delay_ms = 500;
    assert_eq!(granted_token(t.acquire(req, 1_600).unwrap()), 3);
}

#[test]
fn try_lock_during_lock_delay_is_refused() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    t.acquire(Acquire { lock_delay_ms: 500, ..acq("a", 1, 0) }, 0).unwrap();
    assert_eq!(t.acquire(acq("a", 2, 0), 1_100).unwrap(), AcquireOutcome::NotGranted { holder: None });
    assert_eq!(granted_token(t.acquire(acq("a", 2, 0), 1_500).unwrap()), 2);
}

#[test]
fn a_grant_lost_in_the_same_tick_is_not_answered_as_a_grant() {
    // Review defect 4: a late tick runs the hand-off to a waiter and that waiter's own
    // expiry; the waiter must not hear "granted" for a lock that is free again.
    let mut t = table();
    t.grant_lease(LeaseId(1), 500, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    t.acquire(acq("x", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(w) = t.acquire(acq("x", 2, 100_000), 0).unwrap() else { panic!() };
    t.handle_timeout(5_000);
    assert_eq!(answers(&mut t), [format!("{} lease_not_found", w.0)]);
    assert!(effects(&mut t).contains(&format!("500 granted x token=2 lease=2 waiter={}", w.0)), "the history keeps it");
}
