//! Withdrawn requests and implicit leases: a withdrawn twin, a withdrawn grant given
//! back, an implicit lease that exists only for its grant.

use super::*;

#[test]
fn a_withdrawn_twin_does_not_release_the_grant_its_original_was_told() {
    // Review defect 1: H holds X; lease L queues A and B (a retried request); H
    // releases; B's caller goes away. A was told "granted": the lock stays L's.
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL * 10, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    t.acquire(acq("x", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(a) = t.acquire(acq("x", 2, 5_000), 0).unwrap() else { panic!() };
    let AcquireOutcome::Queued(b) = t.acquire(acq("x", 2, 5_000), 0).unwrap() else { panic!() };
    t.release(&name("x"), LeaseId(1), 1).unwrap();
    assert_eq!(answers(&mut t), [format!("{} granted token=2", a.0), format!("{} granted token=2", b.0)]);
    assert!(!t.cancel_wait(b, 2), "B was no longer queued");
    assert_eq!(t.check(&name("x"), Token::new(2).unwrap(), 2), (true, Token::new(2)), "A still holds");
    // Once the last request told of the grant is withdrawn too, nobody knows of it.
    t.cancel_wait(a, 3);
    assert_eq!(t.check(&name("x"), Token::new(2).unwrap(), 3), (false, None));
}

#[test]
fn a_withdrawn_grant_nobody_else_was_told_is_given_back() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL * 10, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL * 10, 0).unwrap();
    t.acquire(acq("x", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(a) = t.acquire(acq("x", 2, 5_000), 0).unwrap() else { panic!() };
    t.release(&name("x"), LeaseId(1), 1).unwrap();
    // The grant raced the caller's departure: given back, and the next one may take it.
    t.cancel_wait(a, 2);
    assert_eq!(t.lock(&name("x"), 2), None);
    // An idempotent re-acquire by the holder counts as told: withdrawing the queued
    // original then keeps the lock.
    assert_eq!(granted_token(t.acquire(acq("x", 1, 0), 3).unwrap()), 3);
    let AcquireOutcome::Queued(d) = t.acquire(acq("x", 2, 5_000), 3).unwrap() else { panic!() };
    t.release(&name("x"), LeaseId(1), 4).unwrap();
    assert_eq!(granted_token(t.acquire(acq("x", 2, 0), 4).unwrap()), 4);
    t.cancel_wait(d, 5);
    assert_eq!(t.check(&name("x"), Token::new(4).unwrap(), 5), (true, Token::new(4)));
}

#[test]
fn an_implicit_lease_exists_only_for_a_grant() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.acquire(acq("x", 1, 0), 0).unwrap();
    // Review defect 3: a refused try-lock creates nothing.
    assert_eq!(
        t.acquire(implicit("x", 9, 300_000, 0), 1).unwrap(),
        AcquireOutcome::NotGranted { holder: Token::new(1) }
    );
    assert_eq!(t.lease_count(), 1);
    // Queued, it cannot expire while it waits, however long past its TTL.
    let AcquireOutcome::Queued(w) = t.acquire(implicit("x", 9, 200, 100_000), 1).unwrap() else { panic!() };
    t.keepalive(LeaseId(1), 900).unwrap();
    t.keepalive(LeaseId(1), 1_800).unwrap();
    t.release(&name("x"), LeaseId(1), 2_000).unwrap();
    assert_eq!(answers(&mut t), [format!("{} granted token=2", w.0)]);
    // Its TTL starts at the grant.
    assert_eq!(t.lease(LeaseId(9), 2_000).unwrap().expires_at_ms, 2_200);
    assert_eq!(t.lease(LeaseId(9), 2_200), None);
    assert_eq!(t.lock_count(), 0);
    // A wait that ends without a grant, or a caller that leaves, leaves no lease.
    t.grant_lease(LeaseId(1), TTL, 3_000).unwrap();
    t.acquire(acq("x", 1, 0), 3_000).unwrap();
    t.acquire(implicit("x", 10, 500, 100), 3_000).unwrap();
    let AcquireOutcome::Queued(gone) = t.acquire(implicit("x", 11, 500, 1_000), 3_000).unwrap() else { panic!() };
    t.cancel_wait(gone, 3_050);
    t.handle_timeout(3_100);
    assert_eq!(t.lease_count(), 1);
    assert!(answers(&mut t).iter().any(|a| a.ends_with("lock_held")), "the timed-out wait is answered");
}

#[test]
fn an_implicit_grant_withdrawn_ends_its_lease() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.acquire(acq("x", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(w) = t.acquire(implicit("x", 9, 500, 5_000), 0).unwrap() else { panic!() };
    t.release(&name("x"), LeaseId(1), 1).unwrap();
    t.cancel_wait(w, 2);
    assert_eq!((t.lease_count(), t.lock_count()), (1, 0));
}
