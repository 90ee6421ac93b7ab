//! The wire protocol's client side (`fenced://host:port`): one TCP connection shared by
//! every request of a [`crate::Client`] and its clones, requests tagged with ids, many
//! in flight at once. Callers append their frames to one buffer and wake a writer task,
//! which sends whatever has gathered in one write; a reader task hands each answer to
//! the caller waiting for its id. Under load many requests share each system call, on
//! both sides.
//!
//! The connection opens on the first request and again after it breaks. A request
//! whose connection could not be opened is retried (it never left; with several
//! endpoints the next member is tried instead); one in flight
//! when the connection breaks fails with `Unavailable`. A caller that stops waiting
//! (timeout or a dropped future) forgets its request; for an acquire it also sends
//! CANCEL (a grant that raced the cancel is left to the caller's lease: the acquire
//! may be retried under it elsewhere, and revokes it itself when it gives up).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_core::{LeaseId, Token};
use fenced_wire::{self as w, op, FrameError, Request, Response, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

use crate::error::{ApiError, Error};

/// Frames of one watch delivered and not yet read before the watch is dropped.
const STREAM_QUEUED: usize = 1024;

/// Bytes kept free in the read buffer before each read.
const READ_CHUNK_BYTES: usize = 16 << 10;

/// An answer, owned.
#[derive(Debug)]
pub(crate) enum Reply {
    Done,
    Lease {
        lease: LeaseId,
        ttl_ms: u64,
    },
    /// `signature`: hex, when the service signs grants.
    Granted {
        token: Token,
        lease: LeaseId,
        ttl_ms: u64,
        signature: Option<String>,
    },
    GrantedAll {
        lease: LeaseId,
        ttl_ms: u64,
        grants: Vec<(String, Token, Option<String>)>,
    },
    Released,
    Checked {
        current: bool,
        token: Option<Token>,
    },
    Written {
        highest_seen: Token,
    },
    Read {
        highest_seen: Option<Token>,
        value: Vec<u8>,
    },
    /// A watch's event: its index and JSON object.
    Event {
        index: u64,
        data: Vec<u8>,
    },
    /// A watch's position marker.
    Mark(u64),
    /// A watch fell behind the member's events.
    Lagged(u64),
    Error(ApiError),
}

/// The multiplexed connection of one client.
#[derive(Debug)]
pub(crate) struct Mux {
    /// `fenced://host:port` as given.
    pub endpoint: String,
    /// `host:port`.
    addr: String,
    /// For `fenceds://`: the TLS handshake's configuration and the server's name.
    #[cfg(feature = "tls")]
    tls: Option<(Arc<rustls::ClientConfig>, rustls::pki_types::ServerName<'static>)>,
    /// The bearer token, sent first on every connection.
    auth: Option<Vec<u8>>,
    /// Bound on opening a connection.
    connect_timeout: Duration,
    /// Upper bound on one request's round trip; a waiting acquire adds its wait.
    pub request_timeout: Duration,
    /// Tries of a request whose connection could not be opened.
    connect_attempts: u32,
    /// The open connection, if any.
    current: Mutex<Option<Arc<Link>>>,
    /// Serializes opening connections.
    connecting: tokio::sync::Mutex<()>,
}

/// One open connection.
#[derive(Debug)]
struct Link {
    /// Frames not yet handed to the writer.
    out: Mutex<Vec<u8>>,
    /// Wakes the writer.
    wake: Notify,
    /// Requests in flight by id; `dead` is set under this lock.
    slots: Mutex<Slots>,
    /// The next request id.
    next_id: AtomicU32,
    /// Set once the connection broke; nothing more is sent on it.
    dead: AtomicBool,
    /// The server's refusal of the whole connection (`bad_preamble`: it speaks no
    /// version this client does), answered to the calls in flight when it closes.
    refused: Mutex<Option<ApiError>>,
}

#[derive(Debug, Default)]
struct Slots {
    map: HashMap<u32, Slot>,
    dead: bool,
}

#[derive(Debug)]
enum Slot {
    Waiting(oneshot::Sender<Reply>),
    /// A watch: every frame of its id, until an error frame ends it. A reader that
    /// falls [`STREAM_QUEUED`] frames behind loses the stream (it resumes from its
    /// position), so that one slow watcher cannot hold up the connection's answers.
    Stream(tokio::sync::mpsc::Sender<Reply>),
    /// An acquire whose caller stopped waiting: its answer, if it still comes, is
    /// dropped (the caller retries under the same lease, or revokes it).
    Abandoned,
}

impl Mux {
    /// `endpoint` is `fenced://host:port`, or `fenceds://host:port` over TLS (the
    /// server's certificate checked against `dial.tls.ca_pem`, else the public web
    /// roots; `dial.tls.client_pem` presented to a server that asks for one).
    pub fn new(endpoint: &str, dial: crate::http::Dial<'_>) -> Result<Mux, Error> {
        let crate::http::Dial { auth, connect_timeout, request_timeout, tls: tls_files, connect_attempts } = dial;
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let (addr, tls) = match endpoint.strip_prefix("fenceds://") {
            Some(addr) => (addr, true),
            None => (endpoint.strip_prefix("fenced://").unwrap_or_default(), false),
        };
        if addr.is_empty() || addr.contains('/') || !addr.contains(':') {
            return Err(Error::BadRequest(format!(
                "endpoint '{endpoint}' must be fenced://HOST:PORT or fenceds://HOST:PORT with no path"
            )));
        }
        #[cfg(not(feature = "tls"))]
        if tls {
            let _ = tls_files;
            return Err(Error::BadRequest("fenceds:// endpoints need fenced-client's `tls` feature".into()));
        }
        #[cfg(feature = "tls")]
        let tls = match tls {
            false => None,
            true => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| Error::BadRequest(format!("endpoint '{endpoint}': {e}")))?;
                let config = crate::http::tls_client_config(tls_files)?;
                Some((Arc::new(config), name))
            }
        };
        Ok(Mux {
            #[cfg(feature = "tls")]
            tls,
            addr: addr.to_owned(),
            endpoint: endpoint.clone(),
            auth: auth.map(|t| t.as_bytes().to_vec()),
            connect_timeout,
            request_timeout,
            connect_attempts,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    /// Sends `reqs` back to back on one connection (the server runs them in order) and
    /// waits for every answer, all within `timeout`. `abandon` marks requests (acquires)
    /// to withdraw with CANCEL if nobody waits for them any more.
    pub async fn call_many(&self, reqs: &[(Request<'_>, bool)], timeout: Duration) -> Result<Vec<Reply>, Error> {
        let mut backoff = Duration::from_millis(50);
        let mut attempt = 1;
        let (link, ids) = loop {
            let sent = match self.link().await {
                Ok(link) => link.submit(reqs).map(|ids| (link, ids)),
                Err(e) => Err(e),
            };
            match sent {
                Ok(x) => break x,
                Err(e) if attempt >= self.connect_attempts => return Err(e),
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
            }
        };
        let mut waits: Vec<InFlight<'_>> = ids
            .into_iter()
            .zip(reqs)
            .map(|((id, rx), (_, abandon))| InFlight { link: &link, id, rx: Some(rx), abandon: *abandon })
            .collect();
        let all = async {
            let mut replies = Vec::with_capacity(waits.len());
            for w in waits.iter_mut() {
                let rx = w.rx.as_mut().expect("not yet answered");
                let r = rx.await;
                w.rx = None;
                replies.push(r.map_err(|_| {
                    Error::unavailable(format!("{}: the connection closed before the answer", self.endpoint))
                })?);
            }
            Ok(replies)
        };
        match tokio::time::timeout(timeout, all).await {
            Ok(r) => r,
            Err(_) => {
                Err(Error::unavailable(format!("{}: no answer within {} ms", self.endpoint, timeout.as_millis())))
            }
        }
    }

    /// One request.
    pub async fn call(&self, req: Request<'_>, abandon: bool, timeout: Duration) -> Result<Reply, Error> {
        let mut replies = self.call_many(&[(req, abandon)], timeout).await?;
        Ok(replies.pop().expect("one answer per request"))
    }

    /// Opens a stream (a WATCH): its frames, as they come, until an error frame (or the
    /// connection's end) closes the channel. Dropping the [`Stream`] sends CANCEL.
    pub async fn stream(&self, req: Request<'_>) -> Result<Stream, Error> {
        let link = self.link().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_QUEUED);
        let id = {
            let mut slots = link.slots.lock().expect("slots lock");
            if slots.dead {
                return Err(Error::unavailable("the connection closed"));
            }
            let id = link.id();
            slots.map.insert(id, Slot::Stream(tx));
            id
        };
        w::encode_request(&mut link.out.lock().expect("out lock"), id, &req);
        link.wake.notify_one();
        Ok(Stream { link, id, rx, peeked: None })
    }

    /// Whether the member answers an `AUTH` (with this client's own token, so that an
    /// authenticated connection stays so) within `within`: any answer proves it alive.
    pub async fn probe(&self, within: Duration) -> bool {
        let token = self.auth.as_deref().unwrap_or_default();
        self.call(Request::Auth { token }, false, within).await.is_ok()
    }

    /// The open connection, opening one if there is none.
    async fn link(&self) -> Result<Arc<Link>, Error> {
        if let Some(l) = self.live() {
            return Ok(l);
        }
        let _one = self.connecting.lock().await;
        if let Some(l) = self.live() {
            return Ok(l);
        }
        let stream = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Error::unavailable(format!("{}: cannot connect: {e}", self.endpoint))),
            Err(_) => return Err(Error::unavailable(format!("{}: connect timed out", self.endpoint))),
        };
        let _ = stream.set_nodelay(true);
        #[cfg(feature = "tls")]
        if let Some((config, name)) = &self.tls {
            let handshake = tokio_rustls::TlsConnector::from(config.clone()).connect(name.clone(), stream);
            let stream = match tokio::time::timeout(self.connect_timeout, handshake).await {
                Ok(Ok(s)) => s,
                // A certificate that does not verify is no transient failure: say so.
                Ok(Err(e)) => return Err(Error::BadRequest(format!("{}: TLS handshake failed: {e}", self.endpoint))),
                Err(_) => return Err(Error::unavailable(format!("{}: TLS handshake timed out", self.endpoint))),
            };
            let (rd, wr) = tokio::io::split(stream);
            let link = Link::start(rd, wr, self.auth.as_deref());
            *self.current.lock().expect("link lock") = Some(link.clone());
            return Ok(link);
        }
        let (rd, wr) = stream.into_split();
        let link = Link::start(rd, wr, self.auth.as_deref());
        *self.current.lock().expect("link lock") = Some(link.clone());
        Ok(link)
    }

    fn live(&self) -> Option<Arc<Link>> {
        self.current.lock().expect("link lock").as_ref().filter(|l| !l.dead.load(Ordering::Acquire)).cloned()
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        // The tasks hold the link; ending it closes the connection.
        if let Some(link) = self.current.get_mut().ok().and_then(Option::take) {
            link.die();
        }
    }
}

impl Link {
    fn start<R, W>(rd: R, wr: W, auth: Option<&[u8]>) -> Arc<Link>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut out = w::PREAMBLE.to_vec();
        if let Some(token) = auth {
            // Id 0 is never a caller's: the answer is dropped. A refused token makes
            // every later request answer 401 on its own.
            w::encode_request(&mut out, 0, &Request::Auth { token });
        }
        let link = Arc::new(Link {
            out: Mutex::new(out),
            wake: Notify::new(),
            slots: Mutex::new(Slots::default()),
            next_id: AtomicU32::new(1),
            dead: AtomicBool::new(false),
            refused: Mutex::new(None),
        });
        tokio::spawn(read_loop(link.clone(), rd));
        tokio::spawn(write_loop(link.clone(), wr));
        link.wake.notify_one();
        link
    }

    fn id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// Registers and queues `reqs`; fails if the connection is already dead.
    fn submit(&self, reqs: &[(Request<'_>, bool)]) -> Result<Vec<(u32, oneshot::Receiver<Reply>)>, Error> {
        let mut out = Vec::with_capacity(reqs.len());
        {
            let mut slots = self.slots.lock().expect("slots lock");
            if slots.dead {
                return Err(Error::unavailable("the connection closed"));
            }
            for _ in reqs {
                let (tx, rx) = oneshot::channel();
                let id = self.id();
                slots.map.insert(id, Slot::Waiting(tx));
                out.push((id, rx));
            }
        }
        {
            let mut buf = self.out.lock().expect("out lock");
            for ((req, _), (id, _)) in reqs.iter().zip(&out) {
                w::encode_request(&mut buf, *id, req);
            }
        }
        self.wake.notify_one();
        Ok(out)
    }

    /// Queues a request nobody waits for.
    fn send_forgotten(&self, req: &Request<'_>) {
        let id = self.id();
        w::encode_request(&mut self.out.lock().expect("out lock"), id, req);
        self.wake.notify_one();
    }

    fn deliver(&self, id: u32, kind: u8, payload: &[u8]) {
        let reply = match w::decode_response(id, kind, payload) {
            Ok(r) => owned(r),
            Err(e) => Reply::Error(unreadable(kind, payload, e)),
        };
        if id == 0 {
            return self.connection_answer(reply);
        }
        let mut slots = self.slots.lock().expect("slots lock");
        if let Some(Slot::Stream(tx)) = slots.map.get(&id) {
            let last = matches!(reply, Reply::Error(_));
            // Full: the reader is too slow; dropping the sender ends its stream.
            if tx.try_send(reply).is_err() || last {
                slots.map.remove(&id);
            }
            return;
        }
        match slots.map.remove(&id) {
            Some(Slot::Waiting(tx)) => drop(tx.send(reply)),
            Some(Slot::Stream(_) | Slot::Abandoned) | None => {}
        }
    }

    /// An answer of id 0: to the AUTH sent first (dropped: a refused token makes every
    /// later call answer `unauthorized` on its own), or the server's refusal of the
    /// whole connection before it closes it.
    fn connection_answer(&self, reply: Reply) {
        if let Reply::Error(e) = reply {
            if e.code == "bad_preamble" {
                *self.refused.lock().expect("refused lock") = Some(e);
            }
        }
    }

    /// Marks the connection broken: callers in flight get the server's refusal of the
    /// connection if it sent one, else `Unavailable`; the writer ends.
    fn die(&self) {
        self.dead.store(true, Ordering::Release);
        let waiting = {
            let mut slots = self.slots.lock().expect("slots lock");
            slots.dead = true;
            std::mem::take(&mut slots.map)
        };
        if let Some(refused) = self.refused.lock().expect("refused lock").take() {
            for slot in waiting.into_values() {
                match slot {
                    Slot::Waiting(tx) => drop(tx.send(Reply::Error(refused.clone()))),
                    Slot::Stream(tx) => drop(tx.try_send(Reply::Error(refused.clone()))),
                    Slot::Abandoned => {}
                }
            }
        }
        self.wake.notify_one();
    }
}

/// An open stream's frames; dropped, it is forgotten and withdrawn with CANCEL.
pub(crate) struct Stream {
    link: Arc<Link>,
    id: u32,
    rx: tokio::sync::mpsc::Receiver<Reply>,
    peeked: Option<Reply>,
}

impl Stream {
    /// The next frame; `None` once the stream ended (after its error frame), its reader
    /// fell too far behind, or the connection broke.
    pub async fn next(&mut self) -> Option<Reply> {
        match self.peeked.take() {
            Some(r) => Some(r),
            None => self.rx.recv().await,
        }
    }

    /// The next frame, left for `next`.
    pub async fn peek(&mut self) -> Option<&Reply> {
        if self.peeked.is_none() {
            self.peeked = self.rx.recv().await;
        }
        self.peeked.as_ref()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut slots = self.link.slots.lock().expect("slots lock");
        let open = slots.map.remove(&self.id).is_some();
        if open && !slots.dead {
            drop(slots);
            self.link.send_forgotten(&Request::Cancel { target: self.id });
        }
    }
}

/// A request in flight; dropped before its answer, it is forgotten (see the module).
struct InFlight<'a> {
    link: &'a Link,
    id: u32,
    /// `None` once answered.
    rx: Option<oneshot::Receiver<Reply>>,
    abandon: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.rx.is_none() {
            return;
        }
        let mut slots = self.link.slots.lock().expect("slots lock");
        if slots.map.remove(&self.id).is_some() && self.abandon && !slots.dead {
            slots.map.insert(self.id, Slot::Abandoned);
            drop(slots);
            self.link.send_forgotten(&Request::Cancel { target: self.id });
        }
    }
}

fn owned(r: Response<'_>) -> Reply {
    match r {
        Response::Done { .. } => Reply::Done,
        Response::Lease { lease, ttl_ms, .. } => Reply::Lease { lease, ttl_ms },
        Response::Granted { token, lease, ttl_ms, signature } => {
            Reply::Granted { token, lease, ttl_ms, signature: signature.map(fenced_core::hex) }
        }
        Response::GrantedAll { lease, ttl_ms, grants, signatures } => {
            let mut signatures = signatures.into_iter().map(fenced_core::hex);
            let grants = grants.into_iter().map(|(n, t)| (n.to_owned(), t, signatures.next())).collect();
            Reply::GrantedAll { lease, ttl_ms, grants }
        }
        Response::Released { .. } => Reply::Released,
        Response::Checked { current, token } => Reply::Checked { current, token },
        Response::Written { highest_seen, .. } => Reply::Written { highest_seen },
        Response::Read { highest_seen, value } => Reply::Read { highest_seen, value: value.to_vec() },
        Response::Event { index, data } => Reply::Event { index, data: data.to_vec() },
        Response::Mark { index } => Reply::Mark(index),
        Response::Lagged { missed } => Reply::Lagged(missed),
        Response::Error { code, message, details } => Reply::Error(ApiError::from_wire(code, message, details)),
    }
}

/// An answer that does not decode. An error answer's code still reads (it comes first
/// in every version of the protocol): a server of an earlier release refusing this
/// client's version says `bad_preamble` in its own shape.
fn unreadable(kind: u8, payload: &[u8], e: FrameError) -> ApiError {
    let code = match (kind, w::error_code(payload)) {
        (op::ERROR, Some(code)) => code,
        _ => return ApiError::unreadable(format!("could not read the server's answer: {e:?}")),
    };
    let message = match code {
        "bad_preamble" => format!(
            "the server does not speak wire protocol version {}: it is of an earlier release; upgrade it \
             (servers before their clients), or use its http:// endpoint",
            Version::CURRENT.number()
        ),
        _ => format!("the server refused with {code}, in an answer this client cannot read: {e:?}"),
    };
    ApiError::new(None, code.to_string(), message, Vec::new())
}

async fn read_loop(link: Arc<Link>, mut rd: impl AsyncRead + Unpin) {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut start = 0;
    'read: loop {
        if buf.capacity() - buf.len() < READ_CHUNK_BYTES / 4 {
            buf.reserve(READ_CHUNK_BYTES);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        loop {
            match w::split_frame(&buf[start..], u32::MAX as usize) {
                Ok(Some((id, kind, payload, used))) => {
                    link.deliver(id, kind, payload);
                    start += used;
                }
                Ok(None) => break,
                Err(_) => break 'read,
            }
        }
        if start == buf.len() {
            buf.clear();
            start = 0;
        } else if start >= READ_CHUNK_BYTES {
            buf.drain(..start);
            start = 0;
        }
        if link.dead.load(Ordering::Acquire) {
            break;
        }
    }
    link.die();
}

async fn write_loop(link: Arc<Link>, mut wr: impl AsyncWrite + Unpin) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        std::mem::swap(&mut *link.out.lock().expect("out lock"), &mut buf);
        if buf.is_empty() {
            if link.dead.load(Ordering::Acquire) {
                let _ = wr.shutdown().await;
                return;
            }
            link.wake.notified().await;
            continue;
        }
        if wr.write_all(&buf).await.is_err() {
            link.die();
            return;
        }
        buf.clear();
    }
}
