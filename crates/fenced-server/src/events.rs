//! Server-sent events: what the lock service and the fenced store publish.
//!
//! Lease ids never appear here: a lease id is the capability to release or revoke.

use serde::Serialize;
use utoipa::ToSchema;

/// The `type` field names the event; `at_ms` is the lock table's time.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Granted {
        at_ms: u64,
        name: String,
        token: u64,
        ttl_ms: u64,
        /// The holder's label, when it gave one.
        #[serde(skip_serializing_if = "Option::is_none")]
        holder: Option<String>,
    },
    /// Released explicitly (`reason` "released") or by a lease revoke ("revoked").
    Released {
        at_ms: u64,
        name: String,
        token: u64,
        reason: &'static str,
    },
    /// Released because the holder's lease expired.
    Expired {
        at_ms: u64,
        name: String,
        token: u64,
    },
    StoreAccepted {
        at_ms: u64,
        key: String,
        token: u64,
        op: &'static str,
    },
    StoreRejected {
        at_ms: u64,
        key: String,
        token: u64,
        highest_seen: u64,
        op: &'static str,
    },
}

impl Event {
    /// The lock or store key it is about, and the right an identity needs to see it.
    pub fn subject(&self) -> (crate::identity::Op, &str) {
        use crate::identity::Op;
        match self {
            Event::Granted { name, .. } | Event::Released { name, .. } | Event::Expired { name, .. } => {
                (Op::Lock, name)
            }
            Event::StoreAccepted { key, .. } | Event::StoreRejected { key, .. } => (Op::StoreRead, key),
        }
    }

    /// The SSE `event:` field.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Granted { .. } => "granted",
            Event::Released { .. } => "released",
            Event::Expired { .. } => "expired",
            Event::StoreAccepted { .. } => "store_accepted",
            Event::StoreRejected { .. } => "store_rejected",
        }
    }
}

/// An event and its position: strictly increasing, and the same on every member for the
/// same event (it is the position of its effect among every effect the replicated lock
/// table produced), so a watcher may resume from another member than the one it left.
/// Positions have gaps: effects that are not events (a lease's expiry, a wait's end)
/// have positions too.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Indexed {
    pub index: u64,
    #[serde(flatten)]
    pub event: Event,
}

impl Indexed {
    /// Whether a watcher of `prefix` sees it (the lock name or store key starts with it).
    pub fn matches(&self, prefix: &str) -> bool {
        self.event.subject().1.starts_with(prefix)
    }
}

/// Where a watcher starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Exactly after this position (`since`, `Last-Event-ID`).
    After(u64),
    /// The last `n` events held, then what follows (for a view opening).
    Tail(usize),
    /// What happens from now on.
    Now,
}

/// `since` is older than every event held.
#[derive(Debug, PartialEq, Eq)]
pub struct Compacted {
    /// The oldest position held: `since` at least one below it resumes.
    pub oldest_index: u64,
}

/// The recent events of this member, bounded, for watchers to resume from, and the
/// signal of new ones. Filled in log order as entries are applied; a watcher reads it
/// at its own pace with a cursor, so a live stream and a resumed one are the same code.
pub struct EventLog {
    ring: std::sync::Mutex<Ring>,
    /// The position of the last effect applied here: watchers wait on its changes.
    through: tokio::sync::watch::Sender<u64>,
    retained: usize,
}

struct Ring {
    events: std::collections::VecDeque<std::sync::Arc<Indexed>>,
    /// Every event at a position at or above this one is held (when it happened).
    from: u64,
    /// The position of the last effect applied.
    through: u64,
}

/// At most this many events go to a watcher per look at the log.
const BATCH: usize = 256;

impl EventLog {
    pub fn new(retained: usize) -> EventLog {
        let ring = Ring { events: Default::default(), from: 1, through: 0 };
        EventLog { ring: std::sync::Mutex::new(ring), through: tokio::sync::watch::channel(0).0, retained }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state was replaced: what comes next follows `through`, and nothing before it
    /// is known here any more.
    pub fn reset(&self, through: u64) {
        let mut r = self.ring();
        r.events.clear();
        (r.from, r.through) = (through + 1, through);
        drop(r);
        self.signal(through);
    }

    /// One applied command's effects end at `through`; `events` are those of them that
    /// are events (in order, positions at most `through`).
    pub fn append(&self, events: impl IntoIterator<Item = Indexed>, through: u64) {
        let mut r = self.ring();
        if through < r.through {
            // Cannot happen (positions come from the replicated log); start afresh.
            tracing::error!(through, held = r.through, "event positions went backwards");
            r.events.clear();
            r.from = through + 1;
        }
        for e in events {
            if self.retained == 0 {
                r.from = e.index + 1;
                continue;
            }
            if r.events.len() == self.retained {
                let gone = r.events.pop_front().expect("full");
                r.from = gone.index + 1;
            }
            r.events.push_back(std::sync::Arc::new(e));
        }
        r.through = through;
        drop(r);
        self.signal(through);
    }

    /// Tells the watchers that the effects through `through` are applied: called for
    /// every applied command, so with no watcher the position is stored and nobody is
    /// woken (a `watch` sender otherwise locks and wakes each of its waiter lists every
    /// time). A watcher subscribing after the check below places its cursor by the
    /// ring, which already holds `through`, so it misses nothing.
    fn signal(&self, through: u64) {
        if self.through.receiver_count() == 0 {
            self.through.send_if_modified(|v| {
                *v = through;
                false
            });
        } else {
            self.through.send_replace(through);
        }
    }

    /// Where a watcher starting at `from` stands: the position it has seen up to.
    pub fn start(&self, from: Start) -> Result<u64, Compacted> {
        let r = self.ring();
        match from {
            Start::Now => Ok(r.through),
            Start::Tail(n) => {
                let skip = r.events.len().saturating_sub(n);
                Ok(r.events.get(skip).map_or(r.through, |e| e.index - 1))
            }
            // Events after `since` are all held when nothing between it and `from` is
            // missing; a `since` ahead of this member waits for it to catch up.
            Start::After(since) if since.saturating_add(1) >= r.from || since >= r.through => Ok(since),
            Start::After(_) => Err(Compacted { oldest_index: r.from }),
        }
    }

    /// The events after `cursor` (at most [`BATCH`]) and the new cursor; `Err` when the
    /// watcher fell behind what is held (the number of positions it missed, at least).
    pub fn read(&self, cursor: u64, out: &mut Vec<std::sync::Arc<Indexed>>) -> Result<u64, (u64, u64)> {
        let r = self.ring();
        if cursor >= r.through {
            return Ok(cursor);
        }
        if cursor + 1 < r.from {
            return Err((r.from - cursor - 1, r.from - 1));
        }
        let first = r.events.partition_point(|e| e.index <= cursor);
        out.extend(r.events.range(first..).take(BATCH).cloned());
        let taken_all = first + out.len() == r.events.len();
        Ok(if taken_all { r.through } else { out.last().map_or(r.through, |e| e.index) })
    }

    /// Resolves once the position moved past `cursor`.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.through.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(index: u64, name: &str) -> Indexed {
        let event = Event::Expired { at_ms: 0, name: name.into(), token: index };
        Indexed { index, event }
    }

    #[test]
    fn a_watcher_resumes_exactly_after_its_position_or_hears_it_was_compacted() {
        let log = EventLog::new(3);
        log.append([ev(1, "a"), ev(3, "b")], 4);
        log.append([ev(6, "a"), ev(7, "c")], 7);
        // Held: 3, 6, 7; 1 is gone, so positions from 2 on are whole.
        assert_eq!(log.start(Start::After(0)), Err(Compacted { oldest_index: 2 }));
        assert_eq!(log.start(Start::After(1)), Ok(1));
        assert_eq!(log.start(Start::After(9)), Ok(9), "a member behind the watcher makes it wait");
        assert_eq!(log.start(Start::Now), Ok(7));
        assert_eq!(log.start(Start::Tail(2)), Ok(5));
        let mut out = vec![];
        assert_eq!(log.read(3, &mut out), Ok(7));
        assert_eq!(out.iter().map(|e| e.index).collect::<Vec<_>>(), [6, 7]);
        out.clear();
        assert_eq!(log.read(7, &mut out), Ok(7));
        assert!(out.is_empty());
        assert_eq!(log.read(0, &mut out), Err((1, 1)), "a watcher left behind is told");
    }

    #[test]
    fn a_reset_forgets_what_came_before() {
        let log = EventLog::new(10);
        log.append([ev(1, "a")], 1);
        log.reset(50);
        assert_eq!(log.start(Start::After(1)), Err(Compacted { oldest_index: 51 }));
        assert_eq!(log.start(Start::After(50)), Ok(50));
        let log = EventLog::new(0);
        log.append([ev(1, "a")], 2);
        assert_eq!(log.start(Start::After(0)), Err(Compacted { oldest_index: 2 }));
        assert_eq!(log.start(Start::After(2)), Ok(2));
    }

    #[test]
    fn a_long_backlog_comes_in_bounded_batches() {
        let log = EventLog::new(1000);
        log.append((1..=600).map(|i| ev(i, "a")), 600);
        let (mut cursor, mut seen) = (0, vec![]);
        loop {
            let mut out = vec![];
            let next = log.read(cursor, &mut out).unwrap();
            assert!(out.len() <= BATCH);
            seen.extend(out.iter().map(|e| e.index));
            if next == cursor {
                break;
            }
            cursor = next;
        }
        assert_eq!(seen, (1..=600).collect::<Vec<_>>());
    }

    #[test]
    fn appends_without_a_watcher_wake_nobody_and_a_later_watcher_misses_nothing() {
        let log = EventLog::new(10);
        log.append([ev(1, "a")], 1);
        log.append([ev(2, "b")], 2);
        let mut changed = log.subscribe();
        assert_eq!(*changed.borrow(), 2, "the position is kept without a watcher");
        assert!(!changed.has_changed().unwrap(), "a new watcher starts from what it can read");
        let mut out = vec![];
        assert_eq!(log.read(0, &mut out), Ok(2));
        assert_eq!(out.len(), 2);
        log.append([ev(3, "c")], 3);
        assert!(changed.has_changed().unwrap(), "a watcher is woken by the next append");
        assert_eq!(*changed.borrow_and_update(), 3);
        drop(changed);
        log.reset(9);
        assert_eq!(*log.subscribe().borrow(), 9);
    }
}
