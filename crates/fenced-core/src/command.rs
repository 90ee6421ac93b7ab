//! The lock table's one input type and everything applying it produces.
//!
//! Every change to the lock service is a [`Command`] applied at a timestamp
//! (`LockTable::apply`); the [`Output`] is complete: the answer to every request that
//! got one (by [`RequestId`], the command's own and queued acquires that ended), the
//! events observers see, and the acquires left waiting. Nothing in it asks to be made
//! durable: the log of commands is what is durable (the server answers only after a
//! command's log entry is committed, and a restart applies the log again). The driver
//! executes the output its own way: the server answers sockets and publishes events,
//! the simulator turns answers into messages.

use crate::error::Error;
use crate::store::{StoreAnswer, StoreCommand};
use crate::table::{Effect, Grant, LeaseInfo};
use crate::{LeaseId, LockName, Token};

/// Names a request so that its answer, now or later, reaches its caller. Chosen by the
/// driver, unique among the requests it has in flight.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RequestId(pub u64);

/// One change to the lock service.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Command {
    /// Creates a lease with a caller-chosen id (the server draws 128 random bits).
    GrantLease { lease: LeaseId, ttl_ms: u64 },
    /// Extends a live lease to `now + ttl`.
    Keepalive { lease: LeaseId },
    /// Keepalives a leader answered from memory (`Node::keepalive_here`),
    /// each with the table time it was answered at, none before the table's time nor
    /// after this entry's batch. Each lease still alive lives at least its TTL from
    /// then. Applied before the batch's time moves (no timer fires first), so the
    /// expiries due at the batch's time see these renewals; answered to nobody.
    Renewed { leases: Vec<(LeaseId, u64)> },
    /// Acquires a lock at once, or queues for up to `wait_ms`.
    Acquire(Acquire),
    /// Acquires several locks under one lease, all together or none, at once or
    /// within `wait_ms` (see [`AcquireAll`]).
    AcquireAll(AcquireAll),
    /// Releases a lock the lease holds; the next waiter is granted at once.
    Release { name: LockName, lease: LeaseId },
    /// Ends a lease now: its locks are released (no lock-delay) and its waits end. A
    /// guard gives back a lock it acquired with an implicit lease by this one command.
    Revoke { lease: LeaseId },
    /// An operator's release by name: the lock is taken from its holder (with `token`,
    /// only if that is the holder's token), the next waiter is granted, the holder's
    /// lease stays alive for its other locks (an implicit lease ends: it had no other).
    /// Answered with the token taken; `NotHolder` when nobody (or another token) holds it.
    RevokeLock { name: LockName, token: Option<Token> },
    /// The caller of `request` went away. A queued acquire leaves its queue; a grant
    /// it was answered with is given back, unless another request of the same lease
    /// was told of that grant too (a retried request and its original).
    Cancel { request: RequestId },
    /// Runs the timers due: expiries, wait deadlines, lock-delays ending.
    Tick,
    /// A new leader takes over (a new term of the replicated log, or a single node's
    /// restart): the callers of the previous one are gone. Every queued acquire is
    /// withdrawn without an answer (its caller was told to retry), no grant can be given
    /// back by a withdrawal any more, and every lease gets at least its full TTL again,
    /// counted from now (etcd's lessor `Promote`), so that no lease expires before its
    /// holder could reach the new leader.
    Promote,
    /// Counts every token up to `floor` as issued, so the next grant is above it: the
    /// `--tokens-above` of a restore, carried by the log so that every member raises
    /// its counter alike (see `LockTable::raise_tokens_to`).
    RaiseTokens { floor: Token },
    /// A change to the fenced store (a fenced read is one: it moves the key's mark).
    Store(StoreCommand),
    /// The bounds every member decides commands within from now on, the same on each:
    /// proposed by a leader whose configured limits differ from the table's, once every
    /// member reads this command. Answered `Done`.
    SetLimits(crate::table::Limits),
}

impl Command {
    /// About how many bytes the command takes in memory and in a log entry: what the
    /// leader's bounds on waiting proposals and on a batch count (a store write is its
    /// key and value; everything else is small).
    pub fn size_hint(&self) -> usize {
        const BASE: usize = 64;
        BASE + match self {
            Command::Acquire(a) => a.name.as_str().len() + a.holder.as_ref().map_or(0, String::len),
            Command::AcquireAll(a) => {
                a.names.iter().map(|n| n.as_str().len() + 8).sum::<usize>() + a.holder.as_ref().map_or(0, String::len)
            }
            Command::Release { name, .. } | Command::RevokeLock { name, .. } => name.as_str().len(),
            Command::Store(StoreCommand::Write { key, value, .. } | StoreCommand::WriteUnfenced { key, value, .. }) => {
                key.len() + value.len()
            }
            Command::Store(StoreCommand::FencedRead { key, .. }) => key.len(),
            Command::Renewed { leases } => leases.len() * 24,
            Command::Store(StoreCommand::Import { records }) => {
                records.iter().map(|(k, r)| BASE + k.len() + r.value.as_ref().map_or(0, Vec::len)).sum()
            }
            _ => 0,
        }
    }
}

/// An acquire request.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Acquire {
    pub name: LockName,
    pub lease: LeaseRef,
    /// 0 is a try-lock.
    pub wait_ms: u64,
    /// Lock-delay the lock gets if this holder's lease expires while holding it.
    pub lock_delay_ms: u64,
    /// Who holds it, as the caller names itself: a label shown in views and events,
    /// never a secret (at most [`HOLDER_BYTES_MAX`] bytes, checked where requests
    /// come in).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub holder: Option<String>,
}

/// The longest holder label, in bytes.
pub const HOLDER_BYTES_MAX: usize = 256;

/// The most names one [`AcquireAll`] may ask for.
pub const LOCK_NAMES_MAX: usize = 64;

/// An acquire of several locks, all or nothing.
///
/// Granted when every name is free and the request is first in every name's queue;
/// otherwise it waits in every name's queue at once (one arrival, appended to each), so
/// the queues agree with one arrival order and the oldest waiter is first in all of
/// its queues: no deadlock, whatever order callers list the names in. Queues are
/// strict FIFO: a free lock whose first waiter also waits for another lock stays free
/// until that waiter is granted or leaves, so a waiter for `{a, b}` is never starved by
/// a stream of waiters for `a` alone (they queue behind it). Tokens are minted in the
/// names' sorted order, one per name, each above every token before it. A lease that
/// already holds some of the names but not all is refused at once (`lock_held`).
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AcquireAll {
    /// One to [`LOCK_NAMES_MAX`] names; the table sorts them and drops repeats.
    pub names: Vec<LockName>,
    pub lease: LeaseRef,
    /// 0 is a try-lock.
    pub wait_ms: u64,
    pub lock_delay_ms: u64,
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub holder: Option<String>,
}

/// The lease an acquire holds the lock under.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum LeaseRef {
    /// A live lease the caller created and keeps alive.
    Existing(LeaseId),
    /// A lease for this request alone, created only when the acquire is granted or
    /// queued. It cannot expire while its request waits (the open request is the proof
    /// of life; the driver sends `Cancel` when the caller goes away), its TTL starts at
    /// the grant, and a refused or withdrawn request leaves nothing behind. The id may
    /// be the caller's: a retry under the same id (its first attempt's answer was lost
    /// with a leader) gets the first attempt's grant, or waits beside it in the queue
    /// and is granted with it; the lease ends when the last of them is withdrawn.
    Implicit { id: LeaseId, ttl_ms: u64 },
}

impl LeaseRef {
    pub fn id(self) -> LeaseId {
        match self {
            LeaseRef::Existing(id) | LeaseRef::Implicit { id, .. } => id,
        }
    }
}

/// A successful answer.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Answer {
    /// A lease created or kept alive.
    Lease(LeaseInfo),
    /// A lock granted (an idempotent re-acquire by the holder gets the same grant).
    Granted(Grant),
    /// Every lock of an [`AcquireAll`], in the names' sorted order.
    GrantedAll(Vec<Grant>),
    /// A lock released; its token.
    Released(Token),
    /// Revoked, or cancelled.
    Done,
    /// A store command admitted.
    Store(StoreAnswer),
}

/// Everything one `apply` produced, in order.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// The answers, by request: the command's own, if it was answered now, and those of
    /// queued acquires that ended. A request that waits gets no answer yet; a request
    /// withdrawn by `Cancel` gets none at all.
    pub answers: Vec<(RequestId, Result<Answer, Error>)>,
    /// What happened, for observers (events, metrics, traces).
    pub effects: Vec<Effect>,
    /// The position of the last of `effects` among every effect the table produced
    /// since it was created ([`Output::effect_index`]), the same on every replica.
    pub effects_through: u64,
    /// The acquires that now wait in a lock's queue with no answer yet: their answer
    /// comes in a later output (a grant, or a wait's end), or never (withdrawn).
    pub queued: Vec<RequestId>,
}

impl Output {
    pub fn clear(&mut self) {
        self.answers.clear();
        self.effects.clear();
        self.queued.clear();
    }

    /// The position of `effects[i]` (the first effect a table ever produced is 1).
    pub fn effect_index(&self, i: usize) -> u64 {
        self.effects_through - (self.effects.len() - 1 - i) as u64
    }

    /// The answer to `request`, if this output has one.
    pub fn take_answer(&mut self, request: RequestId) -> Option<Result<Answer, Error>> {
        let i = self.answers.iter().position(|(r, _)| *r == request)?;
        Some(self.answers.remove(i).1)
    }
}
