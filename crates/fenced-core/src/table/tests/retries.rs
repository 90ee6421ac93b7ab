//! Retried acquires under the same lease or implicit lease id: the retry gets, or waits
//! beside, its first attempt's grant; after a promote it starts afresh.

use super::*;

#[test]
fn retried_waiter_of_the_same_lease_gets_the_same_grant() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    t.acquire(acq("a", 2, 500), 0).unwrap();
    t.acquire(acq("a", 2, 500), 0).unwrap();
    effects(&mut t);
    t.release(&name("a"), LeaseId(1), 1).unwrap();
    check(
        &mut t,
        &[
            "1 released a token=1 Released",
            "1 granted a token=2 lease=2 waiter=4",
            "1 granted a token=2 lease=2 waiter=5",
        ],
    );
}

/// A client that chose its implicit lease's id retries under it after its first
/// attempt's answer was lost: the retry gets the first attempt's grant, not an orphan
/// grant under a second lease.
#[test]
fn a_retried_implicit_acquire_gets_the_grant_its_first_attempt_got() {
    let mut t = table();
    let first = granted_token(t.acquire(implicit("a", 7, TTL, 0), 0).unwrap());
    // The retry (a try-lock now: the wait was spent) reaches the table after the grant.
    let retry = t.acquire(implicit("a", 7, TTL, 0), 300).unwrap();
    assert_eq!(granted_token(retry), first, "the same grant, the same token");
    assert_eq!(t.lease_count(), 1, "no second lease");
    // The answer's TTL holds from the retry: the retry renewed the lease, as a
    // keepalive would (an outside fuzzer found the lock expiring at the first
    // attempt's TTL while the retry's answer promised a full one).
    assert_eq!(t.t.lease(LeaseId(7)).unwrap().expires_at_ms, 300 + TTL);
    // The lease keeps the TTL of its grant, and the lock is released with it.
    assert_eq!(t.release(&name("a"), LeaseId(7), 400), Ok(Token::new(first).unwrap()));
    // An implicit id naming another lock's lease, or an explicit lease, is refused.
    t.grant_lease(LeaseId(8), TTL, 500).unwrap();
    assert_eq!(t.acquire(implicit("a", 8, TTL, 0), 500), Err(Error::LeaseExists));
    assert_eq!(t.lease_count(), 2, "7 (released, not revoked) and 8; no third");
    granted_token(t.acquire(implicit("b", 9, TTL, 0), 500).unwrap());
    assert_eq!(t.acquire(implicit("c", 9, TTL, 0), 500), Err(Error::LeaseExists));
}

/// Lock `a` held by lease 1, and an acquire under the implicit lease 7 queued behind
/// it (the first attempt of a call): the table and that request.
fn queued_behind_a_holder() -> (T, RequestId) {
    let mut t = table();
    t.grant_lease(LeaseId(1), 10 * TTL, 0).unwrap();
    granted_token(t.acquire(acq("a", 1, 0), 0).unwrap());
    let AcquireOutcome::Queued(original) = t.acquire(implicit("a", 7, TTL, 5_000), 10).unwrap() else { panic!() };
    (t, original)
}

/// The first attempt waits in the queue of a leader the client gave up on; the retry
/// under the same implicit id waits beside it. The first attempt's withdrawal (its
/// connection closed) does not end the lease the retry waits under, and the grant,
/// when it comes, answers both with one token.
#[test]
fn a_retried_implicit_acquire_waits_beside_its_first_attempt() {
    let (mut t, original) = queued_behind_a_holder();
    let AcquireOutcome::Queued(retry) = t.acquire(implicit("a", 7, TTL, 4_000), 800).unwrap() else { panic!() };
    // A try-lock retry while the original waits: refused, nothing changes.
    let held = t.acquire(implicit("a", 7, TTL, 0), 850).unwrap();
    assert_eq!(held, AcquireOutcome::NotGranted { holder: Token::new(1) });
    assert_eq!((t.waiter_count(), t.lease_count()), (2, 2));
    assert!(t.cancel_wait(original, 900), "the original was still queued");
    assert_eq!((t.waiter_count(), t.lease_count()), (1, 2), "the lease stays for the retry");
    effects(&mut t);
    t.release(&name("a"), LeaseId(1), 1_000).unwrap();
    check(&mut t, &["1000 released a token=1 Released", &format!("1000 granted a token=2 lease=7 waiter={}", retry.0)]);
    // Its TTL starts at the grant.
    assert_eq!(t.t.lease(LeaseId(7)).unwrap().expires_at_ms, 1_000 + TTL);
}

/// Both attempts queued, both granted together: withdrawing the first afterwards (its
/// caller gone) leaves the grant to the retry, which was told of it too.
#[test]
fn withdrawing_the_first_attempt_after_the_grant_leaves_it_to_the_retry() {
    let (mut t, original) = queued_behind_a_holder();
    let AcquireOutcome::Queued(retry) = t.acquire(implicit("a", 7, TTL, 5_000), 20).unwrap() else { panic!() };
    t.release(&name("a"), LeaseId(1), 100).unwrap();
    let told: Vec<RequestId> =
        t.answers.iter().filter(|(_, a)| matches!(a, Ok(Answer::Granted(_)))).map(|(r, _)| *r).collect();
    assert_eq!(told, vec![original, retry]);
    assert!(!t.cancel_wait(original, 150), "granted, no longer queued");
    let holder = t.lock(&name("a"), 150).unwrap().holder.map(|(token, lease)| (token, lease.id));
    assert_eq!(holder, Some((Token::new(2).unwrap(), LeaseId(7))), "the retry still holds it");
    // The last one told withdrawn: the grant and the lease are given back.
    t.cancel_wait(retry, 160);
    assert_eq!((t.lock_count(), t.lease_count()), (0, 1));
}

/// A new leader's `Promote` withdraws the first attempt (its caller was told to go
/// elsewhere) and ends its pending lease; the retry under the same id then starts
/// afresh.
#[test]
fn after_promote_a_retry_under_the_same_implicit_id_starts_afresh() {
    let (mut t, _) = queued_behind_a_holder();
    t.run(Command::Promote, 500);
    assert_eq!((t.waiter_count(), t.lease_count()), (0, 1));
    let AcquireOutcome::Queued(_) = t.acquire(implicit("a", 7, TTL, 4_000), 600).unwrap() else { panic!() };
    t.release(&name("a"), LeaseId(1), 700).unwrap();
    let holder = t.lock(&name("a"), 700).unwrap().holder.map(|(token, lease)| (token, lease.id));
    assert_eq!(holder, Some((Token::new(2).unwrap(), LeaseId(7))));
}
