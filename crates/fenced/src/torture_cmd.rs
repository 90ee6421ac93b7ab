//! `fenced torture`: fault injection against Fenced and the locks people use today.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fenced_lab::target::Target;
use fenced_lab::torture::{self, Faults, Nemesis, Progress, TortureConfig, TortureReport};
use fenced_lab::worker::{self, WorkerSpec, Workload};
use tokio::sync::watch;

use crate::args::{duration_ms, BadArgument, Global};
use crate::term::{follow, interrupted, progress_bar};

#[derive(Args, Debug)]
pub struct TortureArgs {
    /// The system under test: fenced, fenced-cluster (three or five members, see
    /// --nodes and --nemesis), fenced-unfenced, redis, etcd, postgres, s3
    /// (Fenced's lock, an S3 object through the client's gate, on moto), dynamodb (an
    /// item through the client's gate, on DynamoDB Local: FENCED_DYNAMODB_LOCAL names
    /// the directory of DynamoDBLocal.jar), and the locks
    /// of other services with Fenced's store as their gate: etcd-gated,
    /// zookeeper-gated, redis-token; or redlock (five Redis instances, no token); and
    /// as clusters, gated too: etcd-cluster (three etcd members), zookeeper-ensemble
    /// (three ZooKeeper servers); and Fenced with its workers written with the other
    /// clients: python and node (python-unfenced and node-unfenced without the token,
    /// the controls; see --python and --node-client).
    #[arg(long, default_value = "fenced")]
    target: String,
    /// Run several targets in turn with the same seed and print one table: a
    /// comma-separated list, or `all`.
    #[arg(long, value_name = "TARGETS")]
    compare: Option<String>,
    /// How long the workers run, faults and recovery included.
    #[arg(long, default_value = "30s", value_parser = duration_ms)]
    duration: u64,
    /// Drives the nemesis and the workers' work times: the same seed, the same plan.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 5)]
    workers: u32,
    /// The lock's lease (etcd's are whole seconds, at least 2 s; ZooKeeper's session
    /// timeout, at least 2 s).
    #[arg(long, default_value = "2s", value_parser = duration_ms)]
    ttl: u64,
    /// The longest work between a worker's read and its write.
    #[arg(long, default_value = "50ms", value_parser = duration_ms)]
    work: u64,
    /// The last stretch without faults (default: a fifth of the run, at least 3 TTLs).
    #[arg(long, value_parser = duration_ms)]
    recovery: Option<u64>,
    /// Faults to inject: a comma-separated subset of pause, crash, delay; or none
    /// [default: pause,crash,delay]. Not for the clusters (fenced-cluster,
    /// etcd-cluster, zookeeper-ensemble), which take --nemesis.
    #[arg(long)]
    faults: Option<String>,
    /// Members of fenced-cluster: 3 or 5 [default: 3].
    #[arg(long)]
    nodes: Option<u32>,
    /// The faults against a cluster (fenced-cluster, etcd-cluster, zookeeper-ensemble):
    /// a comma-separated subset of kill, pause, partition, delay, clock; or none
    /// [default: all of them the target takes]. clock strikes fenced-cluster only, in a
    /// build with the test-only fault-injection feature: etcd (a static Go binary) is
    /// out of faketime's reach, and ZooKeeper's is not built.
    #[arg(long)]
    nemesis: Option<String>,
    /// The Python interpreter the python targets' workers run with: one that imports
    /// the client (`pip install ./clients/python`).
    #[arg(long, env = "FENCED_PYTHON", default_value = "python3", value_name = "PATH")]
    python: PathBuf,
    /// The TypeScript client's package directory, built (`npm ci && npm run build`),
    /// whose worker the node targets run.
    #[arg(long, env = "FENCED_NODE_CLIENT", default_value = "clients/typescript", value_name = "DIR")]
    node_client: PathBuf,
    /// What the workers do: counter (take the lock, increment once, release) or elect
    /// (campaign as leader, increment for a few rounds while leading, asking before
    /// each round whether it still leads, then resign; Fenced's locks with this
    /// binary's workers only).
    #[arg(long, default_value = "counter", value_parser = |s: &str| Workload::parse(s))]
    workload: Workload,
    /// Write every operation and fault as JSON lines to this file.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

/// The worker processes' entry point (`fenced torture-worker SPEC`), not for people.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The worker's settings as JSON.
    spec: String,
}

pub fn run_worker(a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let spec: WorkerSpec = serde_json::from_str(&a.spec).context("a torture worker's spec")?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    rt.block_on(worker::run(spec, &mut out))?;
    Ok(ExitCode::SUCCESS)
}

pub fn run(a: TortureArgs, g: &Global) -> anyhow::Result<ExitCode> {
    let configs = configs(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut reports = Vec::new();
    if let Some(p) = &a.history {
        history_path_usable(p)?;
    }
    // Created once the first run is done: a run refused before it starts (a peer or a
    // client not installed) leaves an earlier history as it was.
    let mut history: Option<std::io::BufWriter<std::fs::File>> = None;
    let mut skipped: Vec<(Target, String)> = Vec::new();
    for cfg in &configs {
        // Comparing, a row whose peer is not installed is skipped with the reason; a
        // target asked for alone fails with it (below, when it starts).
        if let (Some(_), Some(why)) = (&a.compare, cfg.target.missing()) {
            eprintln!("skipped {}: {why}", cfg.target);
            skipped.push((cfg.target, why));
            continue;
        }
        let report = match rt.block_on(one(cfg))? {
            Some(r) => r,
            None => {
                eprintln!("interrupted: every service and worker this run started has been stopped");
                return Ok(ExitCode::from(130));
            }
        };
        if let Some(p) = &a.history {
            let h = match &mut history {
                Some(h) => h,
                None => history.insert(std::io::BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("create {}", p.display()))?,
                )),
            };
            write_history(h, &report)?;
        }
        reports.push(report);
    }
    if let Some(mut h) = history {
        h.flush()?;
    }
    print_reports(&a, g, &reports, &skipped)?;
    // Fencing on and unsafe is a bug in Fenced (or in its adapter): say so and fail.
    let broken: Vec<&TortureReport> = reports.iter().filter(|r| r.fencing && !r.safe).collect();
    for r in &broken {
        eprintln!("error: {} lost safety with fencing on (seed {}):", r.target, r.seed);
        for p in &r.proofs {
            eprintln!("  {p}");
        }
    }
    Ok(if broken.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// One run's settings for each target asked for, checked.
fn configs(a: &TortureArgs) -> anyhow::Result<Vec<TortureConfig>> {
    let targets = targets(a)?;
    let faults = parse_faults(a.faults.as_deref().unwrap_or("pause,crash,delay"))
        .map_err(|e| BadArgument::error("--faults", e))?;
    let nemesis = nemesis(a, &targets)?;
    // Asked for by name, a clock fault on a peer cluster is refused (by `validate`);
    // by default, they go without it.
    let nemesis_of = |t: Target| {
        let clock = nemesis.clock && (t.fenced_cluster() || a.nemesis.is_some());
        Nemesis { clock, ..nemesis }
    };
    let duration = Duration::from_millis(a.duration);
    let ttl = Duration::from_millis(a.ttl);
    let recovery = a.recovery.map(Duration::from_millis).unwrap_or_else(|| (duration / 5).max(ttl * 3));
    let configs: Vec<TortureConfig> = targets
        .iter()
        .map(|&target| TortureConfig {
            target,
            duration,
            seed: a.seed,
            workers: a.workers,
            ttl,
            work: Duration::from_millis(a.work),
            recovery,
            faults,
            nodes: if target.fenced_cluster() || target.cluster() { a.nodes.unwrap_or(3) } else { 1 },
            nemesis: nemesis_of(target),
            fenced_bin: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("fenced")),
            python: a.python.clone(),
            node_client: a.node_client.clone(),
            workload: a.workload,
        })
        .collect();
    for c in &configs {
        c.validate().map_err(|e| BadArgument::error("torture", e))?;
    }
    Ok(configs)
}

/// The targets of `--compare`, or the one of `--target`.
fn targets(a: &TortureArgs) -> anyhow::Result<Vec<Target>> {
    let targets = match &a.compare {
        // `all`: the one-server rows; a cluster and the other clients' rows are asked
        // for by name.
        Some(list) if list == "all" => Ok(Target::ALL
            .into_iter()
            .filter(|t| !t.fenced_cluster() && !t.cluster() && t.client_language().is_none())
            .collect()),
        Some(list) => list.split(',').map(|t| t.trim().parse()).collect::<Result<_, _>>(),
        None => a.target.parse().map(|t| vec![t]),
    }
    .map_err(|e: String| BadArgument::error(if a.compare.is_some() { "--compare" } else { "--target" }, e))?;
    Ok(targets)
}

/// The clusters' faults, once `--faults`, `--nemesis` and `--nodes` are checked
/// against the targets.
fn nemesis(a: &TortureArgs, targets: &[Target]) -> anyhow::Result<Nemesis> {
    let clusters: Vec<&Target> = targets.iter().filter(|t| t.fenced_cluster() || t.cluster()).collect();
    if let (Some(t), Some(_)) = (clusters.first(), &a.faults) {
        return Err(BadArgument::error("--faults", format!("{t} takes --nemesis, not --faults")));
    }
    if clusters.is_empty() && a.nemesis.is_some() {
        return Err(BadArgument::error(
            "--nemesis",
            "--nemesis is for the clusters: fenced-cluster, etcd-cluster, zookeeper-ensemble",
        ));
    }
    if !targets.iter().any(|t| t.fenced_cluster()) && a.nodes.is_some() {
        return Err(BadArgument::error("--nodes", "--nodes is for --target fenced-cluster"));
    }
    let default_nemesis = if cfg!(feature = "fault-injection") {
        "kill,pause,partition,delay,clock"
    } else {
        "kill,pause,partition,delay"
    };
    let nemesis = Nemesis::parse(a.nemesis.as_deref().unwrap_or(default_nemesis))
        .map_err(|e| BadArgument::error("--nemesis", e))?;
    if nemesis.clock && !cfg!(feature = "fault-injection") {
        return Err(BadArgument::error(
            "--nemesis",
            "the clock nemesis needs a fenced built with the test-only fault-injection feature",
        ));
    }
    Ok(nemesis)
}

/// Refuses, before any run, a history path that could not be written: a directory, or
/// one in a directory that does not exist.
fn history_path_usable(p: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(!p.is_dir(), "--history {} is a directory", p.display());
    let parent = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    anyhow::ensure!(parent.is_dir(), "--history {}: {} is not a directory", p.display(), parent.display());
    Ok(())
}

/// A run's operations and faults as JSON lines, each with its target.
fn write_history(h: &mut impl Write, report: &TortureReport) -> anyhow::Result<()> {
    for op in &report.history {
        serde_json::to_writer(&mut *h, &serde_json::json!({ "target": report.target, "op": op }))?;
        h.write_all(b"\n")?;
    }
    for f in &report.faults {
        serde_json::to_writer(&mut *h, &serde_json::json!({ "target": report.target, "fault": f }))?;
        h.write_all(b"\n")?;
    }
    Ok(())
}

/// The reports as JSON, as a comparison table, or as one run's text.
fn print_reports(
    a: &TortureArgs,
    g: &Global,
    reports: &[TortureReport],
    skipped: &[(Target, String)],
) -> anyhow::Result<()> {
    if g.json() {
        let v = if a.compare.is_some() { serde_json::to_value(reports)? } else { serde_json::to_value(&reports[0])? };
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.compare.is_some() {
        print!("{}", table(reports));
        for (target, why) in skipped {
            println!("{:<16} skipped: {why}", target.name());
        }
    } else {
        print!("{}", text(&reports[0]));
    }
    Ok(())
}

/// One run with a progress bar; `None` when interrupted (everything already stopped).
async fn one(cfg: &TortureConfig) -> anyhow::Result<Option<TortureReport>> {
    let (tx, rx) = watch::channel(Progress::default());
    let bar = progress_bar("torture", cfg.duration.as_millis() as u64, cfg.target.name().to_owned());
    let ticker = follow(&bar, rx, |p: &Progress| {
        (p.elapsed_ms, format!("{:.0} s, {} ops, {} faults", p.elapsed_ms as f64 / 1000.0, p.ops, p.faults))
    });
    let result = tokio::select! {
        r = torture::run(cfg, tx) => Some(r),
        _ = interrupted() => None,
    };
    ticker.abort();
    bar.finish_and_clear();
    result.transpose()
}

fn parse_faults(s: &str) -> Result<Faults, String> {
    let mut f = Faults { pause: false, crash: false, delay: false };
    if s == "none" {
        return Ok(f);
    }
    for part in s.split(',').map(str::trim) {
        match part {
            "pause" => f.pause = true,
            "crash" => f.crash = true,
            "delay" => f.delay = true,
            other => return Err(format!("unknown fault '{other}' (pause, crash, delay, or none)")),
        }
    }
    Ok(f)
}

fn regressions(r: &TortureReport) -> String {
    r.token_regressions.map_or_else(|| "n/a".into(), |n| n.to_string())
}

fn verdict(r: &TortureReport) -> &'static str {
    match (r.safe, r.fencing) {
        (true, _) => "safe",
        (false, true) => "UNSAFE (a bug)",
        (false, false) => "unsafe",
    }
}

fn text(r: &TortureReport) -> String {
    let mut s = format!(
        "torture {}: {} workload, seed {}, {:.1} s, {} workers, lease {} ms, fencing {}\n",
        r.target,
        r.workload,
        r.seed,
        r.duration_ms as f64 / 1000.0,
        r.workers,
        r.ttl_ms,
        if r.fencing { "on" } else { "off" }
    );
    s += &format!(
        "  faults: {} pauses, {} restarts, {} network delays\n",
        r.pauses_injected, r.restarts_injected, r.delays_injected
    );
    if let (Some(kills), Some(freezes)) = (r.leader_kills, r.leader_freezes) {
        s += &format!("  of the cluster's leader: {kills} kill -9, {freezes} freezes\n");
    }
    s += &format!(
        "  {} grants; {} writes, {} acknowledged, {} indeterminate; final counter {}\n",
        r.grants, r.writes_attempted, r.acknowledged, r.writes_indeterminate, r.final_value
    );
    s += &format!(
        "  lost updates {}, zombie writes {}, stale writes rejected {}, token regressions {}\n",
        r.lost_updates,
        r.zombie_writes,
        r.stale_writes_rejected,
        regressions(r)
    );
    if let Some(c) = &r.cluster {
        s += &format!(
            "  cluster: {} members, nemesis {}; {} leader changes, failover p50 {} ms p99 {} ms over {}, {} ms \
             unavailable, {} partitions, {} clock faults\n",
            r.nodes,
            c.nemesis,
            c.leader_changes,
            c.failover_ms_p50.map_or_else(|| "-".into(), |v| v.to_string()),
            c.failover_ms_p99.map_or_else(|| "-".into(), |v| v.to_string()),
            c.failovers_measured,
            c.unavailable_ms,
            c.partitions_injected,
            c.clock_faults_injected
        );
        s += &format!("  replicas: {}; {} plain reads answered\n", c.replicas, c.plain_reads);
    }
    s += &format!(
        "  overlapping holders {}, duplicate tokens {}, late lost signals {}\n",
        r.overlapping_holders.map_or_else(|| "n/a".into(), |n| n.to_string()),
        r.duplicate_tokens.map_or_else(|| "n/a".into(), |n| n.to_string()),
        r.late_lost_signals.map_or_else(|| "n/a".into(), |n| n.to_string())
    );
    s += &format!("  verdict: {}\n", verdict(r));
    for p in r.proofs.iter().take(5) {
        s += &format!("    {p}\n");
    }
    s
}

fn table(reports: &[TortureReport]) -> String {
    let Some(first) = reports.first() else { return String::new() };
    let mut s = format!(
        "torture --compare: {} workload, seed {}, {:.1} s each, {} workers, lease {} ms\n\n",
        first.workload,
        first.seed,
        first.duration_ms as f64 / 1000.0,
        first.workers,
        first.ttl_ms
    );
    s += &format!(
        "{:<16} {:>7} {:>6} {:>6} {:>6} {:>7} {:>8} {:>6} {:>8} {:>6} {:>11}  {}\n",
        "target",
        "fencing",
        "acked",
        "final",
        "lost",
        "zombie",
        "rejected",
        "pauses",
        "restarts",
        "delays",
        "regressions",
        "verdict"
    );
    for r in reports {
        s += &format!(
            "{:<16} {:>7} {:>6} {:>6} {:>6} {:>7} {:>8} {:>6} {:>8} {:>6} {:>11}  {}\n",
            r.target.name(),
            if r.fencing { "on" } else { "off" },
            r.acknowledged,
            r.final_value,
            r.lost_updates,
            r.zombie_writes,
            r.stale_writes_rejected,
            r.pauses_injected,
            r.restarts_injected,
            r.delays_injected,
            regressions(r),
            verdict(r)
        );
    }
    s
}
