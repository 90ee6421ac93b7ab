//! The lock table: leases, exclusive named locks, FIFO waiters and token minting, and
//! every rule of the lock service (implicit leases, twin requests of one lease,
//! lock-delay, `Promote`, and the start-up grace of a migrated data directory).
//!
//! A deterministic state machine: the only way to change it is [`LockTable::apply`],
//! one [`Command`] at a timestamp, whose [`Output`] says everything that happened
//! (answers by request, effects, queued acquires). Views borrow `&self`, never
//! move time and never change anything; the table tells the driver its next deadline
//! (`poll_timeout`) and the driver applies [`Command::Tick`] then (quinn-proto's four
//! kinds of method, openraft's engine/runtime split).
//!
//! `apply` first runs the timers due at its timestamp, so a command sees the state at
//! `now_ms` even when the driver's tick comes late.

pub mod image;
mod timers;

use std::collections::{BTreeMap, HashMap, VecDeque};

use rustc_hash::FxBuildHasher;

use crate::command::{Acquire, AcquireAll, Answer, Command, LeaseRef, Output, RequestId, LOCK_NAMES_MAX};
use crate::error::Error;
use crate::store::{Store, StoreCommand};
use crate::{LeaseId, LockName, Token};
use timers::{Timer, Timers};

/// Bounds on everything a client controls. Each is a named setting in the server.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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

/// A lock granted to a lease.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Grant {
    pub name: LockName,
    pub token: Token,
    pub lease: LeaseId,
    pub ttl_ms: u64,
}

/// A lease as the table sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// The holder's label, when held and it gave one.
    pub label: Option<String>,
    pub waiters: usize,
    /// Set while a lock-delay keeps the lock from being granted.
    pub blocked_until_ms: Option<u64>,
}

/// Why a holder stopped holding.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReleaseReason {
    /// Given back by its holder: a `Release`, or the end (`Revoke`) of the implicit
    /// lease it was acquired with.
    Released,
    /// Its (explicit) lease was revoked, or the caller of its grant went away.
    Revoked,
    Expired,
    /// Taken from its holder by an operator (`Command::RevokeLock`).
    Forced,
}

/// Why a waiter left the queue without a grant.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WaitEnd {
    TimedOut,
    Cancelled,
    /// Its lease expired or was revoked while it waited.
    LeaseGone,
}

/// What happened, in order: the events observers see.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Effect {
    /// A lock was granted: to a queued request (`request` is `Some`) or directly.
    Granted { at_ms: u64, request: Option<RequestId>, grant: Grant, holder: Option<String> },
    /// A holder stopped holding.
    Released { at_ms: u64, name: LockName, token: Token, lease: LeaseId, reason: ReleaseReason },
    /// A lease ended by expiry (its locks follow as `Released` with `Expired`).
    LeaseExpired { at_ms: u64, lease: LeaseId },
    /// A queued request left the queue without the lock.
    WaitEnded { at_ms: u64, request: RequestId, name: LockName, reason: WaitEnd },
    /// The fenced store's gate decided a fenced write or read of `key` with `token`.
    StoreFenced { at_ms: u64, key: String, op: crate::gate::Op, token: Token, outcome: StoreOutcome },
}

/// How the fenced store's gate decided one fenced operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreOutcome {
    /// Admitted: the key's mark is now the operation's token.
    Accepted,
    /// Refused: the key had seen `highest_seen`, a newer token.
    Stale { highest_seen: Token },
    /// Refused: the token is above every token this service issued.
    NotIssued,
}

#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Lease {
    ttl_ms: u64,
    expires_at_ms: u64,
    /// Set while this lease is the implicit lease of a queued request: it does not
    /// expire, and it ends with the request.
    pending_for: Option<RequestId>,
    /// Created by an acquire for itself: withdrawing that request ends the lease.
    implicit: bool,
    /// Locks held under this lease.
    held: Vec<LockName>,
    /// Acquires of this lease still queued.
    waiting: Vec<RequestId>,
}

#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Holder {
    lease: LeaseId,
    token: Token,
    lock_delay_ms: u64,
    /// The holder's label (`Acquire::holder`).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    label: Option<String>,
    /// Requests answered with this grant: the first, retries of the same lease (an
    /// idempotent re-acquire or a twin in the queue). A withdrawn request gives the
    /// grant back only when it was the last one told.
    told: u32,
    /// The queued requests among them, which the driver may still withdraw.
    queued: Vec<RequestId>,
}

#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Lock {
    holder: Option<Holder>,
    /// FIFO; every id here is in `LockTable::waiters`.
    queue: VecDeque<RequestId>,
    /// Lock-delay: no grant before this time.
    blocked_until_ms: u64,
}

#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Waiter {
    name: LockName,
    lease: LeaseId,
    lock_delay_ms: u64,
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    label: Option<String>,
    /// The other names of an [`AcquireAll`], sorted, after `name`: the waiter is in
    /// each one's queue, and is granted all of them together.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Vec::is_empty"))]
    also: Vec<LockName>,
}

impl Waiter {
    /// Every name it waits for, `name` first.
    fn names(&self) -> impl Iterator<Item = &LockName> {
        std::iter::once(&self.name).chain(&self.also)
    }

    /// Waits for exactly `names` (sorted, as the table keeps them).
    fn is_for(&self, names: &[LockName]) -> bool {
        names.split_first().is_some_and(|(first, rest)| *first == self.name && rest == self.also.as_slice())
    }
}

/// Where a table starts that continues a service whose state is not in a log: a data
/// directory of the single-node format, migrated into the log once (the server's
/// `migrate`, which reads that format). The previous run's leases are unknown, so it
/// grants nothing for a while; everything else it knew is in these fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The first token the table mints: every token below it counts as issued.
    pub next_token: Token,
    /// Nothing is granted before this time on the table's clock (which starts at 0).
    pub grants_resume_at_ms: u64,
    /// Locks nobody is granted before a time (lock-delays the previous run may owe).
    pub blocked_until: Vec<(LockName, u64)>,
}

/// The lock table. See the module documentation.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LockTable {
    /// The bounds every command is decided within: each member's configuration until
    /// the cluster agrees on them through the log ([`Command::SetLimits`]), replicated
    /// state from then on.
    #[cfg_attr(feature = "serde", serde(skip))]
    limits: Limits,
    /// Whether `limits` came through the log (and so is the same on every member).
    #[cfg_attr(feature = "serde", serde(skip))]
    agreed_limits: bool,
    now_ms: u64,
    /// The next token to mint; strictly above every token minted before.
    next_token: Token,
    last_token: Option<Token>,
    /// The first token of this run: everything below may have been issued before.
    first_token: Token,
    /// Start-up grace: nothing is granted before this time.
    grants_resume_at_ms: u64,
    leases: HashMap<LeaseId, Lease, FxBuildHasher>,
    locks: BTreeMap<LockName, Lock>,
    waiters: HashMap<RequestId, Waiter, FxBuildHasher>,
    /// The names every queued waiter waits for, a set counting each of its names: what
    /// `waiters_max` bounds, so that the widest sets cannot hold 64 times the memory
    /// (and snapshot bytes) of single waiters. Derived from `waiters`; `None` until it
    /// is counted again after a restore.
    #[cfg_attr(feature = "serde", serde(skip))]
    waiting_names: Option<usize>,
    /// Queued requests that were granted, and the lock: the driver may still withdraw
    /// them. Entries leave with their holder.
    granted: HashMap<RequestId, LockName, FxBuildHasher>,
    /// The same for queued [`AcquireAll`] requests that were granted: the names still
    /// held under that grant.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "HashMap::is_empty"))]
    granted_all: HashMap<RequestId, Vec<LockName>, FxBuildHasher>,
    timers: Timers,
    /// The fenced store: replicated with the locks, so a fenced write is as durable as
    /// a grant and its token check sees the tokens the table issued.
    #[cfg_attr(feature = "serde", serde(default))]
    store: Store,
    /// How many effects every apply so far produced: the position of the last one, so
    /// that every replica numbers the same effect alike (the events' `index`).
    #[cfg_attr(feature = "serde", serde(default))]
    effects_seq: u64,
    #[cfg_attr(feature = "serde", serde(skip))]
    out: Output,
    /// Test-only: a set joins the queues of its names after the first at the front,
    /// so queues disagree on the arrival order (the checker's negative control).
    #[cfg(test)]
    #[cfg_attr(feature = "serde", serde(skip))]
    break_queue_order: bool,
}

impl LockTable {
    /// A fresh table: no grace, tokens from 1, its clock at 0.
    pub fn new(limits: Limits) -> LockTable {
        let fresh = Resume { next_token: Token::new(1).expect("not 0"), grants_resume_at_ms: 0, blocked_until: vec![] };
        LockTable::resume(limits, fresh)
    }

    /// A table that continues a service whose state is not in a log (see [`Resume`]),
    /// with its clock at 0.
    pub fn resume(limits: Limits, from: Resume) -> LockTable {
        let Resume { next_token: first, grants_resume_at_ms: grace_ms, blocked_until } = from;
        let mut t = LockTable {
            limits,
            agreed_limits: false,
            now_ms: 0,
            next_token: first,
            last_token: None,
            first_token: first,
            grants_resume_at_ms: grace_ms,
            leases: HashMap::default(),
            locks: BTreeMap::new(),
            waiters: HashMap::default(),
            waiting_names: Some(0),
            granted: HashMap::default(),
            granted_all: HashMap::default(),
            timers: Timers::default(),
            store: Store::default(),
            effects_seq: 0,
            out: Output::default(),
            #[cfg(test)]
            break_queue_order: false,
        };
        if grace_ms > 0 {
            t.timers.push(grace_ms, Timer::GrantsResume);
        }
        for (name, until) in blocked_until {
            t.locks.insert(name.clone(), Lock { blocked_until_ms: until, ..Lock::default() });
            t.timers.push(until, Timer::LockDelayEnds(name));
        }
        t
    }

    /// Applies one command at `now_ms` (never earlier than the last one's).
    pub fn apply(&mut self, request: RequestId, cmd: Command, now_ms: u64) -> Output {
        let mut out = Output::default();
        self.apply_into(request, cmd, now_ms, &mut out);
        out
    }

    /// [`apply`](Self::apply), appending to a buffer the caller reuses.
    pub fn apply_into(&mut self, request: RequestId, cmd: Command, now_ms: u64, out: &mut Output) {
        // Renewals happened at or before `now_ms`: taken before the time moves, so that
        // the expiries due at `now_ms` see them.
        if !matches!(cmd, Command::Renewed { .. }) {
            self.advance(now_ms);
        }
        let answer = match cmd {
            Command::GrantLease { lease, ttl_ms } => Some(self.grant_lease(lease, ttl_ms).map(Answer::Lease)),
            Command::Keepalive { lease } => Some(self.keepalive(lease).map(Answer::Lease)),
            // `None`: queued, answered later.
            Command::Acquire(req) => {
                let answer = self.acquire(request, req).transpose();
                if answer.is_none() {
                    out.queued.push(request);
                }
                answer
            }
            Command::AcquireAll(req) => {
                let answer = self.acquire_all(request, req).transpose();
                if answer.is_none() {
                    out.queued.push(request);
                }
                answer
            }
            Command::Release { name, lease } => Some(self.release(&name, lease).map(Answer::Released)),
            Command::Revoke { lease } => Some(self.revoke(lease).map(|()| Answer::Done)),
            Command::RevokeLock { name, token } => Some(self.revoke_lock(&name, token).map(Answer::Released)),
            Command::Cancel { request: target } => {
                self.cancel(target);
                Some(Ok(Answer::Done))
            }
            Command::Renewed { leases } => {
                self.renewed(&leases);
                None
            }
            Command::Tick => None,
            Command::Promote => {
                self.promote();
                None
            }
            Command::RaiseTokens { floor } => {
                self.raise_tokens_to(floor);
                None
            }
            Command::Store(cmd) => Some(self.apply_store(cmd)),
            Command::SetLimits(limits) => {
                (self.limits, self.agreed_limits) = (limits, true);
                Some(Ok(Answer::Done))
            }
        };
        if let Some(a) = answer {
            self.out.answers.push((request, a));
        }
        self.withdraw_stale_grants();
        out.answers.append(&mut self.out.answers);
        self.effects_seq += self.out.effects.len() as u64;
        out.effects.append(&mut self.out.effects);
        out.effects_through = self.effects_seq;
    }

    /// A store command, and for a fenced one the gate's decision as an effect (the
    /// events and counters of every member come from it).
    fn apply_store(&mut self, cmd: StoreCommand) -> Result<Answer, Error> {
        use crate::gate::Op;
        let fenced = match &cmd {
            StoreCommand::Write { key, token, .. } => Some((key.clone(), Op::Write, *token)),
            StoreCommand::FencedRead { key, token, .. } => Some((key.clone(), Op::Read, *token)),
            StoreCommand::WriteUnfenced { .. } | StoreCommand::Import { .. } => None,
        };
        let r = self.store.apply(cmd, self.highest_issued());
        let outcome = match &r {
            Ok(_) => Some(StoreOutcome::Accepted),
            Err(Error::StaleToken { highest_seen, .. }) => Some(StoreOutcome::Stale { highest_seen: *highest_seen }),
            Err(Error::TokenNotIssued { .. }) => Some(StoreOutcome::NotIssued),
            Err(_) => None,
        };
        if let (Some((key, op, token)), Some(outcome)) = (fenced, outcome) {
            self.out.effects.push(Effect::StoreFenced { at_ms: self.now_ms, key, op, token, outcome });
        }
        r.map(Answer::Store)
    }

    // ---- views: `&self`, as of the last applied command ----

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether the limits are the cluster's, agreed through the log
    /// ([`Command::SetLimits`]), rather than this member's configuration.
    pub fn limits_agreed(&self) -> bool {
        self.agreed_limits
    }

    /// Replaces the limits with this member's configuration, unless the cluster agreed
    /// on its own through the log (those stay: every member must decide alike).
    pub fn set_limits(&mut self, limits: Limits) {
        if !self.agreed_limits {
            self.limits = limits;
        }
    }

    /// The fenced store, as of the last applied command.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The position of the last effect produced (`Output::effects_through`).
    pub fn effects_seq(&self) -> u64 {
        self.effects_seq
    }

    /// The time of the last applied command.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The last token minted in this run, if any.
    pub fn last_token(&self) -> Option<Token> {
        self.last_token
    }

    /// The highest token the service may have issued, in this table or before it (a
    /// resumed table counts every token below its first as issued: this errs high,
    /// never low).
    pub fn highest_issued(&self) -> Option<Token> {
        self.last_token.or(Token::new(self.first_token.get() - 1))
    }

    /// Counts `floor` and every token below it as issued, so that the next grant is
    /// above it: a table restored from a backup while the old service may have gone on
    /// granting after the save (`fenced snapshot restore --tokens-above`). Lower
    /// floors change nothing.
    pub fn raise_tokens_to(&mut self, floor: Token) {
        if self.next_token <= floor {
            self.next_token = floor.next();
            self.last_token = Some(floor);
        }
    }

    /// How long the start-up grace still holds every grant back, at `now_ms`.
    pub fn grace_left_ms(&self, now_ms: u64) -> u64 {
        self.grants_resume_at_ms.saturating_sub(now_ms)
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

    /// Timer entries held, live or dead (for tests and metrics).
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// The earliest time at which a `Tick` has work; may be early, never late.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.next_at()
    }

    /// True when a `Tick` at `now_ms` would change something: a view that must be
    /// current is read after one.
    pub fn is_due(&self, now_ms: u64) -> bool {
        self.poll_timeout().is_some_and(|t| t <= now_ms)
    }

    pub fn lease(&self, id: LeaseId) -> Option<LeaseInfo> {
        self.leases.get(&id).map(|l| LeaseInfo { id, ttl_ms: l.ttl_ms, expires_at_ms: l.expires_at_ms })
    }

    /// Chubby's CheckSequencer: is `token` the current holder's token of `name`?
    /// Returns that answer and the current holder's token, if any.
    pub fn check(&self, name: &LockName, token: Token) -> (bool, Option<Token>) {
        let current = self.holder_token(name);
        (current == Some(token), current)
    }

    /// The token of `name`'s holder, if held.
    pub fn holder_token(&self, name: &LockName) -> Option<Token> {
        self.locks.get(name).and_then(|l| l.holder.as_ref()).map(|h| h.token)
    }

    pub fn lock(&self, name: &LockName) -> Option<LockInfo> {
        self.locks.get(name).map(|l| self.lock_info(name, l))
    }

    /// Locks whose names start with `prefix`, in name order, at most `limit` of them.
    pub fn locks_with_prefix(&self, prefix: &str, limit: usize) -> Vec<LockInfo> {
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
            holder: lock.holder.as_ref().map(|h| (h.token, self.lease(h.lease).expect("holder lease is live"))),
            label: lock.holder.as_ref().and_then(|h| h.label.clone()),
            waiters: lock.queue.len(),
            blocked_until_ms: (lock.blocked_until_ms > self.now_ms).then_some(lock.blocked_until_ms),
        }
    }

    // ---- the commands ----

    fn grant_lease(&mut self, id: LeaseId, ttl_ms: u64) -> Result<LeaseInfo, Error> {
        self.check_new_lease(id, ttl_ms)?;
        let expires_at_ms = self.now_ms + ttl_ms;
        let lease = Lease { ttl_ms, expires_at_ms, pending_for: None, implicit: false, held: vec![], waiting: vec![] };
        self.leases.insert(id, lease);
        self.push_timer(expires_at_ms, Timer::LeaseExpiry(id));
        Ok(LeaseInfo { id, ttl_ms, expires_at_ms })
    }

    fn check_new_lease(&self, id: LeaseId, ttl_ms: u64) -> Result<(), Error> {
        let Limits { ttl_ms_min, ttl_ms_max, leases_max, .. } = self.limits;
        if !(ttl_ms_min..=ttl_ms_max).contains(&ttl_ms) {
            return Err(Error::TtlOutOfRange { ttl_ms_min, ttl_ms_max });
        }
        if self.leases.contains_key(&id) {
            return Err(Error::LeaseExists);
        }
        if self.leases.len() >= leases_max {
            return Err(Error::TooManyLeases { leases_max });
        }
        Ok(())
    }

    /// Costs a hash lookup: no timer is touched (the expiry timer re-arms itself lazily
    /// when it fires early).
    fn keepalive(&mut self, id: LeaseId) -> Result<LeaseInfo, Error> {
        let now_ms = self.now_ms;
        let lease = self.leases.get_mut(&id).ok_or(Error::LeaseNotFound)?;
        lease.expires_at_ms = now_ms + lease.ttl_ms;
        Ok(LeaseInfo { id, ttl_ms: lease.ttl_ms, expires_at_ms: lease.expires_at_ms })
    }

    /// [`Command::Renewed`]: each lease still held lives at least its TTL from the time
    /// its keepalive was answered. Costs a hash lookup each, as a keepalive does.
    fn renewed(&mut self, leases: &[(LeaseId, u64)]) {
        for (id, at_ms) in leases {
            if let Some(lease) = self.leases.get_mut(id) {
                lease.expires_at_ms = lease.expires_at_ms.max(at_ms.saturating_add(lease.ttl_ms));
            }
        }
    }

    /// A retried acquire answered with the grant its first attempt got is a sign of life
    /// of the lease, as a keepalive is: renewed, so that the answer's `ttl_ms` holds
    /// from now (the caller counts its deadline from the retry's send at the latest).
    fn renew(&mut self, id: LeaseId) {
        let now_ms = self.now_ms;
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.expires_at_ms = lease.expires_at_ms.max(now_ms + lease.ttl_ms);
        }
    }

    /// Ends lease `id`. An implicit lease belongs to the one caller that acquired with
    /// it, whose guard ends it to give its locks back: one command where a `Release`
    /// and a `Revoke` took two, so its locks are reported `Released`, as a release.
    fn revoke(&mut self, id: LeaseId) -> Result<(), Error> {
        let Some(lease) = self.leases.get(&id) else { return Err(Error::LeaseNotFound) };
        let reason = if lease.implicit { ReleaseReason::Released } else { ReleaseReason::Revoked };
        self.end_lease(id, reason);
        Ok(())
    }

    /// `Ok(None)`: queued; the answer comes with a later command.
    fn acquire(&mut self, request: RequestId, req: Acquire) -> Result<Option<Answer>, Error> {
        let now_ms = self.now_ms;
        self.check_wait(req.wait_ms, req.lock_delay_ms)?;
        let lease_id = req.lease.id();
        match req.lease {
            LeaseRef::Existing(id) => {
                let Some(lease) = self.leases.get(&id) else { return Err(Error::LeaseNotFound) };
                if let Some(holder) = self.locks.get_mut(&req.name).and_then(|l| l.holder.as_mut()) {
                    if holder.lease == id {
                        // A retried request must not mint a second token.
                        holder.told = holder.told.saturating_add(1);
                        let grant = Grant { name: req.name, token: holder.token, lease: id, ttl_ms: lease.ttl_ms };
                        self.renew(id);
                        return Ok(Some(Answer::Granted(grant)));
                    }
                }
            }
            LeaseRef::Implicit { id, ttl_ms } => match self.leases.get(&id) {
                None => self.check_new_lease(id, ttl_ms)?,
                // The caller chose the implicit lease's id, and retries under it (its
                // first attempt reached a leader that went silent): the retry gets
                // what the first attempt got, the grant or its place in the queue.
                Some(lease) if lease.implicit => {
                    let ttl_ms = lease.ttl_ms;
                    let queued = lease.waiting.iter().any(|w| self.waiters[w].is_for(std::slice::from_ref(&req.name)));
                    if let Some(holder) = self.locks.get_mut(&req.name).and_then(|l| l.holder.as_mut()) {
                        if holder.lease == id {
                            holder.told = holder.told.saturating_add(1);
                            let grant = Grant { name: req.name, token: holder.token, lease: id, ttl_ms };
                            self.renew(id);
                            return Ok(Some(Answer::Granted(grant)));
                        }
                    }
                    if !queued {
                        return Err(Error::LeaseExists);
                    }
                    if req.wait_ms == 0 {
                        return Err(Error::LockHeld { holder: self.holder_token(&req.name) });
                    }
                    // A twin in the queue: granted together with its original.
                    self.enqueue(request, req)?;
                    return Ok(None);
                }
                Some(_) => return Err(Error::LeaseExists),
            },
        }
        if !self.locks.contains_key(&req.name) && self.locks.len() >= self.limits.locks_max {
            return Err(Error::TooManyLocks { locks_max: self.limits.locks_max });
        }
        let grantable = self.grants_open(now_ms)
            && self
                .locks
                .get(&req.name)
                .is_none_or(|l| l.holder.is_none() && l.queue.is_empty() && l.blocked_until_ms <= now_ms);
        if grantable {
            if let LeaseRef::Implicit { id, ttl_ms } = req.lease {
                self.grant_lease(id, ttl_ms).expect("checked above");
                self.leases.get_mut(&id).expect("just made").implicit = true;
            }
            let holder = req.holder.clone();
            let grant = self.install_holder(req.name, lease_id, req.lock_delay_ms, req.holder, None);
            self.out.effects.push(Effect::Granted { at_ms: now_ms, request: None, grant: grant.clone(), holder });
            return Ok(Some(Answer::Granted(grant)));
        }
        let holder = self.holder_token(&req.name);
        if req.wait_ms == 0 {
            if !self.grants_open(now_ms) {
                return Err(Error::Recovering { retry_after_ms: self.grace_left_ms(now_ms) });
            }
            return Err(Error::LockHeld { holder });
        }
        self.enqueue(request, req)?;
        Ok(None)
    }

    fn check_wait(&self, wait_ms: u64, lock_delay_ms: u64) -> Result<(), Error> {
        if wait_ms > self.limits.wait_ms_max {
            return Err(Error::WaitOutOfRange { wait_ms_max: self.limits.wait_ms_max });
        }
        if lock_delay_ms > self.limits.lock_delay_ms_max {
            return Err(Error::LockDelayOutOfRange { lock_delay_ms_max: self.limits.lock_delay_ms_max });
        }
        Ok(())
    }

    /// See [`AcquireAll`]. `Ok(None)`: queued in every name's queue.
    fn acquire_all(&mut self, request: RequestId, mut req: AcquireAll) -> Result<Option<Answer>, Error> {
        req.names.sort_unstable();
        req.names.dedup();
        if req.names.is_empty() || req.names.len() > LOCK_NAMES_MAX {
            return Err(Error::InvalidNames { names_max: LOCK_NAMES_MAX });
        }
        self.check_wait(req.wait_ms, req.lock_delay_ms)?;
        let now_ms = self.now_ms;
        let lease_id = req.lease.id();
        match req.lease {
            LeaseRef::Existing(id) if !self.leases.contains_key(&id) => return Err(Error::LeaseNotFound),
            LeaseRef::Existing(_) => {}
            LeaseRef::Implicit { id, ttl_ms } => match self.leases.get(&id) {
                None => self.check_new_lease(id, ttl_ms)?,
                // A retry under the caller's implicit lease id: below, the first
                // attempt's grant, or a place in the queues beside it.
                Some(lease) if lease.implicit => {
                    let queued = lease.waiting.iter().any(|w| self.waiters[w].is_for(&req.names));
                    if !queued && self.held_by(&req.names, id) != req.names.len() {
                        return Err(Error::LeaseExists);
                    }
                }
                Some(_) => return Err(Error::LeaseExists),
            },
        }
        let held = self.held_by(&req.names, lease_id);
        if held == req.names.len() {
            // A retried request must not mint new tokens.
            return Ok(Some(Answer::GrantedAll(self.tell_again(&req.names, lease_id))));
        }
        let first_held = || req.names.iter().find_map(|n| self.holder_token(n));
        if held > 0 {
            return Err(Error::LockHeld { holder: first_held() });
        }
        let new = req.names.iter().filter(|n| !self.locks.contains_key(*n)).count();
        if new > 0 && self.locks.len() + new > self.limits.locks_max {
            return Err(Error::TooManyLocks { locks_max: self.limits.locks_max });
        }
        let twin = self.leases.contains_key(&lease_id) && matches!(req.lease, LeaseRef::Implicit { .. });
        let free = |l: Option<&Lock>| {
            l.is_none_or(|l| l.holder.is_none() && l.queue.is_empty() && l.blocked_until_ms <= now_ms)
        };
        if !twin && self.grants_open(now_ms) && req.names.iter().all(|n| free(self.locks.get(n))) {
            if let LeaseRef::Implicit { id, ttl_ms } = req.lease {
                self.grant_lease(id, ttl_ms).expect("checked above");
                self.leases.get_mut(&id).expect("just made").implicit = true;
            }
            let mut grants = Vec::with_capacity(req.names.len());
            for name in req.names {
                let holder = req.holder.clone();
                let grant = self.install_holder(name, lease_id, req.lock_delay_ms, req.holder.clone(), None);
                self.out.effects.push(Effect::Granted { at_ms: now_ms, request: None, grant: grant.clone(), holder });
                grants.push(grant);
            }
            return Ok(Some(Answer::GrantedAll(grants)));
        }
        if req.wait_ms == 0 {
            if !self.grants_open(now_ms) {
                return Err(Error::Recovering { retry_after_ms: self.grace_left_ms(now_ms) });
            }
            return Err(Error::LockHeld { holder: first_held() });
        }
        self.enqueue_names(request, req.names, req.lease, req.wait_ms, req.lock_delay_ms, req.holder)?;
        Ok(None)
    }

    /// How many of `names` `lease` holds.
    fn held_by(&self, names: &[LockName], lease: LeaseId) -> usize {
        let holds = |n: &LockName| self.locks.get(n).and_then(|l| l.holder.as_ref()).is_some_and(|h| h.lease == lease);
        names.iter().filter(|n| holds(n)).count()
    }

    /// The grants `lease` already has on `names` (every one held), told once more.
    fn tell_again(&mut self, names: &[LockName], lease: LeaseId) -> Vec<Grant> {
        let ttl_ms = self.leases.get(&lease).map_or(0, |l| l.ttl_ms);
        self.renew(lease);
        let mut grants = Vec::with_capacity(names.len());
        for name in names {
            let holder = self.locks.get_mut(name).and_then(|l| l.holder.as_mut()).expect("held, checked by the caller");
            holder.told = holder.told.saturating_add(1);
            grants.push(Grant { name: name.clone(), token: holder.token, lease, ttl_ms });
        }
        grants
    }

    /// See [`Command::Promote`].
    fn promote(&mut self) {
        let mut waiting: Vec<RequestId> = self.waiters.keys().copied().collect();
        waiting.sort_unstable();
        for id in waiting {
            let lease = self.waiters[&id].lease;
            self.end_wait(id, WaitEnd::Cancelled);
            self.waiter_left(lease, id);
        }
        self.granted.clear();
        self.granted_all.clear();
        let names: Vec<LockName> = self.locks.keys().cloned().collect();
        for name in names {
            if let Some(holder) = self.locks.get_mut(&name).and_then(|l| l.holder.as_mut()) {
                holder.queued.clear();
            }
            self.forget_if_idle(&name);
        }
        let now_ms = self.now_ms;
        for lease in self.leases.values_mut() {
            // The expiry timer armed earlier fires early and re-arms at the new time.
            lease.expires_at_ms = lease.expires_at_ms.max(now_ms + lease.ttl_ms);
        }
    }

    /// The caller of `target` went away.
    fn cancel(&mut self, target: RequestId) {
        if let Some(w) = self.waiters.get(&target) {
            let (names, lease): (Vec<LockName>, _) = (w.names().cloned().collect(), w.lease);
            self.end_wait(target, WaitEnd::Cancelled);
            self.waiter_left(lease, target);
            for name in &names {
                self.grant_next(name);
            }
            return;
        }
        if let Some(names) = self.granted_all.remove(&target) {
            for name in names {
                self.give_back(target, &name);
            }
            return;
        }
        let Some(name) = self.granted.remove(&target) else { return };
        self.give_back(target, &name);
    }

    /// A grant `target` was told of, and whose caller went away: given back unless
    /// another request was told of it too, or its lease ends with it.
    fn give_back(&mut self, target: RequestId, name: &LockName) {
        let Some(holder) = self.locks.get_mut(name).and_then(|l| l.holder.as_mut()) else { return };
        if !holder.queued.contains(&target) {
            return; // released meanwhile (another name of the same grant ended its lease)
        }
        holder.queued.retain(|r| *r != target);
        holder.told -= 1;
        let (lease, told) = (holder.lease, holder.told);
        if told > 0 {
            // A retry of the same lease was told of this grant too: it stays.
        } else if self.leases.get(&lease).is_some_and(|l| l.implicit) {
            // The lease existed for this request (and its retries) alone.
            self.end_lease(lease, ReleaseReason::Revoked);
        } else {
            // Nobody was told of this grant: give it back.
            self.drop_holder(name, ReleaseReason::Released);
        }
    }

    /// An operator takes the lock from whoever holds it (with `token`, only from that
    /// holder). The lease stays alive for its other locks; an implicit lease, which
    /// existed for this lock alone, ends with it. No lock-delay: the holder did not fail.
    fn revoke_lock(&mut self, name: &LockName, token: Option<Token>) -> Result<Token, Error> {
        let holder = self.locks.get(name).and_then(|l| l.holder.as_ref());
        let Some(h) = holder.filter(|h| token.is_none_or(|t| t == h.token)) else {
            return Err(Error::NotHolder { holder: holder.map(|h| h.token) });
        };
        let (held, lease_id) = (h.token, h.lease);
        let alone = self.leases.get(&lease_id).is_some_and(|l| l.implicit && l.held.len() == 1 && l.waiting.is_empty());
        if alone {
            self.end_lease(lease_id, ReleaseReason::Forced);
        } else {
            self.drop_holder(name, ReleaseReason::Forced);
        }
        Ok(held)
    }

    fn release(&mut self, name: &LockName, lease: LeaseId) -> Result<Token, Error> {
        let holder = self.locks.get(name).and_then(|l| l.holder.as_ref());
        match holder {
            Some(h) if h.lease == lease => {
                let token = h.token;
                self.drop_holder(name, ReleaseReason::Released);
                Ok(token)
            }
            _ => Err(Error::NotHolder { holder: holder.map(|h| h.token) }),
        }
    }

    // ---- the rules behind them ----

    fn grants_open(&self, now_ms: u64) -> bool {
        now_ms >= self.grants_resume_at_ms
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

    /// The names all queued waiters wait for (see `waiting_names`).
    fn waiting_names(&mut self) -> usize {
        if self.waiting_names.is_none() {
            self.waiting_names = Some(self.waiters.values().map(|w| 1 + w.also.len()).sum());
        }
        self.waiting_names.expect("counted above")
    }

    /// Removes a waiter from the registry, keeping `waiting_names` true.
    fn take_waiter(&mut self, request: &RequestId) -> Option<Waiter> {
        let w = self.waiters.remove(request)?;
        if let Some(n) = self.waiting_names.as_mut() {
            *n -= 1 + w.also.len();
        }
        Some(w)
    }

    fn enqueue(&mut self, request: RequestId, req: Acquire) -> Result<(), Error> {
        self.enqueue_names(request, vec![req.name], req.lease, req.wait_ms, req.lock_delay_ms, req.holder)
    }

    /// Queues `request` at the back of every one of `names`' queues (sorted, distinct).
    fn enqueue_names(
        &mut self,
        request: RequestId,
        names: Vec<LockName>,
        lease: LeaseRef,
        wait_ms: u64,
        lock_delay_ms: u64,
        label: Option<String>,
    ) -> Result<(), Error> {
        if self.waiting_names() + names.len() > self.limits.waiters_max {
            return Err(Error::TooManyWaiters { waiters_max: self.limits.waiters_max });
        }
        let per_lock = names.iter().map(|n| self.locks.get(n).map_or(0, |l| l.queue.len())).max().unwrap_or(0);
        if per_lock >= self.limits.waiters_per_lock_max {
            return Err(Error::TooManyWaiters { waiters_max: self.limits.waiters_per_lock_max });
        }
        assert!(!self.waiters.contains_key(&request), "request id {request:?} reused while queued");
        match lease {
            // A twin of a queued request of the same implicit lease: that lease stays
            // pending for its first request.
            LeaseRef::Implicit { id, .. } if self.leases.contains_key(&id) => {}
            LeaseRef::Implicit { id, ttl_ms } => {
                self.check_new_lease(id, ttl_ms)?;
                // No expiry timer: the lease cannot expire while its request waits.
                let lease = Lease {
                    ttl_ms,
                    expires_at_ms: self.now_ms + ttl_ms,
                    pending_for: Some(request),
                    implicit: true,
                    held: vec![],
                    waiting: vec![],
                };
                self.leases.insert(id, lease);
            }
            LeaseRef::Existing(_) => {}
        }
        let lease_id = lease.id();
        for (i, name) in names.iter().enumerate() {
            let queue = &mut self.locks.entry(name.clone()).or_default().queue;
            #[cfg(test)]
            if self.break_queue_order && i > 0 {
                queue.push_front(request);
                continue;
            }
            let _ = i;
            queue.push_back(request);
        }
        self.leases.get_mut(&lease_id).expect("checked by acquire").waiting.push(request);
        self.push_timer(self.now_ms + wait_ms, Timer::WaitDeadline(request));
        let mut names = names.into_iter();
        let name = names.next().expect("one name or more");
        let w = Waiter { name, lease: lease_id, lock_delay_ms, label, also: names.collect() };
        if let Some(n) = self.waiting_names.as_mut() {
            *n += 1 + w.also.len();
        }
        self.waiters.insert(request, w);
        Ok(())
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
                    self.out.effects.push(Effect::LeaseExpired { at_ms, lease: id });
                    self.end_lease(id, ReleaseReason::Expired);
                }
                Timer::WaitDeadline(id) => {
                    if let Some(w) = self.waiters.get(&id) {
                        let (names, lease): (Vec<LockName>, _) = (w.names().cloned().collect(), w.lease);
                        self.end_wait(id, WaitEnd::TimedOut);
                        let holder = names.iter().find_map(|n| self.holder_token(n));
                        self.out.answers.push((id, Err(Error::LockHeld { holder })));
                        self.waiter_left(lease, id);
                        for name in &names {
                            self.grant_next(name);
                        }
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

    /// Removes a lease: withdraws its waiters and releases its locks.
    fn end_lease(&mut self, id: LeaseId, reason: ReleaseReason) {
        let lease = self.leases.remove(&id).expect("caller checked the lease");
        // Every waiter of the lease leaves its queues before any lock is handed on: a
        // queue's next waiter may be another of them.
        let mut left = Vec::new();
        for waiter in lease.waiting {
            if let Some(w) = self.take_waiter(&waiter) {
                for name in w.names() {
                    if let Some(lock) = self.locks.get_mut(name) {
                        lock.queue.retain(|q| *q != waiter);
                    }
                }
                let at_ms = self.now_ms;
                let name = w.name.clone();
                self.out.effects.push(Effect::WaitEnded { at_ms, request: waiter, name, reason: WaitEnd::LeaseGone });
                if lease.pending_for != Some(waiter) {
                    self.out.answers.push((waiter, Err(Error::LeaseNotFound)));
                }
                left.extend(w.names().cloned());
            }
        }
        for name in &left {
            self.grant_next(name);
        }
        for name in lease.held {
            self.release_held(&name, id, reason);
        }
    }

    /// Called for a lock in the `held` list of a lease that is ending.
    fn release_held(&mut self, name: &LockName, lease: LeaseId, reason: ReleaseReason) {
        let now_ms = self.now_ms;
        let lock = self.locks.get_mut(name).expect("a held lock has an entry");
        let holder = lock.holder.as_ref().expect("a held lock has a holder");
        assert_eq!(holder.lease, lease, "lease and lock disagree on the holder");
        if reason == ReleaseReason::Expired && holder.lock_delay_ms > 0 {
            lock.blocked_until_ms = now_ms + holder.lock_delay_ms;
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
        for r in &h.queued {
            self.granted.remove(r);
            if let Some(names) = self.granted_all.get_mut(r) {
                names.retain(|n| n != name);
                if names.is_empty() {
                    self.granted_all.remove(r);
                }
            }
        }
        self.out.effects.push(Effect::Released {
            at_ms: self.now_ms,
            name: name.clone(),
            token: h.token,
            lease: h.lease,
            reason,
        });
        self.grant_next(name);
    }

    fn end_wait(&mut self, waiter: RequestId, reason: WaitEnd) {
        let w = self.take_waiter(&waiter).expect("caller checked the waiter");
        for name in w.names() {
            if let Some(lock) = self.locks.get_mut(name) {
                lock.queue.retain(|q| *q != waiter);
            }
        }
        if let Some(lease) = self.leases.get_mut(&w.lease) {
            lease.waiting.retain(|q| *q != waiter);
        }
        self.out.effects.push(Effect::WaitEnded { at_ms: self.now_ms, request: waiter, name: w.name, reason });
    }

    /// `waiter` left the queue. When its implicit lease was pending for it, the lease
    /// passes to a twin still queued (a retry of the same request), or ends.
    fn waiter_left(&mut self, lease: LeaseId, waiter: RequestId) {
        let Some(l) = self.leases.get_mut(&lease) else { return };
        if l.pending_for != Some(waiter) {
            return;
        }
        match l.waiting.first() {
            Some(&twin) => l.pending_for = Some(twin),
            None => self.end_lease(lease, ReleaseReason::Revoked),
        }
    }

    /// Grants `name` to the first waiter when nothing holds it back, and forgets lock
    /// entries that have nothing left to remember. A first waiter for several locks is
    /// granted only when it is first in every one of their queues and all are free;
    /// until then this lock stays free for it (strict FIFO, see [`AcquireAll`]).
    fn grant_next(&mut self, name: &LockName) {
        let now_ms = self.now_ms;
        let open = self.grants_open(now_ms);
        let Some(lock) = self.locks.get(name) else { return };
        if lock.holder.is_some() || !open || lock.blocked_until_ms > now_ms {
            return self.forget_if_idle(name);
        }
        let Some(&first) = lock.queue.front() else { return self.forget_if_idle(name) };
        let w = &self.waiters[&first];
        if !w.also.is_empty() && !w.names().all(|n| self.free_for(n, first)) {
            return;
        }
        self.grant_waiter(first);
    }

    /// `name` is free for `waiter`: no holder, no lock-delay, and `waiter` first in line.
    fn free_for(&self, name: &LockName, waiter: RequestId) -> bool {
        self.locks.get(name).is_some_and(|l| {
            l.holder.is_none() && l.blocked_until_ms <= self.now_ms && l.queue.front() == Some(&waiter)
        })
    }

    /// Grants every lock `first` waits for (it is first in each queue, each is free),
    /// and the same grant to its twins: queued requests of the same lease for the same
    /// names (a retried request).
    fn grant_waiter(&mut self, first: RequestId) {
        let now_ms = self.now_ms;
        let w = self.take_waiter(&first).expect("queued waiters are registered");
        let names: Vec<LockName> = w.names().cloned().collect();
        for name in &names {
            let popped = self.locks.get_mut(name).and_then(|l| l.queue.pop_front());
            debug_assert_eq!(popped, Some(first), "granted from the front of every queue");
        }
        let lease = self.leases.get_mut(&w.lease).expect("waiters of gone leases are withdrawn");
        lease.waiting.retain(|q| *q != first);
        if lease.pending_for.take().is_some() {
            // An implicit lease's TTL starts at its grant.
            lease.expires_at_ms = now_ms + lease.ttl_ms;
            let at = lease.expires_at_ms;
            self.push_timer(at, Timer::LeaseExpiry(w.lease));
        }
        let single = names.len() == 1;
        let mut grants = Vec::with_capacity(names.len());
        for name in &names {
            let request = single.then_some(first);
            let grant = self.install_holder(name.clone(), w.lease, w.lock_delay_ms, w.label.clone(), request);
            let holder = w.label.clone();
            self.out.effects.push(Effect::Granted {
                at_ms: now_ms,
                request: Some(first),
                grant: grant.clone(),
                holder,
            });
            grants.push(grant);
        }
        if !single {
            self.tell_queued(first, &names);
        }
        self.out.answers.push((first, Ok(Self::granted_answer(&grants))));
        // Other queued acquires of the same lease for the same names (a retried
        // request) get the same grant: same lease, same tokens. Found through the
        // lease's own short list, not by scanning the queues.
        let lease = self.leases.get_mut(&w.lease).expect("still live");
        let twins: Vec<RequestId> =
            lease.waiting.iter().copied().filter(|id| self.waiters[id].is_for(&names)).collect();
        lease.waiting.retain(|q| !twins.contains(q));
        for twin in twins {
            self.take_waiter(&twin);
            for name in &names {
                self.locks.get_mut(name).expect("just granted").queue.retain(|q| *q != twin);
                let holder = self.locks.get_mut(name).and_then(|l| l.holder.as_mut()).expect("just granted");
                holder.told += 1;
                if single {
                    holder.queued.push(twin);
                    self.granted.insert(twin, name.clone());
                }
            }
            if !single {
                self.tell_queued(twin, &names);
            }
            for grant in &grants {
                let (grant, holder) = (grant.clone(), w.label.clone());
                self.out.effects.push(Effect::Granted { at_ms: now_ms, request: Some(twin), grant, holder });
            }
            self.out.answers.push((twin, Ok(Self::granted_answer(&grants))));
        }
    }

    /// Records that queued `request` was told of the grant of every one of `names`
    /// (an [`AcquireAll`]): the driver may still withdraw it.
    fn tell_queued(&mut self, request: RequestId, names: &[LockName]) {
        for name in names {
            let holder = self.locks.get_mut(name).and_then(|l| l.holder.as_mut()).expect("just granted");
            holder.queued.push(request);
        }
        self.granted_all.insert(request, names.to_vec());
    }

    fn granted_answer(grants: &[Grant]) -> Answer {
        match grants {
            [one] => Answer::Granted(one.clone()),
            all => Answer::GrantedAll(all.to_vec()),
        }
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

    /// Mints the next token and makes `lease` the holder: the one place a token is
    /// born.
    fn install_holder(
        &mut self,
        name: LockName,
        lease: LeaseId,
        lock_delay_ms: u64,
        label: Option<String>,
        request: Option<RequestId>,
    ) -> Grant {
        let token = self.next_token;
        // Invariant: every token is greater than every token minted before it.
        assert!(self.last_token.is_none_or(|last| token > last), "token {token} not above {:?}", self.last_token);
        self.next_token = token.next();
        self.last_token = Some(token);
        let l = self.leases.get_mut(&lease).expect("a holder's lease is live");
        l.held.push(name.clone());
        let ttl_ms = l.ttl_ms;
        let lock = self.locks.entry(name.clone()).or_default();
        assert!(lock.holder.is_none(), "granting a held lock");
        let queued = request.into_iter().collect::<Vec<_>>();
        if let Some(r) = request {
            self.granted.insert(r, name.clone());
        }
        lock.holder = Some(Holder { lease, token, lock_delay_ms, label, told: 1, queued });
        Grant { name, token, lease, ttl_ms }
    }

    /// A grant answered in this command whose holder lost it again before the command
    /// ended (a lease that expired in the same tick) is not answered as a grant: the
    /// caller would believe it holds a lock that is already free.
    fn withdraw_stale_grants(&mut self) {
        for i in 0..self.out.answers.len() {
            let (request, grants) = match &self.out.answers[i] {
                (request, Ok(Answer::Granted(g))) => (*request, std::slice::from_ref(g)),
                (request, Ok(Answer::GrantedAll(all))) => (*request, all.as_slice()),
                _ => continue,
            };
            let Some(g) = grants.iter().find(|g| self.holder_token(&g.name) != Some(g.token)) else { continue };
            let e = if self.leases.contains_key(&g.lease) {
                Error::LockHeld { holder: self.holder_token(&g.name) }
            } else {
                Error::LeaseNotFound
            };
            self.granted.remove(&request);
            self.granted_all.remove(&request);
            self.out.answers[i].1 = Err(e);
        }
    }
}

#[cfg(test)]
mod multi_tests;
#[cfg(test)]
mod tests;
