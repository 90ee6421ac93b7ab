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
//! A request in flight (a waiting acquire) is never cut by the idle or head clocks: the
//! `observe` middleware counts it in the connection's [`ConnMeta`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::{server::TlsStream, Accept, TlsAcceptor};

use crate::metrics::{inc, Metrics};

/// Answer to a connection over `connections_max` (plain HTTP only), then close.
/// How long an end of file from the client is held back while a request is in flight.
const HALF_CLOSE_GRACE: Duration = Duration::from_secs(2);

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
}

impl ConnMeta {
    fn new(remote: SocketAddr) -> ConnMeta {
        ConnMeta { remote, in_flight: Arc::default(), started: Arc::default(), idle_waker: Arc::default() }
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
            };
            return (conn, meta);
        }
    }

    fn local_addr(&self) -> io::Result<ConnMeta> {
        Ok(ConnMeta::new(self.tcp.local_addr()?))
    }
}

/// Builds a TLS acceptor (rustls, ring provider, HTTP/1.1) from PEM files.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    use tokio_rustls::rustls::{crypto::ring, ServerConfig};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tls_cert {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("tls_cert {}: no certificate found", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("tls_key {}: {e}", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
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

    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Io::Handshaking(accept) = &mut self.io {
            let stream = ready!(accept.as_mut().poll(cx))?;
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
        let r = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Io::Handshaking(_) => unreachable!("handshake finished above"),
        };
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
