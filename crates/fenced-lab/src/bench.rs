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
mod clients;
pub mod driver;
mod keepalive;
mod pacer;
mod peer;
pub mod stats;
mod target;

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
use clients::{cpu_fields, run_clients};
use driver::{Conn, ConnOptions, Held, Writer};
use pacer::Pacer;
pub use peer::Peer;
use stats::{cpu_time, percentiles, record, Tally};
pub use target::{BenchTarget, Workload};

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
