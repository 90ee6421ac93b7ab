//! Fenced members of one raft group, each reaching the others through its `peer_routes`.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::net::{hold, Net};
use super::{Ensemble, Kind, Links, Member};
use crate::peers::{fenced_server_args, TempDir};

impl Ensemble {
    pub(super) fn fenced_once(bin: &Path, n: usize, links: Links) -> Result<Ensemble> {
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
