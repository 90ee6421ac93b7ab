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
use crate::target::{ClientLanguage, Driver, Endpoints, Target, LOCK, REDLOCK_INSTANCES, S3_BUCKET};
use crate::worker::{now_us, WorkerSpec, Workload};

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

/// The command of one worker process, its spec to follow as the last argument: this
/// binary's `torture-worker`, or the worker written with the target's client library.
fn worker_command(cfg: &TortureConfig) -> Command {
    match cfg.target.client_language() {
        None => {
            let mut c = Command::new(&cfg.fenced_bin);
            c.arg("torture-worker");
            c
        }
        Some(ClientLanguage::Python) => {
            let mut c = Command::new(&cfg.python);
            c.args(["-u", "-m", "fenced._torture_worker"]);
            c
        }
        Some(ClientLanguage::Node) => {
            let mut c = Command::new("node");
            c.arg(node_worker(&cfg.node_client));
            c
        }
    }
}

/// The TypeScript client's built worker under its package directory.
fn node_worker(package: &std::path::Path) -> PathBuf {
    package.join("dist/src/torture-worker.js")
}

/// Before anything starts: whether the target's client library can run its workers,
/// with what to do when it cannot.
async fn check_client(cfg: &TortureConfig) -> Result<()> {
    let (mut probe, what) = match cfg.target.client_language() {
        None => return Ok(()),
        Some(ClientLanguage::Python) => {
            let mut c = Command::new(&cfg.python);
            c.args(["-c", "import fenced._torture_worker"]);
            (
                c,
                format!(
                    "the {} target needs a Python that imports the client: `{}` could not \
                     (pip install ./clients/python, then --python or FENCED_PYTHON names that interpreter)",
                    cfg.target,
                    cfg.python.display()
                ),
            )
        }
        Some(ClientLanguage::Node) => {
            let worker = node_worker(&cfg.node_client);
            if !worker.is_file() {
                bail!(
                    "the {} target needs the TypeScript client built: no {} (npm ci && npm run build in \
                     clients/typescript, then --node-client or FENCED_NODE_CLIENT names that directory)",
                    cfg.target,
                    worker.display()
                );
            }
            let mut c = Command::new("node");
            c.args(["-e", "if (+process.versions.node.split('.')[0] < 20) process.exit(3)"]);
            (c, format!("the {} target needs Node 20 or later on the PATH", cfg.target))
        }
    };
    let ok = timeout(
        Duration::from_secs(20),
        probe.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status(),
    )
    .await
    .is_ok_and(|s| s.is_ok_and(|s| s.success()));
    if !ok {
        bail!("{what}");
    }
    Ok(())
}

/// A worker process; killed when dropped.
struct Worker {
    child: Child,
    pid: u32,
}

/// Operations the workers streamed in and the nemesis has not taken yet. It takes
/// them at least every 50 ms, except while it holds a pause or restarts a service (a
/// few TTLs at most), when a fast target's workers send a few thousand. Past the bound
/// a worker's reader waits, and so does the worker on its stdout pipe: the run slows,
/// but no operation is dropped (the checkers judge the whole history).
const OPS_QUEUED_MAX: usize = 65_536;

/// The workers of a run and the operations they stream in.
pub(crate) struct Workers {
    procs: Vec<Worker>,
    stderr: Vec<tokio::task::JoinHandle<String>>,
    rx: mpsc::Receiver<Op>,
    /// Workers that completed a read since the last look (the pause's victims).
    pending_reads: Vec<u32>,
    pub(crate) history: Vec<Op>,
    pub(crate) faults: Vec<Fault>,
    start_us: u64,
    progress: watch::Sender<Progress>,
}

impl Workers {
    /// Starts `cfg.workers` worker processes against `endpoints`, running until `until_us`.
    pub(crate) fn spawn(
        cfg: &TortureConfig,
        endpoints: &Endpoints,
        start_us: u64,
        until_us: u64,
        progress: watch::Sender<Progress>,
    ) -> Result<Workers> {
        let (ops_tx, rx) = mpsc::channel::<Op>(OPS_QUEUED_MAX);
        let mut procs = Vec::new();
        let mut stderr_tasks = Vec::new();
        for w in 0..cfg.workers {
            let spec = WorkerSpec {
                target: cfg.target,
                endpoints: endpoints.clone(),
                worker: w,
                seed: cfg.seed,
                until_us,
                ttl_ms: cfg.ttl.as_millis() as u64,
                work_ms: cfg.work.as_millis() as u64,
                op_timeout_ms: cfg.op_timeout().as_millis() as u64,
                lock: LOCK.to_owned(),
                counter_key: cfg.target.counter_key(),
                workload: cfg.workload,
            };
            let mut child = worker_command(cfg)
                .arg(serde_json::to_string(&spec)?)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("start worker {w} of {}", cfg.target))?;
            let pid = child.id().context("a worker without a pid")?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let mut stderr = child.stderr.take().context("worker stderr")?;
            let tx = ops_tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(op) = serde_json::from_str::<Op>(&line) {
                        let _ = tx.send(op).await;
                    }
                }
            });
            stderr_tasks.push(tokio::spawn(async move {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s).await;
                s
            }));
            procs.push(Worker { child, pid });
        }
        Ok(Workers {
            procs,
            stderr: stderr_tasks,
            rx,
            pending_reads: Vec::new(),
            history: Vec::new(),
            faults: Vec::new(),
            start_us,
            progress,
        })
    }

    /// Takes in the operations streamed so far, and reports progress.
    pub(crate) fn pump(&mut self) {
        while let Ok(op) = self.rx.try_recv() {
            if op.kind == OpKind::Read && op.result == OpResult::Ok {
                self.pending_reads.push(op.worker);
            }
            self.history.push(op);
        }
        let _ = self.progress.send(Progress {
            elapsed_ms: now_us().saturating_sub(self.start_us) / 1000,
            ops: self.history.len() as u64,
            faults: self.faults.len() as u64,
        });
    }

    /// Sleeps until `until`, taking operations in meanwhile.
    pub(crate) async fn pump_until(&mut self, until: Instant) {
        while Instant::now() < until {
            sleep(Duration::from_millis(50).min(until - Instant::now())).await;
            self.pump();
        }
    }

    /// Freezes the next worker that has just read (it holds the lock and is about to
    /// write) for longer than the TTL; false when none read within two TTLs.
    pub(crate) async fn pause_one(&mut self, ttl: Duration, rng: &mut ChaCha8Rng) -> bool {
        let Some(w) = self.next_read(ttl * 2).await else { return false };
        let pid = self.procs[w as usize].pid;
        if signal(pid, libc::SIGSTOP).is_err() {
            return false;
        }
        let from = now_us();
        let ttl_ms = ttl.as_millis() as u64;
        let hold = ttl_ms + ttl_ms / 5 + rng.next_u64() % (ttl_ms * 3 / 2 + 1);
        sleep(Duration::from_millis(hold)).await;
        let _ = signal(pid, libc::SIGCONT);
        self.faults.push(Fault::Pause { worker: w, start_us: from, end_us: now_us() });
        true
    }

    /// The next worker to complete a read from now (it holds the lock and is about to
    /// work), waiting up to `within`.
    pub(crate) async fn next_read(&mut self, within: Duration) -> Option<u32> {
        self.pending_reads.clear();
        let deadline = Instant::now() + within;
        loop {
            self.pump();
            if let Some(w) = self.pending_reads.first() {
                return Some(*w);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits for every worker to finish its last cycle (they stop by themselves at the
    /// end), taking the rest of the history.
    pub(crate) async fn finish(&mut self, cfg: &TortureConfig, until_us: u64) -> Result<()> {
        let grace = cfg.op_timeout() * 4 + cfg.ttl * 6;
        let exit_by = Instant::now() + Duration::from_micros(until_us.saturating_sub(now_us())) + grace;
        for w in 0..self.procs.len() {
            let status = loop {
                self.pump();
                match timeout(Duration::from_millis(100), self.procs[w].child.wait()).await {
                    Ok(status) => break status?,
                    Err(_) if Instant::now() > exit_by => {
                        bail!("worker {w} did not finish within {grace:?} of the end")
                    }
                    Err(_) => {}
                }
            };
            let err = self.stderr.remove(0);
            if !status.success() {
                let err = err.await.unwrap_or_default();
                bail!("worker {w} failed ({status}): {}", err.trim());
            }
        }
        while let Some(op) = self.rx.recv().await {
            self.history.push(op);
        }
        Ok(())
    }
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

/// A fault of a run on one lock service (the clusters' are [`crate::nemesis`]'s).
#[derive(Clone, Copy, Debug)]
enum LocalFault {
    Pause,
    Crash,
    Delay,
}

/// One round of faults: every enabled kind, pauses twice (they are the seeds' story).
fn local_faults(faults: Faults) -> Vec<LocalFault> {
    let kinds = [
        (faults.pause, LocalFault::Pause),
        (faults.pause, LocalFault::Pause),
        (faults.crash, LocalFault::Crash),
        (faults.delay, LocalFault::Delay),
    ];
    kinds.into_iter().filter_map(|(on, f)| on.then_some(f)).collect()
}

/// The nemesis, while the history streams in: a seeded gap, then the next fault of
/// the plan, until the recovery phase.
async fn inject_faults(
    cfg: &TortureConfig,
    w: &mut Workers,
    locks: &[Arc<Mutex<Service>>],
    proxies: &[DelayProxy],
    faults_until: Instant,
) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut plan = Vec::new();
    let ttl_ms = cfg.ttl.as_millis() as u64;
    while Instant::now() < faults_until {
        let gap = Duration::from_millis(ttl_ms / 2 + rng.next_u64() % (ttl_ms * 3 / 2 + 1));
        w.pump_until((Instant::now() + gap).min(faults_until)).await;
        if Instant::now() >= faults_until {
            break;
        }
        // Faults come in rounds, a seeded shuffle of every enabled kind, so a short run
        // still sees each kind.
        let Some(fault) = crate::nemesis::next_in_round(&mut plan, || local_faults(cfg.faults), &mut rng) else {
            continue;
        };
        match fault {
            LocalFault::Pause => {
                w.pause_one(cfg.ttl, &mut rng).await;
            }
            LocalFault::Crash => crash_one(cfg, w, locks, faults_until, &mut rng).await?,
            LocalFault::Delay => delay_links(w, proxies, ttl_ms, faults_until, &mut rng).await,
        }
        w.pump();
    }
    Ok(())
}

/// kill -9 one lock service and start it again on its data directory.
async fn crash_one(
    cfg: &TortureConfig,
    w: &mut Workers,
    locks: &[Arc<Mutex<Service>>],
    faults_until: Instant,
    rng: &mut ChaCha8Rng,
) -> Result<()> {
    // Aimed at a holder: just after a worker's read (a lock held, its lease to outlive
    // the restart), so the restart is judged on the lease it must keep, not on an idle
    // moment; within a TTL, before recovery.
    w.next_read(cfg.ttl.min(faults_until.saturating_duration_since(Instant::now()))).await;
    let from = now_us();
    let down = Duration::from_millis(100 + rng.next_u64() % 500);
    // Redlock's five instances: one crashes at a time (a draw only then, so the other
    // targets keep their plan).
    let which = if locks.len() > 1 { rng.next_u64() as usize % locks.len() } else { 0 };
    let svc = locks[which].clone();
    tokio::task::spawn_blocking(move || {
        let mut s = svc.lock().expect("service lock");
        s.crash();
        std::thread::sleep(down);
        s.restart()
    })
    .await??;
    w.faults.push(Fault::Restart { start_us: from, end_us: now_us() });
    Ok(())
}

/// Holds the bytes between the workers and the lock service for a seeded while.
async fn delay_links(
    w: &mut Workers,
    proxies: &[DelayProxy],
    ttl_ms: u64,
    faults_until: Instant,
    rng: &mut ChaCha8Rng,
) {
    let delay_ms = ttl_ms / 2 + rng.next_u64() % (ttl_ms + 1);
    let hold = Duration::from_millis(1000 + rng.next_u64() % 2000);
    let from = now_us();
    proxies.iter().for_each(|p| p.set_delay(Duration::from_millis(delay_ms)));
    w.pump_until((Instant::now() + hold).min(faults_until)).await;
    proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
    w.faults.push(Fault::Delay { delay_ms, start_us: from, end_us: now_us() });
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
    let locks = match target {
        Target::Redis | Target::RedisToken => vec![Service::redis(true)?],
        Target::Redlock => (0..REDLOCK_INSTANCES).map(|_| Service::redis(true)).collect::<Result<_>>()?,
        Target::Etcd | Target::EtcdGated => vec![Service::etcd()?],
        Target::ZookeeperGated => vec![Service::zookeeper()?],
        Target::Fenced
        | Target::FencedUnfenced
        | Target::Postgres
        | Target::S3
        | Target::Dynamodb
        | Target::Python
        | Target::PythonUnfenced
        | Target::Node
        | Target::NodeUnfenced => vec![Service::fenced(bin, &[])?],
        Target::FencedCluster | Target::EtcdCluster | Target::ZookeeperEnsemble => {
            bail!("a cluster is started by its nemesis")
        }
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
