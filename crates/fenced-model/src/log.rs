//! The model's log entries, and the real lock table they are applied to.
//!
//! An entry carries one command of the model's small alphabet, which `replay` turns into
//! the core's real [`Command`] and applies with the real [`LockTable`], at
//! `max(entry stamp, table time)` as `fenced-raft`'s state machine does. The table is
//! never stored in a model state (it is neither `Clone` nor `Hash`): it is a function of
//! the log, recomputed when needed, so the model checks the very code the server runs.

use fenced_core::{Acquire, Command, LeaseId, LeaseRef, Limits, LockName, LockTable, Output, RequestId};

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
}

/// The request id of the entry at `index`: unique within a log, 0 is "nobody waits".
pub fn request_of(index: usize) -> RequestId {
    RequestId(index as u64 + 1)
}

fn limits(ttl_ms: u64) -> Limits {
    Limits { ttl_ms_min: 1, ttl_ms_max: ttl_ms, ..Limits::default() }
}

/// Applies `log` to a fresh table: the table, and each entry's output.
pub fn replay(log: &[Entry], ttl_ms: u64) -> (LockTable, Vec<Output>) {
    let mut table = LockTable::new(limits(ttl_ms));
    let mut outputs = Vec::with_capacity(log.len());
    for (index, e) in log.iter().enumerate() {
        let mut out = Output::default();
        let now_ms = e.now_ms.max(table.now_ms());
        let request = request_of(index);
        let commands: Vec<Command> = match e.cmd {
            Cmd::Init => (0..2).map(|c| Command::GrantLease { lease: lease_of(c), ttl_ms }).collect(),
            Cmd::Keepalive(c) => vec![Command::Keepalive { lease: lease_of(c) }],
            Cmd::Acquire(c) => vec![Command::Acquire(Acquire {
                name: lock_name(),
                lease: LeaseRef::Existing(lease_of(c)),
                wait_ms: 0,
                lock_delay_ms: 0,
            })],
            Cmd::Tick => vec![Command::Tick],
            Cmd::Blank => vec![],
            Cmd::Promote => vec![Command::Promote],
        };
        for cmd in commands {
            table.apply_into(request, cmd, now_ms, &mut out);
        }
        outputs.push(out);
    }
    (table, outputs)
}
