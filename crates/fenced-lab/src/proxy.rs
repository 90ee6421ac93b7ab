//! A loopback TCP proxy that holds bytes: the nemesis's network delay.
//!
//! Every chunk read from one side is written to the other no earlier than the delay in
//! force when it was read, in order. Raising the delay stalls a connection's traffic
//! without closing it, like a congested or partitioned link; setting it back to zero
//! lets the held bytes through.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running proxy; it stops accepting (and drops its connections) when dropped.
#[derive(Debug)]
pub struct DelayProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind the proxy")?;
        let addr = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let accept = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((down, _)) = listener.accept().await {
                let delay = delay.clone();
                conns.spawn(async move {
                    // Upstream down (a crashed server): the client sees its connection close.
                    if let Ok(up) = TcpStream::connect(upstream).await {
                        let _ = (down.set_nodelay(true), up.set_nodelay(true));
                        let (dr, dw) = down.into_split();
                        let (ur, uw) = up.into_split();
                        tokio::join!(pump(dr, uw, delay.clone()), pump(ur, dw, delay));
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(DelayProxy { addr, delay_ms, accept })
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

/// Copies `from` to `to`, each chunk released at its read time plus the delay then.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_ms: Arc<AtomicU64>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::Relaxed));
                    if tx.send((due, buf[..n].to_vec())).is_err() {
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
