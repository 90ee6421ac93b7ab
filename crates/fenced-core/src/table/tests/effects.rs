//! Effects of entries: the store gate's decisions, positions that only grow, renewals
//! taken before their batch's time moves.

use super::*;

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
