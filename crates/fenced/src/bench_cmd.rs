//! `fenced bench`: load against Fenced and the lock services people run instead, one
//! table with the durability of every row.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fenced_lab::bench::{self, BenchConfig, BenchReport, BenchTarget, Peer, Progress, Workload};
use tokio::sync::watch;

use crate::args::{duration_ms, BadArgument, Global};
use crate::term::{follow, interrupted, progress_bar};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The system to load: fenced, etcd, zookeeper, redis, redis-aof or postgres; or
    /// three members of one: fenced-3, etcd-3, zookeeper-3 (uncontended and contended
    /// only). Without --spawn, --endpoint says where it runs (default: the target's
    /// usual port on 127.0.0.1; a three-member target: every member's, comma-separated).
    #[arg(long, default_value = "fenced")]
    target: String,
    /// Several targets in turn, one table with ratios against Fenced: a comma-separated
    /// list, or `all`. Needs --spawn.
    #[arg(long, value_name = "TARGETS")]
    compare: Option<String>,
    /// Start the targets on free loopback ports (temporary data, stopped afterwards).
    #[arg(long)]
    spawn: bool,
    /// What the clients do: uncontended, contended, keepalive, store; comma-separated
    /// for several. Default: uncontended.
    #[arg(long)]
    workload: Option<String>,
    /// Shorthand for --workload contended.
    #[arg(long)]
    contended: bool,
    /// Clients, each with its own connection (keepalive: connections).
    #[arg(long, default_value_t = 16)]
    clients: u32,
    /// How long each run is measured.
    #[arg(long, default_value = "10s", value_parser = duration_ms)]
    duration: u64,
    /// How long a holder keeps the lock before releasing it.
    #[arg(long, default_value = "0ms", value_parser = duration_ms)]
    hold: u64,
    /// Operations per second over all clients: an open loop, latency counted from each
    /// operation's due time. Default: a closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Leases of the keepalive workload, each kept alive at a third of --ttl.
    #[arg(long, default_value_t = 10_000)]
    leases: u32,
    /// Every lease's TTL (etcd: whole seconds, at least 2s; zookeeper: the session
    /// timeout, 4s to 40s).
    #[arg(long, default_value = "10s", value_parser = duration_ms)]
    ttl: u64,
    /// Runs per target and workload; the figures are the median run's.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
}

pub fn run(a: BenchArgs, g: &Global) -> anyhow::Result<ExitCode> {
    let targets: Vec<BenchTarget> = match &a.compare {
        Some(list) if list == "all" => Ok(BenchTarget::ALL.to_vec()),
        Some(list) => list.split(',').map(|t| t.trim().parse()).collect(),
        None => a.target.parse().map(|t| vec![t]),
    }
    .map_err(|e: String| BadArgument::error(if a.compare.is_some() { "--compare" } else { "--target" }, e))?;
    if a.compare.is_some() && !a.spawn {
        return Err(BadArgument::error(
            "--compare",
            "starts every target itself: add --spawn (or bench one target at a time with --endpoint)",
        ));
    }
    let workloads: Vec<Workload> = match (&a.workload, a.contended) {
        (Some(_), true) => return Err(BadArgument::error("--contended", "is --workload contended: give one of them")),
        (None, true) => vec![Workload::Contended],
        (None, false) => vec![Workload::Uncontended],
        (Some(list), false) => list
            .split(',')
            .map(|w| w.trim().parse())
            .collect::<Result<_, String>>()
            .map_err(|e| BadArgument::error("--workload", e))?,
    };
    if !(1..=9).contains(&a.repeat) {
        return Err(BadArgument::error("--repeat", format!("must be between 1 and 9, not {}", a.repeat)));
    }
    let mut configs = Vec::new();
    let mut skipped: Vec<(BenchTarget, String)> = Vec::new();
    for &target in &targets {
        for &workload in &workloads {
            let c = BenchConfig {
                target,
                workload,
                clients: a.clients,
                duration: Duration::from_millis(a.duration),
                hold: Duration::from_millis(a.hold),
                rate: a.rate,
                leases: a.leases,
                ttl: Duration::from_millis(a.ttl),
            };
            if a.compare.is_some() && !target.supports(workload) {
                continue; // a comparison runs each workload where it is built
            }
            // Comparing, a peer that is not installed is skipped with the reason.
            if let (Some(_), true, Some(why)) = (&a.compare, a.spawn, target.missing()) {
                if !skipped.iter().any(|(t, _)| *t == target) {
                    eprintln!("skipped {}: {why}", target.name());
                    skipped.push((target, why));
                }
                continue;
            }
            c.validate().map_err(|e| BadArgument::error("bench", e))?;
            configs.push(c);
        }
    }
    let endpoint = endpoint_for(targets[0], &g.endpoint);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let reports = rt.block_on(async {
        tokio::select! {
            r = run_all(&configs, a.spawn, &endpoint, a.repeat) => Some(r),
            _ = interrupted() => None,
        }
    });
    let Some(reports) = reports.transpose()? else {
        eprintln!("interrupted: every service this run started has been stopped");
        return Ok(ExitCode::from(130));
    };

    if g.json() {
        let v = if reports.len() == 1 && a.compare.is_none() {
            serde_json::to_value(&reports[0])?
        } else {
            serde_json::to_value(&reports)?
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.compare.is_some() {
        print!("{}", table(&reports));
        for (target, why) in &skipped {
            println!("{:<12} skipped: {why}", target.name());
        }
    } else {
        for r in &reports {
            print!("{}", text(r));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--endpoint` as given, unless it is Fenced's default and the target is not Fenced:
/// then the target's own usual address.
fn endpoint_for(target: BenchTarget, given: &str) -> String {
    let fenced_default =
        given == BenchTarget::Fenced.default_endpoint() || std::env::var("FENCED_ENDPOINT").is_ok_and(|e| e == given);
    if target != BenchTarget::Fenced && fenced_default {
        target.default_endpoint().to_owned()
    } else {
        given.to_owned()
    }
}

/// Every configuration in turn; a spawned target lives for its own configurations
/// only, so the next one runs on a machine without it.
async fn run_all(
    configs: &[BenchConfig],
    spawn: bool,
    endpoint: &str,
    repeat: u32,
) -> anyhow::Result<Vec<BenchReport>> {
    let mut reports = Vec::new();
    let mut peer: Option<Peer> = None;
    for cfg in configs {
        if peer.as_ref().is_none_or(|p| p.target != cfg.target) {
            drop(peer.take()); // stop the previous target first
            peer = Some(if spawn {
                let (target, bin) = (cfg.target, std::env::current_exe().unwrap_or_else(|_| PathBuf::from("fenced")));
                tokio::task::spawn_blocking(move || Peer::spawn(target, &bin)).await??
            } else {
                Peer::external(cfg.target, endpoint)
            });
        }
        let p = peer.as_ref().expect("a peer was just set");
        let mut runs = Vec::new();
        for i in 0..repeat {
            let label = if repeat > 1 { format!(" ({}/{repeat})", i + 1) } else { String::new() };
            runs.push(one(cfg, p, &label).await?);
        }
        if let Some(mut r) = bench::median(runs) {
            if spawn {
                r = tokio::task::spawn_blocking(move || bench::add_log_ceiling(&mut r).map(|()| r)).await??;
            }
            reports.push(r);
        }
    }
    Ok(reports)
}

/// One run with a progress bar on stderr.
async fn one(cfg: &BenchConfig, peer: &Peer, label: &str) -> anyhow::Result<BenchReport> {
    let (tx, rx) = watch::channel(Progress::default());
    let total = match cfg.workload {
        // The creation pass (a third of the TTL) comes before the measured window.
        Workload::Keepalive => cfg.duration + cfg.ttl / 3,
        _ => cfg.duration,
    };
    let bar = progress_bar("bench", total.as_millis() as u64, format!("{} {}{label}", cfg.target, cfg.workload));
    let ticker = follow(&bar, rx, |p: &Progress| {
        (p.elapsed_ms, format!("{:.0} s, {} ops", p.elapsed_ms as f64 / 1000.0, p.ops))
    });
    let r = bench::run(cfg, peer, tx).await;
    ticker.abort();
    bar.finish_and_clear();
    r
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn cpu(r: &BenchReport) -> String {
    let mut s = String::new();
    if let (Some(c), Some(per)) = (r.server_cpu_s, r.server_cpu_us_per_op) {
        let cores = c / (r.duration_ms.max(1) as f64 / 1000.0);
        s += &format!("server CPU {c:.2} s ({cores:.2} cores, {per:.1} µs per op)");
    }
    if let Some(c) = r.client_cpu_s {
        s += &format!("{}bench CPU {c:.2} s", if s.is_empty() { "" } else { "; " });
    }
    s
}

/// The row's share of its log's zero-work ceiling, when it was measured.
fn ceiling(r: &BenchReport) -> Option<String> {
    let (ceiling, share) = (r.log_ceiling_ops_per_s?, r.of_log_ceiling?);
    Some(format!(
        "{:.0}% of its log's zero-work ceiling ({ceiling:.0} ops/s: a preallocated log segment written as the server writes it, the same clients, nothing else, measured after it)",
        share * 100.0
    ))
}

fn text(r: &BenchReport) -> String {
    let mode = match r.rate_per_s {
        Some(rate) => format!("open loop at {rate:.0}/s"),
        None => "closed loop".into(),
    };
    let mut s = format!(
        "bench {} {}: {} clients, {mode}, {:.1} s, hold {} ms\n",
        r.target,
        r.workload,
        r.clients,
        r.duration_ms as f64 / 1000.0,
        r.hold_ms
    );
    s += &format!("  durability: {}\n  recipe: {}\n", r.durability, r.recipe);
    s += &format!(
        "  {:.0} ops/s ({} ops, {} errors); latency p50 {}, p99 {}, p99.9 {}, max {}\n",
        r.ops_per_s,
        r.ops,
        r.errors,
        ms(r.p50_us),
        ms(r.p99_us),
        ms(r.p999_us),
        ms(r.max_us)
    );
    if let (Some(a50), Some(a99)) = (r.acquire_p50_us, r.acquire_p99_us) {
        s += &format!("  acquire alone: p50 {}, p99 {}\n", ms(a50), ms(a99));
    }
    if let (Some(l50), Some(l99)) = (r.send_lag_p50_us, r.send_lag_p99_us) {
        s += &format!("  sent after the due time by: p50 {}, p99 {} (included in the latencies)\n", ms(l50), ms(l99));
    }
    if let (Some(lo), Some(hi), Some(st)) = (r.grants_per_client_min, r.grants_per_client_max, r.starved_clients) {
        s += &format!("  cycles per client: min {lo}, max {hi}; starved clients {st}\n");
    }
    if let (Some(n), Some(ttl), Some(fe), Some(late)) = (r.leases, r.ttl_ms, r.false_expiries, r.late_keepalives) {
        s += &format!(
            "  {n} leases, TTL {ttl} ms, each kept alive every {} ms; false expiries {fe}, late keepalives {late}, unsent at the end {}\n",
            ttl / 3,
            r.keepalives_unsent.unwrap_or(0)
        );
    }
    let c = cpu(r);
    if !c.is_empty() {
        s += &format!("  {c}\n");
    }
    if let Some(line) = ceiling(r) {
        s += &format!("  {line}\n");
    }
    if let Some(e) = &r.first_error {
        s += &format!("  first error: {e}\n");
    }
    if r.runs_ops_per_s.len() > 1 {
        let runs: Vec<String> = r.runs_ops_per_s.iter().map(|x| format!("{x:.0}")).collect();
        s += &format!("  runs: {} ops/s (the median run is shown)\n", runs.join(", "));
    }
    s
}

fn table(reports: &[BenchReport]) -> String {
    let mut s = String::new();
    let mut workloads: Vec<Workload> = Vec::new();
    for r in reports {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
    }
    for w in workloads {
        let rows: Vec<&BenchReport> = reports.iter().filter(|r| r.workload == w).collect();
        // Each row against Fenced of its own size (one node, or three members).
        let fenced = |t: BenchTarget| rows.iter().find(|r| r.target == t.fenced_peer()).map(|r| r.ops_per_s);
        let first = rows[0];
        s += &format!(
            "bench --compare, {w}: {} clients, {}, {:.0} s per run{}\n",
            first.clients,
            if first.rate_per_s.is_some() { "open loop" } else { "closed loop" },
            first.duration_ms as f64 / 1000.0,
            if first.runs_ops_per_s.len() > 1 {
                format!(", median of {}", first.runs_ops_per_s.len())
            } else {
                String::new()
            }
        );
        s += &format!(
            "{:<12} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11}  {}\n",
            "target", "ops/s", "fenced÷", "p50", "p99", "p99.9", "max", "acquire p99", "per client", "durability"
        );
        for r in &rows {
            let ratio = match fenced(r.target) {
                Some(f) if r.ops_per_s > 0.0 => format!("{:.2}×", f / r.ops_per_s),
                _ => "n/a".into(),
            };
            let spread = match (r.grants_per_client_min, r.grants_per_client_max) {
                (Some(lo), Some(hi)) => format!("{lo}..{hi}"),
                _ => match r.false_expiries {
                    Some(fe) => format!("{fe} expired"),
                    None => "".into(),
                },
            };
            s += &format!(
                "{:<12} {:>10.0} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11}  {}\n",
                r.target.name(),
                r.ops_per_s,
                ratio,
                ms(r.p50_us),
                ms(r.p99_us),
                ms(r.p999_us),
                ms(r.max_us),
                r.acquire_p99_us.map(ms).unwrap_or_default(),
                spread,
                r.durability
            );
            let c = cpu(r);
            if !c.is_empty() && w == Workload::Keepalive {
                s += &format!("{:<12} {c}\n", "");
            }
            if let Some(line) = ceiling(r) {
                s += &format!("{:<12} {line}\n", "");
            }
        }
        s += "\n";
    }
    s
}
