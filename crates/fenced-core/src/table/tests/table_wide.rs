//! What holds across the table: the start-up grace, limits, prefix listing, timers.

use super::*;

#[test]
fn start_up_grace_grants_nothing_until_it_ends() {
    let from = Resume { next_token: Token::new(1_000).unwrap(), grants_resume_at_ms: 5_000, blocked_until: vec![] };
    let mut t = T::on(LockTable::resume(Limits::default(), from));
    t.grant_lease(LeaseId(1), TTL * 10, 0).unwrap();
    assert_eq!(t.grace_left_ms(10), 4_990);
    assert_eq!(t.acquire(acq("a", 1, 0), 10), Err(Error::Recovering { retry_after_ms: 4_990 }));
    assert!(matches!(t.acquire(acq("a", 1, 9_000), 10).unwrap(), AcquireOutcome::Queued(_)));
    t.handle_timeout(5_000);
    check(&mut t, &["5000 granted a token=1000 lease=1 waiter=3"]);
}

#[test]
fn limits_are_enforced_and_change_nothing() {
    let limits = Limits { leases_max: 2, locks_max: 1, waiters_max: 1, waiters_per_lock_max: 1, ..Limits::default() };
    let mut t = T::on(LockTable::new(limits));
    assert_eq!(t.grant_lease(LeaseId(1), 10, 0), Err(Error::TtlOutOfRange { ttl_ms_min: 100, ttl_ms_max: 300_000 }));
    assert_eq!(
        t.grant_lease(LeaseId(1), 300_001, 0).unwrap_err(),
        Error::TtlOutOfRange { ttl_ms_min: 100, ttl_ms_max: 300_000 }
    );
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    assert_eq!(t.grant_lease(LeaseId(1), TTL, 0), Err(Error::LeaseExists));
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    assert_eq!(t.grant_lease(LeaseId(3), TTL, 0), Err(Error::TooManyLeases { leases_max: 2 }));
    t.acquire(acq("a", 1, 0), 0).unwrap();
    assert_eq!(t.acquire(acq("b", 1, 0), 0), Err(Error::TooManyLocks { locks_max: 1 }));
    assert_eq!(t.acquire(acq("a", 2, 400_000), 0), Err(Error::WaitOutOfRange { wait_ms_max: 300_000 }));
    assert!(matches!(t.acquire(acq("a", 2, 100), 0), Ok(AcquireOutcome::Queued(_))));
    assert_eq!(t.acquire(acq("a", 2, 100), 0), Err(Error::TooManyWaiters { waiters_max: 1 }));
    assert_eq!(t.acquire(acq("a", 7, 100), 0), Err(Error::LeaseNotFound));
    assert_eq!((t.lease_count(), t.lock_count(), t.waiter_count()), (2, 1, 1));
}

#[test]
fn prefix_listing() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    for n in ["orders/1", "orders/2", "ordersx", "jobs/1"] {
        t.acquire(acq(n, 1, 0), 0).unwrap();
    }
    let names: Vec<String> = t.locks_with_prefix("orders/", 10, 0).into_iter().map(|l| l.name.to_string()).collect();
    assert_eq!(names, ["orders/1", "orders/2"]);
    assert_eq!(t.locks_with_prefix("", 10, 0).len(), 4);
    assert_eq!(t.locks_with_prefix("", 3, 0).len(), 3);
}

#[test]
fn dead_timers_do_not_pile_up() {
    // Leases that come and go, and waits that end in a grant long before their
    // deadline: without the sweep every one would leave an entry for its whole TTL or
    // wait.
    let mut t = table();
    t.grant_lease(LeaseId(0), TTL * 100, 0).unwrap();
    t.acquire(acq("a", 0, 0), 0).unwrap();
    for i in 1..=50_000u128 {
        t.grant_lease(LeaseId(i), 300_000, 1).unwrap();
        t.acquire(acq("b", i, 300_000), 1).unwrap();
        t.release(&name("b"), LeaseId(i), 1).unwrap();
        t.revoke(LeaseId(i), 1).unwrap();
    }
    assert!(t.timer_entries() < 5_000, "{} timer entries for {} live leases", t.timer_entries(), t.lease_count());
    // The live ones survived the sweeps: lease 0 still expires on time.
    t.handle_timeout(TTL * 100);
    assert_eq!(t.lease_count(), 0);
}
