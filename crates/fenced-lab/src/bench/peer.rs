//! The target of a bench: started here on free loopback ports, or already running.

use super::*;

/// A target to bench: started by us on a free loopback port, or already running.
#[derive(Debug)]
pub struct Peer {
    pub target: BenchTarget,
    /// In the form the target's client takes.
    pub endpoint: String,
    /// The server's process id, when we started it (PostgreSQL: none, it has many;
    /// a three-member target: none, see `member_pids`).
    pub pid: Option<u32>,
    /// A spawned three-member target's process ids.
    pub member_pids: Vec<u32>,
    /// Killed and removed when the peer drops.
    _service: Option<Service>,
    _ensemble: Option<Ensemble>,
}

impl Peer {
    /// Starts `target` (blocking until it listens). `fenced_bin` is the `fenced`
    /// executable, for the Fenced server.
    pub fn spawn(target: BenchTarget, fenced_bin: &Path) -> Result<Peer> {
        if target.members() > 1 {
            let ensemble = match target.base() {
                BenchTarget::Fenced => Ensemble::fenced(fenced_bin, target.members(), Links::Direct)?,
                BenchTarget::Etcd => Ensemble::etcd(target.members(), Links::Direct)?,
                BenchTarget::Zookeeper => Ensemble::zookeeper(target.members(), Links::Direct)?,
                other => bail!("{other} has no three-member form"),
            };
            let endpoint = match target.base() {
                // Fenced over its wire protocol, as one node: the client takes every
                // member and follows the leader.
                BenchTarget::Fenced => {
                    ensemble.wire_addrs().iter().map(|a| format!("fenced://{a}")).collect::<Vec<_>>()
                }
                BenchTarget::Etcd => ensemble.addrs().iter().map(|a| format!("http://{a}")).collect(),
                _ => ensemble.addrs().iter().map(ToString::to_string).collect(),
            }
            .join(",");
            let member_pids = (0..ensemble.len()).filter_map(|i| ensemble.pid(i)).collect();
            return Ok(Peer { target, endpoint, pid: None, member_pids, _service: None, _ensemble: Some(ensemble) });
        }
        // Fenced is benched over its wire protocol (`fenced://`), the path its client
        // takes for speed; the HTTP API stays on for the views.
        let wire = format!("127.0.0.1:{}", free_port()?);
        let service = match target {
            BenchTarget::Fenced => Service::fenced(fenced_bin, &["--wire-listen", &wire])?,
            BenchTarget::Etcd => Service::etcd()?,
            BenchTarget::Redis => Service::redis(false)?,
            BenchTarget::RedisAof => Service::redis(true)?,
            BenchTarget::Zookeeper => Service::zookeeper()?,
            BenchTarget::Postgres => Service::postgres()?,
            BenchTarget::Fenced3 | BenchTarget::Etcd3 | BenchTarget::Zookeeper3 => unreachable!("spawned above"),
        };
        let endpoint = match target {
            BenchTarget::Redis | BenchTarget::RedisAof => format!("redis://{}/", service.addr),
            BenchTarget::Postgres => service.pg_config(),
            BenchTarget::Fenced => format!("fenced://{wire}"),
            BenchTarget::Zookeeper => service.addr.to_string(),
            _ => service.url(),
        };
        let pid = if target == BenchTarget::Postgres { None } else { service.pid() };
        Ok(Peer { target, endpoint, pid, member_pids: Vec::new(), _service: Some(service), _ensemble: None })
    }

    /// A target already running at `endpoint`.
    pub fn external(target: BenchTarget, endpoint: &str) -> Peer {
        let endpoint = target.normalise_endpoint(endpoint);
        Peer { target, endpoint, pid: None, member_pids: Vec::new(), _service: None, _ensemble: None }
    }

    /// The CPU time the target's processes have used, when we started them (every
    /// member's, summed).
    pub(super) fn server_cpu(&self) -> Option<Duration> {
        match self.pid {
            Some(pid) => cpu_time(pid),
            None if !self.member_pids.is_empty() => self.member_pids.iter().map(|&p| cpu_time(p)).sum(),
            None => None,
        }
    }

    /// What the figures of `w` on this peer have on disk before their answer.
    pub(super) async fn durability(&self, w: Workload) -> String {
        match (self.target, w) {
            (BenchTarget::Fenced, Workload::Store) => {
                "each write in the raft log, fsynced before its answer (a cluster of one, group commit)".into()
            }
            (BenchTarget::Fenced, Workload::Keepalive) => "each keepalive answered from memory, its renewal in the \
                 raft log with the next batch, within 100 ms (a cluster of one; a restart gives every lease its whole \
                 TTL again)"
                .into(),
            (BenchTarget::Fenced, _) => {
                "every command in the raft log, fsynced before its answer (a cluster of one, group commit)".into()
            }
            (BenchTarget::Etcd, _) => "fsync per commit (etcd default)".into(),
            (BenchTarget::Zookeeper, _) => {
                "transaction log fsynced before each write's answer (forceSync=yes, default)".into()
            }
            (BenchTarget::Redis | BenchTarget::RedisAof, _) => driver::redis_durability(&self.endpoint)
                .await
                .unwrap_or_else(|e| format!("unknown (CONFIG GET refused: {e:#})")),
            (BenchTarget::Postgres, _) => pg_durability(&self.endpoint).await,
            (BenchTarget::Fenced3, _) => {
                "every command committed on a majority of the 3 members, each fsyncing its raft log (group commit)"
                    .into()
            }
            (BenchTarget::Etcd3, _) => {
                "committed on a majority of the 3 members, fsync per commit on each (etcd default)".into()
            }
            (BenchTarget::Zookeeper3, _) => {
                "committed on a majority of the 3 servers, each fsyncing its transaction log (forceSync=yes, default)"
                    .into()
            }
        }
    }
}

async fn pg_durability(endpoint: &str) -> String {
    let probe = async {
        let db = driver::pg_connect(endpoint, Duration::from_secs(5)).await?;
        let fsync: String = db.query_one("SHOW fsync", &[]).await?.get(0);
        let sync: String = db.query_one("SHOW synchronous_commit", &[]).await?.get(0);
        anyhow::Ok(format!("WAL fsync={fsync}, synchronous_commit={sync} (PostgreSQL default: fsync per commit)"))
    };
    probe.await.unwrap_or_else(|e| format!("unknown ({e:#})"))
}
