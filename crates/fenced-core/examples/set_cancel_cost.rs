//! What withdrawing queued sets of locks costs the state machine: `sets` waiters for the
//! same `width` names (behind a holder of one of them) are queued, then withdrawn one
//! by one, as callers that go away would be. Prints the time of each phase.
//!
//! `cargo run --release -p fenced-core --example set_cancel_cost -- [sets] [width]`

use std::time::Instant;

use fenced_core::{Acquire, AcquireAll, Command, LeaseId, LeaseRef, Limits, LockName, LockTable, RequestId};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let sets = args.next().unwrap_or(10_000);
    let width = args.next().unwrap_or(64);
    let mut t = LockTable::new(Limits::default());
    let names: Vec<LockName> = (0..width).map(|i| LockName::new(&format!("n/{i}")).unwrap()).collect();
    t.apply(RequestId(0), Command::GrantLease { lease: LeaseId(1), ttl_ms: 300_000 }, 0);
    let hold = Acquire {
        name: names[0].clone(),
        lease: LeaseRef::Existing(LeaseId(1)),
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: None,
    };
    t.apply(RequestId(1), Command::Acquire(hold), 0);
    let queued = Instant::now();
    for i in 0..sets {
        let lease = LeaseRef::Implicit { id: LeaseId(1_000 + i as u128), ttl_ms: 10_000 };
        let set = AcquireAll { names: names.clone(), lease, wait_ms: 300_000, lock_delay_ms: 0, holder: None };
        let out = t.apply(RequestId(10 + i as u64), Command::AcquireAll(set), 1);
        assert_eq!(out.queued.len(), 1, "set {i} was not queued: {:?}", out.answers);
    }
    let queue_s = queued.elapsed().as_secs_f64();
    let cancelled = Instant::now();
    let mut slowest = 0f64;
    for i in 0..sets {
        let one = Instant::now();
        t.apply(RequestId(1_000_000 + i as u64), Command::Cancel { request: RequestId(10 + i as u64) }, 2);
        slowest = slowest.max(one.elapsed().as_secs_f64());
    }
    let cancel_s = cancelled.elapsed().as_secs_f64();
    println!(
        "{sets} sets of {width} names: queued in {queue_s:.3} s, withdrawn in {cancel_s:.3} s (slowest withdrawal {:.2} ms); waiters left {}",
        slowest * 1e3,
        t.waiter_count()
    );
}
