//! A watch on the lock service's events that misses nothing across a reconnect.
//!
//! Every event has an `index`, strictly increasing and the same on every member. The
//! watch remembers the last position the server told it (an event's index, or a
//! position marker the server sends when a stream opens and while it passes over
//! events of other prefixes) and, when the stream breaks, reopens it on whichever
//! member answers with `since` that position: the events after it arrive exactly once.
//! When the members no longer hold every event after it (`compacted`), or a stream fell
//! behind what they hold (`lagged`), the watch says so as [`Error::Missed`] rather than
//! going on with a gap: list the locks again and start a new watch.

use std::collections::VecDeque;
use std::time::Duration;

use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::conn::{Conn, EventSource};
use crate::error::Error;
use crate::mux::Reply;

/// No byte for this long (the server sends a comment at least every 15 s): the stream
/// is taken for dead and reopened.
const SILENCE_MAX: Duration = Duration::from_secs(45);
/// The most bytes one SSE block may take (an event is a few hundred).
const BLOCK_BYTES_MAX: usize = 64 << 10;

/// One event, as the server published it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct WatchEvent {
    /// Its position: strictly increasing, the same on every member.
    pub index: u64,
    /// The lock table's time of the log entry, in milliseconds.
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    Granted {
        name: String,
        token: u64,
        ttl_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<String>,
    },
    /// `reason`: `released`, `revoked` (the lease was revoked) or `forced` (an
    /// operator took the lock).
    Released {
        name: String,
        token: u64,
        reason: String,
    },
    Expired {
        name: String,
        token: u64,
    },
    StoreAccepted {
        key: String,
        token: u64,
        op: String,
    },
    StoreRejected {
        key: String,
        token: u64,
        highest_seen: u64,
        op: String,
    },
    /// A type this client does not know (a newer server's).
    #[serde(other)]
    Other,
}

/// A watch of the events of names and keys that start with a prefix
/// ([`crate::Client::watch`]).
pub struct Watch {
    conn: Conn,
    prefix: String,
    /// The last position the server told: the next stream starts exactly after it.
    position: Option<u64>,
    /// Whether a stream was ever open: from then on, a reconnect needs the position.
    started: bool,
    source: Option<EventSource>,
    buf: Vec<u8>,
    ready: VecDeque<WatchEvent>,
    /// How long the watch keeps trying to reopen a broken stream before `next` fails.
    retry_for: Duration,
}

impl Watch {
    pub(crate) fn new(conn: Conn, prefix: &str, since: Option<u64>, retry_for: Duration) -> Watch {
        Watch {
            conn,
            prefix: prefix.to_string(),
            position: since,
            started: since.is_some(),
            source: None,
            buf: Vec::new(),
            ready: VecDeque::new(),
            retry_for,
        }
    }

    /// The last position the server told this watch: a new watch from here
    /// (`since`) misses nothing and repeats nothing.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Opens the stream now and waits until the server told where it starts: events
    /// from then on are this watch's (read the state after this, not before, and no
    /// change between the two is missed). `next` does it by itself otherwise.
    pub async fn ready(&mut self) -> Result<(), Error> {
        if self.source.is_none() {
            self.open().await?;
        }
        while self.position.is_none() {
            if self.read_block().await?.is_none() {
                self.source = None;
                return Err(Error::unavailable("the event stream closed before it told its position"));
            }
        }
        Ok(())
    }

    /// The next event. A broken stream is reopened (on any member) from the last
    /// position; `Unavailable` after `retry_for` without a stream (call again to go on
    /// trying); [`Error::Missed`] when events after the position are no longer held.
    pub async fn next(&mut self) -> Result<WatchEvent, Error> {
        let mut broken_since: Option<Instant> = None;
        let mut backoff = Duration::from_millis(50);
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(e);
            }
            if self.source.is_none() {
                match self.open().await {
                    Ok(()) => {}
                    Err(e @ Error::Unavailable { .. }) => {
                        let since = *broken_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.retry_for {
                            return Err(e);
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            match self.read_block().await? {
                Some(()) => {}
                None => {
                    self.source = None;
                    self.buf.clear();
                }
            }
        }
    }

    async fn open(&mut self) -> Result<(), Error> {
        // A stream that broke before it said where it started cannot resume.
        if self.position.is_none() && self.started {
            return Err(Error::Missed {
                oldest_index: None,
                message: "the stream broke before the server told its position".into(),
            });
        }
        match self.conn.open_watch(&self.prefix, self.position).await? {
            Ok(source) => {
                self.source = Some(source);
                self.started = true;
                Ok(())
            }
            Err(e) if e.code == "compacted" => Err(Error::Missed {
                oldest_index: e.detail_u64("oldest_index"),
                message: format!("events after index {} are no longer held: {}", self.position.unwrap_or(0), e.message),
            }),
            Err(e) => Err(e.into_error()),
        }
    }

    /// Reads one item of the stream and handles it; `None` when the stream broke.
    async fn read_block(&mut self) -> Result<Option<()>, Error> {
        match self.source.as_mut().expect("a stream is open") {
            EventSource::Http(_) => self.read_sse_block().await,
            EventSource::Wire(stream) => {
                let reply = match tokio::time::timeout(SILENCE_MAX, stream.next()).await {
                    Ok(Some(reply)) => reply,
                    // Silent too long, ended (shutting down, cancelled), or broken: reopen.
                    _ => return Ok(None),
                };
                match reply {
                    Reply::Event { index, data } => self.on_item(Some(index), None, Some(&data))?,
                    Reply::Mark(index) => self.on_item(Some(index), None, None)?,
                    Reply::Lagged(missed) => return Err(self.lagged(Some(missed))),
                    Reply::Error(_) => return Ok(None),
                    other => return Err(crate::error::bad_answer(&format!("a watch answered {other:?}"))),
                }
                Ok(Some(()))
            }
        }
    }

    /// Reads until one SSE block is whole and handles it; `None` when the stream broke.
    async fn read_sse_block(&mut self) -> Result<Option<()>, Error> {
        loop {
            if let Some(end) = find_block_end(&self.buf) {
                let block: Vec<u8> = self.buf.drain(..end).collect();
                self.handle(&block)?;
                return Ok(Some(()));
            }
            if self.buf.len() > BLOCK_BYTES_MAX {
                return Ok(None);
            }
            let Some(EventSource::Http(body)) = self.source.as_mut() else { return Ok(None) };
            let frame = match tokio::time::timeout(SILENCE_MAX, body.frame()).await {
                Ok(Some(Ok(frame))) => frame,
                // Silent too long, ended, or broken: reopen from the position.
                _ => return Ok(None),
            };
            if let Ok(data) = frame.into_data() {
                self.buf.extend(data.iter().filter(|b| **b != b'\r'));
            }
        }
    }

    fn handle(&mut self, block: &[u8]) -> Result<(), Error> {
        let text = String::from_utf8_lossy(block);
        let (mut id, mut kind, mut data) = (None, None, None);
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().parse::<u64>().ok();
            } else if let Some(v) = line.strip_prefix("event:") {
                kind = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data = Some(v.trim_start().to_string());
            }
        }
        self.on_item(id, kind.as_deref(), data.as_deref().map(str::as_bytes))
    }

    /// The stream fell behind what the server holds (by `missed` positions, when it said).
    fn lagged(&mut self, missed: Option<u64>) -> Error {
        self.source = None;
        self.buf.clear();
        let by = missed.map_or(String::new(), |n| format!(" by {n} positions"));
        Error::Missed {
            oldest_index: None,
            message: format!("the stream fell behind what the server holds{by} after index {:?}", self.position),
        }
    }

    /// One item of either transport: a position (`id`), its kind, its event's JSON.
    fn on_item(&mut self, id: Option<u64>, kind: Option<&str>, data: Option<&[u8]>) -> Result<(), Error> {
        if kind == Some("lagged") {
            return Err(self.lagged(None));
        }
        if let Some(data) = data {
            let event: WatchEvent = serde_json::from_slice(data).map_err(|e| Error::Server {
                status: None,
                code: "bad_response".into(),
                message: format!("an event did not parse: {e}"),
            })?;
            if self.position.is_some_and(|p| event.index <= p) {
                // Already delivered (cannot happen with a server that resumes exactly).
                return Ok(());
            }
            self.ready.push_back(event);
        }
        if let Some(id) = id {
            self.position = Some(self.position.map_or(id, |p| p.max(id)));
        }
        Ok(())
    }
}

/// The leader of an election: the holder of its lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Leader {
    /// The leadership's fencing token: a later leader's is higher.
    pub token: u64,
    /// The label the leader campaigned with.
    pub holder: Option<String>,
    /// How long its lease has left, as the lock table counts.
    pub expires_in_ms: Option<u64>,
}

/// A lock view (`GET /v1/locks/{name}`) read as an election.
pub(crate) fn leader_of(view: &serde_json::Value) -> Option<Leader> {
    if view["held"].as_bool() != Some(true) {
        return None;
    }
    Some(Leader {
        token: view["token"].as_u64()?,
        holder: view["holder"].as_str().map(str::to_string),
        expires_in_ms: view["expires_in_ms"].as_u64(),
    })
}

/// A change of an election's leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum LeaderChange {
    /// A leader was elected (`holder`: its label).
    Elected { index: u64, token: u64, holder: Option<String> },
    /// The leader with `token` is leader no more: it resigned (`released`), its lease
    /// ended (`expired`, `revoked`), or an operator took the lock (`forced`).
    Vacated { index: u64, token: u64, reason: String },
}

/// Follows one election ([`crate::Client::observe`]).
pub struct Observe {
    watch: Watch,
    name: String,
}

impl Observe {
    pub(crate) fn new(watch: Watch, name: &str) -> Observe {
        Observe { watch, name: name.to_string() }
    }

    /// See [`Watch::ready`].
    pub async fn ready(&mut self) -> Result<(), Error> {
        self.watch.ready().await
    }

    /// The last position seen (resume a new observer from it).
    pub fn position(&self) -> Option<u64> {
        self.watch.position()
    }

    /// The next change of this election's leader.
    pub async fn next(&mut self) -> Result<LeaderChange, Error> {
        loop {
            let e = self.watch.next().await?;
            let index = e.index;
            match e.kind {
                EventKind::Granted { name, token, holder, .. } if name == self.name => {
                    return Ok(LeaderChange::Elected { index, token, holder })
                }
                EventKind::Released { name, token, reason } if name == self.name => {
                    return Ok(LeaderChange::Vacated { index, token, reason })
                }
                EventKind::Expired { name, token } if name == self.name => {
                    return Ok(LeaderChange::Vacated { index, token, reason: "expired".into() })
                }
                // Another name under the same prefix, or a store event.
                _ => continue,
            }
        }
    }
}

/// The end of the first block (after its blank line), if the buffer holds one whole.
fn find_block_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_unknown_types_are_other() {
        let e: WatchEvent =
            serde_json::from_str(r#"{"index":7,"at_ms":1,"type":"granted","name":"a","token":3,"ttl_ms":10}"#).unwrap();
        assert_eq!(e.index, 7);
        assert!(matches!(e.kind, EventKind::Granted { token: 3, holder: None, .. }));
        let e: WatchEvent = serde_json::from_str(r#"{"index":8,"at_ms":1,"type":"elected","x":1}"#).unwrap();
        assert_eq!(e.kind, EventKind::Other);
        assert_eq!(find_block_end(b"id: 1\n: position\n\nrest"), Some(18));
        assert_eq!(find_block_end(b"id: 1\n"), None);
    }
}
