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
    // Before any AUTH: the open server's identity, or the certificate's.
    let open = app.identity(None, subject.as_deref());
    let (watch_tx, mut watch_rx) = tokio::sync::mpsc::channel(WATCH_FRAMES_QUEUED);
    let mut s = Session {
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
    };
    let mut inbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut start = 0;
    let mut greeted = false;
    let mut fatal = false;
    let mut closing = *stop.borrow();
    let mut last_io = Instant::now();
    let mut idle_sleep = Box::pin(tokio::time::sleep(idle.unwrap_or(Duration::MAX / 4)));
    // A frame begun must arrive whole within this long (the head deadline before
    // AUTH, the body deadline after): a trickled frame closes its connection only.
    let frame_deadline = |authed: bool, app: &App| {
        let ms = if authed { app.config.body_timeout_ms } else { app.config.head_timeout_ms };
        (ms > 0).then(|| Duration::from_millis(ms))
    };
    let mut partial_since: Option<Instant> = None;
    let mut frame_sleep = Box::pin(tokio::time::sleep(Duration::MAX / 4));
    // The body budget's permits for the large frame being read, if one is.
    let mut frame_permit: Option<tokio::sync::OwnedSemaphorePermit> = None;
    // A large frame begun while the leader has no room for it: not read further yet.
    let mut held = false;
    loop {
        if !greeted {
            match s.greet(&inbuf[start..]) {
                Some(true) => (start, greeted) = (start + w::PREAMBLE.len(), true),
                Some(false) => fatal = true,
                None => {}
            }
        }
        let mut incomplete = !greeted && inbuf.len() > start;
        let was_held = held;
        held = false;
        while greeted && !fatal && s.pending.len() < IN_FLIGHT_MAX {
            let limit = if s.authed { frame_max } else { PREAUTH_FRAME_BYTES_MAX };
            match w::split_frame(&inbuf[start..], limit) {
                Ok(Some((id, op, payload, used))) => {
                    s.on_frame(id, op, payload);
                    start += used;
                    frame_permit = None;
                }
                Ok(None) => {
                    incomplete = inbuf.len() > start;
                    if frame_permit.is_none() {
                        match s.reserve_frame(&inbuf[start..], &mut frame_permit) {
                            Reserve::Read => {}
                            Reserve::Hold => held = true,
                            Reserve::Refused => fatal = true,
                        }
                    }
                    break;
                }
                Err(e) => {
                    // Only a length that cannot be trusted gets here: the stream is lost.
                    s.frame_error(e);
                    fatal = true;
                }
            }
        }
        if start == inbuf.len() {
            inbuf.clear();
            start = 0;
        } else if start >= READ_CHUNK_BYTES {
            inbuf.drain(..start);
            start = 0;
        }
        while let Some(Some((id, answer))) = s.pending.next().now_or_never() {
            s.finished(id, answer);
        }
        while let Ok((id, frame, last)) = watch_rx.try_recv() {
            s.watched(id, &frame, last);
        }
        if !s.out.is_empty() {
            if stream.write_all(&s.out).await.is_err() {
                return;
            }
            s.out.clear();
            last_io = Instant::now();
        }
        if fatal || (closing && s.pending.is_empty()) {
            let _ = stream.shutdown().await;
            return;
        }
        if held && !was_held {
            inc(&s.app.metrics.wire_frames_held);
        }
        // A frame held back is not the client's delay: its deadline starts again once
        // the frame is read.
        match (incomplete && !held, partial_since) {
            (false, _) => partial_since = None,
            (true, None) => {
                partial_since = Some(Instant::now());
                if let Some(d) = frame_deadline(s.authed, &s.app) {
                    frame_sleep.as_mut().reset(Instant::now() + d);
                }
            }
            (true, Some(_)) => {}
        }
        let can_read = !closing && !held && s.pending.len() < IN_FLIGHT_MAX;
        if inbuf.capacity() - inbuf.len() < READ_CHUNK_BYTES / 4 {
            inbuf.reserve(READ_CHUNK_BYTES);
        }
        tokio::select! {
            r = stream.read_buf(&mut inbuf), if can_read => match r {
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
            _ = &mut frame_sleep, if partial_since.is_some() && frame_deadline(s.authed, &s.app).is_some() => {
                inc(&s.app.metrics.wire_frame_timeouts);
                return;
            }
            _ = tokio::time::sleep(HOLD_RECHECK), if held => {}
            _ = stop.changed(), if !closing => closing = true,
        }
    }
}

impl Session {
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
    let answer = match req {
        Request::Auth { .. } | Request::Cancel { .. } | Request::Watch { .. } => {
            Err(ApiError::bad_request("invalid_frame", "AUTH, CANCEL and WATCH are answered by the connection itself"))
        }
        Request::CreateLease { ttl_ms } => {
            let app = app.clone();
            return Call::later(false, async move {
                let created = api::create_lease(&app, &caller, ttl_ms).await;
                answer(created, |(l, t)| Answer::Lease(op::CREATE_LEASE, l, t))
            });
        }
        Request::Keepalive { lease } => {
            let app = app.clone();
            return Call::later(false, async move {
                let kept = api::keepalive_lease(&app, &caller, lease).await;
                answer(kept, |ttl| Answer::Lease(op::KEEPALIVE, lease, ttl))
            });
        }
        Request::Revoke { lease } => {
            let app = app.clone();
            return Call::later(false, async move {
                answer(api::revoke_lease(&app, &caller, lease).await, |()| Answer::Done(op::REVOKE))
            });
        }
        Request::Acquire { name, lease, ttl_ms, wait_ms, lock_delay_ms, holder } => {
            match (api::lock_name(app, name), api::holder_label(holder.map(str::to_owned))) {
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(name), Ok(holder)) => {
                    let app = app.clone();
                    let req = api::AcquireReq { lease, ttl_ms, wait_ms, lock_delay_ms, holder };
                    return Call::later(true, async move {
                        let signer = app.signer.clone();
                        let sign = |g: Grant| {
                            let signature = signer.as_ref().map(|s| s.sign_bytes(g.name.as_str(), g.token.get()));
                            Answer::Granted(g, signature)
                        };
                        answer(api::acquire_grant(app, &caller, name, req).await, sign)
                    });
                }
            }
        }
        Request::AcquireAll { names, lease, ttl_ms, wait_ms, lock_delay_ms, holder } => {
            let names = if names.is_empty() || names.len() > fenced_core::LOCK_NAMES_MAX {
                Err(fenced_core::Error::InvalidNames { names_max: fenced_core::LOCK_NAMES_MAX }.into())
            } else {
                names.into_iter().map(|n| api::lock_name(app, n)).collect::<Result<Vec<_>, _>>()
            };
            match (names, api::holder_label(holder.map(str::to_owned))) {
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(names), Ok(holder)) => {
                    let app = app.clone();
                    let req = api::AcquireReq { lease, ttl_ms, wait_ms, lock_delay_ms, holder };
                    return Call::later(true, async move {
                        let signer = app.signer.clone();
                        let sign = |gs: Vec<Grant>| {
                            let sign_one =
                                |g: &Grant| signer.as_ref().map(|s| s.sign_bytes(g.name.as_str(), g.token.get()));
                            let signatures = gs.iter().filter_map(sign_one).collect();
                            Answer::GrantedAll(gs, signatures)
                        };
                        answer(api::acquire_all_grants(app, &caller, names, req).await, sign)
                    });
                }
            }
        }
        Request::Release { name, lease } => match api::lock_name(app, name) {
            Err(e) => Err(e),
            Ok(name) => {
                let app = app.clone();
                return Call::later(false, async move {
                    answer(api::release_lock(&app, &caller, &name, lease).await, Answer::Released)
                });
            }
        },
        Request::Check { name, token } => match api::lock_name(app, name) {
            Err(e) => Err(e),
            Ok(name) => {
                let app = app.clone();
                return Call::later(false, async move {
                    answer(api::check_token(&app, &caller, &name, token).await, |(current, holder)| {
                        Answer::Checked(current, holder)
                    })
                });
            }
        },
        Request::Put { key, token, value } => match api::store_key(app, key.to_owned()) {
            Err(e) => Err(e),
            Ok(key) => {
                let (app, value) = (app.clone(), value.to_vec());
                return Call::later(false, async move {
                    answer(api::write_value(&app, &caller, key, token, value, None).await, Answer::Written)
                });
            }
        },
        Request::Get { key, token } => match api::store_key(app, key.to_owned()) {
            Err(e) => Err(e),
            Ok(key) => {
                let app = app.clone();
                return Call::later(false, async move {
                    answer(api::read_value(&app, &caller, key, token, None).await, |(m, v)| Answer::Read(m, v))
                });
            }
        },
    };
    Call::Now(answer.unwrap_or_else(Answer::Error))
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
