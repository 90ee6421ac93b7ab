//! One log entry applied to a replica's table: the only way a replicated lock service
//! changes.
//!
//! A [`Batch`] is what a leader proposes and the log carries: commands in order, each
//! with the request id its answer is routed by, and the leader's stamp. Every member
//! applies the same batches in the same order through [`LockTable::apply_batch`], so
//! every member holds the same table. It owns the two rules every replica must apply
//! alike:
//!
//! - **the replicated timeline never goes back**: a batch runs at `max(stamp, table
//!   time)`, whatever the proposer stamped (a new leader's clock may start behind);
//! - **a queued acquire is named**: [`Output::queued`] lists the acquires that wait in
//!   a queue with no answer yet, so that a driver never infers it from a missing answer.
//!
//! `fenced-raft`'s state machine (and its test-only faults), the model checker's log and
//! the simulator's replicas all apply entries here.

use std::fmt;

use crate::command::{Command, Output, RequestId};
use crate::table::LockTable;

/// One log entry's commands, applied in order at one timestamp.
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Batch {
    pub items: Vec<(RequestId, Command)>,
    /// The leader's clock when it proposed the batch: milliseconds on the replicated
    /// timeline, which continues from the last applied batch after a leader change.
    pub now_ms: u64,
}

impl Batch {
    /// A batch of one command.
    pub fn one(request: RequestId, cmd: Command, now_ms: u64) -> Batch {
        Batch { items: vec![(request, cmd)], now_ms }
    }
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Batch({} commands at {} ms)", self.items.len(), self.now_ms)
    }
}

impl LockTable {
    /// The time a batch stamped `stamp_ms` runs at: never before the table's time.
    pub fn batch_time(&self, stamp_ms: u64) -> u64 {
        stamp_ms.max(self.now_ms())
    }

    /// Applies a log entry's batch. `each` gets every command's output in turn (its
    /// answers, effects and queued acquire), which is cleared before the next command:
    /// what a command produced is delivered before the next one runs, as a caller
    /// waiting on the first may be told before the second changes the table.
    pub fn apply_batch(&mut self, batch: Batch, out: &mut Output, mut each: impl FnMut(&mut Output)) {
        let now_ms = self.batch_time(batch.now_ms);
        for (request, cmd) in batch.items {
            self.apply_into(request, cmd, now_ms, out);
            each(out);
            out.clear();
        }
    }
}

/// A digest of a table's replicated state: equal on replicas that applied the same
/// log. The table's [`image`](LockTable::image) is hashed: its lists are in a canonical
/// order, so the digest does not depend on how a map or the timer heap was built (a
/// snapshot restore included). Walks the whole table: for checks, not for every request.
pub fn state_hash(table: &LockTable) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    format!("{:?}", table.image()).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Acquire, LeaseId, LeaseRef, Limits, LockName};

    fn acquire(lease: u128, wait_ms: u64) -> Command {
        Command::Acquire(Acquire {
            name: LockName::new("L").unwrap(),
            lease: LeaseRef::Existing(LeaseId(lease)),
            wait_ms,
            lock_delay_ms: 0,
            holder: None,
        })
    }

    /// A batch stamped behind the table runs at the table's time, and the acquire that
    /// waits is named as queued while the one granted is answered.
    #[test]
    fn a_batch_never_goes_back_and_names_its_queued_acquire() {
        let mut t = LockTable::new(Limits::default());
        let mut seen = Vec::new();
        let leases = Batch {
            items: vec![
                (RequestId(1), Command::GrantLease { lease: LeaseId(1), ttl_ms: 10_000 }),
                (RequestId(2), Command::GrantLease { lease: LeaseId(2), ttl_ms: 10_000 }),
            ],
            now_ms: 1_000,
        };
        let mut out = Output::default();
        t.apply_batch(leases, &mut out, |o| seen.push((o.answers.len(), o.queued.clone())));
        let contend =
            Batch { items: vec![(RequestId(3), acquire(1, 0)), (RequestId(4), acquire(2, 5_000))], now_ms: 400 };
        t.apply_batch(contend, &mut out, |o| seen.push((o.answers.len(), o.queued.clone())));
        assert_eq!(t.now_ms(), 1_000, "stamp 400 ran at the table's 1000");
        assert_eq!(seen, vec![(1, vec![]), (1, vec![]), (1, vec![]), (0, vec![RequestId(4)])]);
        assert!(out.answers.is_empty() && out.queued.is_empty(), "cleared after each command");
    }
}
