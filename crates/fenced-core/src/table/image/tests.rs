//! An image is the whole state: a table rebuilt from it is the same table (same image,
//! same answers and effects to every later command), and an image that breaks the
//! table's invariants is refused.

use proptest::prelude::*;

use super::*;
use crate::command::{Acquire, AcquireAll, Command, LeaseRef};
use crate::store::{Quotas, StoreCommand};

mod refused;

fn n(i: u8) -> LockName {
    LockName::new(&format!("l{i}")).unwrap()
}

/// One command of a small world: four leases (some implicit), five locks, waits,
/// sets, lock-delays, releases, revokes, cancels, promotes, store writes and time.
fn command() -> impl Strategy<Value = (Command, u64)> {
    let lease = 1u128..5;
    let cmd = prop_oneof![
        (lease.clone(), 100u64..3_000).prop_map(|(l, ttl_ms)| Command::GrantLease { lease: LeaseId(l), ttl_ms }),
        lease.clone().prop_map(|l| Command::Keepalive { lease: LeaseId(l) }),
        (lease.clone(), 0u8..5, 0u64..2_000, 0u64..500, any::<bool>(), any::<bool>()).prop_map(
            |(l, i, wait_ms, lock_delay_ms, implicit, label)| Command::Acquire(Acquire {
                name: n(i),
                lease: if implicit {
                    LeaseRef::Implicit { id: LeaseId(l + 100), ttl_ms: 1_000 }
                } else {
                    LeaseRef::Existing(LeaseId(l))
                },
                wait_ms,
                lock_delay_ms,
                holder: label.then(|| format!("h{l}")),
            })
        ),
        (lease.clone(), proptest::collection::vec(0u8..5, 1..4), 0u64..2_000).prop_map(|(l, names, wait_ms)| {
            Command::AcquireAll(AcquireAll {
                names: names.into_iter().map(n).collect(),
                lease: LeaseRef::Existing(LeaseId(l)),
                wait_ms,
                lock_delay_ms: 0,
                holder: None,
            })
        }),
        (lease.clone(), 0u8..5).prop_map(|(l, i)| Command::Release { name: n(i), lease: LeaseId(l) }),
        lease.clone().prop_map(|l| Command::Revoke { lease: LeaseId(l) }),
        (0u64..40).prop_map(|r| Command::Cancel { request: RequestId(r) }),
        Just(Command::Promote),
        Just(Command::Tick),
        (0u8..3, 1u64..30, proptest::collection::vec(any::<u8>(), 0..8)).prop_map(|(k, t, value)| {
            Command::Store(StoreCommand::Write {
                key: format!("k{k}"),
                token: Token::new(t).unwrap(),
                value,
                foreign: true,
                quotas: Quotas::default(),
            })
        }),
    ];
    (cmd, 0u64..400)
}

fn run(t: &mut LockTable, cmds: &[(Command, u64)], first: u64) -> Vec<String> {
    let mut now = t.now_ms();
    let mut seen = Vec::new();
    for (i, (cmd, step)) in cmds.iter().enumerate() {
        now += step;
        let out = t.apply(RequestId(first + i as u64), cmd.clone(), now);
        seen.push(format!("{:?} {:?} {:?}", out.answers, out.effects, out.queued));
    }
    seen
}

fn limits() -> Limits {
    Limits { waiters_per_lock_max: 3, ..Limits::default() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any schedule, cut anywhere: the table rebuilt from its image has the same image
    /// and decides every later command exactly as the original does.
    #[test]
    fn a_table_rebuilt_from_its_image_is_the_same_table(
        before in proptest::collection::vec(command(), 0..40),
        after in proptest::collection::vec(command(), 0..20),
    ) {
        let mut t = LockTable::new(limits());
        run(&mut t, &before, 0);
        let image = t.image();
        let mut back = LockTable::from_image(image.clone(), limits()).unwrap();
        prop_assert_eq!(back.image(), image);
        prop_assert_eq!(run(&mut back, &after, 1_000), run(&mut t, &after, 1_000));
        prop_assert_eq!(back.image(), t.image());
    }
}
