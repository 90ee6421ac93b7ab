//! The fault proxies between the members, and the free ports they start on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use super::Ensemble;
use crate::proxy::DelayProxy;

/// The proxies between members, on a runtime of their own (the ensemble is driven from
/// plain threads as well as from tokio's blocking ones).
#[derive(Debug)]
pub(super) struct Net {
    /// The proxies of each directed link `(from, to)`, by member index: one per port the
    /// link carries (ZooKeeper: quorum and election; etcd: the peer port).
    pub(super) links: BTreeMap<(usize, usize), Vec<DelayProxy>>,
    /// Each member's process id while it runs, for etcd's routers.
    pub(super) pids: Arc<Mutex<Vec<Option<u32>>>>,
    /// Dropped (shut down in the background) with the ensemble.
    pub(super) rt: Option<tokio::runtime::Runtime>,
}

impl Net {
    pub(super) fn new(n: usize) -> Result<Net> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ensemble-net")
            .enable_all()
            .build()
            .context("a runtime for the ensemble's proxies")?;
        Ok(Net { links: BTreeMap::new(), pids: Arc::new(Mutex::new(vec![None; n])), rt: Some(rt) })
    }

    pub(super) fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the ensemble")
    }

    /// A proxy to `upstream` on link `(from, to)`, which holds a connection upstream
    /// refuses for up to `patience` ([`DelayProxy::start_patient`]); its address.
    pub(super) fn link(
        &mut self,
        from: usize,
        to: usize,
        upstream: SocketAddr,
        patience: Duration,
    ) -> Result<SocketAddr> {
        let proxy = self.rt().block_on(DelayProxy::start_patient(upstream, patience))?;
        let addr = proxy.addr;
        self.links.entry((from, to)).or_default().push(proxy);
        Ok(addr)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // The proxies abort their tasks; the runtime may be dropped from async code.
        self.links.clear();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A member could not bind a port it was given ("Address already in use").
#[derive(Debug)]
pub(super) struct PortTaken(pub(super) String);

impl std::fmt::Display for PortTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PortTaken {}

/// `start`, tried again on new ports (three times at most) while a member could not
/// bind one it was given: each port is free when chosen and held until the members
/// start, but between its release and the member's bind (a JVM's start, a second or
/// two) another socket on the machine can take it (another test's listener, or an
/// outgoing connection's ephemeral port): seen once in ten runs of the `fenced-lab`
/// suite, its tests in parallel.
pub(super) fn on_free_ports(start: impl Fn() -> Result<Ensemble>) -> Result<Ensemble> {
    let mut attempt = 1;
    loop {
        match start() {
            Err(e) if attempt < 3 && e.is::<PortTaken>() => {
                eprintln!(
                    "ensemble: {}; starting again on new ports",
                    e.to_string().lines().next().unwrap_or_default()
                );
                attempt += 1;
            }
            started => return started,
        }
    }
}

/// A free loopback port, kept bound (in `held`) until the caller lets it go.
pub(super) fn hold(held: &mut Vec<std::net::TcpListener>) -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind a loopback port")?;
    let port = l.local_addr()?.port();
    held.push(l);
    Ok(port)
}
