//! An image that breaks the table's invariants is refused, saying what; what else an
//! image carries (agreed limits, the store's usage, counted again) comes back the same.

use super::*;

fn busy() -> LockTable {
    let mut t = LockTable::new(limits());
    let acquire = |l: u128, i: u8, wait_ms: u64| {
        Command::Acquire(Acquire {
            name: n(i),
            lease: LeaseRef::Existing(LeaseId(l)),
            wait_ms,
            lock_delay_ms: 10,
            holder: None,
        })
    };
    let cmds = [
        (Command::GrantLease { lease: LeaseId(1), ttl_ms: 1_000 }, 0),
        (Command::GrantLease { lease: LeaseId(2), ttl_ms: 1_000 }, 0),
        (acquire(1, 0, 0), 1),
        (acquire(2, 0, 500), 1),
        (acquire(2, 1, 0), 1),
    ];
    run(&mut t, &cmds, 0);
    assert_eq!((t.lease_count(), t.lock_count(), t.waiter_count()), (2, 2, 1));
    t
}

#[track_caller]
fn refused(image: Image, why: &str) {
    match LockTable::from_image(image, limits()) {
        Err(e) => assert!(e.contains(why), "{e}"),
        Ok(_) => panic!("an image that {why} was taken"),
    }
}

/// The negative controls of the invariant check: each breaks one thing a later apply
/// would panic on (or decide wrongly by), and each is refused, saying what.
#[test]
fn an_image_that_breaks_the_tables_invariants_is_refused() {
    let good = busy().image();
    LockTable::from_image(good.clone(), limits()).unwrap();

    let mut i = good.clone();
    i.waiters[0].lease = LeaseId(9);
    refused(i, "lease it does not have");

    let mut i = good.clone();
    i.leases.remove(0);
    refused(i, "holder is not a live lease");

    let mut i = good.clone();
    i.leases.swap(0, 1);
    refused(i, "leases are not in order");

    let mut i = good.clone();
    i.locks[0].queue.push(RequestId(77));
    refused(i, "which is not a waiter");

    let mut i = good.clone();
    let name = i.leases[0].held[0].clone();
    i.leases[0].held.push(name);
    refused(i, "twice");

    let mut i = good.clone();
    i.locks[1].holder = None;
    refused(i, "does not hold");

    let mut i = good.clone();
    i.next_token = i.last_token.unwrap();
    refused(i, "not above those it issued");

    let mut i = good.clone();
    i.timers.reverse();
    refused(i, "timers are out of order");

    let mut i = good.clone();
    i.records = vec![("b".into(), Default::default()), ("a".into(), Default::default())];
    refused(i, "keys are not in order");
}

/// Limits agreed through the log travel in the image and outrank a member's own;
/// limits that were never agreed do not travel, and the member's own apply.
#[test]
fn agreed_limits_travel_in_the_image_and_outrank_a_members_own() {
    let mut t = busy();
    assert_eq!(t.image().limits, None);
    let mine = Limits { locks_max: 7, ..limits() };
    assert_eq!(LockTable::from_image(t.image(), mine.clone()).unwrap().limits(), &mine);

    let agreed = Limits { locks_max: 2, ..limits() };
    t.apply(RequestId(90), Command::SetLimits(agreed.clone()), 10);
    let mut back = LockTable::from_image(t.image(), mine.clone()).unwrap();
    assert_eq!(back.limits(), &agreed);
    back.set_limits(mine);
    assert_eq!(back.limits(), &agreed, "a member's configuration does not override the cluster's");
    let out = back.apply(
        RequestId(91),
        Command::Acquire(Acquire {
            name: n(4),
            lease: LeaseRef::Existing(LeaseId(1)),
            wait_ms: 0,
            lock_delay_ms: 0,
            holder: None,
        }),
        11,
    );
    assert!(matches!(out.answers[0].1, Err(crate::Error::TooManyLocks { .. })), "{:?}", out.answers);
}

/// The store's usage is counted again from its records, to the same figures.
#[test]
fn a_stores_usage_is_counted_again_from_its_records() {
    let mut t = LockTable::new(limits());
    for (i, v) in [&b"one"[..], b"", b"three"].iter().enumerate() {
        let cmd = StoreCommand::WriteUnfenced { key: format!("k{i}"), value: v.to_vec(), quotas: Quotas::default() };
        t.apply(RequestId(i as u64), Command::Store(cmd), 1);
    }
    let back = LockTable::from_image(t.image(), limits()).unwrap();
    assert_eq!(back.store().usage(), t.store().usage());
    assert_eq!(back.store().usage().0, 3);
}
