//! `fenced sim sweep`: zombie writes and lost updates per lease length (or lock-delay,
//! or wall-clock step), fencing off and on, over a range of seeds, as a table, CSV,
//! JSON or an SVG chart.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use fenced_sim::sweep::{self, Axis, Spec};
use fenced_sim::{Config, Scenario};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{duration_ms, BadArgument, Global};

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// The knob to turn: lease, lock-delay or clock-step.
    #[arg(long, default_value = "lease", value_parser = axis)]
    over: Axis,
    /// Lease lengths as multiples of the base lease, comma-separated (--over lease).
    #[arg(long, default_value = "1,2,4,8,16")]
    leases: String,
    /// Lock-delays or clock steps, comma-separated, like 0,500ms,1s,2s (--over
    /// lock-delay: 0,250ms,500ms,1s,2s,4s; clock-step: 250ms,500ms,1s,2s,4s).
    #[arg(long)]
    values: Option<String>,
    /// Seeds, as an inclusive range like 1..20.
    #[arg(long, default_value = "1..50")]
    seeds: String,
    /// The scenario whose other settings the sweep keeps (by default: default,
    /// lock-delay or clock-drift, after the knob).
    #[arg(long, value_parser = crate::sim_cmd::scenario)]
    scenario: Option<Scenario>,
    /// The base lease, like 1s.
    #[arg(long, value_parser = duration_ms)]
    lease: Option<u64>,
    #[arg(long)]
    clients: Option<u32>,
    /// Virtual time per run: long, because what a long lease leaves is the rare long pause.
    #[arg(long, value_parser = duration_ms, default_value = "10m")]
    duration: u64,
    /// Print CSV instead of a table.
    #[arg(long)]
    csv: bool,
    /// Also write the chart as SVG to this file.
    #[arg(long)]
    svg: Option<String>,
}

fn parse_multiples(s: &str) -> anyhow::Result<Vec<u64>> {
    s.split(',')
        .map(|p| p.trim().parse::<u64>().ok().filter(|m| (1..=1_000).contains(m)))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| {
            BadArgument::error("--leases", format!("'{s}' is not a list of multiples from 1 to 1000, like 1,2,4,8"))
        })
}

fn axis(s: &str) -> Result<Axis, String> {
    Axis::parse(s).ok_or_else(|| format!("unknown knob '{s}': choose lease, lock-delay or clock-step"))
}

fn parse_values(s: &str) -> anyhow::Result<Vec<u64>> {
    s.split(',')
        .map(duration_ms)
        .collect::<Result<Vec<u64>, String>>()
        .map_err(|e| BadArgument::error("--values", format!("'{s}' is not a list of durations like 0,500ms,1s: {e}")))
}

fn parse_seeds(s: &str) -> anyhow::Result<std::ops::RangeInclusive<u64>> {
    let bad = || BadArgument::error("--seeds", format!("'{s}' is not a range like 1..20"));
    let (a, b) = s.split_once("..").ok_or_else(bad)?;
    let b = b.strip_prefix('=').unwrap_or(b);
    let (a, b): (u64, u64) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
    if a > b {
        return Err(bad());
    }
    Ok(a..=b)
}

pub fn run(a: SweepArgs, g: &Global) -> anyhow::Result<ExitCode> {
    let scenario = a.scenario.unwrap_or(a.over.scenario());
    let mut base = Config::new(scenario, 0);
    base.lease_ms = a.lease.unwrap_or(fenced_sim::LEASE_MS_DEFAULT);
    if let Some(c) = a.clients {
        base.clients = c;
    }
    base.duration_ms = a.duration;
    let values = match (a.over, &a.values) {
        (Axis::Lease, _) => parse_multiples(&a.leases)?,
        (_, Some(v)) => parse_values(v)?,
        (axis, None) => axis.values(),
    };
    let spec = Spec { base, axis: a.over, values, seeds: parse_seeds(&a.seeds)? };
    spec.validate().map_err(|e| BadArgument::error(e.field, e.message))?;
    let bar = ProgressBar::new(spec.runs());
    bar.set_style(
        ProgressStyle::with_template("{spinner} sweep {bar:40} {pos}/{len} runs, {elapsed} elapsed, ~{eta} left")
            .expect("valid template"),
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = sweep::run(&spec, threads, &|| bar.inc(1))?;
    bar.finish_and_clear();
    if let Some(path) = &a.svg {
        let knob = match a.over {
            Axis::Lease => "lease length",
            Axis::LockDelay => "lock-delay",
            Axis::ClockStep => "wall-clock step",
        };
        let title =
            format!("Zombie writes vs {knob}: {}, seeds {}..{}", scenario.name(), spec.seeds.start(), spec.seeds.end());
        std::fs::write(path, sweep::to_svg(&rows, &title)).with_context(|| format!("cannot write {path}"))?;
    }
    let out = if g.json() {
        sweep::to_json(&rows)
    } else if a.csv {
        sweep::to_csv(&rows)
    } else {
        sweep::to_text(&rows)
    };
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}
