//! Property tests of sets: random mixes of sets and single acquires against the table's invariants.

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
