//! The table's timer queue: a min-heap of (time, insertion order, what).
//!
//! Entries are not removed one by one. A timer whose subject is gone (a revoked lease, a
//! granted waiter) is skipped when it fires, and a lease's expiry timer re-arms itself
//! when the lease was kept alive meanwhile. That keeps keepalive, the hottest call, free
//! of heap work. So that dead entries cannot pile up (a granted waiter's deadline would
//! otherwise sit in the heap for its whole wait), the table sweeps them out with
//! `retain` whenever they outnumber the live subjects: linear work once per doubling,
//! constant per timer amortised, and the heap stays the size of what is live.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::command::RequestId;
use crate::{LeaseId, LockName};

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) enum Timer {
    LeaseExpiry(LeaseId),
    WaitDeadline(RequestId),
    LockDelayEnds(LockName),
    GrantsResume,
}

#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) struct Timers {
    /// Ordered by time, then by insertion, so equal times fire deterministically.
    heap: BinaryHeap<Reverse<(u64, u64, Timer)>>,
    pushed: u64,
}

impl Timers {
    pub(super) fn push(&mut self, at_ms: u64, timer: Timer) {
        self.pushed += 1;
        self.heap.push(Reverse((at_ms, self.pushed, timer)));
    }

    /// Every entry as `(at, order set, what)`, by when it fires: the heap's contents,
    /// whatever its layout.
    pub(super) fn entries(&self) -> Vec<(u64, u64, Timer)> {
        let mut v: Vec<_> = self.heap.iter().map(|Reverse(e)| e.clone()).collect();
        v.sort_unstable_by_key(|e| (e.0, e.1));
        v
    }

    /// How many timers were ever set.
    pub(super) fn set_count(&self) -> u64 {
        self.pushed
    }

    /// The queue of `entries` (as [`entries`](Self::entries) gives them) after `pushed`
    /// were set: refused when they are out of order or one claims a later order.
    pub(super) fn from_entries(entries: Vec<(u64, u64, Timer)>, pushed: u64) -> Result<Timers, String> {
        if entries.windows(2).any(|w| (w[0].0, w[0].1) >= (w[1].0, w[1].1)) || entries.iter().any(|e| e.1 > pushed) {
            return Err("its timers are out of order".into());
        }
        Ok(Timers { heap: entries.into_iter().map(Reverse).collect(), pushed })
    }

    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Keeps only the entries `live` says still have a subject.
    pub(super) fn retain(&mut self, mut live: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse((_, _, t))| live(t));
    }

    pub(super) fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    pub(super) fn pop_due(&mut self, now_ms: u64) -> Option<(u64, Timer)> {
        if self.next_at()? > now_ms {
            return None;
        }
        self.heap.pop().map(|Reverse((at, _, timer))| (at, timer))
    }
}
