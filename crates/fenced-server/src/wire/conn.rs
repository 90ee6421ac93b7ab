//! One wire-protocol connection: read frames, run each through the API's handlers,
//! write the answers, several per write when several are ready.
//!
//! Calls that finish at once (keepalive, release, revoke, check, and an acquire that
//! is granted or refused on the spot) are answered in the order they came, without a
//! task or a wake-up of their own. Those that must wait (a queued acquire, the fenced
//! store's durable calls, a lease that raises the TTL high-water mark) stay in a set
//! of futures that this one task polls; a queued acquire can be withdrawn with
//! CANCEL, and everything in flight is dropped, and so withdrawn, when the
//! connection closes, as an HTTP request is when its connection closes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::http::StatusCode;
use fenced_core::{Grant, LeaseId, Token};
use fenced_wire::{self as w, op, Detail, FrameError, PreambleError, Request, Response, Version};
use futures_util::future::{AbortHandle, Abortable, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use crate::api::{self, ApiError, App, Caller};
use crate::metrics::inc;

/// Requests of one connection that may wait at once; past it the connection stops
/// reading until some finish (the client's further requests wait in the socket).
pub const IN_FLIGHT_MAX: usize = 1024;

/// Watches one connection may hold open at once (WATCH); past it a WATCH is refused
/// `too_busy`.
pub const WATCHES_MAX: usize = 16;

/// Frames of a connection's watches waiting to be written: a watcher whose client
/// does not read waits here, then falls behind the member's events (`lagged`).
const WATCH_FRAMES_QUEUED: usize = 256;

/// Bytes kept free in the read buffer before each read.
const READ_CHUNK_BYTES: usize = 16 << 10;

/// Frames longer than this take their length from the budget of request bodies in
/// flight (`body_bytes_in_flight_max`, shared with HTTP) while they arrive, so that
/// many connections sending large frames at once cannot hold more memory than HTTP
/// bodies may; shorter ones fit the connection's own read buffer.
const FRAME_BUDGET_FROM_BYTES: usize = 64 << 10;
/// How often a held frame asks again whether the leader has room for it.
const HOLD_RECHECK: Duration = Duration::from_millis(5);

/// What becomes of a large frame begun ([`Session::reserve_frame`]).
enum Reserve {
    Read,
    Hold,
    Refused,
}

/// The largest frame a connection may send before it is authenticated (an AUTH frame
/// with a token of up to 4 KiB): an unauthenticated peer cannot make the server
/// buffer a large frame.
const PREAUTH_FRAME_BYTES_MAX: usize = 4096 + w::FRAME_OVERHEAD_BYTES;

/// A request's outcome, owned, ready to encode.
pub(super) enum Answer {
    /// An answer frame encoded already: the leader's, to a frame forwarded to it.
    Frame(Vec<u8>),
    Done(u8),
    Lease(u8, LeaseId, u64),
    /// A grant and, when the service signs grants, its signature.
    Granted(Grant, Option<Vec<u8>>),
    /// Every grant of a set and, when the service signs, a signature for each.
    GrantedAll(Vec<Grant>, Vec<Vec<u8>>),
    Released(Token),
    Checked(bool, Option<Token>),
    Written(Token),
    Read(Option<Token>, Vec<u8>),
    Error(ApiError),
}

type Pending = Pin<Box<dyn Future<Output = (u32, Answer)> + Send>>;

/// A connection's state apart from its socket and read buffer.
struct Session {
    app: App,
    /// Answers not yet written.
    out: Vec<u8>,
    /// Whether the bearer token was presented (always, without auth).
    authed: bool,
    /// Who authenticated (with every right on an open server); None before AUTH.
    caller: Option<Caller>,
    /// The token AUTH presented, to find the caller again after a reload of the
    /// identities (SIGHUP), so that a revoked identity loses its open connections too.
    token: Option<Vec<u8>>,
    /// The identities' generation `caller` was found in.
    generation: u64,
    /// The client's address, for the audit log.
    remote: Option<std::net::SocketAddr>,
    /// The subject of the client certificate the TLS handshake verified (`client_ca`).
    subject: Option<String>,
    /// Requests that must wait.
    pending: FuturesUnordered<Pending>,
    /// Waiting acquires, by request id, for CANCEL.
    cancels: HashMap<u32, AbortHandle>,
    /// Open watches, by request id: their tasks, for CANCEL and for the end of the
    /// connection (every one is stopped then: see `Drop`).
    watches: HashMap<u32, tokio::task::AbortHandle>,
    /// What the watches send: the request id, an encoded frame, whether it is the last.
    watch_tx: tokio::sync::mpsc::Sender<(u32, Vec<u8>, bool)>,
    /// The protocol version the client's preamble named: the shape of its error
    /// answers (the current one until the preamble is read).
    version: Version,
}

impl Drop for Session {
    fn drop(&mut self) {
        for (_, task) in self.watches.drain() {
            task.abort();
        }
    }
}

pub async fn serve_conn<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    remote: Option<std::net::SocketAddr>,
    subject: Option<String>,
    app: App,
    _permit: OwnedSemaphorePermit,
    mut stop: watch::Receiver<bool>,
) {
    let idle = (app.config.idle_timeout_ms > 0).then(|| Duration::from_millis(app.config.idle_timeout_ms));
    let frame_max = app.config.body_bytes_max + w::FRAME_OVERHEAD_BYTES;
    let (watch_tx, mut watch_rx) = tokio::sync::mpsc::channel(WATCH_FRAMES_QUEUED);
    let mut s = Session::new(app, remote, subject, watch_tx);
    let mut inbox = Inbox::default();
    let mut closing = *stop.borrow();
    let mut last_io = Instant::now();
    let mut idle_sleep = Box::pin(tokio::time::sleep(idle.unwrap_or(Duration::MAX / 4)));
    let mut frame_timer = FrameTimer::new();
    // Made once, not at every turn of the loop: a fresh `changed()` would register with
    // the watch and leave it again for every frame read.
    let stopping = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopping);
    loop {
        let was_held = inbox.held;
        let incomplete = inbox.take_frames(&mut s, frame_max);
        s.collect_ready(&mut watch_rx);
        if !s.out.is_empty() {
            if stream.write_all(&s.out).await.is_err() {
                return;
            }
            s.out.clear();
            last_io = Instant::now();
        }
        if inbox.fatal || (closing && s.pending.is_empty()) {
            let _ = stream.shutdown().await;
            return;
        }
        if inbox.held && !was_held {
            inc(&s.app.metrics.wire_frames_held);
        }
        // A frame held back is not the client's delay: its deadline starts again once
        // the frame is read.
        frame_timer.track(incomplete && !inbox.held, s.frame_deadline());
        let can_read = !closing && !inbox.held && s.pending.len() < IN_FLIGHT_MAX;
        inbox.make_room();
        tokio::select! {
            r = stream.read_buf(&mut inbox.buf), if can_read => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => last_io = Instant::now(),
            },
            Some((id, answer)) = s.pending.next(), if !s.pending.is_empty() => s.finished(id, answer),
            Some((id, frame, last)) = watch_rx.recv() => s.watched(id, &frame, last),
            // A connection with a watch open is waiting for events, not idle.
            _ = &mut idle_sleep, if idle.is_some() && s.pending.is_empty() && s.watches.is_empty() => {
                let deadline = last_io + idle.expect("idle is set");
                if Instant::now() >= deadline {
                    return;
                }
                idle_sleep.as_mut().reset(deadline);
            }
            _ = &mut frame_timer.sleep, if frame_timer.since.is_some() && s.frame_deadline().is_some() => {
                inc(&s.app.metrics.wire_frame_timeouts);
                return;
            }
            // An async block: `select!` builds every branch's future, and a bare `sleep`
            // would read the clock at every turn.
            _ = async { tokio::time::sleep(HOLD_RECHECK).await }, if inbox.held => {}
            _ = &mut stopping, if !closing => closing = true,
        }
    }
}

/// The read side of a connection: the bytes read and not yet taken as frames, and the
/// state of the frame being read.
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
    /// Where the bytes not yet taken start in `buf`.
    start: usize,
    /// Whether the preamble was read and accepted.
    greeted: bool,
    /// The stream is lost (a bad preamble, a length that cannot be trusted, a large
    /// frame refused): the connection closes once its answers are written.
    fatal: bool,
    /// The body budget's permits for the large frame being read, if one is.
    frame_permit: Option<OwnedSemaphorePermit>,
    /// A large frame begun while the leader has no room for it: not read further yet.
    held: bool,
}

impl Inbox {
    /// Runs the preamble and every whole frame buffered through the session while it
    /// has room for more requests in flight; returns whether a frame (or the
    /// preamble) is begun and not whole.
    fn take_frames(&mut self, s: &mut Session, frame_max: usize) -> bool {
        if !self.greeted {
            match s.greet(&self.buf[self.start..]) {
                Some(true) => (self.start, self.greeted) = (self.start + w::PREAMBLE.len(), true),
                Some(false) => self.fatal = true,
                None => {}
            }
        }
        let mut incomplete = !self.greeted && self.buf.len() > self.start;
        self.held = false;
        while self.greeted && !self.fatal && s.pending.len() < IN_FLIGHT_MAX {
            let limit = if s.authed { frame_max } else { PREAUTH_FRAME_BYTES_MAX };
            match w::split_frame(&self.buf[self.start..], limit) {
                Ok(Some((id, op, payload, used))) => {
                    s.on_frame(id, op, payload);
                    self.start += used;
                    self.frame_permit = None;
                }
                Ok(None) => {
                    incomplete = self.buf.len() > self.start;
                    if self.frame_permit.is_none() {
                        match s.reserve_frame(&self.buf[self.start..], &mut self.frame_permit) {
                            Reserve::Read => {}
                            Reserve::Hold => self.held = true,
                            Reserve::Refused => self.fatal = true,
                        }
                    }
                    break;
                }
                Err(e) => {
                    // Only a length that cannot be trusted gets here: the stream is lost.
                    s.frame_error(e);
                    self.fatal = true;
                }
            }
        }
        self.compact();
        incomplete
    }

    /// Drops the bytes taken, once they are all of the buffer or a read's worth.
    fn compact(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start >= READ_CHUNK_BYTES {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// Keeps room for a read's worth of bytes.
    fn make_room(&mut self) {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK_BYTES / 4 {
            self.buf.reserve(READ_CHUNK_BYTES);
        }
    }
}

/// The deadline of a frame begun: it must arrive whole within the head deadline before
/// AUTH, the body deadline after; a trickled frame closes its connection only.
struct FrameTimer {
    /// When the frame being read was begun; None when no frame is partly read.
    since: Option<Instant>,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl FrameTimer {
    fn new() -> FrameTimer {
        FrameTimer { since: None, sleep: Box::pin(tokio::time::sleep(Duration::MAX / 4)) }
    }

    /// Starts the deadline when a frame is first seen partly read, forgets it once none is.
    fn track(&mut self, partly_read: bool, deadline: Option<Duration>) {
        match (partly_read, self.since) {
            (false, _) => self.since = None,
            (true, None) => {
                self.since = Some(Instant::now());
                if let Some(d) = deadline {
                    self.sleep.as_mut().reset(Instant::now() + d);
                }
            }
            (true, Some(_)) => {}
        }
    }
}

impl Session {
    fn new(
        app: App,
        remote: Option<std::net::SocketAddr>,
        subject: Option<String>,
        watch_tx: tokio::sync::mpsc::Sender<(u32, Vec<u8>, bool)>,
    ) -> Session {
        // Before any AUTH: the open server's identity, or the certificate's.
        let open = app.identity(None, subject.as_deref());
        Session {
            authed: open.is_some(),
            caller: open.map(|identity| Caller { identity, remote }),
            remote,
            subject,
            token: None,
            generation: app.identities_generation.load(std::sync::atomic::Ordering::Acquire),
            app,
            out: Vec::with_capacity(4096),
            pending: FuturesUnordered::new(),
            cancels: HashMap::new(),
            watches: HashMap::new(),
            watch_tx,
            version: Version::CURRENT,
        }
    }

    /// Takes the answers and watch frames that are ready without waiting.
    fn collect_ready(&mut self, watch_rx: &mut tokio::sync::mpsc::Receiver<(u32, Vec<u8>, bool)>) {
        while let Some(Some((id, answer))) = self.pending.next().now_or_never() {
            self.finished(id, answer);
        }
        while let Ok((id, frame, last)) = watch_rx.try_recv() {
            self.watched(id, &frame, last);
        }
    }

    /// How long a frame begun may take to arrive whole (the head deadline before
    /// AUTH, the body deadline after); None: no limit.
    fn frame_deadline(&self) -> Option<Duration> {
        let ms = if self.authed { self.app.config.body_timeout_ms } else { self.app.config.head_timeout_ms };
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    fn on_frame(&mut self, id: u32, op: u8, payload: &[u8]) {
        inc(&self.app.metrics.wire_requests);
        let req = match w::decode_request(id, op, payload) {
            Ok(r) => r,
            Err(e) => return self.frame_error(e),
        };
        match req {
            Request::Auth { token } => {
                self.token = Some(token.to_vec());
                self.find_caller();
                let answer = if self.authed { Answer::Done(op::AUTH) } else { Answer::Error(api::unauthorized()) };
                return self.reply(id, answer);
            }
            Request::Cancel { target } => {
                if let Some(h) = self.cancels.remove(&target) {
                    h.abort();
                }
                if let Some(task) = self.watches.remove(&target) {
                    task.abort();
                    self.reply(target, Answer::Error(cancelled()));
                }
                return;
            }
            _ => {}
        }
        if self.generation != self.app.identities_generation.load(std::sync::atomic::Ordering::Acquire) {
            self.find_caller();
        }
        let Some(caller) = self.caller.clone().filter(|_| self.authed) else {
            let refused = api::unauthorized_with(self.app.config.client_ca.is_some(), self.subject.as_deref());
            return self.reply(id, Answer::Error(refused));
        };
        if let Request::Watch { prefix, since, tail } = req {
            // Every member holds the events (the same indexes everywhere): served here.
            return self.watch(id, caller, prefix, since, tail);
        }
        if api::forward::member_forwards(&self.app) {
            // A follower sends the frame as it came; an acquire's forwarding is cancellable
            // (a CANCEL drops it, and the leader withdraws the waiter).
            let cancellable = matches!(req, Request::Acquire { .. } | Request::AcquireAll { .. });
            let call = super::forward::to_leader(self.app.clone(), caller, id, op, payload.to_vec(), self.version);
            return self.start(id, cancellable, call);
        }
        match dispatch(&self.app, caller, req) {
            Call::Now(answer) => self.reply(id, answer),
            Call::Later { cancellable, call } => self.start(id, cancellable, call),
        }
    }

    /// The preamble at the front of `buf`, once its 8 bytes are there: `Some(true)` when
    /// it names a version this server speaks (every answer is in it from then on),
    /// `Some(false)` after answering `bad_preamble`.
    fn greet(&mut self, buf: &[u8]) -> Option<bool> {
        let first: &[u8; 8] = buf.get(..w::PREAMBLE.len())?.try_into().ok()?;
        match w::read_preamble(first) {
            Ok(version) => {
                self.version = version;
                Some(true)
            }
            Err(e) => {
                self.reply(0, Answer::Error(bad_preamble(e)));
                Some(false)
            }
        }
    }

    /// Finds the caller by the token AUTH presented, as the identities are now.
    fn find_caller(&mut self) {
        self.generation = self.app.identities_generation.load(std::sync::atomic::Ordering::Acquire);
        let identity = self.app.identity(self.token.as_deref(), self.subject.as_deref());
        self.authed = identity.is_some();
        self.caller = identity.map(|identity| Caller { identity, remote: self.remote });
    }

    /// Runs a call that may have to wait: polled once here, and only if it does not
    /// finish at once is it kept (with a handle for CANCEL when `cancellable`).
    fn start(&mut self, id: u32, cancellable: bool, call: impl Future<Output = Answer> + Send + 'static) {
        let mut call = Box::pin(call);
        if let Some(answer) = (&mut call).now_or_never() {
            return self.reply(id, answer);
        }
        if cancellable {
            let (handle, registration) = AbortHandle::new_pair();
            self.cancels.insert(id, handle);
            // Aborting drops the call, which withdraws the waiter (see `api::acquire_grant`).
            self.pending.push(Box::pin(async move {
                match Abortable::new(call, registration).await {
                    Ok(answer) => (id, answer),
                    Err(_) => (id, Answer::Error(cancelled())),
                }
            }));
        } else {
            self.pending.push(Box::pin(async move { (id, call.await) }));
        }
    }

    /// WATCH: a task reads the member's event log for this caller and sends each item
    /// as a frame of the request's id, until CANCEL, the end of the connection or the
    /// server's shutdown (a last `shutting_down` frame).
    fn watch(&mut self, id: u32, caller: Caller, prefix: &str, since: Option<u64>, tail: Option<u32>) {
        if self.watches.len() >= WATCHES_MAX || self.watches.contains_key(&id) {
            let m = format!("a connection holds at most {WATCHES_MAX} watches open, each under its own id");
            return self.reply(id, Answer::Error(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_busy", m)));
        }
        if prefix.len() > fenced_core::LockName::LEN_MAX.max(1024) {
            let e = ApiError::bad_request("invalid_query", "the prefix is longer than any name or key");
            return self.reply(id, Answer::Error(e));
        }
        let start = match (since, tail) {
            (Some(n), _) => crate::events::Start::After(n),
            (None, Some(n)) => crate::events::Start::Tail(n as usize),
            (None, None) => crate::events::Start::Now,
        };
        let watcher = crate::watcher::Watcher::open(&self.app, caller.identity, start, prefix.to_string());
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(c) => return self.reply(id, Answer::Error(api::ops::compacted(c))),
        };
        let (tx, version) = (self.watch_tx.clone(), self.version);
        let task = tokio::spawn(async move {
            while let Some(item) = watcher.next().await {
                if tx.send((id, watch_frame(id, item), false)).await.is_err() {
                    return;
                }
            }
            let mut frame = Vec::new();
            encode_answer(&mut frame, id, &Answer::Error(fenced_core::Error::ShuttingDown.into()), version);
            let _ = tx.send((id, frame, true)).await;
        });
        self.watches.insert(id, task.abort_handle());
    }

    /// A frame of a watch, to write; after its last one the watch is gone.
    fn watched(&mut self, id: u32, frame: &[u8], last: bool) {
        // A watch cancelled meanwhile was answered `cancelled`: nothing more of it.
        if self.watches.contains_key(&id) {
            self.out.extend_from_slice(frame);
        }
        if last {
            self.watches.remove(&id);
        }
    }

    fn finished(&mut self, id: u32, answer: Answer) {
        self.cancels.remove(&id);
        self.reply(id, answer);
    }

    /// For a large frame begun in `buf` (its length and id read): held back while the
    /// leader has no room for a command of its size (the connection is not read until
    /// it has: the flooding client waits, not the others); else its length from the
    /// body budget into `permit`. Refused, after answering `too_busy` to that frame,
    /// when the budget is spent: the connection then closes (its frame's bytes are
    /// coming).
    fn reserve_frame(&mut self, buf: &[u8], permit: &mut Option<tokio::sync::OwnedSemaphorePermit>) -> Reserve {
        let (Some(len), Some(id)) = (buf.get(..4), buf.get(4..8)) else { return Reserve::Read };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        if len <= FRAME_BUDGET_FROM_BYTES {
            return Reserve::Read;
        }
        if self.authed && !self.app.locks.node.has_room(len as u64) {
            return Reserve::Hold;
        }
        // split_frame bounded it by the frame limit already, itself below the budget.
        let want = len.min(self.app.config.body_bytes_in_flight_max) as u32;
        match self.app.body_budget.clone().try_acquire_many_owned(want) {
            Ok(p) => {
                *permit = Some(p);
                Reserve::Read
            }
            Err(_) => {
                inc(&self.app.metrics.bodies_refused);
                let id = u32::from_be_bytes(id.try_into().expect("4 bytes"));
                let e = ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "too_busy",
                    "the server is reading its limit of request bodies; retry shortly",
                )
                .with(fenced_wire::Detail::RetryAfterMs(100));
                self.reply(id, Answer::Error(e));
                Reserve::Refused
            }
        }
    }

    fn frame_error(&mut self, e: FrameError) {
        let (id, err) = match e {
            FrameError::TooLarge { id, max, .. } => (id.unwrap_or(0), ApiError::too_large("frame", max)),
            FrameError::TooShort { len } => {
                (0, ApiError::bad_request("invalid_frame", format!("a frame's length is at least 5, not {len}")))
            }
            FrameError::UnknownOp { id, op } => {
                (id, ApiError::bad_request("unknown_op", format!("op {op} is not part of wire protocol version 1")))
            }
            FrameError::Malformed { id, what } => {
                (id, ApiError::bad_request("invalid_frame", format!("the payload does not fit the op: {what}")))
            }
        };
        self.reply(id, Answer::Error(err));
    }

    fn reply(&mut self, id: u32, answer: Answer) {
        encode_answer(&mut self.out, id, &answer, self.version);
    }
}

/// 400 `bad_preamble`: what the first 8 bytes should have been.
fn bad_preamble(e: PreambleError) -> ApiError {
    let message = match e {
        PreambleError::Version(v) if v < 2 => {
            format!("wire protocol version {v} is no longer served (this server speaks 2 and 3): upgrade the client")
        }
        PreambleError::Version(v) => {
            format!("this server speaks wire protocol versions 2 and 3, not {v}: upgrade servers before their clients")
        }
        PreambleError::NotFenced => {
            "a wire connection starts with FENCED\\0 and the protocol version (\\x03; \\x02 is still served)".into()
        }
    };
    ApiError::bad_request("bad_preamble", message)
}

/// Appends `answer` to request `id` to `out`, as one frame of protocol `version`.
pub(super) fn encode_answer(out: &mut Vec<u8>, id: u32, answer: &Answer, version: Version) {
    let resp = match answer {
        Answer::Frame(frame) => return out.extend_from_slice(frame),
        Answer::Done(op) => Response::Done { op: *op },
        Answer::Lease(op, lease, ttl_ms) => Response::Lease { op: *op, lease: *lease, ttl_ms: *ttl_ms },
        Answer::Granted(g, signature) => {
            Response::Granted { token: g.token, lease: g.lease, ttl_ms: g.ttl_ms, signature: signature.as_deref() }
        }
        Answer::GrantedAll(gs, signatures) => {
            let (lease, ttl_ms) = gs.first().map_or((LeaseId(0), 0), |g| (g.lease, g.ttl_ms));
            let grants = gs.iter().map(|g| (g.name.as_str(), g.token)).collect();
            let signatures = signatures.iter().map(Vec::as_slice).collect();
            Response::GrantedAll { lease, ttl_ms, grants, signatures }
        }
        Answer::Released(token) => Response::Released { token: *token },
        Answer::Checked(current, token) => Response::Checked { current: *current, token: *token },
        Answer::Written(t) => Response::Written { token: *t, highest_seen: *t },
        Answer::Read(highest_seen, value) => Response::Read { highest_seen: *highest_seen, value },
        Answer::Error(e) => return encode_error(out, id, e, version),
    };
    w::encode_response(out, id, &resp);
}

/// An error answer: its typed fields (version 3), or the HTTP API's JSON error body
/// (version 2).
pub(super) fn encode_error(out: &mut Vec<u8>, id: u32, e: &ApiError, version: Version) {
    match version {
        Version::V2 => w::v2::encode_error(out, id, e.code, &json_bytes(&e.body())),
        Version::V3 => {
            let details = e.details.iter().map(Detail::borrowed).collect();
            w::encode_response(out, id, &Response::Error { code: e.code, message: &e.message, details });
        }
    }
}

/// A JSON value's bytes.
pub(super) fn json_bytes(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a Value serializes")
}

/// What a request comes to: an answer now, or a call to run (one that may wait).
pub(super) enum Call {
    Now(Answer),
    Later { cancellable: bool, call: Deferred },
}

pub(super) type Deferred = Pin<Box<dyn Future<Output = Answer> + Send>>;

impl Call {
    fn later(cancellable: bool, call: impl Future<Output = Answer> + Send + 'static) -> Call {
        Call::Later { cancellable, call: Box::pin(call) }
    }
}

/// Runs one request (neither AUTH nor CANCEL, which belong to the connection) for
/// `caller` through the API's handlers.
pub(super) fn dispatch(app: &App, caller: Caller, req: Request<'_>) -> Call {
    match req {
        Request::Auth { .. } | Request::Cancel { .. } | Request::Watch { .. } => Call::Now(Answer::Error(
            ApiError::bad_request("invalid_frame", "AUTH, CANCEL and WATCH are answered by the connection itself"),
        )),
        Request::CreateLease { ttl_ms } => later(app, Ok(()), false, move |app, ()| async move {
            let created = api::create_lease(&app, &caller, ttl_ms).await;
            answer(created, |(l, t)| Answer::Lease(op::CREATE_LEASE, l, t))
        }),
        Request::Keepalive { lease } => later(app, Ok(()), false, move |app, ()| async move {
            let kept = api::keepalive_lease(&app, &caller, lease).await;
            answer(kept, |ttl| Answer::Lease(op::KEEPALIVE, lease, ttl))
        }),
        Request::Revoke { lease } => later(app, Ok(()), false, move |app, ()| async move {
            answer(api::revoke_lease(&app, &caller, lease).await, |()| Answer::Done(op::REVOKE))
        }),
        Request::Acquire { name, lease, ttl_ms, wait_ms, lock_delay_ms, holder } => {
            let checked = both(api::lock_name(app, name), api::holder_label(holder.map(str::to_owned)));
            later(app, checked, true, move |app, (name, holder)| async move {
                let req = api::AcquireReq { lease, ttl_ms, wait_ms, lock_delay_ms, holder };
                let signer = app.signer.clone();
                let granted = api::acquire_grant(app, &caller, name, req).await;
                answer(granted, |g| {
                    let signature = signature(&signer, &g);
                    Answer::Granted(g, signature)
                })
            })
        }
        Request::AcquireAll { names, lease, ttl_ms, wait_ms, lock_delay_ms, holder } => {
            let checked = both(lock_names(app, names), api::holder_label(holder.map(str::to_owned)));
            later(app, checked, true, move |app, (names, holder)| async move {
                let req = api::AcquireReq { lease, ttl_ms, wait_ms, lock_delay_ms, holder };
                let signer = app.signer.clone();
                let granted = api::acquire_all_grants(app, &caller, names, req).await;
                answer(granted, |gs| {
                    let signatures = gs.iter().filter_map(|g| signature(&signer, g)).collect();
                    Answer::GrantedAll(gs, signatures)
                })
            })
        }
        Request::Release { name, lease } => later(app, api::lock_name(app, name), false, move |app, name| async move {
            answer(api::release_lock(&app, &caller, &name, lease).await, Answer::Released)
        }),
        Request::Check { name, token } => later(app, api::lock_name(app, name), false, move |app, name| async move {
            let checked = api::check_token(&app, &caller, &name, token).await;
            answer(checked, |(current, holder)| Answer::Checked(current, holder))
        }),
        Request::Put { key, token, value } => {
            let value = value.to_vec();
            later(app, api::store_key(app, key.to_owned()), false, move |app, key| async move {
                answer(api::write_value(&app, &caller, key, token, value, None).await, Answer::Written)
            })
        }
        Request::Get { key, token } => {
            later(app, api::store_key(app, key.to_owned()), false, move |app, key| async move {
                answer(api::read_value(&app, &caller, key, token, None).await, |(m, v)| Answer::Read(m, v))
            })
        }
    }
}

/// A request whose fields were `checked`: refused now if they do not hold, else the
/// call `run` makes of them with its own handle on the app.
fn later<T, F>(app: &App, checked: Result<T, ApiError>, cancellable: bool, run: impl FnOnce(App, T) -> F) -> Call
where
    F: Future<Output = Answer> + Send + 'static,
{
    match checked {
        Err(e) => Call::Now(Answer::Error(e)),
        Ok(fields) => Call::later(cancellable, run(app.clone(), fields)),
    }
}

/// Both checks' values, or the first one's error.
fn both<A, B>(a: Result<A, ApiError>, b: Result<B, ApiError>) -> Result<(A, B), ApiError> {
    Ok((a?, b?))
}

/// The names of an ACQUIRE_ALL: one to `LOCK_NAMES_MAX`, each a valid lock name.
fn lock_names(app: &App, names: Vec<&str>) -> Result<Vec<fenced_core::LockName>, ApiError> {
    if names.is_empty() || names.len() > fenced_core::LOCK_NAMES_MAX {
        return Err(fenced_core::Error::InvalidNames { names_max: fenced_core::LOCK_NAMES_MAX }.into());
    }
    names.into_iter().map(|n| api::lock_name(app, n)).collect()
}

/// A grant's signature, when the service signs grants.
fn signature(signer: &Option<std::sync::Arc<crate::signing::GrantSigner>>, g: &Grant) -> Option<Vec<u8>> {
    signer.as_ref().map(|s| s.sign_bytes(g.name.as_str(), g.token.get()))
}

fn answer<T>(r: Result<T, ApiError>, ok: impl FnOnce(T) -> Answer) -> Answer {
    match r {
        Ok(v) => ok(v),
        Err(e) => Answer::Error(e),
    }
}

/// One item of a watch as its frame.
fn watch_frame(id: u32, item: crate::watcher::Item) -> Vec<u8> {
    use crate::watcher::Item;
    let mut out = Vec::new();
    match item {
        Item::Event(e) => {
            let data = serde_json::to_vec(&*e).expect("an event serializes");
            w::encode_response(&mut out, id, &Response::Event { index: e.index, data: &data });
        }
        Item::Mark(index) => w::encode_response(&mut out, id, &Response::Mark { index }),
        Item::Lagged(missed) => w::encode_response(&mut out, id, &Response::Lagged { missed }),
    }
    out
}

fn cancelled() -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "cancelled", "the client withdrew this request")
}
