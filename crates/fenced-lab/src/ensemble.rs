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

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fenced_client::etcd::Etcd;
use hyper::Method;

use crate::http;
use crate::peers::{ask, fenced_server_args, find_program, signal, TempDir, ZOOKEEPER_JAR};
use crate::proxy::DelayProxy;

/// How long an ensemble may take to serve once its members are started (three JVMs on
/// a busy two-core machine take a while).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one member may take to serve again after a restart.
const RESTART_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a ZooKeeper link's proxy holds a connection that its server refuses,
/// trying again, before it closes it ([`DelayProxy::start_patient`]).
///
/// A newly elected leader binds its quorum port only once it has become leader, and
/// its followers connect the moment they have voted; a follower that finds the port
/// not yet bound is refused and tries again (five times, 100 ms apart). Through a
/// proxy that closed at once what its server refused, that follower saw a connection
/// open and close instead ("Successfully connected to leader", then "Exception when
/// following the leader: java.io.EOFException", "Was connected for 1ms"), which it
/// takes for a failed leader: it runs a new election, in which the leader's vote from
/// the round before does not count, while the leader waits `initLimit` ticks (20 s)
/// for a follower before it gives up ("Timeout while waiting for epoch from quorum").
/// With two live servers of three that is 20 s without a leader, again at each retry
/// that loses the same race. One second covers the follower's own retries.
const ZK_LINK_PATIENCE: Duration = Duration::from_secs(1);

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

/// The proxies between members, on a runtime of their own (the ensemble is driven from
/// plain threads as well as from tokio's blocking ones).
#[derive(Debug)]
struct Net {
    /// The proxies of each directed link `(from, to)`, by member index: one per port the
    /// link carries (ZooKeeper: quorum and election; etcd: the peer port).
    links: BTreeMap<(usize, usize), Vec<DelayProxy>>,
    /// Each member's process id while it runs, for etcd's routers.
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    /// Dropped (shut down in the background) with the ensemble.
    rt: Option<tokio::runtime::Runtime>,
}

impl Net {
    fn new(n: usize) -> Result<Net> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ensemble-net")
            .enable_all()
            .build()
            .context("a runtime for the ensemble's proxies")?;
        Ok(Net { links: BTreeMap::new(), pids: Arc::new(Mutex::new(vec![None; n])), rt: Some(rt) })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the ensemble")
    }

    /// A proxy to `upstream` on link `(from, to)`, which holds a connection upstream
    /// refuses for up to `patience` ([`DelayProxy::start_patient`]); its address.
    fn link(&mut self, from: usize, to: usize, upstream: SocketAddr, patience: Duration) -> Result<SocketAddr> {
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

    fn etcd_once(n: usize, links: Links) -> Result<Ensemble> {
        let program = find_program("etcd", "apt-get install -y etcd-server")?;
        let dir = TempDir::new("lab-etcd-cluster")?;
        // The members' ports stay bound until they start: the proxies' own ports
        // cannot take them meanwhile.
        let mut held = Vec::new();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| Ok((hold(&mut held)?, hold(&mut held)?))).collect::<Result<_>>()?;
        let real = |j: usize| SocketAddr::from(([127, 0, 0, 1], ports[j].1));
        // What every member knows as member j's peer address: its router when the
        // links are proxied, its own peer port when direct.
        let mut net = (links == Links::Proxied).then(|| Net::new(n)).transpose()?;
        let mut routers = Vec::new();
        for j in 0..n {
            let Some(net) = net.as_mut() else {
                routers.push(real(j));
                continue;
            };
            let mut routes = vec![None; n];
            for (i, route) in routes.iter_mut().enumerate().filter(|&(i, _)| i != j) {
                *route = Some(net.link(i, j, real(j), Duration::ZERO)?);
            }
            let pids = net.pids.clone();
            routers.push(net.rt().block_on(router::start(real(j), routes, pids))?);
        }
        let initial =
            routers.iter().enumerate().map(|(i, router)| format!("m{i}=http://{router}")).collect::<Vec<_>>().join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let client_url = format!("http://127.0.0.1:{client}");
                let peer_url = format!("http://127.0.0.1:{peer}");
                let advertised = format!("http://{}", routers[i]);
                let mut args: Vec<OsString> = [
                    "--name",
                    &format!("m{i}"),
                    "--listen-client-urls",
                    &client_url,
                    "--advertise-client-urls",
                    &client_url,
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &advertised,
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                    "--log-level",
                    "warn",
                ]
                .iter()
                .map(OsString::from)
                .collect();
                args.push("--data-dir".into());
                let data = dir.path().join(format!("m{i}"));
                args.push(data.clone().into());
                Member {
                    client: SocketAddr::from(([127, 0, 0, 1], client)),
                    wire: None,
                    data,
                    program: program.clone(),
                    args,
                    env: Vec::new(),
                    log: dir.path().join(format!("etcd-m{i}.log")),
                    child: None,
                }
            })
            .collect();
        drop(held);
        Ensemble { kind: Kind::Etcd, members, net, dir }.started()
    }

    /// A ZooKeeper ensemble of `n` servers (`server.N=127.0.0.1:peer:election` lines,
    /// a `myid` file each), sessions as short as one tick (2 s) as the single server in
    /// [`crate::peers`], heap at most 256 MB each.
    ///
    /// Each server has its own `zoo.cfg`, and in it its own view of where its peers
    /// are ([`zoo_cfg`]): its own line names the ports it binds, the others' the fault
    /// proxies of its links to them.
    pub fn zookeeper(n: usize, links: Links) -> Result<Ensemble> {
        on_free_ports(|| Ensemble::zookeeper_once(n, links))
    }

    fn zookeeper_once(n: usize, links: Links) -> Result<Ensemble> {
        const HINT: &str = "apt-get install -y zookeeper";
        let java = find_program("java", HINT)?;
        if !Path::new(ZOOKEEPER_JAR).exists() {
            bail!("{ZOOKEEPER_JAR} not found: ZooKeeper is not installed ({HINT})");
        }
        let dir = TempDir::new("lab-zk-ensemble")?;
        // Per server: client, quorum (peer) and leader-election ports.
        let mut held = Vec::new();
        let ports: Vec<[u16; 3]> =
            (0..n).map(|_| Ok([hold(&mut held)?, hold(&mut held)?, hold(&mut held)?])).collect::<Result<_>>()?;
        let mut net = (links == Links::Proxied).then(|| Net::new(n)).transpose()?;
        let mut members = Vec::new();
        for (i, [client, ..]) in ports.iter().enumerate() {
            let id = i + 1;
            let home = dir.path().join(format!("zk{id}"));
            fs::create_dir_all(home.join("data"))?;
            fs::write(home.join("data").join("myid"), format!("{id}\n"))?;
            // Server i's view of every server j: its own ports, and the proxies of its
            // links to the others.
            let mut view = Vec::new();
            for (j, p) in ports.iter().enumerate() {
                match net.as_mut().filter(|_| i != j) {
                    None => view.push((p[1], p[2])),
                    Some(net) => {
                        let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
                        let quorum = net.link(i, j, at(p[1]), ZK_LINK_PATIENCE)?;
                        let election = net.link(i, j, at(p[2]), ZK_LINK_PATIENCE)?;
                        view.push((quorum.port(), election.port()));
                    }
                }
            }
            let cfg = home.join("zoo.cfg");
            fs::write(&cfg, zoo_cfg(&home.join("data"), *client, &view))
                .with_context(|| format!("write {}", cfg.display()))?;
            let args: Vec<OsString> = [
                "-Xmx256m",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
                "-cp",
                &zk_classpath(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ]
            .iter()
            .map(OsString::from)
            .chain([cfg.into()])
            .collect();
            members.push(Member {
                client: SocketAddr::from(([127, 0, 0, 1], *client)),
                wire: None,
                data: home.join("data"),
                program: java.clone(),
                args,
                env: Vec::new(),
                log: dir.path().join(format!("zookeeper-{id}.log")),
                child: None,
            });
        }
        drop(held);
        Ensemble { kind: Kind::Zookeeper, members, net, dir }.started()
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

    fn fenced_once(bin: &Path, n: usize, links: Links) -> Result<Ensemble> {
        let dir = TempDir::new("lab-fenced-cluster")?;
        let mut held = Vec::new();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| Ok((hold(&mut held)?, hold(&mut held)?))).collect::<Result<_>>()?;
        let http = |j: usize| SocketAddr::from(([127, 0, 0, 1], ports[j].0));
        let peers = (0..n).map(|j| format!("{}=http://{}", j + 1, http(j))).collect::<Vec<_>>().join(",");
        let mut net = (links == Links::Proxied).then(|| Net::new(n)).transpose()?;
        let mut members = Vec::new();
        for (i, &(_, wire)) in ports.iter().enumerate() {
            let (id, wire_listen) = ((i + 1).to_string(), format!("127.0.0.1:{wire}"));
            let mut extra =
                vec!["--wire-listen", &wire_listen, "--node-id", &id, "--peers", &peers, "--insecure-peers"];
            let config = match net.as_mut() {
                Some(net) => Some(fenced_routes(net, dir.path(), i, n, http)?),
                None => None,
            };
            if let Some(config) = &config {
                extra.extend(["--config", config.as_str()]);
            }
            let data = dir.path().join(format!("n{}", i + 1));
            members.push(Member {
                client: http(i),
                wire: Some(SocketAddr::from(([127, 0, 0, 1], wire))),
                args: fenced_server_args(&http(i).to_string(), &data, &extra),
                data,
                program: bin.to_path_buf(),
                env: vec![("FENCED_LOG", "warn")],
                log: dir.path().join(format!("fenced-{}.log", i + 1)),
                child: None,
            });
        }
        drop(held);
        Ensemble { kind: Kind::Fenced, members, net, dir }.started()
    }

    /// Starts every member, waits until each serves and a quorum write succeeds.
    fn started(mut self) -> Result<Ensemble> {
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

    /// Waits until member `i` serves its clients (etcd: `/health` is true, which needs
    /// a leader; ZooKeeper: `srvr` names its mode, which it has only in a quorum;
    /// Fenced: `/livez`).
    fn wait_serving(&mut self, i: usize, deadline: Instant) -> Result<()> {
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
    fn quorum_write(&self) -> Result<()> {
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

impl Drop for Ensemble {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A member could not bind a port it was given ("Address already in use").
#[derive(Debug)]
struct PortTaken(String);

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
fn on_free_ports(start: impl Fn() -> Result<Ensemble>) -> Result<Ensemble> {
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
fn hold(held: &mut Vec<std::net::TcpListener>) -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind a loopback port")?;
    let port = l.local_addr()?.port();
    held.push(l);
    Ok(port)
}

/// Asks an ensemble's members who leads, without holding the [`Ensemble`] (a frozen
/// member makes a question last seconds).
#[derive(Clone, Debug)]
pub struct Probe {
    kind: Kind,
    addrs: Vec<SocketAddr>,
}

impl Probe {
    /// What the members are.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The member that says it leads in the highest term, and that term (etcd: its
    /// `raftTerm`; ZooKeeper: the epoch, the high 32 bits of its last zxid), every
    /// member asked at once; `None` while none does.
    pub fn leader_term(&self) -> Option<(u64, usize)> {
        std::thread::scope(|s| {
            let asks: Vec<_> = self.addrs.iter().map(|&a| s.spawn(move || term_if_leader(self.kind, a))).collect();
            asks.into_iter().enumerate().filter_map(|(i, h)| Some((h.join().ok()??, i))).max()
        })
    }
}

/// The term of the member at `addr` if it says it leads (Fenced: 0, its `/readyz`
/// has no term).
fn term_if_leader(kind: Kind, addr: SocketAddr) -> Option<u64> {
    match kind {
        Kind::Etcd => {
            let status = etcd_ask(addr, |e| async move { e.status().await }).ok()?;
            (status.member_id != 0 && status.member_id == status.leader).then_some(status.raft_term)
        }
        Kind::Zookeeper => {
            let answer = four_letters(addr, "srvr")?;
            if !answer.contains("Mode: leader") {
                return None;
            }
            let zxid = answer.lines().find_map(|l| l.strip_prefix("Zxid: 0x"))?;
            Some(u64::from_str_radix(zxid.trim(), 16).ok()? >> 32)
        }
        Kind::Fenced => http_json(addr, Method::GET, "/readyz", "").is_some_and(|v| v["leader"] == true).then_some(0),
    }
}

/// etcd's peer routers: one per member, at the address every member knows as that
/// member's peer URL. Each connection goes through the proxy of the link from the
/// member that opened it, found as the owner of the connecting socket: the socket's
/// inode in `/proc/net/tcp`, then the member process holding it.
mod router {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    /// Listens on a free loopback port; a connection from member `i` goes to
    /// `routes[i]` (`None`: straight to `upstream`); one whose owner is not found is
    /// closed, and said on stderr. The accept loop lives as long as the ensemble's
    /// runtime.
    pub(super) async fn start(
        upstream: SocketAddr,
        routes: Vec<Option<SocketAddr>>,
        pids: Arc<Mutex<Vec<Option<u32>>>>,
    ) -> Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind a router")?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut down, from)) = listener.accept().await {
                let pids = pids.lock().expect("pids").clone();
                // The owner is looked for twice: a socket can be missing from one read of
                // the table. Unknown, the connection is closed rather than let around
                // a cut (etcd dials again).
                let route = match owner(from.port(), addr.port(), &pids).or_else(|| {
                    std::thread::sleep(Duration::from_millis(5));
                    owner(from.port(), addr.port(), &pids)
                }) {
                    Some(i) => routes[i].unwrap_or(upstream),
                    None => {
                        eprintln!("ensemble router {addr}: a connection from {from}, no member's: closed");
                        continue;
                    }
                };
                conns.spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(route).await {
                        let _ = (down.set_nodelay(true), up.set_nodelay(true));
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(addr)
    }

    /// The index of the member whose process holds the loopback socket connected from
    /// `from_port` to `to_port`.
    pub(super) fn owner(from_port: u16, to_port: u16, pids: &[Option<u32>]) -> Option<usize> {
        let inode = ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|table| {
            let text = fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|line| socket_inode(line, from_port, to_port))
        })?;
        let name = format!("socket:[{inode}]");
        pids.iter().position(|pid| {
            let Some(pid) = pid else { return false };
            let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
            fds.flatten().any(|fd| fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == name.as_str()))
        })
    }

    /// The inode of a `/proc/net/tcp` line's socket if it is `from_port` → `to_port`.
    pub(super) fn socket_inode(line: &str, from_port: u16, to_port: u16) -> Option<u64> {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let port = |col: usize| u16::from_str_radix(cols.get(col)?.rsplit(':').next()?, 16).ok();
        if port(1)? != from_port || port(2)? != to_port {
            return None;
        }
        cols.get(9)?.parse().ok().filter(|&inode| inode != 0)
    }
}

/// The servers' class path: ZooKeeper's jar, and slf4j's simple logger when it is
/// there (Debian's `libslf4j-java`, which ZooKeeper's package pulls in, ships it but
/// the jar's manifest names only slf4j's API, so without it the servers log nothing):
/// each member's log then says what its election and quorum connections do.
fn zk_classpath() -> String {
    const SIMPLE_LOGGER: &str = "/usr/share/java/slf4j-simple.jar";
    if Path::new(SIMPLE_LOGGER).exists() {
        format!("{ZOOKEEPER_JAR}:{SIMPLE_LOGGER}")
    } else {
        ZOOKEEPER_JAR.to_owned()
    }
}

/// Server i's `zoo.cfg`: its data directory and client port, and `view[j]`, the
/// (quorum, election) ports at which it reaches server j+1 (for j = i, the ports it
/// binds; for the others, the proxies of its links to them).
fn zoo_cfg(data: &Path, client: u16, view: &[(u16, u16)]) -> String {
    let mut s = format!(
        "tickTime=2000\ninitLimit=10\nsyncLimit=2\nminSessionTimeout=2000\ndataDir={}\n\
         clientPort={client}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
         4lw.commands.whitelist=srvr\nmaxClientCnxns=0\n",
        data.display()
    );
    for (j, (quorum, election)) in view.iter().enumerate() {
        s += &format!("server.{}=127.0.0.1:{quorum}:{election}\n", j + 1);
    }
    s
}

/// Member `i`'s config file naming the proxies of its links to the others as its
/// `peer_routes` (the proxies made here), of `n` members whose HTTP address is `http`.
fn fenced_routes(net: &mut Net, dir: &Path, i: usize, n: usize, http: impl Fn(usize) -> SocketAddr) -> Result<String> {
    let mut routes = Vec::new();
    for j in (0..n).filter(|&j| j != i) {
        routes.push(format!("{}=http://{}", j + 1, net.link(i, j, http(j), Duration::ZERO)?));
    }
    let file = dir.join(format!("node-{}.toml", i + 1));
    fs::write(&file, format!("peer_routes = \"{}\"\n", routes.join(",")))
        .with_context(|| format!("write {}", file.display()))?;
    Ok(file.to_string_lossy().into_owned())
}

/// Creates a node through a session on the ensemble: a write its leader commits on
/// a quorum.
async fn zk_create(connect: &str) -> Result<()> {
    use zookeeper_client as zk;
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        zk::Client::connector().with_session_timeout(Duration::from_secs(4)).connect(connect),
    )
    .await
    .context("connecting to the ensemble timed out")??;
    let mode = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let created = tokio::time::timeout(Duration::from_secs(5), client.create("/fenced-lab-ready", b"1", &mode))
        .await
        .context("the create timed out")?;
    match created {
        Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A request to `addr` ([`crate::http`]); the JSON body of a 200 answer.
fn http_json(addr: SocketAddr, method: Method, path: &str, body: &str) -> Option<serde_json::Value> {
    http::blocking(method, addr, path, body, Duration::from_secs(2)).ok()?.json_if_ok()
}

/// `ask` of the etcd member at `addr`, by the workspace's etcd client, from a plain
/// thread; the whole within 2 s.
fn etcd_ask<T, F>(addr: SocketAddr, ask: impl FnOnce(Etcd) -> F + Send) -> Result<T, String>
where
    T: Send,
    F: Future<Output = Result<T, fenced_client::Error>> + Send,
{
    let etcd = Etcd::new(&format!("http://{addr}"), Duration::from_secs(1), Duration::from_secs(2));
    http::block_on(async move { ask(etcd.map_err(|e| e.to_string())?).await.map_err(|e| e.to_string()) })
}

/// A ZooKeeper four-letter word's answer.
fn four_letters(addr: SocketAddr, word: &str) -> Option<String> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    ask(conn, word.as_bytes(), Duration::from_millis(1000))
}

fn log_tail(path: &Path) -> String {
    let Ok(mut f) = fs::File::open(path) else { return "(no log)".into() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(1200)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ensemble, or `None` (the test skips) when its programs are missing outside CI.
    fn started(e: Result<Ensemble>) -> Option<Ensemble> {
        match e {
            Err(e) if std::env::var_os("CI").is_none() && format!("{e:#}").contains("not found") => {
                eprintln!("skipping: {e:#}");
                None
            }
            e => Some(e.expect("the ensemble starts")),
        }
    }

    /// The member of `among` that says it leads in the highest term, if that term is
    /// later than `after` (any, when `None`), and its term; waits up to `timeout` for
    /// one, then panics with `what` and the members' logs. A leader that was frozen
    /// and has just been thawed can still say it leads, in its old term, until it
    /// notices it has lost its followers: only a later term shows a new leader.
    fn leader_after(e: &Ensemble, among: &[usize], after: Option<u64>, timeout: Duration, what: &str) -> (u64, usize) {
        let deadline = Instant::now() + timeout;
        loop {
            let newest = among
                .iter()
                .filter(|&&i| e.running(i))
                .filter_map(|&i| Some((term_if_leader(e.kind, e.members[i].client)?, i)))
                .max();
            if let Some((term, i)) = newest.filter(|&(term, _)| after.is_none_or(|a| term > a)) {
                return (term, i);
            }
            assert!(Instant::now() < deadline, "{what} within {timeout:?}{}", e.tails());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How long a test waits for a leader in a later term: ten election timeouts, and at
    /// least 30 s. On a loaded two-core machine etcd's two live members split their
    /// votes more than once (a CI-like run: elected in term 7, split in term 8, elected
    /// in term 9 just past 10 s); a slow election is a liveness figure the nemesis
    /// runs measure, not what this test asserts.
    fn election_window(kind: Kind) -> Duration {
        (kind.election_timeout() * 10).max(Duration::from_secs(30))
    }

    /// The handle's faults on a live ensemble: one leader; kill -9 of it brings
    /// another, in a later term; the killed member restarts and serves; a frozen leader
    /// is replaced in a later term (when `freeze`); a leader cut off behind its link
    /// proxies is replaced by one of the other two, in a later term. etcd and ZooKeeper
    /// only: Fenced's `/readyz` has no term.
    fn exercise(mut e: Ensemble, freeze: bool) {
        assert_eq!(e.len(), 3);
        let all = [0, 1, 2];
        let (term, first) = leader_after(&e, &all, None, Duration::from_secs(20), "no leader");
        let leaders = (0..3).filter(|&i| e.leads(i)).count();
        assert_eq!(leaders, 1, "one leader, not {leaders}");
        e.kill(first);
        assert!(!e.running(first));
        let (term, second) =
            leader_after(&e, &all, Some(term), Duration::from_secs(30), "no new leader after a kill -9 of the leader");
        assert_ne!(second, first, "a killed member cannot lead");
        e.restart(first).unwrap();
        e.quorum_write().unwrap();
        if freeze {
            e.pause(second).unwrap();
            let others: Vec<usize> = (0..3).filter(|&i| i != second).collect();
            let timeout = election_window(e.kind);
            let (_, third) = leader_after(&e, &others, Some(term), timeout, "a frozen leader was not replaced");
            assert_ne!(third, second);
            e.resume(second).unwrap();
            e.quorum_write().unwrap();
        }
        // Cut off behind its link proxies, a leader is replaced by the other two; once
        // healed, the ensemble takes writes again. The leader cut off is the one in the
        // highest term (a thawed one may still say it leads, in its old term).
        let (term, fourth) = leader_after(&e, &all, None, election_window(e.kind), "no leader");
        let rest: Vec<usize> = (0..3).filter(|&i| i != fourth).collect();
        let cut = e.cut(&[fourth], &rest, true);
        assert_eq!(cut.len(), 4, "{cut:?}");
        let probe = e.probe();
        let what =
            format!("the isolated leader {fourth} (term {term}) was not replaced by one of {rest:?} in a later term");
        let (_, fifth) = leader_after(&e, &rest, Some(term), election_window(e.kind), &what);
        assert!(probe.leader_term().is_some(), "the probe sees a leader");
        e.heal();
        let healed = Instant::now() + Duration::from_secs(30);
        while let Err(err) = e.quorum_write() {
            assert!(Instant::now() < healed, "no write after healing (leader {fifth}): {err:#}{}", e.tails());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    #[test]
    fn a_proc_net_tcp_line_names_its_socket() {
        let head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
        let line = "   3: 0100007F:A2F4 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 \
                    0000000000000000 20 4 30 10 -1";
        assert_eq!(router::socket_inode(line, 0xA2F4, 0x9C41), Some(4242));
        assert_eq!(router::socket_inode(line, 0x9C41, 0xA2F4), None, "the other end's socket");
        assert_eq!(router::socket_inode(head, 0xA2F4, 0x9C41), None);
        // This very process's own connection is found as its own.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, from) = l.accept().unwrap();
        assert_eq!(from, c.local_addr().unwrap());
        let me = Some(std::process::id());
        assert_eq!(router::owner(from.port(), l.local_addr().unwrap().port(), &[None, me]), Some(1));
        assert_eq!(router::owner(from.port(), l.local_addr().unwrap().port(), &[None]), None);
    }

    #[test]
    fn an_etcd_cluster_elects_again_when_its_leader_is_killed_or_frozen() {
        if let Some(e) = started(Ensemble::etcd(3, Links::Proxied)) {
            exercise(e, true);
        }
    }

    // Behind the link proxies, ZooKeeper's two live servers used to elect no leader for
    // 20 s and more, at times (2 of 5 runs after a frozen leader, 1 CI run after a
    // killed one): a follower that reached its new leader's proxy before the leader had
    // bound its quorum port saw its connection close, not refused, and ran a new
    // election instead of trying again (`ZK_LINK_PATIENCE`; RELIABILITY.md). Run alone
    // on a shared 2-core machine (2026-12-04): 5 of 6 failed without the patience; with
    // it, 30 of 30 passed in three batches of 10 (with the later-term checks and the
    // port retry in the last), 9 to 15 s each; in the whole suite, 19 of 20 (the other
    // run's ensemble never started: a port taken, now retried).
    #[test]
    fn a_zookeeper_ensemble_elects_again_when_its_leader_is_killed_or_frozen() {
        if let Some(e) = started(Ensemble::zookeeper(3, Links::Proxied)) {
            exercise(e, true);
        }
    }
}
