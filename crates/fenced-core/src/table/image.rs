//! The table's image: a plain, public counterpart of its state, in a canonical order,
//! for a snapshot format to write field by field (rust-analyzer's rule: the core's
//! internals are not the wire format). Renaming or reshaping a private field of the
//! table changes [`LockTable::image`] and [`LockTable::from_image`], never a byte on
//! disk: the format is the encoder's, which writes these fields.
//!
//! Every list is in a canonical order (leases and waiters by id, locks and keys by
//! name, timers by when they fire), so equal tables give equal images, however their
//! maps and heap were built. [`LockTable::from_image`] checks the invariants the table
//! relies on (each held lock's holder and its lease name each other, each queued
//! request is a waiter of a live lease, lists are ordered and unique): a snapshot that
//! breaks them is refused at restore rather than panicking at some later apply.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use super::timers::{Timer, Timers};
use super::{Holder, Lease, Limits, Lock, LockTable, Waiter};
use crate::command::{Output, RequestId};
use crate::store::{Record, Store};
use crate::{LeaseId, LockName, Token};

/// The whole replicated state of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The limits the cluster agreed on through the log (`Command::SetLimits`); `None`
    /// until then, when each member uses its own configuration.
    pub limits: Option<Limits>,
    pub now_ms: u64,
    pub next_token: Token,
    pub last_token: Option<Token>,
    pub first_token: Token,
    pub grants_resume_at_ms: u64,
    pub effects_seq: u64,
    /// By id.
    pub leases: Vec<LeaseImage>,
    /// By name.
    pub locks: Vec<LockImage>,
    /// By request id.
    pub waiters: Vec<WaiterImage>,
    /// Queued requests that were granted, and the lock; by request id.
    pub granted: Vec<(RequestId, LockName)>,
    /// The same for queued sets: the names still held under the grant; by request id.
    pub granted_all: Vec<(RequestId, Vec<LockName>)>,
    /// By when they fire, then by the order they were set.
    pub timers: Vec<TimerImage>,
    /// How many timers were ever set (the next one's order).
    pub timers_set: u64,
    /// The fenced store's records, by key: shared with the table (an image of a store
    /// of hundreds of MiB copies no value).
    pub records: Vec<(String, Arc<Record>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseImage {
    pub id: LeaseId,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub pending_for: Option<RequestId>,
    pub implicit: bool,
    pub held: Vec<LockName>,
    pub waiting: Vec<RequestId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockImage {
    pub name: LockName,
    pub holder: Option<HolderImage>,
    pub queue: Vec<RequestId>,
    pub blocked_until_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderImage {
    pub lease: LeaseId,
    pub token: Token,
    pub lock_delay_ms: u64,
    pub label: Option<String>,
    pub told: u32,
    pub queued: Vec<RequestId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterImage {
    pub request: RequestId,
    pub name: LockName,
    pub lease: LeaseId,
    pub lock_delay_ms: u64,
    pub label: Option<String>,
    pub also: Vec<LockName>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimerImage {
    pub at_ms: u64,
    /// The order it was set in.
    pub seq: u64,
    pub what: TimerKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TimerKind {
    LeaseExpiry(LeaseId),
    WaitDeadline(RequestId),
    LockDelayEnds(LockName),
    GrantsResume,
}

fn sorted<K: Ord, V>(mut v: Vec<(K, V)>) -> Vec<(K, V)> {
    v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    v
}

impl LockTable {
    /// The table's state as an [`Image`], in canonical order.
    pub fn image(&self) -> Image {
        let leases = sorted(self.leases.iter().map(|(id, l)| (*id, l)).collect());
        let waiters = sorted(self.waiters.iter().map(|(id, w)| (*id, w)).collect());
        Image {
            limits: self.agreed_limits.then(|| self.limits.clone()),
            now_ms: self.now_ms,
            next_token: self.next_token,
            last_token: self.last_token,
            first_token: self.first_token,
            grants_resume_at_ms: self.grants_resume_at_ms,
            effects_seq: self.effects_seq,
            leases: leases.into_iter().map(|(id, l)| lease_image(id, l)).collect(),
            locks: self.locks.iter().map(|(name, l)| lock_image(name, l)).collect(),
            waiters: waiters.into_iter().map(|(id, w)| waiter_image(id, w)).collect(),
            granted: sorted(self.granted.iter().map(|(r, n)| (*r, n.clone())).collect()),
            granted_all: sorted(self.granted_all.iter().map(|(r, n)| (*r, n.clone())).collect()),
            timers: self.timers.entries().into_iter().map(timer_image).collect(),
            timers_set: self.timers.set_count(),
            records: self.store.shared_records().map(|(k, r)| (k.clone(), r.clone())).collect(),
        }
    }

    /// The table an [`Image`] describes, deciding with `limits` unless the image
    /// carries limits the cluster agreed on; refused, saying why, when the image breaks
    /// an invariant of the table.
    pub fn from_image(image: Image, limits: Limits) -> Result<LockTable, String> {
        check(&image)?;
        let Image {
            limits: agreed,
            now_ms,
            next_token,
            last_token,
            first_token,
            grants_resume_at_ms,
            effects_seq,
            leases,
            locks,
            waiters,
            granted,
            granted_all,
            timers,
            timers_set,
            records,
        } = image;
        let timers = timers.into_iter().map(|t| (t.at_ms, t.seq, timer(t.what))).collect();
        Ok(LockTable {
            agreed_limits: agreed.is_some(),
            limits: agreed.unwrap_or(limits),
            now_ms,
            next_token,
            last_token,
            first_token,
            grants_resume_at_ms,
            leases: leases.into_iter().map(lease).collect(),
            locks: locks.into_iter().map(lock).collect(),
            waiters: waiters.into_iter().map(waiter).collect(),
            waiting_names: None,
            granted: granted.into_iter().collect(),
            granted_all: granted_all.into_iter().collect(),
            timers: Timers::from_entries(timers, timers_set)?,
            store: Store::from_records(records)?,
            effects_seq,
            out: Output::default(),
            #[cfg(test)]
            break_queue_order: false,
        })
    }
}

fn lease_image(id: LeaseId, l: &Lease) -> LeaseImage {
    LeaseImage {
        id,
        ttl_ms: l.ttl_ms,
        expires_at_ms: l.expires_at_ms,
        pending_for: l.pending_for,
        implicit: l.implicit,
        held: l.held.clone(),
        waiting: l.waiting.clone(),
    }
}

fn lease(l: LeaseImage) -> (LeaseId, Lease) {
    let LeaseImage { id, ttl_ms, expires_at_ms, pending_for, implicit, held, waiting } = l;
    (id, Lease { ttl_ms, expires_at_ms, pending_for, implicit, held, waiting })
}

fn lock_image(name: &LockName, l: &Lock) -> LockImage {
    let holder = l.holder.as_ref().map(|h| HolderImage {
        lease: h.lease,
        token: h.token,
        lock_delay_ms: h.lock_delay_ms,
        label: h.label.clone(),
        told: h.told,
        queued: h.queued.clone(),
    });
    LockImage {
        name: name.clone(),
        holder,
        queue: l.queue.iter().copied().collect(),
        blocked_until_ms: l.blocked_until_ms,
    }
}

fn lock(l: LockImage) -> (LockName, Lock) {
    let holder = l.holder.map(|h| {
        let HolderImage { lease, token, lock_delay_ms, label, told, queued } = h;
        Holder { lease, token, lock_delay_ms, label, told, queued }
    });
    (l.name, Lock { holder, queue: VecDeque::from(l.queue), blocked_until_ms: l.blocked_until_ms })
}

fn waiter_image(request: RequestId, w: &Waiter) -> WaiterImage {
    WaiterImage {
        request,
        name: w.name.clone(),
        lease: w.lease,
        lock_delay_ms: w.lock_delay_ms,
        label: w.label.clone(),
        also: w.also.clone(),
    }
}

fn waiter(w: WaiterImage) -> (RequestId, Waiter) {
    let WaiterImage { request, name, lease, lock_delay_ms, label, also } = w;
    (request, Waiter { name, lease, lock_delay_ms, label, also })
}

fn timer_image((at_ms, seq, t): (u64, u64, Timer)) -> TimerImage {
    let what = match t {
        Timer::LeaseExpiry(l) => TimerKind::LeaseExpiry(l),
        Timer::WaitDeadline(r) => TimerKind::WaitDeadline(r),
        Timer::LockDelayEnds(n) => TimerKind::LockDelayEnds(n),
        Timer::GrantsResume => TimerKind::GrantsResume,
    };
    TimerImage { at_ms, seq, what }
}

fn timer(k: TimerKind) -> Timer {
    match k {
        TimerKind::LeaseExpiry(l) => Timer::LeaseExpiry(l),
        TimerKind::WaitDeadline(r) => Timer::WaitDeadline(r),
        TimerKind::LockDelayEnds(n) => Timer::LockDelayEnds(n),
        TimerKind::GrantsResume => Timer::GrantsResume,
    }
}

/// Whether `keys` strictly ascend (so they are unique too).
fn ascending<'a, K: Ord + 'a>(keys: impl Iterator<Item = &'a K>) -> bool {
    let mut keys = keys.peekable();
    while let Some(k) = keys.next() {
        if keys.peek().is_some_and(|next| *next <= k) {
            return false;
        }
    }
    true
}

/// The invariants the table's code relies on (its `expect`s), so a damaged or crafted
/// image is refused here and not at some later apply.
fn check(i: &Image) -> Result<(), String> {
    if !ascending(i.leases.iter().map(|l| &l.id)) {
        return Err("its leases are not in order, or one repeats".into());
    }
    if !ascending(i.locks.iter().map(|l| &l.name)) {
        return Err("its locks are not in order, or one repeats".into());
    }
    if !ascending(i.waiters.iter().map(|w| &w.request)) {
        return Err("its waiters are not in order, or one repeats".into());
    }
    if i.last_token.is_some_and(|t| t >= i.next_token) || i.first_token > i.next_token {
        return Err(format!("its next token {} is not above those it issued", i.next_token.get()));
    }
    check_holders(i)?;
    let leases: BTreeSet<LeaseId> = i.leases.iter().map(|l| l.id).collect();
    let waiters: BTreeMap<RequestId, LeaseId> = i.waiters.iter().map(|w| (w.request, w.lease)).collect();
    if let Some(w) = i.waiters.iter().find(|w| !leases.contains(&w.lease)) {
        return Err(format!("waiter {} waits under a lease it does not have", w.request.0));
    }
    for l in &i.locks {
        if let Some(r) = l.queue.iter().find(|r| !waiters.contains_key(r)) {
            return Err(format!("lock {} queues request {}, which is not a waiter", l.name, r.0));
        }
    }
    Ok(())
}

/// Each held lock's holder names a live lease that lists the lock, and each lease's
/// list names only locks it holds, once.
fn check_holders(i: &Image) -> Result<(), String> {
    let mut held: HashMap<(LeaseId, &LockName), ()> = HashMap::new();
    for l in &i.leases {
        for name in &l.held {
            if held.insert((l.id, name), ()).is_some() {
                return Err(format!("a lease lists lock {name} twice"));
            }
        }
    }
    let mut holders = 0;
    for l in &i.locks {
        if let Some(h) = &l.holder {
            holders += 1;
            if !held.contains_key(&(h.lease, &l.name)) {
                return Err(format!("lock {}'s holder is not a live lease that lists it", l.name));
            }
        }
    }
    if holders != held.len() {
        return Err("a lease lists a lock it does not hold".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
