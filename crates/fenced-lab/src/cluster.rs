//! A Fenced cluster of three or five `fenced server` processes on loopback, with a fault
//! proxy on each directed link between members, for `fenced torture --target
//! fenced-cluster`.
//!
//! Member `i` reaches member `j` through the proxy of link `i→j` (its `peer_routes`),
//! while the membership keeps the members' real addresses. An RPC and its answer travel
//! on the caller's connection, so blocking `i→j` cuts what `i` asks of `j` and leaves
//! what `j` asks of `i` alone: a one-way loss at the level of Raft's messages. Blocking
//! both directions of every link across a cut is a partition.
//!
//! The harness reads each member's `GET /v1/cluster` directly (never through a proxy).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::time::{sleep, Instant};

use crate::peers::{Service, TempDir};
use crate::proxy::DelayProxy;

/// A member's status, with the digest the replica check compares.
const STATUS: &str = "/v1/cluster?digest=true";

/// A running cluster; every member is killed and its directory removed when dropped.
pub struct Cluster {
    /// Member `i` has node id `i + 1`.
    pub members: Vec<Arc<Mutex<Service>>>,
    /// Each member's HTTP address (what clients and the harness use).
    pub addrs: Vec<SocketAddr>,
    /// The proxy of each directed link `(from, to)`, by member index.
    pub links: BTreeMap<(usize, usize), DelayProxy>,
    /// The members' config files.
    _conf: TempDir,
}

impl Cluster {
    /// Starts `n` members of `bin` (`fenced`) and waits until one leads (up to 30 s).
    pub async fn start(bin: &Path, n: usize) -> Result<Cluster> {
        // Each member's port stays bound here until just before the member starts, so
        // that no other process (a parallel test) takes it meanwhile.
        let mut held: Vec<Option<std::net::TcpListener>> = (0..n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map(Some))
            .collect::<std::io::Result<_>>()
            .context("bind a loopback port")?;
        let addrs: Vec<SocketAddr> =
            held.iter().flatten().map(std::net::TcpListener::local_addr).collect::<std::io::Result<_>>()?;
        let mut links = BTreeMap::new();
        for from in 0..n {
            for to in (0..n).filter(|&to| to != from) {
                links.insert((from, to), DelayProxy::start(addrs[to]).await?);
            }
        }
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}=http://{a}", i + 1)).collect();
        let peers = peers.join(",");
        let conf = TempDir::new("lab-cluster")?;
        let mut specs = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let routes: Vec<String> =
                (0..n).filter(|&to| to != i).map(|to| format!("{}=http://{}", to + 1, links[&(i, to)].addr)).collect();
            let file = conf.path().join(format!("node-{}.toml", i + 1));
            std::fs::write(&file, format!("peer_routes = \"{}\"\n", routes.join(",")))
                .with_context(|| format!("write {}", file.display()))?;
            specs.push((*addr, (i + 1).to_string(), file));
        }
        let bin = bin.to_path_buf();
        let peers2 = peers.clone();
        let members = tokio::task::spawn_blocking(move || {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (addr, id, file))| {
                    drop(held[i].take());
                    let file = file.to_string_lossy().into_owned();
                    let extra = ["--node-id", &id, "--peers", &peers2, "--insecure-peers", "--config", &file];
                    Service::fenced_at(&bin, addr, &extra).map(|s| Arc::new(Mutex::new(s)))
                })
                .collect::<Result<Vec<_>>>()
        })
        .await??;
        let c = Cluster { members, addrs, links, _conf: conf };
        if c.leader(Duration::from_secs(30)).await.is_none() {
            let tail = c.members[0].lock().expect("member").log_tail();
            anyhow::bail!("the {n} members elected no leader within 30 s: {tail}");
        }
        Ok(c)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s `GET /v1/cluster?digest=true` (with its `applied_index` and
    /// `state_hash`), if it answers within 500 ms.
    pub async fn status(&self, i: usize) -> Option<Value> {
        get_json(self.addrs[i], STATUS, Duration::from_millis(500)).await
    }

    /// Every member's status (`None` where it does not answer), asked at once.
    pub async fn statuses(&self) -> Vec<Option<Value>> {
        // Each is bounded by its own time-out; together, so they do not add up.
        let mut asks = tokio::task::JoinSet::new();
        for (i, addr) in self.addrs.iter().copied().enumerate() {
            asks.spawn(async move { (i, get_json(addr, STATUS, Duration::from_millis(500)).await) });
        }
        let mut out = vec![None; self.len()];
        while let Some(Ok((i, v))) = asks.join_next().await {
            out[i] = v;
        }
        out
    }

    /// The member that says it leads with the highest term, waiting up to `within`.
    pub async fn leader(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = leader_of(&self.statuses().await) {
                return Some(l);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every link open, no delay.
    pub fn heal(&self) {
        for p in self.links.values() {
            p.set_blocked(false);
            p.set_delay(Duration::ZERO);
        }
    }

    /// Holds every byte on member `i`'s links (both directions) for `d`.
    pub fn delay_links(&self, i: usize, d: Duration) {
        for ((a, b), p) in &self.links {
            if *a == i || *b == i {
                p.set_delay(d);
            }
        }
    }

    /// Blocks every link from a member of `a` to a member of `b` (both ways when
    /// `both`).
    pub fn cut(&self, a: &[usize], b: &[usize], both: bool) -> Vec<(u64, u64)> {
        let mut cut = Vec::new();
        for &x in a {
            for &y in b.iter().filter(|&&y| y != x) {
                self.links[&(x, y)].set_blocked(true);
                cut.push((x as u64 + 1, y as u64 + 1));
                if both {
                    self.links[&(y, x)].set_blocked(true);
                    cut.push((y as u64 + 1, x as u64 + 1));
                }
            }
        }
        cut
    }
}

/// The index of the member that says it leads in the highest term.
pub fn leader_of(statuses: &[Option<Value>]) -> Option<usize> {
    statuses
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let s = s.as_ref()?;
            (s["state"] == "leader" && s["leader_id"].as_u64() == s["id"].as_u64()).then(|| (s["term"].as_u64(), i))
        })
        .max()
        .map(|(_, i)| i)
}

/// What the replicas-agree check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Every member reported the same applied index with the same state hash.
    Agree { applied_index: u64 },
    /// Same applied index, different hashes: the replicas diverged.
    Differ { applied_index: u64, hashes: Vec<(u64, String)> },
    /// The members never reported one applied index together within the time given.
    Unsettled { indexes: Vec<(u64, Option<u64>)> },
    /// The members do not report `state_hash`: nothing to compare.
    NoHash,
}

/// Compares one round of statuses: `None` while they do not all stand at one applied
/// index (or one does not answer).
pub fn compare_replicas(statuses: &[Option<Value>]) -> Option<Agreement> {
    let mut at = Vec::new();
    for s in statuses {
        let s = s.as_ref()?;
        let index = s["applied_index"].as_u64().or_else(|| s["last_applied_index"].as_u64())?;
        let hash = s.get("state_hash").filter(|h| !h.is_null()).map(|h| h.to_string());
        at.push((s["id"].as_u64().unwrap_or(0), index, hash));
    }
    let applied_index = at.first()?.1;
    if at.iter().any(|(_, i, _)| *i != applied_index) {
        return None;
    }
    if at.iter().any(|(_, _, h)| h.is_none()) {
        return Some(Agreement::NoHash);
    }
    let first = &at[0].2;
    if at.iter().all(|(_, _, h)| h == first) {
        Some(Agreement::Agree { applied_index })
    } else {
        let hashes = at.into_iter().map(|(id, _, h)| (id, h.unwrap_or_default())).collect();
        Some(Agreement::Differ { applied_index, hashes })
    }
}

impl Cluster {
    /// Waits (up to `within`) until every member reports the same applied index, then
    /// compares their state hashes.
    pub async fn replicas_agree(&self, within: Duration) -> Agreement {
        let deadline = Instant::now() + within;
        loop {
            let statuses = self.statuses().await;
            if let Some(a) = compare_replicas(&statuses) {
                return a;
            }
            if Instant::now() >= deadline {
                let indexes = statuses
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let index = s
                            .as_ref()
                            .and_then(|s| s["applied_index"].as_u64().or_else(|| s["last_applied_index"].as_u64()));
                        (i as u64 + 1, index)
                    })
                    .collect();
                return Agreement::Unsettled { indexes };
            }
            sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `GET path` of the Fenced server at `addr` as JSON, within `bound`.
async fn get_json(addr: SocketAddr, path: &str, bound: Duration) -> Option<Value> {
    crate::http::get(addr, path, bound).await.ok()?.json_if_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn st(id: u64, index: u64, hash: Option<&str>) -> Option<Value> {
        let mut v = json!({"id": id, "state": "follower", "leader_id": 1, "term": 2, "applied_index": index});
        if let Some(h) = hash {
            v["state_hash"] = json!(h);
        }
        Some(v)
    }

    #[test]
    fn replicas_agree_only_at_one_index_with_one_hash() {
        let same = [st(1, 40, Some("ab")), st(2, 40, Some("ab")), st(3, 40, Some("ab"))];
        assert_eq!(compare_replicas(&same), Some(Agreement::Agree { applied_index: 40 }));
        // One replica behind: not yet comparable.
        let behind = [st(1, 40, Some("ab")), st(2, 39, Some("aa")), st(3, 40, Some("ab"))];
        assert_eq!(compare_replicas(&behind), None);
        // One member silent: not yet comparable.
        assert_eq!(compare_replicas(&[st(1, 40, Some("ab")), None]), None);
        // The broken variant: same index, another state.
        let diverged = [st(1, 40, Some("ab")), st(2, 40, Some("ff")), st(3, 40, Some("ab"))];
        let Some(Agreement::Differ { applied_index: 40, hashes }) = compare_replicas(&diverged) else {
            panic!("a diverged replica went unseen");
        };
        assert_eq!(hashes[1], (2, "\"ff\"".to_string()));
        // Members without the field: said so, never called agreement.
        assert_eq!(compare_replicas(&[st(1, 40, None), st(2, 40, None)]), Some(Agreement::NoHash));
    }

    #[test]
    fn the_leader_is_the_self_declared_one_of_the_highest_term() {
        let mut old = st(1, 5, None).unwrap();
        old["state"] = json!("leader");
        old["term"] = json!(2);
        let mut new = st(3, 9, None).unwrap();
        new["state"] = json!("leader");
        new["leader_id"] = json!(3);
        new["term"] = json!(4);
        assert_eq!(leader_of(&[Some(old.clone()), st(2, 9, None), Some(new)]), Some(2));
        assert_eq!(leader_of(&[Some(old), None]), Some(0));
        assert_eq!(leader_of(&[st(2, 9, None), None]), None);
    }
}
