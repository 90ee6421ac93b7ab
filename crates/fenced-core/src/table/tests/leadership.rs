//! A table resumed by a new leader, and its `Promote`: lock-delays and issued tokens
//! carried over, waiters withdrawn, leases given a full TTL again.

use super::*;

#[test]
fn a_resumed_table_serves_the_lock_delays_it_was_given() {
    // Review defect 2: TTL 1 s, lock-delay 30 s, the lease left to expire, a restart of
    // the single-node format, which the migration resumes: one maximal TTL of grace,
    // then the delay.
    let blocked_until = vec![(name("x"), TTL + 30_000)];
    let from = Resume { next_token: Token::new(50).unwrap(), grants_resume_at_ms: TTL, blocked_until };
    let mut r = T::on(LockTable::resume(Limits::default(), from));
    r.grant_lease(LeaseId(2), 60_000, 0).unwrap();
    assert_eq!(r.acquire(acq("x", 2, 0), 1_500).unwrap(), AcquireOutcome::NotGranted { holder: None });
    assert_eq!(r.lock(&name("x"), 1_500).unwrap().blocked_until_ms, Some(31_000));
    assert_eq!(granted_token(r.acquire(acq("y", 2, 0), 1_500).unwrap()), 50, "other locks are free");
    assert_eq!(granted_token(r.acquire(acq("x", 2, 0), 31_000).unwrap()), 51);
}

#[test]
fn a_resumed_table_counts_every_token_below_its_first_as_issued() {
    let from = Resume { next_token: Token::new(10).unwrap(), grants_resume_at_ms: 0, blocked_until: vec![] };
    let mut t = T::on(LockTable::resume(Limits::default(), from));
    assert_eq!(t.highest_issued(), Token::new(9), "everything below the old ceiling");
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    for (n, want) in [("a", 10), ("b", 11), ("c", 12), ("d", 13)] {
        assert_eq!(granted_token(t.acquire(acq(n, 1, 0), 0).unwrap()), want);
    }
    assert_eq!(t.highest_issued(), Token::new(13));
}

#[test]
fn promote_withdraws_every_waiter_and_gives_every_lease_its_full_ttl_again() {
    let mut t = T::on(LockTable::new(Limits::default()));
    let (a, b) = (LeaseId(1), LeaseId(2));
    t.grant_lease(a, TTL, 0).unwrap();
    t.grant_lease(b, 5 * TTL, 0).unwrap();
    let x = name("x");
    let req = |lease, wait_ms| Acquire { name: x.clone(), lease, wait_ms, lock_delay_ms: 0, holder: None };
    let AcquireOutcome::Granted { grant } = t.acquire(req(LeaseRef::Existing(a), 0), 0).unwrap() else { panic!() };
    let queued = [
        t.acquire(req(LeaseRef::Existing(b), 10 * TTL), 0).unwrap(),
        t.acquire(req(LeaseRef::Implicit { id: LeaseId(3), ttl_ms: TTL }, 10 * TTL), 0).unwrap(),
    ];
    assert!(queued.iter().all(|q| matches!(q, AcquireOutcome::Queued(_))));
    assert_eq!((t.waiter_count(), t.lease_count()), (2, 3));
    // 900 ms into a's 1,000 ms lease, a new leader takes over.
    t.run(Command::Promote, 900);
    assert_eq!(t.waiter_count(), 0, "the callers of the queued acquires are gone");
    assert_eq!(t.lease_count(), 2, "the implicit lease of a waiter ends with its request");
    assert_eq!(t.t.lease(a).unwrap().expires_at_ms, 900 + TTL, "a full TTL again from the promotion");
    assert_eq!(t.t.lease(b).unwrap().expires_at_ms, 900 + 5 * TTL, "every lease, whatever it had left");
    assert!(t.answers.iter().all(|(r, _)| !matches!(queued[0], AcquireOutcome::Queued(q) if q == *r)));
    // The holder keeps its grant and token; a's lease now lives to 1,900 ms, not 1,000.
    assert_eq!(t.check(&x, grant.token, 1_500), (true, Some(grant.token)));
    assert_eq!(t.check(&x, grant.token, 1_901), (false, None));
    // And the lock is free for b once a's lease ended: nobody stayed queued.
    let AcquireOutcome::Granted { grant: next } = t.acquire(req(LeaseRef::Existing(b), 0), 1_901).unwrap() else {
        panic!()
    };
    assert_eq!(next.token, grant.token.next());
}
