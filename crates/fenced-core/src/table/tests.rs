//! Tests of the lock table through its public surface.

use super::*;

const TTL: u64 = 1_000;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

fn table() -> LockTable {
    LockTable::new(Limits::default(), Token::FIRST, 0)
}

fn acq(name_: &str, lease: u128, wait_ms: u64) -> Acquire {
    Acquire { name: name(name_), lease: LeaseId(lease), wait_ms, lock_delay_ms: 0 }
}

fn granted_token(o: AcquireOutcome) -> u64 {
    match o {
        AcquireOutcome::Granted { grant, .. } => grant.token.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Renders the effects as one line each, for compact expectations.
fn effects(t: &mut LockTable) -> Vec<String> {
    t.drain_effects()
        .map(|e| match e {
            Effect::Granted { at_ms, waiter, grant } => format!(
                "{at_ms} granted {} token={} lease={} waiter={}",
                grant.name,
                grant.token,
                grant.lease.0,
                waiter.map_or("-".into(), |w| w.0.to_string())
            ),
            Effect::Released { at_ms, name, token, reason, .. } => {
                format!("{at_ms} released {name} token={token} {reason:?}")
            }
            Effect::LeaseExpired { at_ms, lease } => format!("{at_ms} expired lease={}", lease.0),
            Effect::WaitEnded { at_ms, waiter, name, reason } => {
                format!("{at_ms} wait-ended {name} waiter={} {reason:?}", waiter.0)
            }
        })
        .collect()
}

fn check(t: &mut LockTable, expected: &[&str]) {
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
        AcquireOutcome::Granted { grant, fresh } => {
            assert_eq!(grant.token.get(), 1);
            assert!(!fresh);
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
    assert_eq!(t.acquire(acq("a", 3, 5_000), 1).unwrap(), AcquireOutcome::Queued(WaiterId(1)));
    assert_eq!(t.acquire(acq("a", 2, 5_000), 2).unwrap(), AcquireOutcome::Queued(WaiterId(2)));
    assert_eq!(t.acquire(acq("a", 4, 5_000), 3).unwrap(), AcquireOutcome::Queued(WaiterId(3)));
    effects(&mut t);
    t.release(&name("a"), LeaseId(1), 10).unwrap();
    t.release(&name("a"), LeaseId(3), 11).unwrap();
    t.release(&name("a"), LeaseId(2), 12).unwrap();
    check(
        &mut t,
        &[
            "10 released a token=1 Released",
            "10 granted a token=2 lease=3 waiter=1",
            "11 released a token=2 Released",
            "11 granted a token=3 lease=2 waiter=2",
            "12 released a token=3 Released",
            "12 granted a token=4 lease=4 waiter=3",
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
    check(&mut t, &["300 wait-ended a waiter=1 TimedOut"]);
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
        &["1 wait-ended a waiter=1 Cancelled", "2 released a token=1 Released", "2 granted a token=2 lease=3 waiter=2"],
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
        &["1600 expired lease=1", "1600 released a token=1 Expired", "1600 granted a token=2 lease=2 waiter=1"],
    );
    assert_eq!(t.keepalive(LeaseId(1), 1_700), Err(LeaseError::NotFound));
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
    check(&mut t, &["1500 granted a token=2 lease=2 waiter=1"]);

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
        &["10 wait-ended c waiter=1 LeaseGone", "10 released a token=1 Revoked", "10 released b token=2 Revoked"],
    );
    assert_eq!(t.revoke(LeaseId(1), 10), Err(LeaseError::NotFound));
    assert_eq!(t.lock_count(), 1);
}

#[test]
fn release_by_a_stranger_is_refused() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    assert_eq!(t.release(&name("a"), LeaseId(9), 1), Err(ReleaseError::NotHolder { holder: Token::new(1) }));
    assert_eq!(t.release(&name("b"), LeaseId(1), 1), Err(ReleaseError::NotHolder { holder: None }));
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
            "1 granted a token=2 lease=2 waiter=1",
            "1 granted a token=2 lease=2 waiter=2",
        ],
    );
}

#[test]
fn start_up_grace_grants_nothing_until_it_ends() {
    let mut t = LockTable::new(Limits::default(), Token::new(1_000).unwrap(), 5_000);
    t.grant_lease(LeaseId(1), TTL * 10, 0).unwrap();
    assert!(t.in_grace(10));
    assert_eq!(t.acquire(acq("a", 1, 0), 10).unwrap(), AcquireOutcome::NotGranted { holder: None });
    assert!(matches!(t.acquire(acq("a", 1, 9_000), 10).unwrap(), AcquireOutcome::Queued(_)));
    t.handle_timeout(5_000);
    check(&mut t, &["5000 granted a token=1000 lease=1 waiter=1"]);
}

#[test]
fn limits_are_enforced_and_change_nothing() {
    let limits = Limits { leases_max: 2, locks_max: 1, waiters_max: 1, waiters_per_lock_max: 1, ..Limits::default() };
    let mut t = LockTable::new(limits, Token::FIRST, 0);
    assert_eq!(
        t.grant_lease(LeaseId(1), 10, 0),
        Err(LeaseError::TtlOutOfRange { ttl_ms_min: 100, ttl_ms_max: 300_000 })
    );
    assert_eq!(
        t.grant_lease(LeaseId(1), 300_001, 0).unwrap_err(),
        LeaseError::TtlOutOfRange { ttl_ms_min: 100, ttl_ms_max: 300_000 }
    );
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    assert_eq!(t.grant_lease(LeaseId(1), TTL, 0), Err(LeaseError::AlreadyExists));
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    assert_eq!(t.grant_lease(LeaseId(3), TTL, 0), Err(LeaseError::TooManyLeases { leases_max: 2 }));
    t.acquire(acq("a", 1, 0), 0).unwrap();
    assert_eq!(t.acquire(acq("b", 1, 0), 0), Err(AcquireError::TooManyLocks { locks_max: 1 }));
    assert_eq!(t.acquire(acq("a", 2, 400_000), 0), Err(AcquireError::WaitOutOfRange { wait_ms_max: 300_000 }));
    assert!(matches!(t.acquire(acq("a", 2, 100), 0), Ok(AcquireOutcome::Queued(_))));
    assert_eq!(t.acquire(acq("a", 2, 100), 0), Err(AcquireError::TooManyWaiters { waiters_max: 1 }));
    assert_eq!(t.acquire(acq("a", 7, 100), 0), Err(AcquireError::LeaseNotFound));
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
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Over any schedule: tokens strictly increase, a lock never has two holders, no
        /// lease holds a lock past its expiry, a grant never lands during a lock-delay,
        /// and waiters are served in the order they queued.
        #[test]
        fn invariants_hold(cmds in prop::collection::vec(cmd(), 1..120)) {
            let mut t = LockTable::new(Limits::default(), Token::FIRST, 0);
            let mut now = 0u64;
            let mut last_token = 0u64;
            let mut holder: HashMap<LockName, (LeaseId, u64)> = HashMap::new();
            let mut expires: HashMap<LeaseId, u64> = HashMap::new();
            let mut queue: HashMap<LockName, Vec<WaiterId>> = HashMap::new();
            let mut delayed_until: HashMap<LockName, u64> = HashMap::new();
            for c in cmds {
                match c {
                    Cmd::Lease(l, ttl) => { let _ = t.grant_lease(LeaseId(l as u128), ttl, now); }
                    Cmd::Keepalive(l) => { let _ = t.keepalive(LeaseId(l as u128), now); }
                    Cmd::Revoke(l) => { let _ = t.revoke(LeaseId(l as u128), now); }
                    Cmd::Acquire(l, n, w, d) => {
                        let nm = name(&format!("n{n}"));
                        let r = t.acquire(Acquire { name: nm.clone(), lease: LeaseId(l as u128), wait_ms: w, lock_delay_ms: d }, now);
                        if let Ok(AcquireOutcome::Queued(id)) = r { queue.entry(nm).or_default().push(id); }
                    }
                    Cmd::Release(l, n) => { let _ = t.release(&name(&format!("n{n}")), LeaseId(l as u128), now); }
                    Cmd::Cancel(w) => { t.cancel_wait(WaiterId(w), now); }
                    Cmd::Tick(dt) => { now += dt; t.handle_timeout(now); }
                }
                let effects: Vec<Effect> = t.drain_effects().collect();
                for e in effects {
                    match e {
                        Effect::Granted { at_ms, waiter, grant } => {
                            prop_assert!(grant.token.get() >= last_token);
                            if grant.token.get() == last_token {
                                // Only a twin waiter of the same lease shares a token.
                                prop_assert_eq!(holder.get(&grant.name).map(|h| (h.0, h.1)), Some((grant.lease, last_token)));
                            } else {
                                prop_assert!(!holder.contains_key(&grant.name), "two holders of {}", grant.name);
                                prop_assert!(at_ms >= *delayed_until.get(&grant.name).unwrap_or(&0));
                            }
                            last_token = grant.token.get();
                            holder.insert(grant.name.clone(), (grant.lease, grant.token.get()));
                            if let Some(w) = waiter {
                                let q = queue.get_mut(&grant.name).unwrap();
                                prop_assert_eq!(q.first().copied(), Some(w), "FIFO");
                                q.remove(0);
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
                        Effect::LeaseExpired { .. } => {}
                        Effect::WaitEnded { waiter, name, .. } => {
                            let q = queue.get_mut(&name).unwrap();
                            q.retain(|w| *w != waiter);
                        }
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
