//! Until the members serve: started, each answering its clients, a write through a quorum.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use hyper::Method;

use super::etcd::etcd_ask;
use super::net::PortTaken;
use super::zookeeper::{four_letters, zk_create};
use super::{Ensemble, Kind, START_TIMEOUT};
use crate::http;

impl Ensemble {
    /// Starts every member, waits until each serves and a quorum write succeeds.
    pub(super) fn started(mut self) -> Result<Ensemble> {
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0..self.members.len() {
            self.wait_serving(i, deadline)?;
        }
        loop {
            match self.quorum_write() {
                Ok(()) => return Ok(self),
                Err(e) if Instant::now() > deadline => {
                    bail!(
                        "the {} ensemble took no write within {START_TIMEOUT:?}: {e:#}{}",
                        self.kind.name(),
                        self.tails()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Waits until member `i` serves its clients (etcd: `/health` is true, which needs
    /// a leader; ZooKeeper: `srvr` names its mode, which it has only in a quorum;
    /// Fenced: `/livez`).
    pub(super) fn wait_serving(&mut self, i: usize, deadline: Instant) -> Result<()> {
        loop {
            let addr = self.members[i].client;
            let serving = match self.kind {
                Kind::Etcd => http_json(addr, Method::GET, "/health", "").is_some_and(|v| v["health"] == "true"),
                Kind::Zookeeper => four_letters(addr, "srvr").is_some_and(|a| a.contains("Mode: ")),
                Kind::Fenced => http_json(addr, Method::GET, "/livez", "").is_some_and(|v| v["status"] == "live"),
            };
            if serving {
                return Ok(());
            }
            if let Some(child) = &mut self.members[i].child {
                if let Some(status) = child.try_wait()? {
                    self.members[i].child = None;
                    let why =
                        format!("{} member {i} exited ({status}) before serving{}", self.kind.name(), self.tails());
                    let log = fs::read_to_string(&self.members[i].log).unwrap_or_default();
                    if log.to_lowercase().contains("address already in use") {
                        return Err(PortTaken(why).into());
                    }
                    bail!(why);
                }
            }
            if Instant::now() > deadline {
                bail!("{} member {i} did not serve on {addr} in time{}", self.kind.name(), self.tails());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One write that needs a quorum. etcd: a Put, asked of each running member in
    /// turn until one answers it or 10 s pass (a member that was just thawed or
    /// restarted may take a few seconds to follow the current leader again).
    pub(super) fn quorum_write(&self) -> Result<()> {
        match self.kind {
            Kind::Etcd => {
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut last = String::from("no member running");
                for i in (0..self.members.len()).cycle() {
                    if Instant::now() >= deadline {
                        break;
                    }
                    if !self.running(i) {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    match etcd_ask(self.members[i].client, |e| async move {
                        e.put(b"fenced-lab/ensemble-ready", b"1").await
                    }) {
                        Ok(()) => return Ok(()),
                        Err(e) => last = format!("member {i}: {e}"),
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                bail!("no Put went through in 10 s: {last}")
            }
            Kind::Zookeeper => {
                let connect = self.addrs().iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
                // A runtime of its own, on a thread of its own: the caller may be on
                // one of tokio's blocking threads.
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                        rt.block_on(zk_create(&connect))
                    })
                    .join()
                    .unwrap_or_else(|_| bail!("the ZooKeeper probe panicked"))
                })
            }
            Kind::Fenced => {
                let ok = self.addrs().iter().any(|&a| {
                    http_json(a, Method::GET, "/readyz", "")
                        .is_some_and(|v| v["leader"] == true && v["recovering"] == false)
                });
                if ok {
                    Ok(())
                } else {
                    bail!("no member is a ready leader")
                }
            }
        }
    }

    /// The last lines of every member's log, for an error message.
    pub fn tails(&self) -> String {
        let mut s = String::new();
        for (i, m) in self.members.iter().enumerate() {
            s += &format!("\n--- {} member {i} ({}):\n{}", self.kind.name(), m.client, log_tail(&m.log));
        }
        s
    }
}

/// A request to `addr` ([`crate::http`]); the JSON body of a 200 answer.
pub(super) fn http_json(addr: SocketAddr, method: Method, path: &str, body: &str) -> Option<serde_json::Value> {
    http::blocking(method, addr, path, body, Duration::from_secs(2)).ok()?.json_if_ok()
}

fn log_tail(path: &Path) -> String {
    let Ok(mut f) = fs::File::open(path) else { return "(no log)".into() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(1200)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s.trim().to_owned()
}
