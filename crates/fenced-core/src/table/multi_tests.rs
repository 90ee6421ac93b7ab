//! Tests of [`AcquireAll`]: all or nothing, no deadlock whatever the order of names,
//! strict FIFO fairness, and the twin and withdrawal rules it shares with one acquire.

use super::*;

mod handoff;
mod props;

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
