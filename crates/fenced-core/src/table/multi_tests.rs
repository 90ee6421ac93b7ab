//! Tests of [`AcquireAll`]: all or nothing, no deadlock whatever the order of names,
//! strict FIFO fairness, and the twin and withdrawal rules it shares with one acquire.

use super::*;

const TTL: u64 = 1_000;

fn n(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

fn all(names: &[&str], lease: u128, wait_ms: u64) -> Command {
    let names = names.iter().map(|s| n(s)).collect();
    Command::AcquireAll(AcquireAll {
        names,
        lease: LeaseRef::Existing(LeaseId(lease)),
        wait_ms,
        lock_delay_ms: 0,
        holder: None,
    })
}

fn one(name: &str, lease: u128, wait_ms: u64) -> Command {
    Command::Acquire(Acquire {
        name: n(name),
        lease: LeaseRef::Existing(LeaseId(lease)),
        wait_ms,
        lock_delay_ms: 0,
        holder: None,
    })
}

/// A table with leases 1..=k, and a counter of request ids.
struct M {
    t: LockTable,
    next: u64,
    answers: Vec<(RequestId, Result<Answer, Error>)>,
}

impl M {
    fn new(leases: u128) -> M {
        let mut m = M { t: LockTable::new(Limits::default()), next: 0, answers: vec![] };
        for l in 1..=leases {
            m.run(Command::GrantLease { lease: LeaseId(l), ttl_ms: 60_000 }, 0);
        }
        m.answers.clear();
        m
    }
    fn run(&mut self, cmd: Command, now: u64) -> RequestId {
        self.next += 1;
        let r = RequestId(self.next);
        let out = self.t.apply(r, cmd, now);
        self.answers.extend(out.answers);
        r
    }
    fn answer(&mut self, r: RequestId) -> Option<Result<Answer, Error>> {
        let i = self.answers.iter().position(|(q, _)| *q == r)?;
        Some(self.answers.remove(i).1)
    }
    fn holder(&self, name: &str) -> Option<LeaseId> {
        self.t.lock(&n(name)).and_then(|l| l.holder).map(|(_, lease)| lease.id)
    }
}

fn tokens(a: Option<Result<Answer, Error>>) -> Vec<u64> {
    match a {
        Some(Ok(Answer::GrantedAll(gs))) => gs.iter().map(|g| g.token.get()).collect(),
        other => panic!("expected every lock granted, got {other:?}"),
    }
}

#[test]
fn free_names_are_granted_together_in_sorted_order_and_a_held_one_grants_none() {
    let mut m = M::new(2);
    let r = m.run(all(&["b", "a", "c", "a"], 1, 0), 10);
    assert_eq!(tokens(m.answer(r)), [1, 2, 3], "a, b, c: one token each, sorted, the repeat dropped");
    let r = m.run(all(&["c", "d"], 2, 0), 20);
    assert_eq!(m.answer(r), Some(Err(Error::LockHeld { holder: Token::new(3) })));
    assert_eq!(m.holder("d"), None, "nothing of a refused set is taken");
    let r = m.run(all(&["a", "b", "c"], 1, 0), 30);
    assert_eq!(tokens(m.answer(r)), [1, 2, 3], "the holder asking again gets the same grants");
    let r = m.run(all(&["a", "z"], 1, 0), 30);
    assert!(matches!(m.answer(r), Some(Err(Error::LockHeld { .. }))), "holding some but not all is refused");
    let r = m.run(all(&[], 1, 0), 30);
    assert_eq!(m.answer(r), Some(Err(Error::InvalidNames { names_max: LOCK_NAMES_MAX })));
}

/// `waiters_max` bounds the names waited for, a set counting each of its names: the
/// widest sets cannot hold 64 times what single waiters may.
#[test]
fn a_waiting_set_counts_each_of_its_names_against_waiters_max() {
    let mut m = M::new(4);
    m.t.set_limits(Limits { waiters_max: 4, ..Limits::default() });
    let held = m.run(all(&["a", "b", "c"], 1, 0), 1);
    assert_eq!(tokens(m.answer(held)).len(), 3);
    let three = m.run(all(&["a", "b", "c"], 2, 60_000), 2);
    assert!(m.answer(three).is_none(), "queued: 3 of 4 waiting names");
    let two = m.run(all(&["a", "b"], 3, 60_000), 3);
    assert_eq!(m.answer(two), Some(Err(Error::TooManyWaiters { waiters_max: 4 })), "3 + 2 names is past 4");
    let single = m.run(one("a", 3, 60_000), 4);
    assert!(m.answer(single).is_none(), "3 + 1 fits");
    // A restored table counts again from its waiters.
    m.t.waiting_names = None;
    let again = m.run(one("b", 4, 60_000), 5);
    assert_eq!(m.answer(again), Some(Err(Error::TooManyWaiters { waiters_max: 4 })));
}

#[test]
fn opposite_orders_never_deadlock() {
    // Lease 1 holds a, lease 2 holds b; 3 waits for {a, b}, 4 for {b, a}: with one lock
    // each taken in turn this is the classic deadlock. Released, both get through.
    let mut m = M::new(4);
    m.run(one("a", 1, 0), 1);
    m.run(one("b", 2, 0), 1);
    let w3 = m.run(all(&["a", "b"], 3, 10_000), 2);
    let w4 = m.run(all(&["b", "a"], 4, 10_000), 3);
    m.run(Command::Release { name: n("a"), lease: LeaseId(1) }, 4);
    assert_eq!(m.answer(w3), None, "a alone is not enough");
    assert_eq!(m.holder("a"), None, "a stays free for its first waiter");
    m.run(Command::Release { name: n("b"), lease: LeaseId(2) }, 5);
    assert_eq!(tokens(m.answer(w3)), [3, 4]);
    m.run(Command::Revoke { lease: LeaseId(3) }, 6);
    assert_eq!(tokens(m.answer(w4)), [5, 6]);
}

#[test]
fn a_waiter_for_two_locks_is_not_starved_by_waiters_for_one() {
    let mut m = M::new(10);
    m.run(one("a", 1, 0), 0);
    m.run(one("b", 2, 0), 0);
    let both = m.run(all(&["a", "b"], 3, 60_000), 1);
    // A stream of waiters for a alone, each queued behind the waiter for both.
    let singles: Vec<RequestId> = (4..=10).map(|l| m.run(one("a", l, 60_000), 2)).collect();
    m.run(Command::Release { name: n("a"), lease: LeaseId(1) }, 3);
    assert!(singles.iter().all(|r| m.answer(*r).is_none()), "none overtakes the waiter for both");
    m.run(Command::Release { name: n("b"), lease: LeaseId(2) }, 4);
    assert_eq!(tokens(m.answer(both)), [3, 4]);
    m.run(Command::Revoke { lease: LeaseId(3) }, 5);
    assert!(matches!(m.answer(singles[0]), Some(Ok(Answer::Granted(_)))), "then the singles, in order");
}

#[test]
fn a_wait_that_ends_hands_every_name_on_and_a_withdrawn_grant_gives_all_back() {
    let mut m = M::new(4);
    m.run(one("b", 1, 0), 0);
    let both = m.run(all(&["a", "b"], 2, 500), 1);
    let single = m.run(one("a", 3, 60_000), 2);
    assert_eq!(m.answer(single), None, "behind the waiter for both");
    let mut out = m.t.apply(RequestId(1_000), Command::Tick, 600);
    m.answers.append(&mut out.answers);
    assert!(matches!(m.answer(both), Some(Err(Error::LockHeld { .. }))), "its wait ended");
    assert_eq!(m.holder("a"), Some(LeaseId(3)), "its leaving granted a to the next in line");
    // A queued set granted, then withdrawn by its departed caller: every name back.
    let late = m.run(all(&["c", "d"], 4, 60_000), 700);
    assert!(matches!(m.answer(late), Some(Ok(Answer::GrantedAll(_)))), "c and d were free");
    m.run(one("c", 1, 0), 700);
    let queued = m.run(all(&["c", "e"], 2, 60_000), 701);
    m.run(Command::Revoke { lease: LeaseId(4) }, 702);
    m.run(Command::Release { name: n("c"), lease: LeaseId(1) }, 703);
    assert!(matches!(m.answer(queued), Some(Ok(Answer::GrantedAll(_)))));
    m.run(Command::Cancel { request: queued }, 704);
    assert_eq!((m.holder("c"), m.holder("e")), (None, None), "given back together");
}

#[test]
fn an_implicit_retry_of_a_queued_set_is_granted_with_its_original() {
    let mut m = M::new(1);
    m.run(one("a", 1, 0), 0);
    let implicit = |wait_ms| {
        let names = vec![n("a"), n("b")];
        let lease = LeaseRef::Implicit { id: LeaseId(77), ttl_ms: TTL };
        Command::AcquireAll(AcquireAll { names, lease, wait_ms, lock_delay_ms: 0, holder: None })
    };
    let first = m.run(implicit(60_000), 1);
    let retry = m.run(implicit(60_000), 2);
    assert_eq!((m.answer(first), m.answer(retry)), (None, None));
    m.run(Command::Release { name: n("a"), lease: LeaseId(1) }, 3);
    let (a, b) = (tokens(m.answer(first)), tokens(m.answer(retry)));
    assert_eq!(a, b, "one grant, told twice");
    m.run(Command::Cancel { request: first }, 4);
    assert_eq!(m.holder("a"), Some(LeaseId(77)), "the retry was told of it too: it stays");
    let again = m.run(implicit(0), 5);
    assert_eq!(tokens(m.answer(again)), a, "a third try gets the same grant");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Lease, a subset of {n0..n3} in a random order (by a permutation seed), wait.
        All(u8, Vec<u8>, u64),
        One(u8, u8, u64),
        Release(u8, u8),
        Revoke(u8),
        Lease(u8),
        Cancel(u64),
        Tick(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..5, prop::collection::vec(0u8..4, 1..4), 0u64..2_000).prop_map(|(l, ns, w)| Op::All(l, ns, w)),
            2 => (0u8..5, 0u8..4, 0u64..2_000).prop_map(|(l, k, w)| Op::One(l, k, w)),
            2 => (0u8..5, 0u8..4).prop_map(|(l, k)| Op::Release(l, k)),
            1 => (0u8..5).prop_map(Op::Revoke),
            1 => (0u8..5).prop_map(Op::Lease),
            1 => (1u64..60).prop_map(Op::Cancel),
            2 => (0u64..700).prop_map(Op::Tick),
        ]
    }

    /// Runs `ops` on a fresh table (its queue order broken, for the negative control)
    /// and checks, after each: tokens strictly increase, no lock has two holders, a set
    /// is answered only when all of it is held by its lease, no waiter is left waiting
    /// while every lock it waits for is free for it, and the oldest waiter is first in
    /// every one of its queues (so it is granted as soon as its holders let go: no
    /// deadlock).
    fn run_checked(ops: Vec<Op>, break_queue_order: bool) -> Result<(), TestCaseError> {
        let mut t = LockTable::new(Limits::default());
        t.break_queue_order = break_queue_order;
        let mut next = 0u64;
        let mut now = 0u64;
        let mut last = 0u64;
        let mut holders: std::collections::HashMap<LockName, Token> = Default::default();
        for l in 0..5u128 {
            next += 1;
            t.apply(RequestId(next), Command::GrantLease { lease: LeaseId(l), ttl_ms: 1_500 }, now);
        }
        for o in ops {
            let cmd = match o {
                Op::All(l, ns, w) => {
                    let names = ns.iter().map(|k| n(&format!("n{k}"))).collect();
                    let lease = LeaseRef::Existing(LeaseId(l as u128));
                    Command::AcquireAll(AcquireAll { names, lease, wait_ms: w, lock_delay_ms: 0, holder: None })
                }
                Op::One(l, k, w) => one(&format!("n{k}"), l as u128, w),
                Op::Release(l, k) => Command::Release { name: n(&format!("n{k}")), lease: LeaseId(l as u128) },
                Op::Revoke(l) => Command::Revoke { lease: LeaseId(l as u128) },
                Op::Lease(l) => Command::GrantLease { lease: LeaseId(l as u128), ttl_ms: 1_500 },
                Op::Cancel(r) => Command::Cancel { request: RequestId(r) },
                Op::Tick(dt) => {
                    now += dt;
                    Command::Tick
                }
            };
            next += 1;
            let out = t.apply(RequestId(next), cmd, now);
            for e in &out.effects {
                match e {
                    Effect::Granted { grant, .. } => {
                        if let Some(held) = holders.get(&grant.name) {
                            prop_assert_eq!(*held, grant.token, "two holders of {}", grant.name);
                        } else {
                            prop_assert!(grant.token.get() > last, "token {} not above {}", grant.token, last);
                            last = grant.token.get();
                            holders.insert(grant.name.clone(), grant.token);
                        }
                    }
                    Effect::Released { name, token, .. } => prop_assert_eq!(holders.remove(name), Some(*token)),
                    _ => {}
                }
            }
            for (_, a) in &out.answers {
                if let Ok(Answer::GrantedAll(gs)) = a {
                    for g in gs {
                        prop_assert_eq!(t.holder_token(&g.name), Some(g.token), "a set answered but not all held");
                    }
                }
            }
            for (id, w) in &t.waiters {
                prop_assert!(!w.names().all(|nm| t.free_for(nm, *id)), "waiter {:?} left waiting with all free", id);
            }
            let counted: usize = t.waiters.values().map(|w| 1 + w.also.len()).sum();
            prop_assert_eq!(t.waiting_names, Some(counted), "the count of waiting names drifted");
            if let Some(oldest) = t.waiters.keys().min() {
                for nm in t.waiters[oldest].names() {
                    let front = t.locks[nm].queue.front();
                    prop_assert_eq!(front, Some(oldest), "the oldest waiter is not first for {}", nm);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn all_or_nothing_without_deadlock(ops in prop::collection::vec(op(), 1..150)) {
            run_checked(ops, false)?;
        }
    }

    /// The negative control: queues that disagree on the arrival order (a set appended
    /// to the back of its first name's queue but put in front in the others': the
    /// ordering bug behind every lock-order deadlock) are caught at once.
    #[test]
    fn the_checker_catches_queues_that_disagree_on_the_order() {
        let ops = vec![Op::One(0, 0, 0), Op::All(1, vec![0, 1], 60_000), Op::All(2, vec![1, 0], 60_000)];
        assert!(run_checked(ops.clone(), false).is_ok());
        let caught = run_checked(ops, true).expect_err("the broken order must be caught");
        assert!(caught.to_string().contains("the oldest waiter is not first"), "{caught}");
    }
}
