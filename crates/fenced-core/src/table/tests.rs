//! Tests of the lock table through its one input, `apply`, and its views.

use super::*;

const TTL: u64 = 1_000;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

/// The table behind a call-per-command shim: each call is one `apply` with a fresh
/// request id (1, 2, ...), its answer returned, the rest of the output kept.
struct T {
    t: LockTable,
    next: u64,
    effects: Vec<Effect>,
    answers: Vec<(RequestId, Result<Answer, Error>)>,
}

#[derive(Debug, PartialEq, Eq)]
enum AcquireOutcome {
    Granted { grant: Grant },
    Queued(RequestId),
    NotGranted { holder: Option<Token> },
}

impl T {
    fn on(t: LockTable) -> T {
        T { t, next: 0, effects: vec![], answers: vec![] }
    }
    fn run(&mut self, cmd: Command, now: u64) -> (RequestId, Option<Result<Answer, Error>>) {
        self.next += 1;
        let r = RequestId(self.next);
        let mut out = self.t.apply(r, cmd, now);
        let own = out.take_answer(r);
        self.effects.extend(out.effects);
        self.answers.extend(out.answers);
        (r, own)
    }
    fn grant_lease(&mut self, id: LeaseId, ttl_ms: u64, now: u64) -> Result<LeaseInfo, Error> {
        match self.run(Command::GrantLease { lease: id, ttl_ms }, now).1.unwrap() {
            Ok(Answer::Lease(l)) => Ok(l),
            Ok(a) => panic!("{a:?}"),
            Err(e) => Err(e),
        }
    }
    fn keepalive(&mut self, id: LeaseId, now: u64) -> Result<LeaseInfo, Error> {
        match self.run(Command::Keepalive { lease: id }, now).1.unwrap() {
            Ok(Answer::Lease(l)) => Ok(l),
            Ok(a) => panic!("{a:?}"),
            Err(e) => Err(e),
        }
    }
    fn acquire(&mut self, req: Acquire, now: u64) -> Result<AcquireOutcome, Error> {
        match self.run(Command::Acquire(req), now) {
            (r, None) => Ok(AcquireOutcome::Queued(r)),
            (_, Some(Ok(Answer::Granted(grant)))) => Ok(AcquireOutcome::Granted { grant }),
            (_, Some(Err(Error::LockHeld { holder }))) => Ok(AcquireOutcome::NotGranted { holder }),
            (_, Some(Ok(a))) => panic!("{a:?}"),
            (_, Some(Err(e))) => Err(e),
        }
    }
    fn release(&mut self, name: &LockName, lease: LeaseId, now: u64) -> Result<Token, Error> {
        match self.run(Command::Release { name: name.clone(), lease }, now).1.unwrap() {
            Ok(Answer::Released(t)) => Ok(t),
            Ok(a) => panic!("{a:?}"),
            Err(e) => Err(e),
        }
    }
    fn revoke(&mut self, lease: LeaseId, now: u64) -> Result<(), Error> {
        self.run(Command::Revoke { lease }, now).1.unwrap().map(drop)
    }
    /// True when the request was still queued.
    fn cancel_wait(&mut self, request: RequestId, now: u64) -> bool {
        let queued = self.t.waiters.contains_key(&request);
        self.run(Command::Cancel { request }, now);
        queued
    }
    fn handle_timeout(&mut self, now: u64) {
        self.run(Command::Tick, now);
    }
    fn drain_effects(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }
    fn lock(&mut self, name: &LockName, now: u64) -> Option<LockInfo> {
        self.handle_timeout(now);
        self.t.lock(name)
    }
    fn lease(&mut self, id: LeaseId, now: u64) -> Option<LeaseInfo> {
        self.handle_timeout(now);
        self.t.lease(id)
    }
    fn check(&mut self, name: &LockName, token: Token, now: u64) -> (bool, Option<Token>) {
        self.handle_timeout(now);
        self.t.check(name, token)
    }
    fn locks_with_prefix(&mut self, prefix: &str, limit: usize, now: u64) -> Vec<LockInfo> {
        self.handle_timeout(now);
        self.t.locks_with_prefix(prefix, limit)
    }
}

impl std::ops::Deref for T {
    type Target = LockTable;
    fn deref(&self) -> &LockTable {
        &self.t
    }
}

fn table() -> T {
    T::on(LockTable::new(Limits::default()))
}

fn acq(name_: &str, lease: u128, wait_ms: u64) -> Acquire {
    Acquire { name: name(name_), lease: LeaseRef::Existing(LeaseId(lease)), wait_ms, lock_delay_ms: 0, holder: None }
}

fn implicit(name_: &str, lease: u128, ttl_ms: u64, wait_ms: u64) -> Acquire {
    Acquire {
        name: name(name_),
        lease: LeaseRef::Implicit { id: LeaseId(lease), ttl_ms },
        wait_ms,
        lock_delay_ms: 0,
        holder: None,
    }
}

fn granted_token(o: AcquireOutcome) -> u64 {
    match o {
        AcquireOutcome::Granted { grant, .. } => grant.token.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Renders the effects as one line each, for compact expectations.
fn effects(t: &mut T) -> Vec<String> {
    t.drain_effects()
        .map(|e| match e {
            Effect::Granted { at_ms, request, grant, .. } => format!(
                "{at_ms} granted {} token={} lease={} waiter={}",
                grant.name,
                grant.token,
                grant.lease.0,
                request.map_or("-".into(), |w| w.0.to_string())
            ),
            Effect::Released { at_ms, name, token, reason, .. } => {
                format!("{at_ms} released {name} token={token} {reason:?}")
            }
            Effect::LeaseExpired { at_ms, lease } => format!("{at_ms} expired lease={}", lease.0),
            Effect::WaitEnded { at_ms, request, name, reason } => {
                format!("{at_ms} wait-ended {name} waiter={} {reason:?}", request.0)
            }
            Effect::StoreFenced { at_ms, key, op, token, outcome } => {
                format!("{at_ms} store {op:?} {key} token={token} {outcome:?}")
            }
        })
        .collect()
}

fn check(t: &mut T, expected: &[&str]) {
    assert_eq!(effects(t), expected);
}

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
fn revoke_releases_everything_and_withdraws_waiters() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    t.acquire(acq("b", 1, 0), 0).unwrap();
    t.acquire(acq("c", 2, 0), 0).unwrap();
    t.acquire(acq("c", 1, 500), 0).unwrap();
    effects(&mut t);
    t.revoke(LeaseId(1), 10).unwrap();
    check(
        &mut t,
        &["10 wait-ended c waiter=6 LeaseGone", "10 released a token=1 Revoked", "10 released b token=2 Revoked"],
    );
    assert_eq!(t.revoke(LeaseId(1), 10), Err(Error::LeaseNotFound));
    assert_eq!(t.lock_count(), 1);
}

#[test]
fn release_by_a_stranger_is_refused() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    assert_eq!(t.release(&name("a"), LeaseId(9), 1), Err(Error::NotHolder { holder: Token::new(1) }));
    assert_eq!(t.release(&name("b"), LeaseId(1), 1), Err(Error::NotHolder { holder: None }));
    assert_eq!(t.check(&name("a"), Token::new(1).unwrap(), 1), (true, Token::new(1)));
    assert_eq!(t.check(&name("a"), Token::new(2).unwrap(), 1), (false, Token::new(1)));
}

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

/// The answers the table gave to queued requests, rendered.
fn answers(t: &mut T) -> Vec<String> {
    t.answers
        .drain(..)
        .map(|(r, a)| match a {
            Ok(Answer::Granted(g)) => format!("{} granted token={}", r.0, g.token),
            Ok(other) => format!("{} {other:?}", r.0),
            Err(e) => format!("{} {}", r.0, e.code()),
        })
        .collect()
}

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

mod props {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Cmd {
        Lease(u8, u64),
        Keepalive(u8),
        Revoke(u8),
        Acquire(u8, u8, u64, u64),
        Release(u8, u8),
        Cancel(u64),
        Tick(u64),
        Implicit(u8, u64, u64),
        /// An implicit acquire under a caller-chosen id from a small pool: retries.
        ImplicitRetry(u8, u8, u64, u64),
    }

    fn cmd() -> impl Strategy<Value = Cmd> {
        prop_oneof![
            (0u8..6, 100u64..2_000).prop_map(|(l, ttl)| Cmd::Lease(l, ttl)),
            (0u8..6).prop_map(Cmd::Keepalive),
            (0u8..6).prop_map(Cmd::Revoke),
            (0u8..6, 0u8..3, 0u64..1_500, 0u64..300).prop_map(|(l, n, w, d)| Cmd::Acquire(l, n, w, d)),
            (0u8..6, 0u8..3).prop_map(|(l, n)| Cmd::Release(l, n)),
            (1u64..30).prop_map(Cmd::Cancel),
            (0u64..800).prop_map(Cmd::Tick),
            (0u8..3, 100u64..2_000, 0u64..1_500).prop_map(|(n, ttl, w)| Cmd::Implicit(n, ttl, w)),
            (0u8..3, 0u8..3, 100u64..2_000, 0u64..1_500).prop_map(|(k, n, ttl, w)| Cmd::ImplicitRetry(k, n, ttl, w)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Over any schedule: tokens strictly increase, a lock never has two holders, no
        /// lease holds a lock past its expiry, a grant never lands during a lock-delay,
        /// and waiters are served in the order they queued.
        #[test]
        fn invariants_hold(cmds in prop::collection::vec(cmd(), 1..120)) {
            let mut t = T::on(LockTable::new(Limits::default()));
            let mut now = 0u64;
            let mut last_token = 0u64;
            let mut holder: HashMap<LockName, (LeaseId, u64)> = HashMap::new();
            let mut expires: HashMap<LeaseId, u64> = HashMap::new();
            let mut queue: HashMap<LockName, Vec<RequestId>> = HashMap::new();
            let mut delayed_until: HashMap<LockName, u64> = HashMap::new();
            for c in cmds {
                match c {
                    Cmd::Lease(l, ttl) => {
                        if t.grant_lease(LeaseId(l as u128), ttl, now).is_ok() { expires.remove(&LeaseId(l as u128)); }
                    }
                    Cmd::Keepalive(l) => { let _ = t.keepalive(LeaseId(l as u128), now); }
                    Cmd::Revoke(l) => { let _ = t.revoke(LeaseId(l as u128), now); }
                    Cmd::Acquire(l, n, w, d) => {
                        let nm = name(&format!("n{n}"));
                        let r = t.acquire(Acquire { name: nm.clone(), lease: LeaseRef::Existing(LeaseId(l as u128)), wait_ms: w, lock_delay_ms: d, holder: None }, now);
                        if let Ok(AcquireOutcome::Queued(id)) = r { queue.entry(nm).or_default().push(id); }
                    }
                    Cmd::Release(l, n) => { let _ = t.release(&name(&format!("n{n}")), LeaseId(l as u128), now); }
                    Cmd::Cancel(w) => { t.cancel_wait(RequestId(w), now); }
                    Cmd::Tick(dt) => { now += dt; t.handle_timeout(now); }
                    Cmd::Implicit(n, ttl, w) => {
                        let nm = name(&format!("n{n}"));
                        let r = t.acquire(implicit(&format!("n{n}"), 1_000 + t.next as u128, ttl, w), now);
                        if let Ok(AcquireOutcome::Queued(id)) = r { queue.entry(nm).or_default().push(id); }
                    }
                    Cmd::ImplicitRetry(k, n, ttl, w) => {
                        let nm = name(&format!("n{n}"));
                        let r = t.acquire(implicit(&format!("n{n}"), 2_000 + k as u128, ttl, w), now);
                        if let Ok(AcquireOutcome::Queued(id)) = r { queue.entry(nm).or_default().push(id); }
                    }
                }
                let effects: Vec<Effect> = t.drain_effects().collect();
                for e in effects {
                    match e {
                        Effect::Granted { at_ms, request: waiter, grant, .. } => {
                            prop_assert!(grant.token.get() >= last_token);
                            if grant.token.get() == last_token {
                                // Only a twin waiter of the same lease shares a token.
                                prop_assert_eq!(holder.get(&grant.name).map(|h| (h.0, h.1)), Some((grant.lease, last_token)));
                            } else {
                                prop_assert!(!holder.contains_key(&grant.name), "two holders of {}", grant.name);
                                prop_assert!(at_ms >= *delayed_until.get(&grant.name).unwrap_or(&0));
                            }
                            let twin = grant.token.get() == last_token;
                            last_token = grant.token.get();
                            holder.insert(grant.name.clone(), (grant.lease, grant.token.get()));
                            if let Some(w) = waiter {
                                let q = queue.get_mut(&grant.name).unwrap();
                                if twin {
                                    // A retry joins its original's grant, wherever it queued.
                                    q.retain(|x| *x != w);
                                } else {
                                    prop_assert_eq!(q.first().copied(), Some(w), "FIFO");
                                    q.remove(0);
                                }
                            }
                        }
                        Effect::Released { at_ms, name, token, lease, reason } => {
                            prop_assert_eq!(holder.remove(&name), Some((lease, token.get())));
                            if reason == ReleaseReason::Expired {
                                prop_assert!(at_ms >= expires.get(&lease).copied().unwrap_or(0));
                            }
                            if reason == ReleaseReason::Expired {
                                delayed_until.insert(name, at_ms); // refined below from lock()
                            }
                        }
                        Effect::LeaseExpired { .. } | Effect::StoreFenced { .. } => {}
                        Effect::WaitEnded { request: waiter, name, .. } => {
                            let q = queue.get_mut(&name).unwrap();
                            q.retain(|w| *w != waiter);
                        }
                    }
                }
                // Every grant answered is held when its command ends.
                for (_, a) in t.answers.drain(..) {
                    if let Ok(Answer::Granted(g)) = a {
                        prop_assert_eq!(holder.get(&g.name).copied(), Some((g.lease, g.token.get())));
                    }
                }
                for (nm, until) in delayed_until.iter_mut() {
                    if let Some(info) = t.lock(nm, now) { if let Some(b) = info.blocked_until_ms { *until = (*until).max(b); } }
                }
                // No lease holds anything past its expiry.
                for (_, (lease, _)) in holder.iter() {
                    let info = t.lease(*lease, now);
                    prop_assert!(info.is_some_and(|i| i.expires_at_ms > now));
                    expires.insert(*lease, info.unwrap().expires_at_ms);
                }
            }
        }
    }
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

/// The store gate's decisions are effects of the entry (every member publishes the
/// same events from them): admitted, stale and not-issued fenced operations each say
/// so; an unfenced write says nothing.
#[test]
fn fenced_store_operations_are_effects() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    granted_token(t.acquire(acq("a", 1, 0), 0).unwrap());
    granted_token(t.acquire(acq("b", 1, 0), 0).unwrap());
    t.drain_effects().count();
    let quotas = crate::Quotas { keys_max: 10, bytes_max: 1 << 20 };
    let write = |token: u64| {
        Command::Store(StoreCommand::Write {
            key: "k".into(),
            token: Token::new(token).unwrap(),
            value: b"v".to_vec(),
            foreign: false,
            quotas,
        })
    };
    t.run(write(2), 1);
    t.run(write(1), 2);
    t.run(write(9), 3);
    t.run(
        Command::Store(StoreCommand::FencedRead {
            key: "k".into(),
            token: Token::new(2).unwrap(),
            foreign: false,
            quotas,
        }),
        4,
    );
    t.run(Command::Store(StoreCommand::WriteUnfenced { key: "u".into(), value: vec![], quotas }), 5);
    check(
        &mut t,
        &[
            "1 store Write k token=2 Accepted",
            "2 store Write k token=1 Stale { highest_seen: Token(2) }",
            "3 store Write k token=9 NotIssued",
            "4 store Read k token=2 Accepted",
        ],
    );
}

fn revoke_lock(t: &mut T, n: &str, token: Option<Token>, now: u64) -> Result<Token, Error> {
    match t.run(Command::RevokeLock { name: name(n), token }, now).1.unwrap() {
        Ok(Answer::Released(t)) => Ok(t),
        Ok(a) => panic!("{a:?}"),
        Err(e) => Err(e),
    }
}

#[test]
fn an_operator_takes_a_lock_from_its_holder_and_the_next_waiter_gets_a_higher_token() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    let AcquireOutcome::Granted { grant: held } = t.acquire(acq("a", 1, 0), 0).unwrap() else { panic!() };
    t.acquire(acq("b", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(waiter) = t.acquire(acq("a", 2, TTL), 0).unwrap() else { panic!() };
    t.drain_effects().for_each(drop);

    // Naming another token takes nothing.
    let other = Token::new(held.token.get() + 100).unwrap();
    assert_eq!(revoke_lock(&mut t, "a", Some(other), 1), Err(Error::NotHolder { holder: Some(held.token) }));
    assert_eq!(revoke_lock(&mut t, "a", Some(held.token), 1), Ok(held.token));
    let (ok, _) = t.check(&name("a"), held.token, 1);
    assert!(!ok, "the old token no longer holds");
    let next = t.answers.iter().find(|(r, _)| *r == waiter).expect("the waiter was answered");
    let Ok(Answer::Granted(next)) = &next.1 else { panic!("{next:?}") };
    assert!(next.token > held.token);
    assert!(t.drain_effects().any(|e| matches!(e, Effect::Released { reason: ReleaseReason::Forced, .. })));
    // The holder's lease lives on with its other lock.
    assert!(t.keepalive(LeaseId(1), 2).is_ok());
    assert!(t.check(&name("b"), Token::new(held.token.get() + 1).unwrap(), 2).0);
    // Nobody holds "c": a clear refusal, nothing changed.
    assert_eq!(revoke_lock(&mut t, "c", None, 3), Err(Error::NotHolder { holder: None }));
}

#[test]
fn revoking_a_lock_held_under_an_implicit_lease_ends_that_lease() {
    let mut t = table();
    let AcquireOutcome::Granted { grant } = t.acquire(implicit("a", 9, TTL, 0), 0).unwrap() else { panic!() };
    assert_eq!(revoke_lock(&mut t, "a", None, 1), Ok(grant.token));
    assert_eq!(t.keepalive(LeaseId(9), 2), Err(Error::LeaseNotFound), "the guard hears at its next keepalive");
}

#[test]
fn every_effect_has_a_position_that_only_grows() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    let mut last = t.effects_seq();
    for i in 0..5 {
        let out = t.t.apply(RequestId(300 + i), Command::Acquire(acq("a", 1, 0)), i);
        assert_eq!(out.effects.len(), 1);
        assert!(out.effect_index(0) > last);
        last = out.effect_index(0);
        let out = t.t.apply(RequestId(400 + i), Command::Release { name: name("a"), lease: LeaseId(1) }, i);
        assert_eq!(out.effect_index(0), last + 1);
        last = out.effect_index(0);
    }
    assert_eq!(t.effects_seq(), last);
}

/// `Command::Renewed` (keepalives a cluster of one answered from memory) is taken
/// before its batch's time moves: a lease renewed at 900 with a TTL of 1,000 lives to
/// 1,900 though the batch that carries the renewal is stamped 1,500, past the lease's
/// old expiry. The same renewal as a plain keepalive in that batch comes too late: the
/// expiry due at 1,500 fires first.
#[test]
fn renewals_are_taken_before_their_batch_time_moves() {
    for renewed in [true, false] {
        let mut t = table();
        t.grant_lease(LeaseId(1), 1_000, 0).unwrap();
        let cmd = match renewed {
            true => Command::Renewed { leases: vec![(LeaseId(1), 900), (LeaseId(2), 900)] },
            false => Command::Keepalive { lease: LeaseId(1) },
        };
        t.run(cmd, 1_500);
        let lease = t.t.lease(LeaseId(1));
        match renewed {
            true => assert_eq!(lease.map(|l| l.expires_at_ms), Some(1_900)),
            false => assert_eq!(lease, None, "a keepalive stamped past the expiry finds the lease gone"),
        }
        t.handle_timeout(1_899);
        assert_eq!(t.t.lease(LeaseId(1)).is_some(), renewed);
        t.handle_timeout(1_900);
        assert_eq!(t.t.lease(LeaseId(1)), None, "expired at its renewed time");
    }
}
