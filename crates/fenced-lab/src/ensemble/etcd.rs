//! etcd members, and the routers that send each peer connection through its link's proxy.

use std::ffi::OsString;
use std::fs;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use fenced_client::etcd::Etcd;

use super::net::{hold, Net};
use super::{Ensemble, Kind, Links, Member};
use crate::http;
use crate::peers::{find_program, TempDir};

impl Ensemble {
    pub(super) fn etcd_once(n: usize, links: Links) -> Result<Ensemble> {
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
}

/// `ask` of the etcd member at `addr`, by the workspace's etcd client, from a plain
/// thread; the whole within 2 s.
pub(super) fn etcd_ask<T, F>(addr: SocketAddr, ask: impl FnOnce(Etcd) -> F + Send) -> Result<T, String>
where
    T: Send,
    F: Future<Output = Result<T, fenced_client::Error>> + Send,
{
    let etcd = Etcd::new(&format!("http://{addr}"), Duration::from_secs(1), Duration::from_secs(2));
    http::block_on(async move { ask(etcd.map_err(|e| e.to_string())?).await.map_err(|e| e.to_string()) })
}

/// etcd's peer routers: one per member, at the address every member knows as that
/// member's peer URL. Each connection goes through the proxy of the link from the
/// member that opened it, found as the owner of the connecting socket: the socket's
/// inode in `/proc/net/tcp`, then the member process holding it.
pub(super) mod router {
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
    pub(in crate::ensemble) fn owner(from_port: u16, to_port: u16, pids: &[Option<u32>]) -> Option<usize> {
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
    pub(in crate::ensemble) fn socket_inode(line: &str, from_port: u16, to_port: u16) -> Option<u64> {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let port = |col: usize| u16::from_str_radix(cols.get(col)?.rsplit(':').next()?, 16).ok();
        if port(1)? != from_port || port(2)? != to_port {
            return None;
        }
        cols.get(9)?.parse().ok().filter(|&inode| inode != 0)
    }
}
