//! `fenced torture`: the counter workload in separate worker processes against one
//! target, a seeded nemesis injecting faults, and the checker's verdict.
//!
//! The run: start the target's services on free loopback ports with temporary data
//! directories, put a delay proxy between the workers and the lock service, start the
//! workers, inject faults until the recovery phase, let the workers finish, read the
//! final counter, analyse the history. Everything started is stopped and removed on
//! every path: services and workers are killed when their handles drop.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout, Instant};

use crate::history::{
    analyse, late_lost_signals, overlapping_holders, store_linearizable, Fault, Op, OpKind, OpResult,
};
pub use crate::nemesis::{ClusterFigures, Nemesis};
use crate::peers::{signal, Service};
use crate::proxy::DelayProxy;
use crate::target::{ClientLanguage, Driver, Endpoints, LockService, Target, LOCK, REDLOCK_INSTANCES, S3_BUCKET};
use crate::worker::{now_us, WorkerSpec, Workload};

mod faults;
mod workers;

use faults::inject_faults;
use workers::check_client;
pub(crate) use workers::Workers;

/// The faults the nemesis may inject.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub struct Faults {
    /// SIGSTOP a worker between its read and its write, for longer than the TTL.
    pub pause: bool,
    /// kill -9 the lock service and start it again on the same data directory.
    pub crash: bool,
    /// Hold the bytes between workers and lock service.
    pub delay: bool,
}

impl Faults {
    pub const ALL: Faults = Faults { pause: true, crash: true, delay: true };
}

/// One torture run.
#[derive(Clone, Debug)]
pub struct TortureConfig {
    pub target: Target,
    pub duration: Duration,
    pub seed: u64,
    pub workers: u32,
    pub ttl: Duration,
    /// The longest "work" between a worker's read and its write.
    pub work: Duration,
    /// The last stretch of the run, without faults.
    pub recovery: Duration,
    pub faults: Faults,
    /// Members of a cluster target (`fenced-cluster`: 3 or 5; the peers' clusters: 3);
    /// 1 for the others.
    pub nodes: u32,
    /// The faults of a cluster target, [`crate::nemesis`] (the others take `faults`).
    pub nemesis: Nemesis,
    /// The `fenced` executable: the server, and the workers (`fenced torture-worker`).
    pub fenced_bin: PathBuf,
    /// The workers written in other languages: the Python interpreter that imports
    /// `fenced` (`python` targets), the TypeScript client's package directory with its
    /// build in `dist/` (`node` targets).
    pub python: PathBuf,
    pub node_client: PathBuf,
    /// What the workers do with the lock: the counter, or leaders doing it.
    pub workload: Workload,
}

impl TortureConfig {
    /// A one-line error for settings that cannot make a run.
    pub fn validate(&self) -> Result<(), String> {
        if self.workers < 2 || self.workers > 64 {
            return Err(format!("--workers must be between 2 and 64, not {}", self.workers));
        }
        if self.ttl < self.target.min_ttl() || self.ttl > Duration::from_secs(60) {
            return Err(format!(
                "--ttl must be between {:?} and 60s for {}, not {:?}",
                self.target.min_ttl(),
                self.target,
                self.ttl
            ));
        }
        if self.target.etcd_locks() && self.ttl.subsec_nanos() != 0 {
            return Err(format!("--ttl must be whole seconds for etcd (its leases are), not {:?}", self.ttl));
        }
        if self.duration < Duration::from_secs(2) || self.duration > Duration::from_secs(3600) {
            return Err(format!("--duration must be between 2s and 1h, not {:?}", self.duration));
        }
        if self.target.fenced_cluster() && self.nodes != 3 && self.nodes != 5 {
            return Err(format!("--nodes must be 3 or 5 for {}, not {}", self.target, self.nodes));
        }
        if self.target.cluster() && self.nodes != 3 {
            return Err(format!("{} runs three members, not {}", self.target, self.nodes));
        }
        if !self.target.fenced_cluster() && !self.target.cluster() && self.nodes != 1 {
            return Err(format!("--nodes is for --target fenced-cluster; {} runs one server", self.target));
        }
        if self.target.cluster() && self.nemesis.clock {
            return Err(crate::nemesis::peers::clock_refusal(self.target).unwrap_or("no clock nemesis here").into());
        }
        if self.workload == Workload::Elect && (!self.target.fenced_locks() || self.target.client_language().is_some())
        {
            return Err(format!(
                "--workload elect campaigns with the Rust client for Fenced's locks; {} has no election",
                self.target
            ));
        }
        if self.recovery >= self.duration {
            return Err(format!(
                "--recovery ({:?}) must be shorter than --duration ({:?})",
                self.recovery, self.duration
            ));
        }
        Ok(())
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        (self.ttl * 3).max(Duration::from_secs(3))
    }
}

/// What a run found, in the design's words.
#[derive(Clone, Debug, Serialize)]
pub struct TortureReport {
    pub target: Target,
    pub workload: Workload,
    pub seed: u64,
    pub duration_ms: u64,
    pub workers: u32,
    pub ttl_ms: u64,
    /// Whether the resource checks tokens.
    pub fencing: bool,
    pub grants: u64,
    pub writes_attempted: u64,
    pub acknowledged: u64,
    pub writes_indeterminate: u64,
    pub final_value: u64,
    pub lost_updates: u64,
    pub zombie_writes: u64,
    pub stale_writes_rejected: u64,
    pub stale_reads_rejected: u64,
    pub pauses_injected: u64,
    pub restarts_injected: u64,
    pub delays_injected: u64,
    /// Clusters only: how many of the restarts were a kill -9 of the member that led
    /// at that moment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_kills: Option<u64>,
    /// Clusters only: how many times the leader was frozen past its election timeout
    /// and the TTL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_freezes: Option<u64>,
    /// `null` for a lock service that mints no tokens (Redis).
    pub token_regressions: Option<u64>,
    /// Of those, tokens granted twice; `null` without tokens.
    pub duplicate_tokens: Option<u64>,
    /// Grants made while another holder's lease was certainly valid by the service's own
    /// promise ([`crate::history::overlapping_holders`]); `null` where the lock service
    /// is not Fenced (the window is Fenced's promise, not theirs).
    pub overlapping_holders: Option<u64>,
    /// Writes a holder began after another worker's grant with its client library's
    /// lost signal not yet set ([`crate::history::late_lost_signals`]); `null` where the
    /// client has no such signal.
    pub late_lost_signals: Option<u64>,
    /// Lock servers: 1, or the members of a cluster.
    pub nodes: u32,
    /// Cluster runs: the nemesis, the leaders seen and how long the service took to
    /// answer after each fault; `null` for one server.
    #[serde(flatten)]
    pub cluster: Option<ClusterFigures>,
    /// Whether the counter's history in the Fenced store is linearizable (the core's
    /// Wing-Gong search); `null` for targets whose counter is elsewhere, or when the
    /// search ran out of its step budget.
    pub linearizable: Option<bool>,
    /// No lost update, no zombie write, no token regression, no overlapping holders, and
    /// in a cluster no replicas that disagree.
    pub safe: bool,
    /// The operations that prove each violation.
    pub proofs: Vec<String>,
    #[serde(skip)]
    pub history: Vec<Op>,
    #[serde(skip)]
    pub faults: Vec<Fault>,
}

/// What the run is doing, for a progress bar.
#[derive(Clone, Copy, Default, Debug)]
pub struct Progress {
    pub elapsed_ms: u64,
    pub ops: u64,
    pub faults: u64,
}

/// Runs one torture run.
pub async fn run(cfg: &TortureConfig, progress: watch::Sender<Progress>) -> Result<TortureReport> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    if cfg.target.fenced_cluster() || cfg.target.cluster() {
        return crate::nemesis::run(cfg, progress).await;
    }
    check_client(cfg).await?;
    let bin = cfg.fenced_bin.clone();
    let target = cfg.target;
    let Services { locks, gate, pg, s3, ddb } =
        tokio::task::spawn_blocking(move || start_services(target, &bin)).await??;
    let lock_addrs: Vec<_> = locks.iter().map(|s| s.addr).collect();
    let locks: Vec<Arc<Mutex<Service>>> = locks.into_iter().map(|s| Arc::new(Mutex::new(s))).collect();
    let mut proxies = Vec::new();
    for addr in &lock_addrs {
        proxies.push(DelayProxy::start(*addr).await?);
    }
    let endpoints = Endpoints {
        lock: comma_list(proxies.iter().map(|p| p.addr)),
        pg: pg.as_ref().map(Service::pg_config),
        gate: gate.as_ref().map(|g| g.addr.to_string()),
        s3: s3.as_ref().map(Service::url),
        dynamodb: ddb.as_ref().map(Service::url),
    };
    if let Some(endpoint) = &endpoints.dynamodb {
        crate::target::dynamo_gate(endpoint)?.create_table().await.context("create the DynamoDB table")?;
    }

    let start_us = now_us();
    let until_us = start_us + cfg.duration.as_micros() as u64;
    let faults_until = Instant::now() + cfg.duration - cfg.recovery;
    let mut w = Workers::spawn(cfg, &endpoints, start_us, until_us, progress)?;
    inject_faults(cfg, &mut w, &locks, &proxies, faults_until).await?;

    // Recovery: no faults; the workers finish their last cycle and exit.
    w.finish(cfg, until_us).await?;
    drop(proxies);

    // The counter as it ends, read directly (not through the proxy).
    let direct = Endpoints { lock: comma_list(&lock_addrs), ..endpoints };
    let final_value = read_counter(target, &direct, cfg.op_timeout()).await?;
    drop(pg);
    drop(s3);
    drop(ddb);
    drop(gate);
    drop(locks);
    Ok(report(cfg, w.history, w.faults, final_value, None, None))
}

/// Addresses as the drivers take several: separated by commas.
fn comma_list<A: ToString>(addrs: impl IntoIterator<Item = A>) -> String {
    addrs.into_iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

/// The report of a run from its history: the checkers' verdicts, and the cluster's
/// figures when it was one (`replicas_agree` among them).
pub(crate) fn report(
    cfg: &TortureConfig,
    history: Vec<Op>,
    faults: Vec<Fault>,
    final_value: u64,
    cluster: Option<ClusterFigures>,
    extra_proofs: Option<Vec<String>>,
) -> TortureReport {
    let target = cfg.target;
    let ttl_ms = cfg.ttl.as_millis() as u64;
    let mut a = analyse(&history, &faults, final_value, target.has_tokens(), target.fenced());
    let overlapping = target.fenced_locks().then(|| {
        let (n, proofs) = overlapping_holders(&history, ttl_ms);
        a.proofs.extend(proofs);
        n
    });
    let (late_lost, proofs) = late_lost_signals(&history);
    a.proofs.extend(proofs);
    let (linearizable, proof) =
        if matches!(target, Target::Fenced | Target::FencedCluster | Target::Python | Target::Node) {
            store_linearizable(&history)
        } else {
            (None, None)
        };
    a.proofs.extend(proof);
    a.proofs.extend(extra_proofs.unwrap_or_default());
    let count = |f: fn(&Fault) -> bool| faults.iter().filter(|x| f(x)).count() as u64;
    let replicas_disagree = cluster.as_ref().is_some_and(|c| c.replicas_agree == Some(false));
    TortureReport {
        target,
        workload: cfg.workload,
        seed: cfg.seed,
        duration_ms: cfg.duration.as_millis() as u64,
        workers: cfg.workers,
        ttl_ms,
        fencing: target.fenced(),
        grants: a.grants,
        writes_attempted: a.writes_attempted,
        acknowledged: a.acknowledged,
        writes_indeterminate: a.writes_indeterminate,
        final_value,
        lost_updates: a.lost_updates,
        zombie_writes: a.zombie_writes,
        stale_writes_rejected: a.stale_writes_rejected,
        stale_reads_rejected: a.stale_reads_rejected,
        pauses_injected: count(|f| matches!(f, Fault::Pause { .. } | Fault::NodePause { .. })),
        restarts_injected: count(|f| matches!(f, Fault::Restart { .. } | Fault::Kill { .. })),
        delays_injected: count(|f| matches!(f, Fault::Delay { .. } | Fault::LinkDelay { .. })),
        // etcd-cluster and zookeeper-ensemble: filled in by their nemesis.
        leader_kills: None,
        leader_freezes: None,
        token_regressions: a.token_regressions,
        duplicate_tokens: a.duplicate_tokens,
        overlapping_holders: overlapping,
        late_lost_signals: late_lost,
        nodes: cfg.nodes,
        safe: a.lost_updates == 0
            && a.zombie_writes == 0
            && a.token_regressions.unwrap_or(0) == 0
            && overlapping.unwrap_or(0) == 0
            && late_lost.unwrap_or(0) == 0
            && linearizable != Some(false)
            && !replicas_disagree,
        cluster,
        linearizable,
        proofs: a.proofs,
        history,
        faults,
    }
}

/// The services of a run.
struct Services {
    /// The lock service (Redlock's five instances): the one the nemesis crashes.
    locks: Vec<Service>,
    /// The Fenced server that gates the rows whose lock service is another.
    gate: Option<Service>,
    /// PostgreSQL, for `postgres`.
    pg: Option<Service>,
    /// moto's S3 server, for `s3` (in memory: never crashed).
    s3: Option<Service>,
    /// DynamoDB Local, for `dynamodb` (in memory: never crashed).
    ddb: Option<Service>,
}

fn start_services(target: Target, bin: &std::path::Path) -> Result<Services> {
    if target.cluster() || target.fenced_cluster() {
        bail!("a cluster is started by its nemesis");
    }
    let locks = match target.lock_service() {
        LockService::Fenced => vec![Service::fenced(bin, &[])?],
        LockService::Redis => vec![Service::redis(true)?],
        LockService::Redlock => (0..REDLOCK_INSTANCES).map(|_| Service::redis(true)).collect::<Result<_>>()?,
        LockService::Etcd => vec![Service::etcd()?],
        LockService::Zookeeper => vec![Service::zookeeper()?],
    };
    let gate = if target.gated_elsewhere() { Some(Service::fenced(bin, &[])?) } else { None };
    let pg = if target == Target::Postgres { Some(Service::postgres()?) } else { None };
    let s3 = if target == Target::S3 { Some(Service::moto(S3_BUCKET)?) } else { None };
    let ddb = if target == Target::Dynamodb { Some(Service::dynamodb_local()?) } else { None };
    Ok(Services { locks, gate, pg, s3, ddb })
}

/// Reads the final counter, retrying while the service comes back from a crash.
pub(crate) async fn read_counter(target: Target, ep: &Endpoints, op_timeout: Duration) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let attempt = async {
            let mut d = Driver::connect(target, ep, op_timeout, 0).await?;
            d.counter().await
        };
        match attempt.await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e.context("read the final counter")),
            Err(_) => sleep(Duration::from_millis(200)).await,
        }
    }
}
