//! Tests of the lock table through its one input, `apply`, and its views.

use super::*;

mod effects;
mod expiry;
mod leadership;
mod props;
mod queue;
mod release;
mod retries;
mod shim;
mod table_wide;
mod withdrawn;

use shim::{AcquireOutcome, T};

const TTL: u64 = 1_000;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
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
