//! The lock table: leases, exclusive named locks, FIFO waiters and token minting.
//!
//! A deterministic state machine in the style of quinn-proto: every call takes the
//! caller's monotonic `now_ms`, the table tells the caller its next deadline
//! (`poll_timeout`), the caller calls back (`handle_timeout`), and everything that
//! happened (grants to waiters, releases, expiries, waiters that gave up) comes out as
//! [`Effect`] values through [`LockTable::drain_effects`].
//!
//! Every public call first runs the timers that are due, so the answer is right at
//! `now_ms` even when the driver's wake-up comes late.

mod timers;

use std::collections::{BTreeMap, HashMap, VecDeque};

use rustc_hash::FxBuildHasher;

use crate::{LeaseId, LockName, Token};
use timers::{Timer, Timers};

/// Bounds on everything a client controls. Each is a named setting in the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Live leases at once.
    pub leases_max: usize,
    /// Lock entries at once (held, or with waiters, or in lock-delay).
    pub locks_max: usize,
    /// Waiters at once, over all locks.
    pub waiters_max: usize,
    /// Waiters queued on one lock.
    pub waiters_per_lock_max: usize,
    pub ttl_ms_min: u64,
    pub ttl_ms_max: u64,
    /// The longest an acquire may wait.
    pub wait_ms_max: u64,
    pub lock_delay_ms_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            leases_max: 1_000_000,
            locks_max: 1_000_000,
            waiters_max: 100_000,
            waiters_per_lock_max: 10_000,
            ttl_ms_min: 100,
            ttl_ms_max: 300_000,
            wait_ms_max: 300_000,
            lock_delay_ms_max: 60_000,
        }
    }
}

/// A queued acquire, named so that the driver can match the grant to its caller.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct WaiterId(pub u64);

/// A lock granted to a lease.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Grant {
    pub name: LockName,
    pub token: Token,
    pub lease: LeaseId,
    pub ttl_ms: u64,
}

/// A lease as the table sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LeaseInfo {
    pub id: LeaseId,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

/// A lock as the table sees it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LockInfo {
    pub name: LockName,
    /// The holder's token and lease, when held.
    pub holder: Option<(Token, LeaseInfo)>,
    pub waiters: usize,
    /// Set while a lock-delay keeps the lock from being granted.
    pub blocked_until_ms: Option<u64>,
}

/// The answer to an acquire.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum AcquireOutcome {
    /// Granted now; `fresh` is false for an idempotent re-acquire by the holder.
    Granted { grant: Grant, fresh: bool },
    /// Queued: the grant or the time-out arrives later as an [`Effect`].
    Queued(WaiterId),
    /// Not granted and not allowed to wait (wait 0). `holder` is the holder's token, if
    /// any: a free lock can still refuse during lock-delay or the start-up grace.
    NotGranted { holder: Option<Token> },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LeaseError {
    NotFound,
    TtlOutOfRange {
        ttl_ms_min: u64,
        ttl_ms_max: u64,
    },
    TooManyLeases {
        leases_max: usize,
    },
    /// The caller reused a live lease id; the server draws 128 random bits, so this is
    /// a bug or an attack, never a coincidence.
    AlreadyExists,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AcquireError {
    LeaseNotFound,
    TooManyLocks { locks_max: usize },
    TooManyWaiters { waiters_max: usize },
    WaitOutOfRange { wait_ms_max: u64 },
    LockDelayOutOfRange { lock_delay_ms_max: u64 },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReleaseError {
    /// The lease does not hold the lock; `holder` is the token of whoever does.
    NotHolder { holder: Option<Token> },
}

/// Why a holder stopped holding.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReleaseReason {
    Released,
    Revoked,
    Expired,
}

/// Why a waiter left the queue without a grant.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WaitEnd {
    TimedOut,
    Cancelled,
    /// Its lease expired or was revoked while it waited.
    LeaseGone,
}

/// What happened, in order. The driver executes these its own way.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Effect {
    /// A lock was granted: to a queued waiter (`waiter` is `Some`) or directly.
    Granted { at_ms: u64, waiter: Option<WaiterId>, grant: Grant },
    /// A holder stopped holding.
    Released { at_ms: u64, name: LockName, token: Token, lease: LeaseId, reason: ReleaseReason },
    /// A lease ended by expiry (its locks follow as `Released` with `Expired`).
    LeaseExpired { at_ms: u64, lease: LeaseId },
    /// A waiter left the queue without the lock.
    WaitEnded { at_ms: u64, waiter: WaiterId, name: LockName, reason: WaitEnd },
}

/// One acquire request.
#[derive(Clone, Debug)]
pub struct Acquire {
    pub name: LockName,
    pub lease: LeaseId,
    /// 0 is a try-lock.
    pub wait_ms: u64,
    /// Lock-delay the lock gets if this holder's lease expires while holding it.
    pub lock_delay_ms: u64,
}

#[derive(Debug)]
struct Lease {
    ttl_ms: u64,
    expires_at_ms: u64,
    /// Locks held under this lease.
    held: Vec<LockName>,
    /// Acquires of this lease still queued.
    waiting: Vec<WaiterId>,
}

#[derive(Debug)]
struct Holder {
    lease: LeaseId,
    token: Token,
    lock_delay_ms: u64,
}

#[derive(Debug, Default)]
struct Lock {
    holder: Option<Holder>,
    /// FIFO; every id here is in `LockTable::waiters`.
    queue: VecDeque<WaiterId>,
    /// Lock-delay: no grant before this time.
    blocked_until_ms: u64,
}

#[derive(Debug)]
struct Waiter {
    name: LockName,
    lease: LeaseId,
    lock_delay_ms: u64,
}

/// The lock table. See the module documentation.
#[derive(Debug)]
pub struct LockTable {
    limits: Limits,
    now_ms: u64,
    /// The next token to mint; strictly above every token minted before.
    next_token: Token,
    last_token: Option<Token>,
    /// Start-up grace: nothing is granted before this time.
    grants_resume_at_ms: u64,
    leases: HashMap<LeaseId, Lease, FxBuildHasher>,
    locks: BTreeMap<LockName, Lock>,
    waiters: HashMap<WaiterId, Waiter, FxBuildHasher>,
    next_waiter: u64,
    timers: Timers,
    effects: Vec<Effect>,
}

impl LockTable {
    /// A table whose first token will be `first_token` (the persisted ceiling after a
    /// restart) and which grants nothing before `grants_resume_at_ms` (the start-up
    /// grace; 0 for none).
    pub fn new(limits: Limits, first_token: Token, grants_resume_at_ms: u64) -> LockTable {
        let mut timers = Timers::default();
        if grants_resume_at_ms > 0 {
            timers.push(grants_resume_at_ms, Timer::GrantsResume);
        }
        LockTable {
            limits,
            now_ms: 0,
            next_token: first_token,
            last_token: None,
            grants_resume_at_ms,
            leases: HashMap::default(),
            locks: BTreeMap::new(),
            waiters: HashMap::default(),
            next_waiter: 1,
            timers,
            effects: Vec::new(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The last token minted, if any. The driver makes its ceiling durable above this
    /// before it hands the token to anyone.
    pub fn last_token(&self) -> Option<Token> {
        self.last_token
    }

    /// True while the start-up grace holds every grant back.
    pub fn in_grace(&self, now_ms: u64) -> bool {
        now_ms < self.grants_resume_at_ms
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }
    pub fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    /// The earliest time at which `handle_timeout` has work; may be early, never late.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.next_at()
    }

    /// Runs every timer due at `now_ms`.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.advance(now_ms);
    }

    /// Everything that happened since the last drain, in order.
    pub fn drain_effects(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }

    /// Creates a lease with a caller-chosen id.
    pub fn grant_lease(&mut self, id: LeaseId, ttl_ms: u64, now_ms: u64) -> Result<LeaseInfo, LeaseError> {
        self.advance(now_ms);
        let Limits { ttl_ms_min, ttl_ms_max, leases_max, .. } = self.limits;
        if !(ttl_ms_min..=ttl_ms_max).contains(&ttl_ms) {
            return Err(LeaseError::TtlOutOfRange { ttl_ms_min, ttl_ms_max });
        }
        if self.leases.contains_key(&id) {
            return Err(LeaseError::AlreadyExists);
        }
        if self.leases.len() >= leases_max {
            return Err(LeaseError::TooManyLeases { leases_max });
        }
        let expires_at_ms = now_ms + ttl_ms;
        self.leases.insert(id, Lease { ttl_ms, expires_at_ms, held: Vec::new(), waiting: Vec::new() });
        self.push_timer(expires_at_ms, Timer::LeaseExpiry(id));
        Ok(LeaseInfo { id, ttl_ms, expires_at_ms })
    }

    /// Extends a live lease to `now_ms + ttl`. Costs a hash lookup: no timer is touched
    /// (the expiry timer re-arms itself lazily when it fires early).
    pub fn keepalive(&mut self, id: LeaseId, now_ms: u64) -> Result<LeaseInfo, LeaseError> {
        self.advance(now_ms);
        let lease = self.leases.get_mut(&id).ok_or(LeaseError::NotFound)?;
        lease.expires_at_ms = now_ms + lease.ttl_ms;
        Ok(LeaseInfo { id, ttl_ms: lease.ttl_ms, expires_at_ms: lease.expires_at_ms })
    }

    pub fn lease(&mut self, id: LeaseId, now_ms: u64) -> Option<LeaseInfo> {
        self.advance(now_ms);
        self.lease_info(id)
    }

    /// Ends a lease now; its locks are released (no lock-delay: this is not an expiry)
    /// and its waiters leave their queues.
    pub fn revoke(&mut self, id: LeaseId, now_ms: u64) -> Result<(), LeaseError> {
        self.advance(now_ms);
        if !self.leases.contains_key(&id) {
            return Err(LeaseError::NotFound);
        }
        self.end_lease(id, ReleaseReason::Revoked);
        Ok(())
    }

    /// Acquires `req.name` for `req.lease`, at once, or queues for up to `req.wait_ms`.
    pub fn acquire(&mut self, req: Acquire, now_ms: u64) -> Result<AcquireOutcome, AcquireError> {
        self.advance(now_ms);
        if req.wait_ms > self.limits.wait_ms_max {
            return Err(AcquireError::WaitOutOfRange { wait_ms_max: self.limits.wait_ms_max });
        }
        if req.lock_delay_ms > self.limits.lock_delay_ms_max {
            let lock_delay_ms_max = self.limits.lock_delay_ms_max;
            return Err(AcquireError::LockDelayOutOfRange { lock_delay_ms_max });
        }
        let Some(lease) = self.leases.get(&req.lease) else {
            return Err(AcquireError::LeaseNotFound);
        };
        let ttl_ms = lease.ttl_ms;
        if let Some(lock) = self.locks.get(&req.name) {
            if let Some(holder) = lock.holder.as_ref().filter(|h| h.lease == req.lease) {
                // A retried request must not mint a second token.
                let grant = Grant { name: req.name, token: holder.token, lease: req.lease, ttl_ms };
                return Ok(AcquireOutcome::Granted { grant, fresh: false });
            }
        } else if self.locks.len() >= self.limits.locks_max {
            return Err(AcquireError::TooManyLocks { locks_max: self.limits.locks_max });
        }
        let grantable = self.grants_open(now_ms)
            && self
                .locks
                .get(&req.name)
                .is_none_or(|l| l.holder.is_none() && l.queue.is_empty() && l.blocked_until_ms <= now_ms);
        if grantable {
            let lock = self.locks.entry(req.name.clone()).or_default();
            let grant = install_holder(
                lock,
                &mut self.next_token,
                &mut self.last_token,
                req.name,
                req.lease,
                ttl_ms,
                req.lock_delay_ms,
            );
            self.leases.get_mut(&req.lease).expect("checked above").held.push(grant.name.clone());
            self.effects.push(Effect::Granted { at_ms: now_ms, waiter: None, grant: grant.clone() });
            return Ok(AcquireOutcome::Granted { grant, fresh: true });
        }
        let holder = self.locks.get(&req.name).and_then(|l| l.holder.as_ref()).map(|h| h.token);
        if req.wait_ms == 0 {
            return Ok(AcquireOutcome::NotGranted { holder });
        }
        self.enqueue(req, now_ms).map(AcquireOutcome::Queued)
    }

    /// Withdraws a queued acquire (its caller gave up or disconnected). False when it
    /// is no longer queued: already granted, timed out or cancelled.
    pub fn cancel_wait(&mut self, waiter: WaiterId, now_ms: u64) -> bool {
        self.advance(now_ms);
        let Some(w) = self.waiters.get(&waiter) else { return false };
        let name = w.name.clone();
        self.end_wait(waiter, WaitEnd::Cancelled);
        self.grant_next(&name);
        true
    }

    /// Releases `name` if `lease` holds it; the next waiter is granted at once.
    pub fn release(&mut self, name: &LockName, lease: LeaseId, now_ms: u64) -> Result<Token, ReleaseError> {
        self.advance(now_ms);
        let lock = self.locks.get(name);
        let holder = lock.and_then(|l| l.holder.as_ref());
        match holder {
            Some(h) if h.lease == lease => {
                let token = h.token;
                self.drop_holder(name, ReleaseReason::Released);
                Ok(token)
            }
            _ => Err(ReleaseError::NotHolder { holder: holder.map(|h| h.token) }),
        }
    }

    /// Chubby's CheckSequencer: is `token` the current holder's token of `name`?
    /// Returns that answer and the current holder's token, if any.
    pub fn check(&mut self, name: &LockName, token: Token, now_ms: u64) -> (bool, Option<Token>) {
        self.advance(now_ms);
        let current = self.locks.get(name).and_then(|l| l.holder.as_ref()).map(|h| h.token);
        (current == Some(token), current)
    }

    pub fn lock(&mut self, name: &LockName, now_ms: u64) -> Option<LockInfo> {
        self.advance(now_ms);
        self.locks.get(name).map(|l| self.lock_info(name, l))
    }

    /// Locks whose names start with `prefix`, in name order, at most `limit` of them.
    pub fn locks_with_prefix(&mut self, prefix: &str, limit: usize, now_ms: u64) -> Vec<LockInfo> {
        self.advance(now_ms);
        let start = LockName::new(prefix).ok();
        let range = match &start {
            Some(s) => self.locks.range(s.clone()..),
            None => self.locks.range(..),
        };
        range
            .take_while(|(n, _)| n.as_str().starts_with(prefix))
            .take(limit)
            .map(|(n, l)| self.lock_info(n, l))
            .collect()
    }

    fn lock_info(&self, name: &LockName, lock: &Lock) -> LockInfo {
        LockInfo {
            name: name.clone(),
            holder: lock.holder.as_ref().map(|h| (h.token, self.lease_info(h.lease).expect("holder lease is live"))),
            waiters: lock.queue.len(),
            blocked_until_ms: (lock.blocked_until_ms > self.now_ms).then_some(lock.blocked_until_ms),
        }
    }

    fn lease_info(&self, id: LeaseId) -> Option<LeaseInfo> {
        self.leases.get(&id).map(|l| LeaseInfo { id, ttl_ms: l.ttl_ms, expires_at_ms: l.expires_at_ms })
    }

    /// Arms a timer, first sweeping out dead entries when they outnumber the live
    /// subjects (see `timers.rs`).
    fn push_timer(&mut self, at_ms: u64, timer: Timer) {
        let live = self.leases.len() + self.waiters.len() + self.locks.len() + 1;
        if self.timers.len() > 2 * live + 1_024 {
            let (leases, waiters, locks) = (&self.leases, &self.waiters, &self.locks);
            self.timers.retain(|t| match t {
                Timer::LeaseExpiry(id) => leases.contains_key(id),
                Timer::WaitDeadline(w) => waiters.contains_key(w),
                Timer::LockDelayEnds(name) => locks.contains_key(name),
                Timer::GrantsResume => true,
            });
        }
        self.timers.push(at_ms, timer);
    }

    /// Timer entries held, live or dead (for tests and metrics).
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    fn grants_open(&self, now_ms: u64) -> bool {
        now_ms >= self.grants_resume_at_ms
    }

    fn enqueue(&mut self, req: Acquire, now_ms: u64) -> Result<WaiterId, AcquireError> {
        if self.waiters.len() >= self.limits.waiters_max {
            return Err(AcquireError::TooManyWaiters { waiters_max: self.limits.waiters_max });
        }
        let lock = self.locks.entry(req.name.clone()).or_default();
        if lock.queue.len() >= self.limits.waiters_per_lock_max {
            let waiters_max = self.limits.waiters_per_lock_max;
            return Err(AcquireError::TooManyWaiters { waiters_max });
        }
        let id = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        lock.queue.push_back(id);
        self.leases.get_mut(&req.lease).expect("checked by acquire").waiting.push(id);
        self.push_timer(now_ms + req.wait_ms, Timer::WaitDeadline(id));
        self.waiters.insert(id, Waiter { name: req.name, lease: req.lease, lock_delay_ms: req.lock_delay_ms });
        Ok(id)
    }

    /// Runs the timers due at `now_ms`, in time order.
    fn advance(&mut self, now_ms: u64) {
        assert!(now_ms >= self.now_ms, "time went backwards: {now_ms} < {}", self.now_ms);
        while let Some((at_ms, timer)) = self.timers.pop_due(now_ms) {
            // Each timer runs at its own time, so effects carry the moment they happened.
            self.now_ms = self.now_ms.max(at_ms);
            match timer {
                Timer::LeaseExpiry(id) => {
                    let Some(lease) = self.leases.get(&id) else { continue };
                    if lease.expires_at_ms > at_ms {
                        // Kept alive since this timer was armed: re-arm at the new expiry.
                        self.timers.push(lease.expires_at_ms, Timer::LeaseExpiry(id));
                        continue;
                    }
                    self.effects.push(Effect::LeaseExpired { at_ms, lease: id });
                    self.end_lease(id, ReleaseReason::Expired);
                }
                Timer::WaitDeadline(id) => {
                    if let Some(w) = self.waiters.get(&id) {
                        let name = w.name.clone();
                        self.end_wait(id, WaitEnd::TimedOut);
                        self.grant_next(&name);
                    }
                }
                Timer::LockDelayEnds(name) => self.grant_next(&name),
                Timer::GrantsResume => {
                    let waiting: Vec<LockName> =
                        self.locks.iter().filter(|(_, l)| !l.queue.is_empty()).map(|(n, _)| n.clone()).collect();
                    for name in waiting {
                        self.grant_next(&name);
                    }
                }
            }
        }
        self.now_ms = now_ms;
    }

    /// Removes a lease: releases its locks and withdraws its waiters.
    fn end_lease(&mut self, id: LeaseId, reason: ReleaseReason) {
        let lease = self.leases.remove(&id).expect("caller checked the lease");
        for waiter in lease.waiting {
            if self.waiters.contains_key(&waiter) {
                let name = self.waiters[&waiter].name.clone();
                self.end_wait_of_gone_lease(waiter);
                self.grant_next(&name);
            }
        }
        for name in lease.held {
            self.release_held(&name, id, reason);
        }
    }

    fn end_wait_of_gone_lease(&mut self, waiter: WaiterId) {
        let w = self.waiters.remove(&waiter).expect("checked");
        if let Some(lock) = self.locks.get_mut(&w.name) {
            lock.queue.retain(|q| *q != waiter);
        }
        self.effects.push(Effect::WaitEnded { at_ms: self.now_ms, waiter, name: w.name, reason: WaitEnd::LeaseGone });
    }

    /// Called for a lock in the `held` list of a lease that is ending.
    fn release_held(&mut self, name: &LockName, lease: LeaseId, reason: ReleaseReason) {
        let lock = self.locks.get_mut(name).expect("a held lock has an entry");
        let holder = lock.holder.as_ref().expect("a held lock has a holder");
        assert_eq!(holder.lease, lease, "lease and lock disagree on the holder");
        if reason == ReleaseReason::Expired && holder.lock_delay_ms > 0 {
            lock.blocked_until_ms = self.now_ms + holder.lock_delay_ms;
            self.timers.push(lock.blocked_until_ms, Timer::LockDelayEnds(name.clone()));
        }
        self.clear_holder(name, reason);
    }

    /// Explicit release: drop the holder and take it off its lease's list.
    fn drop_holder(&mut self, name: &LockName, reason: ReleaseReason) {
        let lease_id = self.locks[name].holder.as_ref().expect("held").lease;
        if let Some(lease) = self.leases.get_mut(&lease_id) {
            lease.held.retain(|n| n != name);
        }
        self.clear_holder(name, reason);
    }

    fn clear_holder(&mut self, name: &LockName, reason: ReleaseReason) {
        let lock = self.locks.get_mut(name).expect("held");
        let h = lock.holder.take().expect("held");
        self.effects.push(Effect::Released {
            at_ms: self.now_ms,
            name: name.clone(),
            token: h.token,
            lease: h.lease,
            reason,
        });
        self.grant_next(name);
    }

    fn end_wait(&mut self, waiter: WaiterId, reason: WaitEnd) {
        let w = self.waiters.remove(&waiter).expect("caller checked the waiter");
        if let Some(lock) = self.locks.get_mut(&w.name) {
            lock.queue.retain(|q| *q != waiter);
        }
        if let Some(lease) = self.leases.get_mut(&w.lease) {
            lease.waiting.retain(|q| *q != waiter);
        }
        self.effects.push(Effect::WaitEnded { at_ms: self.now_ms, waiter, name: w.name, reason });
    }

    /// Grants `name` to the first waiter when nothing holds it back, and forgets lock
    /// entries that have nothing left to remember.
    fn grant_next(&mut self, name: &LockName) {
        let now_ms = self.now_ms;
        let open = self.grants_open(now_ms);
        let Some(lock) = self.locks.get_mut(name) else { return };
        if lock.holder.is_none() && open && lock.blocked_until_ms <= now_ms {
            if let Some(waiter_id) = lock.queue.pop_front() {
                let w = self.waiters.remove(&waiter_id).expect("queued waiters are registered");
                let lease = self.leases.get_mut(&w.lease).expect("waiters of gone leases are withdrawn");
                lease.waiting.retain(|q| *q != waiter_id);
                lease.held.push(name.clone());
                let grant = install_holder(
                    lock,
                    &mut self.next_token,
                    &mut self.last_token,
                    name.clone(),
                    w.lease,
                    lease.ttl_ms,
                    w.lock_delay_ms,
                );
                self.effects.push(Effect::Granted { at_ms: now_ms, waiter: Some(waiter_id), grant: grant.clone() });
                // Other queued acquires of the same lease on this lock (a retried
                // request) get the same grant: same lease, same token. Found through
                // the lease's own short list, not by scanning the queue.
                if lease.waiting.is_empty() {
                    return self.forget_if_idle(name);
                }
                let twins: Vec<WaiterId> =
                    lease.waiting.iter().copied().filter(|id| self.waiters[id].name == *name).collect();
                for twin in twins {
                    lock.queue.retain(|q| *q != twin);
                    self.waiters.remove(&twin);
                    lease.waiting.retain(|q| *q != twin);
                    self.effects.push(Effect::Granted { at_ms: now_ms, waiter: Some(twin), grant: grant.clone() });
                }
            }
        }
        self.forget_if_idle(name);
    }

    fn forget_if_idle(&mut self, name: &LockName) {
        let now_ms = self.now_ms;
        if self
            .locks
            .get(name)
            .is_some_and(|l| l.holder.is_none() && l.queue.is_empty() && l.blocked_until_ms <= now_ms)
        {
            self.locks.remove(name);
        }
    }
}

/// Mints the next token and makes `lease` the holder. The one place a token is born.
fn install_holder(
    lock: &mut Lock,
    next_token: &mut Token,
    last_token: &mut Option<Token>,
    name: LockName,
    lease: LeaseId,
    ttl_ms: u64,
    lock_delay_ms: u64,
) -> Grant {
    assert!(lock.holder.is_none(), "granting a held lock");
    let token = *next_token;
    // Invariant: every token is greater than every token minted before it.
    assert!(last_token.is_none_or(|last| token > last), "token {token} not above {last_token:?}");
    *next_token = token.next();
    *last_token = Some(token);
    lock.holder = Some(Holder { lease, token, lock_delay_ms });
    Grant { name, token, lease, ttl_ms }
}

#[cfg(test)]
mod tests;
