//! A loopback TCP proxy that holds bytes: the nemesis's network delay.
//!
//! Every chunk read from one side is written to the other no earlier than the delay in
//! force when it was read, in order. Raising the delay stalls a connection's traffic
//! without closing it, like a congested or partitioned link; setting it back to zero
//! lets the held bytes through.
//!
//! A proxy can also be *blocked*: every connection through it is cut at once and new
//! ones are closed as soon as they are accepted, until it is unblocked (a partitioned
//! link: the cluster nemesis puts one proxy on each directed link between members).
//!
//! A proxy accepts a connection before it knows whether its upstream will: where a
//! direct connection would be refused (nothing listens there, or not yet), the client
//! sees one that opened and then closed. [`DelayProxy::start`] closes it at once;
//! [`DelayProxy::start_patient`] first tries upstream again for a while, as a client
//! that retries a refused connection would (ZooKeeper's followers do: see
//! `crate::ensemble`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running proxy; it stops accepting (and drops its connections) when dropped.
#[derive(Debug)]
pub struct DelayProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    blocked: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`; one
    /// that upstream refuses is closed at once.
    pub async fn start(upstream: SocketAddr) -> Result<DelayProxy> {
        DelayProxy::start_patient(upstream, Duration::ZERO).await
    }

    /// [`DelayProxy::start`], but a connection that upstream refuses is held while the
    /// proxy tries upstream again, every [`RETRY_EVERY`], for up to `patience`; only
    /// then is it closed. Its bytes wait meanwhile, and go through once upstream
    /// accepts.
    pub async fn start_patient(upstream: SocketAddr, patience: Duration) -> Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind the proxy")?;
        let addr = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let (blocked, _) = watch::channel(false);
        let block = blocked.clone();
        let accept = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((down, _)) = listener.accept().await {
                if *block.borrow() {
                    drop(down);
                    continue;
                }
                let delay = delay.clone();
                let mut cut = block.subscribe();
                conns.spawn(async move {
                    let relay = async {
                        // Upstream down (a crashed server, or one not listening yet) past
                        // the patience: the client sees its connection close.
                        if let Some(up) = connect_within(upstream, patience).await {
                            let _ = (down.set_nodelay(true), up.set_nodelay(true));
                            let (dr, dw) = down.into_split();
                            let (ur, uw) = up.into_split();
                            tokio::join!(pump(dr, uw, delay.clone()), pump(ur, dw, delay));
                        }
                    };
                    // Blocking drops the relay, and with it both sockets.
                    tokio::select! {
                        () = relay => {}
                        _ = cut.wait_for(|b| *b) => {}
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(DelayProxy { addr, delay_ms, blocked, accept })
    }

    /// Cuts every connection and refuses new ones (`true`), or lets them through again.
    pub fn set_blocked(&self, on: bool) {
        self.blocked.send_replace(on);
    }

    pub fn blocked(&self) -> bool {
        *self.blocked.borrow()
    }

    /// Holds every byte read from now on for `d`.
    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection.
        self.accept.abort();
    }
}

/// How often a patient proxy tries again an upstream that refused.
pub const RETRY_EVERY: Duration = Duration::from_millis(50);

/// A connection to `upstream`, tried again every [`RETRY_EVERY`] while it is refused,
/// for up to `patience`; `None` if it never is accepted.
async fn connect_within(upstream: SocketAddr, patience: Duration) -> Option<TcpStream> {
    let deadline = Instant::now() + patience;
    loop {
        match TcpStream::connect(upstream).await {
            Ok(up) => return Some(up),
            Err(_) if Instant::now() + RETRY_EVERY <= deadline => tokio::time::sleep(RETRY_EVERY).await,
            Err(_) => return None,
        }
    }
}

/// Chunks (of up to 16 KiB) one direction of a link holds for their delay. Past it
/// the proxy stops reading that direction: the sender's bytes wait in the kernel's
/// buffers and TCP's flow control slows it, as a slow link would. Nothing is dropped
/// (a byte stream cannot lose bytes); the lab's traffic is far below it.
const CHUNKS_HELD_MAX: usize = 1024;

/// Copies `from` to `to`, each chunk released at its read time plus the delay then.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_ms: Arc<AtomicU64>) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_HELD_MAX);
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::Relaxed));
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> std::io::Result<usize> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await.map_err(std::io::Error::other)?
    }

    /// A loopback address nothing listens on (for now).
    fn vacant() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_closes_the_connection_at_once_unless_the_proxy_is_patient() {
        let proxy = DelayProxy::start(vacant()).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let mut buf = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_secs(1), c.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "not closed at once: {read:?}");

        // Patient, the proxy holds the connection until upstream listens, and the bytes
        // written meanwhile go through.
        let upstream = vacant();
        let proxy = DelayProxy::start_patient(upstream, Duration::from_secs(2)).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let l = TcpListener::bind(upstream).await.unwrap();
        let (mut s, _) = tokio::time::timeout(Duration::from_secs(2), l.accept()).await.unwrap().unwrap();
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        s.write_all(b"pong").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");

        // Past its patience, it closes the connection.
        let proxy = DelayProxy::start_patient(vacant(), Duration::from_millis(300)).await.unwrap();
        let started = Instant::now();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "not closed: {read:?}");
        assert!(started.elapsed() >= Duration::from_millis(250), "closed after {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn blocking_cuts_open_connections_and_refuses_new_ones_until_lifted() {
        let proxy = DelayProxy::start(echo_server().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut open).await.unwrap(), 4);
        proxy.set_blocked(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!matches!(round_trip(&mut open).await, Ok(4)), "an open connection survived the block");
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(!matches!(round_trip(&mut fresh).await, Ok(4)), "a new connection got through the block");
        proxy.set_blocked(false);
        let mut again = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut again).await.unwrap(), 4);
    }
}
