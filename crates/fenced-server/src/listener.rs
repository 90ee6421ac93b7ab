//! The accept loop's listener: a connection limit (a semaphore permit rides along with
//! each connection), optional TLS, handshaking lazily on the connection's own task so a
//! slow handshake never stalls `accept`, and the connection's clocks:
//! - an idle timeout: a connection with no request in flight that moves no byte for
//!   `idle_timeout_ms` is closed (forgotten keep-alive connections);
//! - a head deadline: a request head must arrive whole within `head_timeout_ms` of its
//!   first byte. It counts progress, not bytes: a client trickling one header byte at a
//!   time cannot hold a connection (and its permit) past it;
//! - half-close: a client that shuts its write side after a request (`nc -N`,
//!   `shutdown(SHUT_WR)`) still gets the answer. The end of file is held back from
//!   hyper while a request is in flight, for at most `HALF_CLOSE_GRACE`: a quick call is
//!   answered, and a waiting acquire whose client went away is still withdrawn soon
//!   (a half-close and a full close look the same from here).
//!
//! - hyper's own answers: a request head hyper cannot parse (400), one too large (431:
//!   over 100 header lines, or past hyper's read buffer of about 400 KiB) or a URI too
//!   long (414) is answered by hyper itself with an empty body before any handler runs;
//!   the connection rewrites that answer into the API's JSON error as it goes out;
//! - no h2c: HTTP/2 over cleartext is not served, whatever hyper was built with. A
//!   client that opens with HTTP/2's preface gets HTTP/2's own refusal, a GOAWAY with
//!   `HTTP_1_1_REQUIRED`, and the connection closes (see [`H2_PREFACE`]).
//!
//! A request in flight (a waiting acquire) is never cut by the idle or head clocks: the
//! `observe` middleware counts it in the connection's [`ConnMeta`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::{server::TlsStream, Accept, TlsAcceptor};

use crate::metrics::{inc, Metrics};

/// How long an end of file from the client is held back while a request is in flight.
const HALF_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The request line of HTTP/2's connection preface (RFC 9113, 3.4). h2c is refused
/// rather than served: every deadline, budget and limit of this edge is built and
/// tested for HTTP/1.1, HTTP/2 brings its own attack surface (stream floods, rapid
/// reset, CONTINUATION floods), TLS offers only `http/1.1` in ALPN, and every client
/// of the API speaks HTTP/1.1 (throughput has the wire protocol). Refusing it here
/// keeps it off even if a feature of hyper gets switched on by another crate.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// HTTP/2's refusal, sent to a client that opened with the preface: the server's
/// (empty) SETTINGS frame, which must come first, then GOAWAY (last stream 0, error
/// code 0xd `HTTP_1_1_REQUIRED`) with a reason as debug data.
const H2_REFUSAL: &[u8] = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00\
\x00\x00\x27\x07\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0dh2c is not served: use HTTP/1.1";

/// Answer to a connection over `connections_max` (plain HTTP only), then close.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 92\r\n\r\n{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the server is at its connection limit\"}}\n";

pub struct FencedListener {
    pub tcp: TcpListener,
    pub tls: Option<TlsAcceptor>,
    pub conns: Arc<Semaphore>,
    pub metrics: Arc<Metrics>,
    /// None: no idle timeout.
    pub idle: Option<Duration>,
    /// None: no head deadline.
    pub head: Option<Duration>,
}

/// What a request knows of its connection (axum's `ConnectInfo`).
#[derive(Clone, Debug)]
pub struct ConnMeta {
    pub remote: SocketAddr,
    /// Requests of this connection being handled now.
    pub in_flight: Arc<AtomicUsize>,
    /// Requests of this connection that reached a handler, ever: a change means the
    /// head being read was parsed.
    pub started: Arc<AtomicU64>,
    /// The reader waiting for the last request in flight to end (a held-back EOF).
    pub idle_waker: Arc<AtomicWaker>,
    /// The subject of the client certificate the TLS handshake verified (`client_ca`),
    /// set once the handshake is done, before any request is read.
    pub client_subject: Arc<OnceLock<String>>,
}

impl ConnMeta {
    fn new(remote: SocketAddr) -> ConnMeta {
        ConnMeta {
            remote,
            in_flight: Arc::default(),
            started: Arc::default(),
            idle_waker: Arc::default(),
            client_subject: Arc::default(),
        }
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, FencedListener>> for ConnMeta {
    fn connect_info(stream: axum::serve::IncomingStream<'_, FencedListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// Counts a request in flight on its connection for as long as it lives.
pub struct InFlight(ConnMeta);

impl InFlight {
    pub fn new(meta: &ConnMeta) -> InFlight {
        meta.started.fetch_add(1, Ordering::AcqRel);
        meta.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(meta.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle_waker.wake();
        }
    }
}

impl axum::serve::Listener for FencedListener {
    type Io = Conn;
    type Addr = ConnMeta;

    async fn accept(&mut self) -> (Conn, ConnMeta) {
        loop {
            let (stream, addr) = match self.tcp.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Ok(permit) = self.conns.clone().try_acquire_owned() else {
                inc(&self.metrics.connections_refused);
                if self.tls.is_none() {
                    let _ = stream.try_write(BUSY);
                }
                continue;
            };
            let io = match &self.tls {
                None => Io::Plain(stream),
                Some(acceptor) => Io::Handshaking(Box::pin(acceptor.accept(stream))),
            };
            let meta = ConnMeta::new(addr);
            let conn = Conn {
                io,
                _permit: permit,
                meta: meta.clone(),
                metrics: self.metrics.clone(),
                idle: self.idle,
                head: self.head,
                last_io: Instant::now(),
                head_started: None,
                eof_at: None,
                awaiting_answer: false,
                sleep: None,
                preface: Some(0),
                rewrite: None,
            };
            return (conn, meta);
        }
    }

    fn local_addr(&self) -> io::Result<ConnMeta> {
        Ok(ConnMeta::new(self.tcp.local_addr()?))
    }
}

/// One accepted connection; holding it holds a connection permit.
pub struct Conn {
    io: Io,
    _permit: OwnedSemaphorePermit,
    meta: ConnMeta,
    metrics: Arc<Metrics>,
    idle: Option<Duration>,
    head: Option<Duration>,
    /// The last time a byte moved either way.
    last_io: Instant,
    /// When the first byte of the head being read arrived, and `started` then.
    head_started: Option<(Instant, u64)>,
    /// When the client's end of file was first held back.
    eof_at: Option<Instant>,
    /// Bytes came in since the last answer went out: a request may be on its way to a
    /// handler (one that is not yet counted in flight).
    awaiting_answer: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    /// While the connection's first bytes may still be HTTP/2's preface: how many of
    /// [`H2_PREFACE`] they matched.
    preface: Option<usize>,
    /// hyper's empty-bodied error answer, rewritten as JSON, and how much of it is out.
    rewrite: Option<(Vec<u8>, usize)>,
}

enum Io {
    Plain(TcpStream),
    Handshaking(Pin<Box<Accept<TcpStream>>>),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    fn in_flight(&self) -> usize {
        self.meta.in_flight.load(Ordering::Acquire)
    }

    /// Bytes arrived: they start a head's clock when no request is in flight and no
    /// head is being read already.
    fn saw_bytes(&mut self) {
        self.last_io = Instant::now();
        self.awaiting_answer = true;
        let started = self.meta.started.load(Ordering::Acquire);
        if self.in_flight() > 0 {
            self.head_started = None;
        } else if self.head_started.is_none_or(|(_, n)| n != started) {
            self.head_started = Some((self.last_io, started));
        }
    }

    /// Called when a read is pending: an error once the connection has been idle, with
    /// no request in flight, for the idle timeout, or once a head has taken longer than
    /// its deadline. The wake-up timer is re-armed only when it fires early (the
    /// connection was busy meanwhile), not on every read: resetting a tokio timer per
    /// request costs a driver lock.
    fn poll_clocks(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        loop {
            if self.in_flight() > 0 {
                return None;
            }
            let started = self.meta.started.load(Ordering::Acquire);
            let idle = self.idle.map(|d| (self.last_io + d, "idle connection"));
            let head = match (self.head, self.head_started) {
                (Some(d), Some((t, n))) if n == started => Some((t + d, "request head too slow")),
                _ => None,
            };
            let (deadline, why) = match (idle, head) {
                (Some(i), Some(h)) => i.min(h),
                (i, h) => i.or(h)?,
            };
            if Instant::now() >= deadline {
                if head.is_some_and(|(d, _)| d == deadline) {
                    inc(&self.metrics.head_timeouts);
                }
                return Some(io::Error::new(io::ErrorKind::TimedOut, why));
            }
            if !self.arm(cx, deadline) {
                return None;
            }
        }
    }

    /// Arms the wake-up timer for `deadline`; true when it has fired already.
    fn arm(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).is_ready()
    }

    /// The client shut its side: hold the end of file back while a request is in
    /// flight (for at most `HALF_CLOSE_GRACE`), so that its answer is still written.
    fn poll_eof(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let at = *self.eof_at.get_or_insert_with(Instant::now);
        let until = at + HALF_CLOSE_GRACE;
        loop {
            let answered = self.in_flight() == 0 && !self.awaiting_answer;
            if answered || Instant::now() >= until {
                return Poll::Ready(Ok(()));
            }
            self.meta.idle_waker.register(cx.waker());
            if self.in_flight() == 0 && !self.awaiting_answer {
                return Poll::Ready(Ok(()));
            }
            if !self.arm(cx, until) {
                return Poll::Pending;
            }
        }
    }

    /// Follows the first bytes against HTTP/2's preface; an error once they match it
    /// (after sending HTTP/2's refusal, best effort, on a plain connection).
    fn refuse_h2c(&mut self, new: &[u8]) -> Option<io::Error> {
        let matched = self.preface?;
        let want = &H2_PREFACE[matched..];
        let n = new.len().min(want.len());
        if new[..n] != want[..n] {
            self.preface = None;
            return None;
        }
        if matched + n < H2_PREFACE.len() {
            self.preface = Some(matched + n);
            return None;
        }
        self.preface = None;
        inc(&self.metrics.h2c_refused);
        if let Io::Plain(s) = &self.io {
            let _ = s.try_write(H2_REFUSAL);
        }
        Some(io::Error::new(io::ErrorKind::InvalidData, "h2c is not served"))
    }

    fn poll_write_io(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Io::Handshaking(_) => unreachable!("handshake finished above"),
        }
    }

    /// Writes `buf`, or its JSON rewrite when it is hyper's own error answer: the
    /// rewrite goes out whole before `buf` counts as written.
    fn poll_write_answer(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.rewrite.is_none() {
            self.rewrite = hyper_error_as_json(buf).map(|b| (b, 0));
        }
        let Some((bytes, mut at)) = self.rewrite.take() else {
            return self.poll_write_io(cx, buf);
        };
        while at < bytes.len() {
            match self.poll_write_io(cx, &bytes[at..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)),
                Poll::Ready(Ok(n)) => at += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.rewrite = Some((bytes, at));
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Io::Handshaking(accept) = &mut self.io {
            let stream = ready!(accept.as_mut().poll(cx))?;
            if let Some(subject) = crate::tls::client_subject(stream.get_ref().1) {
                let _ = self.meta.client_subject.set(subject);
            }
            self.io = Io::Tls(Box::new(stream));
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = match this.poll_handshake(cx) {
            Poll::Ready(Ok(())) => match &mut this.io {
                Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
                Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                Io::Handshaking(_) => unreachable!("handshake finished above"),
            },
            other => other,
        };
        match r {
            Poll::Pending => match this.poll_clocks(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                if let Some(e) = this.refuse_h2c(&buf.filled()[before..]) {
                    return Poll::Ready(Err(e));
                }
                this.saw_bytes();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(())) if buf.remaining() > 0 => this.poll_eof(cx),
            Poll::Ready(r) => Poll::Ready(r),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        let r = this.poll_write_answer(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                this.last_io = Instant::now();
                this.awaiting_answer = false;
                if this.eof_at.is_some() {
                    // A held-back end of file may be delivered now that the answer is out.
                    cx.waker().wake_by_ref();
                }
            }
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Io::Handshaking(_) => unreachable!("handshake finished above"),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Io::Handshaking(_) => unreachable!("handshake finished above"),
        }
    }
}

/// hyper's answer to a request head it could not take (it has no hook for the body):
/// a status line, `connection: close`, `content-length: 0`, a date, no content type.
/// No handler of the API answers an error without a JSON body, so such an answer at
/// the end of `buf` is hyper's; the same bytes with the API's JSON error instead.
fn hyper_error_as_json(buf: &[u8]) -> Option<Vec<u8>> {
    const START: &[u8] = b"HTTP/1.1 4";
    // Cheap first: most writes end with a body, and hyper's answer ends its write.
    if !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let at = buf.windows(START.len()).rposition(|w| w == START)?;
    let head = std::str::from_utf8(&buf[at..]).ok()?;
    let lower = head.to_ascii_lowercase();
    if !lower.ends_with("\r\n\r\n") || !lower.contains("\r\ncontent-length: 0\r\n") || lower.contains("content-type") {
        return None;
    }
    let (status, code, message) = match head.get(9..12)? {
        "400" => ("400 Bad Request", "malformed_request", "the request head is not well-formed HTTP/1.1"),
        "414" => ("414 URI Too Long", "uri_too_long", "the request's URI is longer than 65534 bytes"),
        "431" => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "the request head is too large: over 100 header lines, or over about 400 KiB",
        ),
        _ => return None,
    };
    let body = format!("{{\"error\":{{\"code\":\"{code}\",\"message\":\"{message}\"}}}}\n");
    let mut out = buf[..at].to_vec();
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    Some(out)
}
