//! Lock services as clusters: three (or N) etcd members, a ZooKeeper ensemble, or
//! Fenced members, as real processes on free loopback ports, each with its own data
//! directory under one temporary directory.
//!
//! An [`Ensemble`] is returned only once it serves: every member answers and one
//! quorum write went through (etcd: a `Put`; ZooKeeper: a node created; Fenced: a
//! leader that has committed its first entry, which `/readyz` reports). Any member
//! can be killed with SIGKILL, started again on its data directory, frozen with
//! SIGSTOP and thawed; [`Ensemble::leader`] asks the members who leads. Dropping the
//! handle kills every member and removes the directories.
//!
//! With [`Links::Proxied`] (the nemesis's), the members reach each other through a
//! fault proxy per directed link ([`crate::proxy::DelayProxy`]), so [`Ensemble::cut`]
//! and [`Ensemble::delay_links`] partition or slow them; with [`Links::Direct`] (the
//! bench's) they talk straight to each other's ports:
//!
//! - **Fenced**: each member's `peer_routes` names the proxies of its links, while the
//!   membership keeps the members' real addresses.
//! - **ZooKeeper**: each server has its own `zoo.cfg`, whose line for itself names the
//!   ports it binds and whose lines for the others name the proxies of its links to
//!   them (quorum and election port each). One limit: a server that receives an
//!   election connection from a server with a lower id drops it and calls back at the
//!   address that server declared for itself, its real port; those callbacks bypass
//!   the proxies. The quorum links (leader to followers: every proposal, commit and
//!   heartbeat) all go through them. A ZooKeeper link's proxy holds a connection its
//!   server refuses for up to `ZK_LINK_PATIENCE`, trying again, as the follower
//!   whose connection it is would have (`ZK_LINK_PATIENCE` says why).
//! - **etcd** keeps one peer address per member in its membership, the same for every
//!   member: each member listens on its real peer port and advertises a *router*'s
//!   address instead; the router finds which member opened each connection (the
//!   socket's owner in `/proc`) and sends it through that member's link proxy.

use std::ffi::OsString;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::peers::{signal, TempDir};

mod etcd;
mod fenced;
mod net;
mod probe;
mod serving;
mod zookeeper;

use net::{on_free_ports, Net};
use probe::term_if_leader;
pub use probe::Probe;

/// How long an ensemble may take to serve once its members are started (three JVMs on
/// a busy two-core machine take a while).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one member may take to serve again after a restart.
const RESTART_TIMEOUT: Duration = Duration::from_secs(30);

/// What the members are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// etcd members with their default durability (fsync per commit) and election
    /// timeout (1 s; heartbeat 100 ms).
    Etcd,
    /// A ZooKeeper ensemble (Debian's `QuorumPeerMain`), `forceSync=yes` (its default),
    /// `tickTime=2000`, `syncLimit=2`: a follower that hears nothing from its leader
    /// for 4 s looks for another.
    Zookeeper,
    /// `fenced server` members of one raft group.
    Fenced,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Etcd => "etcd",
            Kind::Zookeeper => "zookeeper",
            Kind::Fenced => "fenced",
        }
    }

    /// How long the members take at most to notice their leader is gone and to elect
    /// another: what a frozen leader must outlast to be replaced.
    pub fn election_timeout(self) -> Duration {
        match self {
            Kind::Etcd => Duration::from_secs(1),
            Kind::Zookeeper => Duration::from_secs(4),
            Kind::Fenced => Duration::from_millis(600),
        }
    }
}

/// One member process.
#[derive(Debug)]
struct Member {
    /// Where its clients connect (Fenced: the HTTP API).
    client: SocketAddr,
    /// Fenced only: the wire protocol's address.
    wire: Option<SocketAddr>,
    /// Its data directory.
    data: PathBuf,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(&'static str, &'static str)>,
    log: PathBuf,
    child: Option<Child>,
}

/// N members of one lock service on loopback; killed and removed when dropped.
#[derive(Debug)]
pub struct Ensemble {
    pub kind: Kind,
    members: Vec<Member>,
    /// The fault proxies between members ([`Links::Proxied`]).
    net: Option<Net>,
    /// Every member's directory lives under it.
    dir: TempDir,
}

/// How the members of an etcd or ZooKeeper ensemble reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Straight to each other's ports, as in production: for benchmarks, where a
    /// proxy's extra hops would be a cost Fenced's members do not pay.
    Direct,
    /// Through a fault proxy per directed link, which the nemesis cuts and delays.
    Proxied,
}

impl Ensemble {
    /// `n` etcd members (`--initial-cluster` naming them all), default durability.
    pub fn etcd(n: usize, links: Links) -> Result<Ensemble> {
        on_free_ports(|| Ensemble::etcd_once(n, links))
    }

    /// A ZooKeeper ensemble of `n` servers (`server.N=127.0.0.1:peer:election` lines,
    /// a `myid` file each), sessions as short as one tick (2 s) as the single server in
    /// [`crate::peers`], heap at most 256 MB each.
    ///
    /// Each server has its own `zoo.cfg`, and in it its own view of where its peers
    /// are ([`zoo_cfg`](zookeeper::zoo_cfg)): its own line names the ports it binds, the others' the fault
    /// proxies of its links to them.
    pub fn zookeeper(n: usize, links: Links) -> Result<Ensemble> {
        on_free_ports(|| Ensemble::zookeeper_once(n, links))
    }

    /// `n` Fenced members (`fenced server --node-id I --peers ...`, ids 1..=n), each
    /// with the wire protocol on too, and the lab's unfenced and foreign-token
    /// prefixes.
    ///
    /// With [`Links::Proxied`], member `i` reaches member `j` through the proxy of link
    /// `i→j` (its `peer_routes`), while the membership keeps the members' real
    /// addresses. An RPC and its answer travel on the caller's connection, so blocking
    /// `i→j` cuts what `i` asks of `j` and leaves what `j` asks of `i` alone: a one-way
    /// loss at the level of Raft's messages.
    pub fn fenced(bin: &Path, n: usize, links: Links) -> Result<Ensemble> {
        on_free_ports(|| Ensemble::fenced_once(bin, n, links))
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client address (Fenced: its HTTP API), member 0 first.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.client).collect()
    }

    /// Fenced only: every member's wire-protocol address.
    pub fn wire_addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().filter_map(|m| m.wire).collect()
    }

    /// Member `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.members[i].data
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Whether member `i` runs (it may be frozen).
    pub fn running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// kill -9 of member `i`, reaped.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
        self.note_pid(i);
    }

    /// Starts members `victims` again (each killed first if it runs), all at once, and
    /// waits until each serves: members that need each other to serve (etcd's
    /// `/health` wants a leader) come back together.
    pub fn restart_all(&mut self, victims: &[usize]) -> Result<()> {
        for &i in victims {
            self.kill(i);
        }
        for &i in victims {
            self.spawn(i)?;
        }
        let deadline = Instant::now() + RESTART_TIMEOUT;
        victims.iter().try_for_each(|&i| self.wait_serving(i, deadline))
    }

    /// Cuts every link from a member of `a` to a member of `b` (and back, when `both`):
    /// open connections are closed and new ones refused until [`Ensemble::heal`]. The
    /// links cut, as `(from, to)` member numbers from 1.
    pub fn cut(&self, a: &[usize], b: &[usize], both: bool) -> Vec<(u64, u64)> {
        let mut cut = Vec::new();
        let mut block = |x: usize, y: usize| {
            if let Some(proxies) = self.net.as_ref().and_then(|n| n.links.get(&(x, y))) {
                proxies.iter().for_each(|p| p.set_blocked(true));
                cut.push((x as u64 + 1, y as u64 + 1));
            }
        };
        for &x in a {
            for &y in b.iter().filter(|&&y| y != x) {
                block(x, y);
                if both {
                    block(y, x);
                }
            }
        }
        cut
    }

    /// Holds every byte on member `i`'s links (both directions) for `d`.
    pub fn delay_links(&self, i: usize, d: Duration) {
        for ((a, b), proxies) in self.net.iter().flat_map(|n| &n.links) {
            if *a == i || *b == i {
                proxies.iter().for_each(|p| p.set_delay(d));
            }
        }
    }

    /// Every link open, no delay.
    pub fn heal(&self) {
        for proxies in self.net.iter().flat_map(|n| n.links.values()) {
            for p in proxies {
                p.set_blocked(false);
                p.set_delay(Duration::ZERO);
            }
        }
    }

    /// Whether the members reach each other through fault proxies.
    pub fn has_links(&self) -> bool {
        self.net.as_ref().is_some_and(|n| !n.links.is_empty())
    }

    /// A handle that asks the members who leads, usable while the ensemble is locked.
    pub fn probe(&self) -> Probe {
        Probe { kind: self.kind, addrs: self.addrs() }
    }

    fn note_pid(&self, i: usize) {
        if let Some(net) = &self.net {
            net.pids.lock().expect("pids")[i] = self.pid(i);
        }
    }

    /// Starts member `i` again (killed first if it runs) on its ports and data
    /// directory, and waits until it serves again.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_serving(i, Instant::now() + RESTART_TIMEOUT)
    }

    /// SIGSTOP of member `i`: it neither answers nor notices time pass.
    pub fn pause(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i).with_context(|| format!("member {i} is not running"))?;
        signal(pid, libc::SIGSTOP).with_context(|| format!("SIGSTOP member {i}"))
    }

    /// SIGCONT of member `i`.
    pub fn resume(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i).with_context(|| format!("member {i} is not running"))?;
        signal(pid, libc::SIGCONT).with_context(|| format!("SIGCONT member {i}"))
    }

    /// The member that leads, by its own word (etcd: `/v3/maintenance/status`, whose
    /// `leader` is its own `member_id`; ZooKeeper: `srvr` says `Mode: leader`; Fenced:
    /// `/readyz` says `"leader": true`); `None` while none does (an election) or the
    /// leader is frozen.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.running(i) && self.leads(i))
    }

    /// [`Ensemble::leader`], waiting up to `timeout` for one.
    pub fn wait_leader(&self, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if Instant::now() > deadline {
                bail!("no {} member leads after {timeout:?}{}", self.kind.name(), self.tails());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether member `i` says it leads.
    fn leads(&self, i: usize) -> bool {
        term_if_leader(self.kind, self.members[i].client).is_some()
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let m = &mut self.members[i];
        let log = fs::OpenOptions::new().create(true).append(true).open(&m.log)?;
        let child = Command::new(&m.program)
            .args(&m.args)
            .envs(m.env.iter().copied())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", m.program.display()))?;
        m.child = Some(child);
        self.note_pid(i);
        Ok(())
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

#[cfg(test)]
mod tests;
