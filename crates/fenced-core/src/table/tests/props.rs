//! Property tests of the table: random command sequences against its invariants.

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
