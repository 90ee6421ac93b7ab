//! One reader of the member's event log, whatever carries it (the HTTP event stream,
//! the wire protocol's WATCH): the events an identity may see under a prefix, from a
//! start position, with position markers so that a reconnect need not read again what
//! the filter passed over, and a `Lagged` item when the reader fell behind what the
//! member holds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::api::App;
use crate::events::{Compacted, EventLog, Indexed, Start};

/// What a watcher yields.
#[derive(Debug)]
pub enum Item {
    /// An event the watcher may see.
    Event(Arc<Indexed>),
    /// Every position up to this one was read (sent or passed over by the filter).
    Mark(u64),
    /// The reader fell behind what the member holds, by at least this many positions.
    Lagged(u64),
}

/// How often at most a position marker tells a filtered watcher how far it has read.
const MARK_EVERY: Duration = Duration::from_secs(1);

/// One watch's reader of the member's event log.
pub struct Watcher {
    log: Arc<EventLog>,
    changed: tokio::sync::watch::Receiver<u64>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    identity: Arc<crate::identity::Identity>,
    prefix: String,
    /// Every event up to this index was sent or passed over.
    cursor: u64,
    /// The last position the client was told (an event's, or a marker's).
    announced: Option<u64>,
    marked_at: tokio::time::Instant,
    batch: VecDeque<Arc<Indexed>>,
}

impl Watcher {
    /// A watcher of `prefix` for `identity` from `start`; `Compacted` when the events
    /// after `start` are no longer all held here.
    pub fn open(
        app: &App,
        identity: Arc<crate::identity::Identity>,
        start: Start,
        prefix: String,
    ) -> Result<Watcher, Compacted> {
        let log = app.locks.events.clone();
        // Subscribed before the cursor is placed: nothing appended after it is missed.
        let changed = log.subscribe();
        let cursor = log.start(start)?;
        Ok(Watcher {
            log,
            changed,
            shutdown: app.shutdown.clone(),
            identity,
            prefix,
            cursor,
            announced: None,
            marked_at: tokio::time::Instant::now(),
            batch: VecDeque::new(),
        })
    }

    /// The next item; `None` once the server shuts down. The first is always a marker
    /// of where the watch starts, so a reconnect before any event resumes from there.
    pub async fn next(&mut self) -> Option<Item> {
        loop {
            if *self.shutdown.borrow() {
                return None;
            }
            while let Some(e) = self.batch.pop_front() {
                // An identity sees the events of the names it may lock or read, and no other.
                let (op, subject) = e.event.subject();
                if e.matches(&self.prefix) && self.identity.allows(op, subject) {
                    self.announced = Some(e.index);
                    return Some(Item::Event(e));
                }
            }
            if self.announced.is_none() {
                return Some(self.mark());
            }
            self.changed.borrow_and_update();
            let mut got = Vec::new();
            match self.log.read(self.cursor, &mut got) {
                Ok(next) if next != self.cursor => {
                    self.cursor = next;
                    self.batch.extend(got);
                }
                Ok(_) => {
                    // Events passed over (filtered) move the position too: say so now
                    // and then, so a reconnect need not read them again.
                    let behind = self.announced != Some(self.cursor);
                    let mark_at = self.marked_at + MARK_EVERY;
                    tokio::select! {
                        r = self.changed.changed() => r.ok()?,
                        _ = self.shutdown.changed() => return None,
                        _ = tokio::time::sleep_until(mark_at), if behind => return Some(self.mark()),
                    }
                }
                Err((missed, at)) => {
                    self.cursor = at;
                    return Some(Item::Lagged(missed));
                }
            }
        }
    }

    fn mark(&mut self) -> Item {
        self.announced = Some(self.cursor);
        self.marked_at = tokio::time::Instant::now();
        Item::Mark(self.cursor)
    }
}
