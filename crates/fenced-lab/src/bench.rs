//! `fenced bench`: load against Fenced and the lock services people run instead
//! (etcd, ZooKeeper, Redis, PostgreSQL), each driven by this one program the way its
//! users drive it, with the durability of every figure stated next to it.
//!
//! Workloads: `uncontended` (each client its own lock, acquire+release cycles),
//! `contended` (every client on one lock: Fenced, etcd and ZooKeeper queue waiters,
//! Redis and PostgreSQL clients poll), `keepalive` (M leases kept alive at a third of
//! their TTL; the server's CPU and false expiries), `store` (a durable write, 16
//! bytes). Closed loop by default; with a rate, an open loop whose latencies count from
//! the moment each operation was due, so a stalled server is not hidden by clients that
//! waited for it (no coordinated omission); a `pacer` thread keeps the open loops'
//! schedules. See [`driver`] for each target's recipe.

pub mod ceiling;
pub mod driver;
mod keepalive;
mod pacer;
pub mod stats;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::ensemble::{Ensemble, Links};
use crate::peers::{free_port, Service};
use driver::{Conn, ConnOptions, Held, Writer};
use pacer::Pacer;
use stats::{cpu_time, percentiles, record, Tally};

/// A system `fenced bench` can drive.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchTarget {
    Fenced,
    Etcd,
    /// ZooKeeper with the recipe of Curator's `InterProcessMutex`.
    Zookeeper,
    /// Redis as it is usually run for locks: no persistence when spawned.
    Redis,
    /// Redis with the append-only file fsynced on every write, when spawned.
    RedisAof,
    Postgres,
    /// Three Fenced members (one raft group); the clients know all three and follow
    /// the leader.
    #[serde(rename = "fenced-3")]
    Fenced3,
    /// Three etcd members; client i talks to member i mod 3.
    #[serde(rename = "etcd-3")]
    Etcd3,
    /// A three-server ZooKeeper ensemble; client i talks to server i mod 3.
    #[serde(rename = "zookeeper-3")]
    Zookeeper3,
}

impl BenchTarget {
    pub const ALL: [BenchTarget; 9] = [
        BenchTarget::Fenced,
        BenchTarget::Etcd,
        BenchTarget::Zookeeper,
        BenchTarget::Redis,
        BenchTarget::RedisAof,
        BenchTarget::Postgres,
        BenchTarget::Fenced3,
        BenchTarget::Etcd3,
        BenchTarget::Zookeeper3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BenchTarget::Fenced => "fenced",
            BenchTarget::Etcd => "etcd",
            BenchTarget::Zookeeper => "zookeeper",
            BenchTarget::Redis => "redis",
            BenchTarget::RedisAof => "redis-aof",
            BenchTarget::Postgres => "postgres",
            BenchTarget::Fenced3 => "fenced-3",
            BenchTarget::Etcd3 => "etcd-3",
            BenchTarget::Zookeeper3 => "zookeeper-3",
        }
    }

    /// Why this target cannot be spawned here (its program not installed), or None.
    pub fn missing(self) -> Option<String> {
        use crate::peers::Peer;
        let peer = match self.base() {
            BenchTarget::Etcd => Peer::Etcd,
            BenchTarget::Zookeeper => Peer::Zookeeper,
            BenchTarget::Redis | BenchTarget::RedisAof => Peer::Redis,
            BenchTarget::Postgres => Peer::Postgres,
            _ => return None,
        };
        peer.missing()
    }

    /// The service, whatever its size: a three-member target is driven with the
    /// one-node target's recipe.
    pub fn base(self) -> BenchTarget {
        match self {
            BenchTarget::Fenced3 => BenchTarget::Fenced,
            BenchTarget::Etcd3 => BenchTarget::Etcd,
            BenchTarget::Zookeeper3 => BenchTarget::Zookeeper,
            t => t,
        }
    }

    /// How many members the target runs as.
    pub fn members(self) -> usize {
        if self.base() == self {
            1
        } else {
            3
        }
    }

    /// The Fenced target of the same size, which a comparison's ratios are against.
    pub fn fenced_peer(self) -> BenchTarget {
        if self.members() == 1 {
            BenchTarget::Fenced
        } else {
            BenchTarget::Fenced3
        }
    }

    /// Where the target usually listens, for `--endpoint` left at Fenced's default
    /// (a three-member target: its first member; give every member's, separated by
    /// commas).
    pub fn default_endpoint(self) -> &'static str {
        match self.base() {
            BenchTarget::Fenced => "http://127.0.0.1:7400",
            BenchTarget::Etcd => "http://127.0.0.1:2379",
            BenchTarget::Zookeeper => "127.0.0.1:2181",
            BenchTarget::Redis | BenchTarget::RedisAof => "redis://127.0.0.1:6379/",
            BenchTarget::Postgres => "host=127.0.0.1 port=5432 user=postgres dbname=postgres",
            _ => unreachable!("a base target"),
        }
    }

    /// `endpoint` in the form the target's client takes (`host:port` gets a scheme);
    /// for etcd and Fenced, each of a comma-separated list.
    pub fn normalise_endpoint(self, endpoint: &str) -> String {
        match self.base() {
            BenchTarget::Etcd | BenchTarget::Fenced => endpoint
                .split(',')
                .map(|e| if e.contains("://") { e.to_owned() } else { format!("http://{e}") })
                .collect::<Vec<_>>()
                .join(","),
            BenchTarget::Redis | BenchTarget::RedisAof if !endpoint.contains("://") => format!("redis://{endpoint}/"),
            _ => endpoint.to_owned(),
        }
    }

    /// Whether it can run `w`.
    pub fn supports(self, w: Workload) -> bool {
        match self.members() {
            1 => {
                w != Workload::Keepalive
                    || matches!(self, BenchTarget::Fenced | BenchTarget::Redis | BenchTarget::RedisAof)
            }
            // The fenced store is in the replicated log too; keepalives are one node's.
            _ => w != Workload::Keepalive,
        }
    }
}

impl fmt::Display for BenchTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BenchTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<BenchTarget, String> {
        BenchTarget::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<_> = BenchTarget::ALL.iter().map(|t| t.name()).collect();
            format!("unknown target '{s}' (one of: {})", names.join(", "))
        })
    }
}

/// What the clients do.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Uncontended,
    Contended,
    Keepalive,
    Store,
}

impl Workload {
    pub const ALL: [Workload; 4] = [Workload::Uncontended, Workload::Contended, Workload::Keepalive, Workload::Store];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Keepalive => "keepalive",
            Workload::Store => "store",
        }
    }

    fn locks(self) -> bool {
        matches!(self, Workload::Uncontended | Workload::Contended)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown workload '{s}' (one of: uncontended, contended, keepalive, store)"))
    }
}

/// One measurement: a workload against a target.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub target: BenchTarget,
    pub workload: Workload,
    /// Bench clients, each with its own connection (for keepalive: connections).
    pub clients: u32,
    /// The measured time.
    pub duration: Duration,
    /// How long a holder keeps the lock before releasing it.
    pub hold: Duration,
    /// Operations per second over all clients, for an open loop; `None`: closed loop.
    pub rate: Option<f64>,
    /// Leases of the keepalive workload.
    pub leases: u32,
    /// Every lease's TTL (etcd: whole seconds).
    pub ttl: Duration,
}

impl BenchConfig {
    /// A one-line error for settings that cannot make a run.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1024).contains(&self.clients) {
            return Err(format!("--clients must be between 1 and 1024, not {}", self.clients));
        }
        if self.duration < Duration::from_millis(100) || self.duration > Duration::from_secs(3600) {
            return Err(format!("--duration must be between 100ms and 1h, not {:?}", self.duration));
        }
        if self.hold > Duration::from_secs(10) {
            return Err(format!("--hold must be at most 10s, not {:?}", self.hold));
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0 && r <= 10_000_000.0) {
                return Err(format!("--rate must be a number of operations per second above 0, not {r}"));
            }
            if self.workload == Workload::Keepalive {
                return Err("--rate: the keepalive workload's rate is set by --leases and --ttl".into());
            }
        }
        if self.ttl < Duration::from_millis(300) || self.ttl > Duration::from_secs(300) {
            return Err(format!("--ttl must be between 300ms and 300s, not {:?}", self.ttl));
        }
        if self.target.base() == BenchTarget::Etcd
            && (self.ttl.subsec_nanos() != 0 || self.ttl < Duration::from_secs(2))
        {
            return Err(format!(
                "--ttl must be whole seconds, at least 2s, for etcd (its leases are), not {:?}",
                self.ttl
            ));
        }
        // ZooKeeper's session is the lease; a standalone server with the default tick
        // keeps session timeouts between 4 s and 40 s.
        if self.target.base() == BenchTarget::Zookeeper
            && !(Duration::from_secs(4)..=Duration::from_secs(40)).contains(&self.ttl)
        {
            return Err(format!(
                "--ttl must be between 4s and 40s for zookeeper (its session timeout), not {:?}",
                self.ttl
            ));
        }
        if !(1..=1_000_000).contains(&self.leases) {
            return Err(format!("--leases must be between 1 and 1000000, not {}", self.leases));
        }
        if !self.target.supports(self.workload) {
            let built = match self.workload {
                Workload::Keepalive => "fenced and redis",
                _ => "one-node targets (the three-member ones run uncontended, contended and store)",
            };
            return Err(format!("the {} workload is built for {built}, not {}", self.workload, self.target));
        }
        Ok(())
    }

    fn options(&self) -> ConnOptions {
        ConnOptions { ttl: self.ttl, op_timeout: Duration::from_secs(10) }
    }

    /// How long a contended acquire may wait: every other client may be ahead of it.
    fn wait(&self) -> Duration {
        (self.hold * self.clients * 4).max(Duration::from_secs(10))
    }
}

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
    fn server_cpu(&self) -> Option<Duration> {
        match self.pid {
            Some(pid) => cpu_time(pid),
            None if !self.member_pids.is_empty() => self.member_pids.iter().map(|&p| cpu_time(p)).sum(),
            None => None,
        }
    }

    /// What the figures of `w` on this peer have on disk before their answer.
    async fn durability(&self, w: Workload) -> String {
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

/// What one run measured. Latencies are in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub target: BenchTarget,
    pub workload: Workload,
    pub clients: u32,
    /// What was on disk before each answer.
    pub durability: String,
    /// How the target was driven.
    pub recipe: &'static str,
    /// `closed` (each client sends when its previous answer came) or `open` (at a rate).
    pub mode: &'static str,
    pub rate_per_s: Option<f64>,
    pub hold_ms: u64,
    /// The measured time.
    pub duration_ms: u64,
    /// Completed operations: lock cycles (acquire+release), writes, keepalives.
    pub ops: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub ops_per_s: f64,
    /// Latency of one operation (a whole cycle for the lock workloads).
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// The acquire alone (lock workloads).
    pub acquire_p50_us: Option<u64>,
    pub acquire_p99_us: Option<u64>,
    /// Open loop: how late after its due time an operation was sent, p50 and p99 (the
    /// pacer's wake-up, or the client still busy with its previous operation); the
    /// latencies include it.
    pub send_lag_p50_us: Option<u64>,
    pub send_lag_p99_us: Option<u64>,
    /// Fairness (lock workloads): the fewest and most cycles one client completed, and
    /// how many completed none.
    pub grants_per_client_min: Option<u64>,
    pub grants_per_client_max: Option<u64>,
    pub starved_clients: Option<u64>,
    /// Keepalive workload: leases, their TTL, and those lost while kept alive.
    pub leases: Option<u32>,
    pub ttl_ms: Option<u64>,
    pub false_expiries: Option<u64>,
    pub late_keepalives: Option<u64>,
    /// Keepalives due in the window but not sent by its end (the schedule was not kept).
    pub keepalives_unsent: Option<u64>,
    /// The server's CPU time over the measured window, when we started it.
    pub server_cpu_s: Option<f64>,
    /// The server's CPU time per operation.
    pub server_cpu_us_per_op: Option<f64>,
    /// This bench process's CPU time over the window (it shares the machine).
    pub client_cpu_s: Option<f64>,
    /// With repeated runs, every run's throughput; this report is the median run.
    pub runs_ops_per_s: Vec<f64>,
    /// A spawned Fenced of one node, closed loop, uncontended or store: what the same
    /// clients get in this workload's operations from the log Fenced writes with no
    /// other work ([`ceiling`]), measured right after the row on the same disk.
    pub log_ceiling_ops_per_s: Option<f64>,
    /// This row's throughput as a share of that ceiling.
    pub of_log_ceiling: Option<f64>,
}

/// Measures the zero-work ceiling of the log a Fenced server of one writes (a redb
/// table, the server's default linger), with this row's clients and duration, in the
/// directory the spawned servers keep their data in, and puts it and the row's share
/// beside the row. A lock cycle is two commits, a store write one. Only for rows the
/// ceiling models: a contended cycle waits for the holder before it, which the ceiling's
/// independent clients do not, and an open loop's rate is not the disk's.
pub fn add_log_ceiling(r: &mut BenchReport) -> std::io::Result<()> {
    let modelled = matches!(r.workload, Workload::Uncontended | Workload::Store);
    if r.target != BenchTarget::Fenced || r.rate_per_s.is_some() || !modelled {
        return Ok(());
    }
    let duration = Duration::from_millis(r.duration_ms.max(1000));
    let cfg = ceiling::CeilingConfig::server_log(r.clients as usize, duration, &std::env::temp_dir());
    let c = ceiling::measure(&cfg)?;
    let ops_per_s = if r.workload == Workload::Store { c.cycles_per_s * 2.0 } else { c.cycles_per_s };
    r.log_ceiling_ops_per_s = Some(ops_per_s);
    r.of_log_ceiling = (ops_per_s > 0.0).then(|| r.ops_per_s / ops_per_s);
    Ok(())
}

/// What a run is doing, for a progress bar.
#[derive(Clone, Copy, Default, Debug)]
pub struct Progress {
    pub elapsed_ms: u64,
    pub ops: u64,
}

/// Runs `cfg` against `peer`. Bounded in time: set-up, the duration, then at most one
/// wait and one request timeout for operations in flight.
pub async fn run(cfg: &BenchConfig, peer: &Peer, progress: watch::Sender<Progress>) -> Result<BenchReport> {
    if let Err(e) = cfg.validate() {
        bail!(e);
    }
    let durability = peer.durability(cfg.workload).await;
    let ops = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let ticker = {
        let ops = ops.clone();
        tokio::spawn(async move {
            loop {
                sleep(Duration::from_millis(200)).await;
                let elapsed_ms = started.elapsed().as_millis() as u64;
                let _ = progress.send(Progress { elapsed_ms, ops: ops.load(Ordering::Relaxed) });
            }
        })
    };
    let measured = match cfg.workload {
        Workload::Keepalive => run_keepalive(cfg, peer, ops).await,
        _ => run_clients(cfg, peer, ops).await,
    };
    ticker.abort();
    let mut r = measured?;
    r.durability = durability;
    if r.ops == 0 {
        bail!(
            "{} {}: no operation succeeded ({})",
            cfg.target,
            cfg.workload,
            r.first_error.as_deref().unwrap_or("no error either")
        );
    }
    Ok(r)
}

/// The median run by throughput, with every run's throughput.
pub fn median(mut runs: Vec<BenchReport>) -> Option<BenchReport> {
    let all: Vec<f64> = runs.iter().map(|r| r.ops_per_s).collect();
    runs.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    let mid = runs.len().checked_sub(1)? / 2;
    let mut m = runs.swap_remove(mid);
    m.runs_ops_per_s = all;
    Some(m)
}

fn recipe(target: BenchTarget, w: Workload) -> &'static str {
    match (target, w) {
        (BenchTarget::Fenced, Workload::Store) => "PUT /v1/store/{key} with the writer's token (fenced-client)",
        (BenchTarget::Fenced, Workload::Keepalive) => "fenced-client keepalive, up to 64 in flight on each bench connection (fenced:// when spawned)",
        (BenchTarget::Fenced, _) => "fenced-client: acquire with its own lease; release and end the lease",
        (BenchTarget::Etcd, Workload::Store) => "Put",
        (BenchTarget::Etcd, _) => "a session lease per client, kept alive; Lock with it, Unlock",
        (BenchTarget::Zookeeper, Workload::Store) => "setData",
        (BenchTarget::Zookeeper, _) => {
            "Curator's InterProcessMutex: an ephemeral sequential node, getChildren, a watch on the one before; delete"
        }
        (BenchTarget::Redis | BenchTarget::RedisAof, Workload::Store) => "SET",
        (BenchTarget::Redis | BenchTarget::RedisAof, Workload::Keepalive) => {
            "a key with a TTL, PEXPIRE, up to 64 in flight on each connection"
        }
        (BenchTarget::Redis | BenchTarget::RedisAof, _) => "SET NX PX, compare-and-delete (EVALSHA); waiters poll every 1 ms",
        (BenchTarget::Postgres, Workload::Store) => "fenced-client PgKv: one conditional upsert",
        (BenchTarget::Postgres, _) => {
            "lease row: INSERT .. ON CONFLICT DO UPDATE .. WHERE expires_at < now(), token from a sequence; DELETE by token; waiters poll every 1 ms, SELECT before trying"
        }
        (BenchTarget::Fenced3, _) => {
            "as fenced, every client given all 3 members (fenced://): it follows the leader, followers answer not_leader"
        }
        (BenchTarget::Etcd3, _) => "as etcd, client i on member i mod 3 (a follower forwards to the leader)",
        (BenchTarget::Zookeeper3, _) => {
            "as zookeeper, client i's session on server i mod 3 (a follower forwards writes to the leader)"
        }
    }
}

fn blank_report(cfg: &BenchConfig) -> BenchReport {
    BenchReport {
        target: cfg.target,
        workload: cfg.workload,
        clients: cfg.clients,
        durability: String::new(),
        recipe: recipe(cfg.target, cfg.workload),
        mode: if cfg.rate.is_some() { "open" } else { "closed" },
        rate_per_s: cfg.rate,
        hold_ms: cfg.hold.as_millis() as u64,
        duration_ms: 0,
        ops: 0,
        errors: 0,
        first_error: None,
        ops_per_s: 0.0,
        p50_us: 0,
        p99_us: 0,
        p999_us: 0,
        max_us: 0,
        acquire_p50_us: None,
        acquire_p99_us: None,
        send_lag_p50_us: None,
        send_lag_p99_us: None,
        grants_per_client_min: None,
        grants_per_client_max: None,
        starved_clients: None,
        leases: None,
        ttl_ms: None,
        false_expiries: None,
        late_keepalives: None,
        keepalives_unsent: None,
        server_cpu_s: None,
        server_cpu_us_per_op: None,
        client_cpu_s: None,
        log_ceiling_ops_per_s: None,
        of_log_ceiling: None,
        runs_ops_per_s: Vec::new(),
    }
}

/// One bench client's connection, for the workload at hand.
enum Work {
    Lock(Conn),
    Store(Writer),
}

/// The lock and store workloads: connect every client, warm each connection with one
/// operation, then run them together for the duration.
async fn run_clients(cfg: &BenchConfig, peer: &Peer, ops: Arc<AtomicU64>) -> Result<BenchReport> {
    let o = cfg.options();
    driver::prepare(cfg.target, &peer.endpoint, o).await?;
    let mut connecting = JoinSet::new();
    for id in 0..cfg.clients {
        let (cfg, endpoint) = (cfg.clone(), peer.endpoint.clone());
        connecting.spawn(async move {
            let mut work = if cfg.workload.locks() {
                Work::Lock(Conn::connect(cfg.target, &endpoint, id, o).await?)
            } else {
                Work::Store(Writer::connect(cfg.target, &endpoint, id, o).await?)
            };
            // Warm-up, not measured: the connection is open and the names exist.
            once(&mut work, &cfg, id).await.with_context(|| format!("cannot reach {} at {endpoint}", cfg.target))?;
            anyhow::Ok((id, work))
        });
    }
    let mut works = Vec::new();
    let connected = timeout(Duration::from_secs(30), async {
        while let Some(joined) = connecting.join_next().await {
            works.push(joined??);
        }
        anyhow::Ok(())
    })
    .await;
    match connected {
        Ok(r) => r?,
        Err(_) => bail!("{} at {}: the clients could not connect within 30 s", cfg.target, peer.endpoint),
    }

    let start = Instant::now() + Duration::from_millis(50);
    let end = start + cfg.duration;
    // Client id's operations are due at start + (id + k * clients) / rate.
    let pacer = cfg.rate.map(|rate| {
        let every = Duration::from_secs_f64(f64::from(cfg.clients) / rate);
        let schedules: Vec<_> = (0..cfg.clients).map(|id| (start + every * id / cfg.clients, every)).collect();
        Pacer::start(&schedules, end)
    });
    let mut clients = JoinSet::new();
    for (id, work) in works {
        let (cfg, ops) = (cfg.clone(), ops.clone());
        let due = pacer.as_ref().map(|p| p.bell(id as usize));
        clients.spawn(async move { client_loop(work, cfg, id, start, end, ops, due).await });
    }
    sleep_until(start).await;
    let (server0, client0) = (peer.server_cpu(), cpu_time(std::process::id()));
    let drain = cfg.wait() + o.op_timeout + Duration::from_secs(5);
    let mut tallies = Vec::new();
    let joined = timeout(cfg.duration + drain, async {
        while let Some(t) = clients.join_next().await {
            tallies.push(t?);
        }
        anyhow::Ok(())
    })
    .await;
    let finished = Instant::now();
    let (server1, client1) = (peer.server_cpu(), cpu_time(std::process::id()));
    match joined {
        Ok(r) => r?,
        Err(_) => bail!("{} {}: clients still busy {drain:?} after the end of the run", cfg.target, cfg.workload),
    }

    let mut r = blank_report(cfg);
    let elapsed = finished - start;
    r.duration_ms = elapsed.as_millis() as u64;
    let mut latency = stats::histogram();
    let mut acquire = stats::histogram();
    let mut lag = stats::histogram();
    let mut per_client = Vec::new();
    for t in &tallies {
        latency.add(&t.latency)?;
        acquire.add(&t.acquire)?;
        lag.add(&t.lag)?;
        r.ops += t.ops;
        r.errors += t.errors;
        per_client.push(t.ops);
        if r.first_error.is_none() {
            r.first_error.clone_from(&t.first_error);
        }
    }
    [r.p50_us, r.p99_us, r.p999_us, r.max_us] = percentiles(&latency);
    r.ops_per_s = r.ops as f64 / elapsed.as_secs_f64();
    if cfg.rate.is_some() {
        let [l50, l99, ..] = percentiles(&lag);
        (r.send_lag_p50_us, r.send_lag_p99_us) = (Some(l50), Some(l99));
    }
    if cfg.workload.locks() {
        let [a50, a99, ..] = percentiles(&acquire);
        r.acquire_p50_us = Some(a50);
        r.acquire_p99_us = Some(a99);
        r.grants_per_client_min = per_client.iter().min().copied();
        r.grants_per_client_max = per_client.iter().max().copied();
        r.starved_clients = Some(per_client.iter().filter(|&&n| n == 0).count() as u64);
    }
    cpu_fields(&mut r, server0.zip(server1), client0.zip(client1));
    Ok(r)
}

fn cpu_fields(r: &mut BenchReport, server: Option<(Duration, Duration)>, client: Option<(Duration, Duration)>) {
    if let Some((a, b)) = server {
        let cpu = b.saturating_sub(a);
        r.server_cpu_s = Some(cpu.as_secs_f64());
        r.server_cpu_us_per_op = (r.ops > 0).then(|| cpu.as_secs_f64() * 1e6 / r.ops as f64);
    }
    if let Some((a, b)) = client {
        r.client_cpu_s = Some(b.saturating_sub(a).as_secs_f64());
    }
}

/// The name client `id` locks, or the key it writes.
fn name(w: Workload, id: u32) -> String {
    match w {
        Workload::Contended => "bench/one".into(),
        Workload::Store => format!("bench/store/{id}"),
        _ => format!("bench/own/{id}"),
    }
}

/// One operation; for the lock workloads returns when the lock was acquired.
async fn once(work: &mut Work, cfg: &BenchConfig, id: u32) -> Result<Option<Instant>> {
    let o = cfg.options();
    let name = name(cfg.workload, id);
    match work {
        Work::Lock(conn) => {
            let held: Held = conn.acquire(&name, o, cfg.wait()).await?;
            let acquired = Instant::now();
            if !cfg.hold.is_zero() {
                sleep(cfg.hold).await;
            }
            conn.release(held, o).await?;
            Ok(Some(acquired))
        }
        Work::Store(w) => {
            w.write(&name, o).await?;
            Ok(None)
        }
    }
}

/// Client `id`'s loop until `end`: back to back (closed loop), or each operation at
/// its due time (open loop, `rate / clients` per second, latency from the due time,
/// woken by the pacer's `bell`).
async fn client_loop(
    mut work: Work,
    cfg: BenchConfig,
    id: u32,
    start: Instant,
    end: Instant,
    ops: Arc<AtomicU64>,
    bell: Option<Arc<Notify>>,
) -> Tally {
    let mut t = Tally::default();
    let interval = cfg.rate.map(|r| Duration::from_secs_f64(f64::from(cfg.clients) / r));
    let phase = interval.map_or(Duration::ZERO, |iv| iv * id / cfg.clients);
    sleep_until(start).await;
    let mut k: u32 = 0;
    loop {
        let due = match interval {
            Some(iv) => start + phase + iv.saturating_mul(k),
            None => Instant::now(),
        };
        if due >= end {
            break;
        }
        k = k.saturating_add(1);
        // A closed loop never sleeps: tokio rounds a timer up to its next millisecond
        // tick, even one due now.
        if let Some(bell) = &bell {
            pacer::until(bell, due).await;
            record(&mut t.lag, Instant::now().saturating_duration_since(due));
        }
        match once(&mut work, &cfg, id).await {
            Ok(acquired) => {
                let done = Instant::now();
                record(&mut t.latency, done - due);
                if let Some(a) = acquired {
                    record(&mut t.acquire, a - due);
                }
                t.ops += 1;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                t.failed(&e);
                if interval.is_none() {
                    // Do not spin on a failing target.
                    sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    if let Work::Store(w) = work {
        w.close().await;
    }
    t
}

async fn run_keepalive(cfg: &BenchConfig, peer: &Peer, ops: Arc<AtomicU64>) -> Result<BenchReport> {
    let k = keepalive::run(cfg, &peer.endpoint, peer.pid, ops).await?;
    let mut r = blank_report(cfg);
    r.mode = "open";
    r.duration_ms = k.window.as_millis() as u64;
    r.ops = k.tally.ops;
    r.errors = k.tally.errors;
    r.first_error = k.tally.first_error;
    r.ops_per_s = r.ops as f64 / k.window.as_secs_f64();
    r.rate_per_s = Some(f64::from(cfg.leases) * 3.0 / cfg.ttl.as_secs_f64());
    [r.p50_us, r.p99_us, r.p999_us, r.max_us] = percentiles(&k.tally.latency);
    r.leases = Some(cfg.leases);
    r.ttl_ms = Some(cfg.ttl.as_millis() as u64);
    r.false_expiries = Some(k.false_expiries);
    r.late_keepalives = Some(k.late);
    r.keepalives_unsent = Some(k.unsent);
    cpu_fields(&mut r, k.server_cpu.map(|c| (Duration::ZERO, c)), k.client_cpu.map(|c| (Duration::ZERO, c)));
    Ok(r)
}
