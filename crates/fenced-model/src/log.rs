//! The model's log entries, and the real lock table they are applied to.
//!
//! An entry carries one command of the model's small alphabet, which [`batch_of`] turns
//! into the core's real [`Batch`] and `replay` applies with the real [`LockTable`]
//! through the one apply every replica uses (`LockTable::apply_batch`). The table is
//! never stored in a model state (it is neither `Clone` nor `Hash`): it is a function of
//! the log, recomputed when needed, so the model checks the very code the server runs.

use fenced_core::{Acquire, Batch, Command, LeaseId, LeaseRef, Limits, LockName, LockTable, Output, RequestId};

/// The lease of client `c` (clients are 0 and 1).
pub fn lease_of(client: u8) -> LeaseId {
    LeaseId(u128::from(client) + 1)
}

/// The client a lease belongs to.
pub fn client_of(lease: LeaseId) -> u8 {
    (lease.0 - 1) as u8
}

/// The one lock both clients contend for.
pub fn lock_name() -> LockName {
    LockName::new("L").expect("a valid name")
}

/// What an entry asks of the lock table.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Cmd {
    /// The first entry: both clients' leases, granted at time 0.
    Init,
    Keepalive(u8),
    /// A try-lock (`wait_ms` 0) under the client's lease.
    Acquire(u8),
    /// The leader's timer: runs the expiries due.
    Tick,
    /// Raft's blank entry of a new term: applies nothing (as in `state_machine.rs`).
    Blank,
    /// A new leader's first batch.
    Promote,
}

/// One log entry.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Entry {
    /// The term of the leader that appended it.
    pub term: u8,
    /// The leader's stamp: its replicated-timeline time when it proposed the entry.
    pub now_ms: u64,
    pub cmd: Cmd,
    /// Keepalives the leader answered from memory since its last entry, by client: the
    /// time it answered each at. The batch carries them first (`Command::Renewed`).
    pub renewed: Renewals,
}

/// Keepalives answered from memory and not yet in the log, by client: the leader's time
/// of the last one.
pub type Renewals = [Option<u64>; 2];

/// No renewals.
pub const NONE_RENEWED: Renewals = [None, None];

impl Entry {
    /// An entry that carries no renewals.
    pub fn new(term: u8, now_ms: u64, cmd: Cmd) -> Entry {
        Entry { term, now_ms, cmd, renewed: NONE_RENEWED }
    }
}

/// The request id of the entry at `index`: unique within a log, 0 is "nobody waits".
pub fn request_of(index: usize) -> RequestId {
    RequestId(index as u64 + 1)
}

fn limits(ttl_ms: u64) -> Limits {
    Limits { ttl_ms_min: 1, ttl_ms_max: ttl_ms, ..Limits::default() }
}

/// The core's batch for the entry at `index`: what the server's log would carry.
pub fn batch_of(index: usize, e: &Entry, ttl_ms: u64) -> Batch {
    let request = request_of(index);
    let commands: Vec<Command> = match e.cmd {
        Cmd::Init => (0..2).map(|c| Command::GrantLease { lease: lease_of(c), ttl_ms }).collect(),
        Cmd::Keepalive(c) => vec![Command::Keepalive { lease: lease_of(c) }],
        Cmd::Acquire(c) => vec![Command::Acquire(Acquire {
            name: lock_name(),
            lease: LeaseRef::Existing(lease_of(c)),
            wait_ms: 0,
            lock_delay_ms: 0,
            holder: None,
        })],
        Cmd::Tick => vec![Command::Tick],
        Cmd::Blank => vec![],
        Cmd::Promote => vec![Command::Promote],
    };
    let leases: Vec<(LeaseId, u64)> = (0..2).filter_map(|c| e.renewed[c].map(|at| (lease_of(c as u8), at))).collect();
    let renewed = (!leases.is_empty()).then_some((RequestId(0), Command::Renewed { leases }));
    let items = renewed.into_iter().chain(commands.into_iter().map(|c| (request, c))).collect();
    Batch { items, now_ms: e.now_ms }
}

/// A fresh table for a model of lease TTL `ttl_ms`.
pub fn fresh_table(ttl_ms: u64) -> LockTable {
    LockTable::new(limits(ttl_ms))
}

/// Applies `log` to a fresh table through the core's one apply (`apply_batch`): the
/// table, and what each entry produced (its commands' outputs together).
pub fn replay(log: &[Entry], ttl_ms: u64) -> (LockTable, Vec<Output>) {
    let mut table = fresh_table(ttl_ms);
    let mut outputs = Vec::with_capacity(log.len());
    let mut scratch = Output::default();
    for (index, e) in log.iter().enumerate() {
        let mut entry_out = Output::default();
        table.apply_batch(batch_of(index, e, ttl_ms), &mut scratch, |out| {
            entry_out.answers.append(&mut out.answers);
            entry_out.effects.append(&mut out.effects);
            entry_out.queued.append(&mut out.queued);
            entry_out.effects_through = out.effects_through;
        });
        outputs.push(entry_out);
    }
    (table, outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(now_ms: u64, cmd: Cmd) -> Entry {
        Entry::new(1, now_ms, cmd)
    }

    /// The bridge to the core: leases granted at 0 with TTL 2 expire at 2 unless kept
    /// alive, a grant mints token 1, a blank entry applies nothing, and `Promote` gives
    /// every lease a full TTL again.
    #[test]
    fn replay_applies_the_real_table() {
        let (t, out) = replay(&[at(0, Cmd::Init), at(1, Cmd::Keepalive(0)), at(2, Cmd::Tick)], 2);
        assert!(t.lease(lease_of(0)).is_some() && t.lease(lease_of(1)).is_none());
        assert!(out[2]
            .effects
            .iter()
            .any(|e| matches!(e, fenced_core::Effect::LeaseExpired { lease, .. } if client_of(*lease) == 1)));
        let (t, _) = replay(&[at(0, Cmd::Init), at(1, Cmd::Acquire(1))], 2);
        assert_eq!(t.holder_token(&lock_name()).map(|t| t.get()), Some(1));
        let (t, _) = replay(&[at(0, Cmd::Init), at(5, Cmd::Blank)], 2);
        assert_eq!(t.now_ms(), 0, "a blank entry does not move the table's clock");
        let (t, _) = replay(&[at(0, Cmd::Init), at(1, Cmd::Promote), at(2, Cmd::Tick)], 2);
        assert_eq!(t.lease(lease_of(1)).map(|l| l.expires_at_ms), Some(3));
        // Stamps never take the table back (`max(stamp, table time)`).
        let (t, _) = replay(&[at(0, Cmd::Init), at(1, Cmd::Keepalive(0)), at(0, Cmd::Keepalive(0))], 2);
        assert_eq!((t.now_ms(), t.lease(lease_of(0)).map(|l| l.expires_at_ms)), (1, Some(3)));
        // A renewal answered at 1 rides the tick at 2: taken before the tick's expiries.
        let tick = Entry { renewed: [Some(1), None], ..at(2, Cmd::Tick) };
        let (t, _) = replay(&[at(0, Cmd::Init), tick], 2);
        assert_eq!(t.lease(lease_of(0)).map(|l| l.expires_at_ms), Some(3));
        assert!(t.lease(lease_of(1)).is_none(), "the lease not renewed expired at 2");
    }
}
