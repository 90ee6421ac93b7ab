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

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use crate::peers::{ask, find_program, free_port, signal, TempDir, FOREIGN_PREFIX, UNFENCED_PREFIX, ZOOKEEPER_JAR};

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
    /// Every member's directory lives under it.
    dir: TempDir,
}

impl Ensemble {
    /// `n` etcd members (`--initial-cluster` naming them all), default durability.
    pub fn etcd(n: usize) -> Result<Ensemble> {
        let program = find_program("etcd", "apt-get install -y etcd-server")?;
        let dir = TempDir::new("lab-etcd-cluster")?;
        let ports: Vec<(u16, u16)> = (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<_>>()?;
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let client_url = format!("http://127.0.0.1:{client}");
                let peer_url = format!("http://127.0.0.1:{peer}");
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
                    &peer_url,
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
                args.push(dir.path().join(format!("m{i}")).into());
                Member {
                    client: SocketAddr::from(([127, 0, 0, 1], client)),
                    wire: None,
                    program: program.clone(),
                    args,
                    env: Vec::new(),
                    log: dir.path().join(format!("etcd-m{i}.log")),
                    child: None,
                }
            })
            .collect();
        Ensemble { kind: Kind::Etcd, members, dir }.started()
    }

    /// A ZooKeeper ensemble of `n` servers (`server.N=127.0.0.1:peer:election` lines,
    /// a `myid` file each), sessions as short as one tick (2 s) as the single server in
    /// [`crate::peers`], heap at most 256 MB each.
    ///
    /// Each server has its own `zoo.cfg`, and in it its own view of where its peers
    /// are ([`zoo_cfg`]): today every view names the peers' real ports, but a later
    /// change can give server i the address of a fault proxy for each link i → j
    /// (its own line stays the address it binds), and so cut or delay one direction
    /// of one link.
    pub fn zookeeper(n: usize) -> Result<Ensemble> {
        const HINT: &str = "apt-get install -y zookeeper";
        let java = find_program("java", HINT)?;
        if !Path::new(ZOOKEEPER_JAR).exists() {
            bail!("{ZOOKEEPER_JAR} not found: ZooKeeper is not installed ({HINT})");
        }
        let dir = TempDir::new("lab-zk-ensemble")?;
        // Per server: client, quorum (peer) and leader-election ports.
        let ports: Vec<[u16; 3]> =
            (0..n).map(|_| Ok([free_port()?, free_port()?, free_port()?])).collect::<Result<_>>()?;
        let mut members = Vec::new();
        for (i, [client, ..]) in ports.iter().enumerate() {
            let id = i + 1;
            let home = dir.path().join(format!("zk{id}"));
            fs::create_dir_all(home.join("data"))?;
            fs::write(home.join("data").join("myid"), format!("{id}\n"))?;
            // Server i's view of every server j: the real ports, for now.
            let view: Vec<(u16, u16)> = ports.iter().map(|p| (p[1], p[2])).collect();
            let cfg = home.join("zoo.cfg");
            fs::write(&cfg, zoo_cfg(&home.join("data"), *client, &view))
                .with_context(|| format!("write {}", cfg.display()))?;
            let args: Vec<OsString> =
                ["-Xmx256m", "-cp", ZOOKEEPER_JAR, "org.apache.zookeeper.server.quorum.QuorumPeerMain"]
                    .iter()
                    .map(OsString::from)
                    .chain([cfg.into()])
                    .collect();
            members.push(Member {
                client: SocketAddr::from(([127, 0, 0, 1], *client)),
                wire: None,
                program: java.clone(),
                args,
                env: Vec::new(),
                log: dir.path().join(format!("zookeeper-{id}.log")),
                child: None,
            });
        }
        Ensemble { kind: Kind::Zookeeper, members, dir }.started()
    }

    /// `n` Fenced members (`fenced server --node-id I --peers ...`, ids 1..=n), each
    /// with the wire protocol on too, and the lab's unfenced and foreign-token
    /// prefixes.
    pub fn fenced(bin: &Path, n: usize) -> Result<Ensemble> {
        let dir = TempDir::new("lab-fenced-cluster")?;
        let ports: Vec<(u16, u16)> = (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<_>>()?;
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, (http, _))| format!("{}=http://127.0.0.1:{http}", i + 1))
            .collect::<Vec<_>>();
        let peers = peers.join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(http, wire))| {
                let mut args: Vec<OsString> = [
                    "server",
                    "--listen",
                    &format!("127.0.0.1:{http}"),
                    "--wire-listen",
                    &format!("127.0.0.1:{wire}"),
                    "--node-id",
                    &(i + 1).to_string(),
                    "--peers",
                    &peers,
                    "--unfenced-prefix",
                    UNFENCED_PREFIX,
                    "--foreign-token-prefix",
                    FOREIGN_PREFIX,
                ]
                .iter()
                .map(OsString::from)
                .collect();
                args.push("--data-dir".into());
                args.push(dir.path().join(format!("n{}", i + 1)).into());
                Member {
                    client: SocketAddr::from(([127, 0, 0, 1], http)),
                    wire: Some(SocketAddr::from(([127, 0, 0, 1], wire))),
                    program: bin.to_path_buf(),
                    args,
                    env: vec![("FENCED_LOG", "warn")],
                    log: dir.path().join(format!("fenced-{}.log", i + 1)),
                    child: None,
                }
            })
            .collect();
        Ensemble { kind: Kind::Fenced, members, dir }.started()
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
        let addr = self.members[i].client;
        match self.kind {
            Kind::Etcd => {
                let Some(status) = http_json(addr, "POST", "/v3/maintenance/status", "{}") else { return false };
                let me = status["header"]["member_id"].as_str();
                me.is_some() && me == status["leader"].as_str()
            }
            Kind::Zookeeper => four_letters(addr, "srvr").is_some_and(|a| a.contains("Mode: leader")),
            Kind::Fenced => http_json(addr, "GET", "/readyz", "").is_some_and(|v| v["leader"] == true),
        }
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
        Ok(())
    }

    /// Waits until member `i` serves its clients (etcd: `/health` is true, which needs
    /// a leader; ZooKeeper: `srvr` names its mode, which it has only in a quorum;
    /// Fenced: `/livez`).
    fn wait_serving(&mut self, i: usize, deadline: Instant) -> Result<()> {
        loop {
            let addr = self.members[i].client;
            let serving = match self.kind {
                Kind::Etcd => http_json(addr, "GET", "/health", "").is_some_and(|v| v["health"] == "true"),
                Kind::Zookeeper => four_letters(addr, "srvr").is_some_and(|a| a.contains("Mode: ")),
                Kind::Fenced => http_json(addr, "GET", "/livez", "").is_some_and(|v| v["status"] == "live"),
            };
            if serving {
                return Ok(());
            }
            if let Some(child) = &mut self.members[i].child {
                if let Some(status) = child.try_wait()? {
                    self.members[i].child = None;
                    bail!("{} member {i} exited ({status}) before serving{}", self.kind.name(), self.tails());
                }
            }
            if Instant::now() > deadline {
                bail!("{} member {i} did not serve on {addr} in time{}", self.kind.name(), self.tails());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One write that needs a quorum.
    fn quorum_write(&self) -> Result<()> {
        let addr = self.members[0].client;
        match self.kind {
            Kind::Etcd => {
                let body = format!(
                    r#"{{"key":"{}","value":"{}"}}"#,
                    BASE64.encode("fenced-lab/ensemble-ready"),
                    BASE64.encode("1")
                );
                let v = http_json(addr, "POST", "/v3/kv/put", &body).context("no answer to a Put")?;
                v["header"]["revision"].as_str().map(drop).with_context(|| format!("a Put answered {v}"))
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
                    http_json(a, "GET", "/readyz", "").is_some_and(|v| v["leader"] == true && v["recovering"] == false)
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

/// Server i's `zoo.cfg`: its data directory and client port, and `view[j]`, the
/// (quorum, election) ports at which it reaches server j+1 (for j = i, the ports it
/// binds). A fault proxy per directed link goes in here, in a later change.
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

/// A one-shot HTTP/1.1 request to `addr`; the JSON body of a 200 answer.
fn http_json(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<serde_json::Value> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = ask(conn, request.as_bytes(), Duration::from_secs(2))?;
    if !answer.starts_with("HTTP/1.1 200") {
        return None;
    }
    // The body is one JSON object (chunked or not: take it from brace to brace).
    let body = answer.split_once("\r\n\r\n")?.1;
    let json = &body[body.find('{')?..=body.rfind('}')?];
    serde_json::from_str(json).ok()
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

    /// The handle's faults on a live ensemble: one leader; kill -9 of it brings
    /// another; the killed member restarts and serves; a frozen leader is replaced.
    fn exercise(mut e: Ensemble) {
        assert_eq!(e.len(), 3);
        let first = e.wait_leader(Duration::from_secs(20)).unwrap();
        let leaders = (0..3).filter(|&i| e.leads(i)).count();
        assert_eq!(leaders, 1, "one leader, not {leaders}");
        e.kill(first);
        assert!(!e.running(first));
        let second = e.wait_leader(Duration::from_secs(30)).unwrap();
        assert_ne!(second, first, "a killed member cannot lead");
        e.restart(first).unwrap();
        e.quorum_write().unwrap();
        e.pause(second).unwrap();
        let third = e.wait_leader(e.kind.election_timeout() * 10).unwrap();
        assert_ne!(third, second, "a frozen leader was not replaced");
        e.resume(second).unwrap();
        e.quorum_write().unwrap();
    }

    #[test]
    fn an_etcd_cluster_elects_again_when_its_leader_is_killed_or_frozen() {
        if let Some(e) = started(Ensemble::etcd(3)) {
            exercise(e);
        }
    }

    #[test]
    fn a_zookeeper_ensemble_elects_again_when_its_leader_is_killed_or_frozen() {
        if let Some(e) = started(Ensemble::zookeeper(3)) {
            exercise(e);
        }
    }
}
