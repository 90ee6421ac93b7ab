//! A ZooKeeper ensemble: each server's own `zoo.cfg`, and its view of the others through the proxies.

use std::ffi::OsString;
use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::net::{hold, Net};
use super::{Ensemble, Kind, Links, Member};
use crate::peers::{ask, find_program, TempDir, ZOOKEEPER_JAR};

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

impl Ensemble {
    pub(super) fn zookeeper_once(n: usize, links: Links) -> Result<Ensemble> {
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
pub(super) fn zoo_cfg(data: &Path, client: u16, view: &[(u16, u16)]) -> String {
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
pub(super) async fn zk_create(connect: &str) -> Result<()> {
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

/// A ZooKeeper four-letter word's answer.
pub(super) fn four_letters(addr: SocketAddr, word: &str) -> Option<String> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    ask(conn, word.as_bytes(), Duration::from_millis(1000))
}
