//! The accept loop's listener: a connection limit (a semaphore permit rides along with
//! each connection), optional TLS, handshaking lazily on the connection's own task so a
//! slow handshake never stalls `accept`, and an idle timeout: a connection with no
//! request in flight that moves no byte for `idle_timeout_ms` is closed (slow or stalled
//! request heads, forgotten keep-alive connections). A request in flight (a waiting
//! acquire) is never cut: the `observe` middleware counts it in the connection's
//! [`ConnMeta`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::{server::TlsStream, Accept, TlsAcceptor};

use crate::metrics::{inc, Metrics};

/// Answer to a connection over `connections_max` (plain HTTP only), then close.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 92\r\n\r\n{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the server is at its connection limit\"}}\n";

pub struct FencedListener {
    pub tcp: TcpListener,
    pub tls: Option<TlsAcceptor>,
    pub conns: Arc<Semaphore>,
    pub metrics: Arc<Metrics>,
    /// None: no idle timeout.
    pub idle: Option<Duration>,
}

/// What a request knows of its connection (axum's `ConnectInfo`).
#[derive(Clone, Debug)]
pub struct ConnMeta {
    pub remote: SocketAddr,
    /// Requests of this connection being handled now.
    pub in_flight: Arc<AtomicUsize>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, FencedListener>> for ConnMeta {
    fn connect_info(stream: axum::serve::IncomingStream<'_, FencedListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// Counts a request in flight on its connection for as long as it lives.
pub struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub fn new(meta: &ConnMeta) -> InFlight {
        meta.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(meta.in_flight.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
            let meta = ConnMeta { remote: addr, in_flight: Arc::new(AtomicUsize::new(0)) };
            let conn = Conn {
                io,
                _permit: permit,
                in_flight: meta.in_flight.clone(),
                idle: self.idle,
                last_io: Instant::now(),
                sleep: None,
            };
            return (conn, meta);
        }
    }

    fn local_addr(&self) -> io::Result<ConnMeta> {
        Ok(ConnMeta { remote: self.tcp.local_addr()?, in_flight: Arc::default() })
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
    in_flight: Arc<AtomicUsize>,
    idle: Option<Duration>,
    /// The last time a byte moved either way.
    last_io: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
}

enum Io {
    Plain(TcpStream),
    Handshaking(Pin<Box<Accept<TcpStream>>>),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    /// Called when a read is pending: an error once the connection has been idle, with
    /// no request in flight, for the idle timeout. The wake-up timer is re-armed only
    /// when it fires early (the connection was busy meanwhile), not on every read:
    /// resetting a tokio timer per request costs a driver lock.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let idle = self.idle?;
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let timed_out = || Some(io::Error::new(io::ErrorKind::TimedOut, "idle connection"));
        let deadline = self.last_io + idle;
        if Instant::now() >= deadline {
            return timed_out();
        }
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        while sleep.as_mut().poll(cx).is_ready() {
            let deadline = self.last_io + idle;
            if Instant::now() >= deadline {
                return timed_out();
            }
            sleep.as_mut().reset(deadline);
        }
        None
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
            Poll::Pending => match this.poll_idle(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.last_io = Instant::now();
                }
                Poll::Ready(r)
            }
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
