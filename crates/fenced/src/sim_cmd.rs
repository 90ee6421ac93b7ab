//! `fenced sim` and `fenced sim sweep`: the laboratory on the command line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use fenced_sim::trace::JsonLines;
use fenced_sim::{Config, PauseModel, Record, Replication, Scenario, ServiceClock, ServiceRestart, Summary};

use crate::args::{duration_ms, on_off, BadArgument, Global};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    sub: Option<SimSub>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum SimSub {
    /// Zombie writes and lost updates per lease multiple, fencing off and on, over seeds.
    Sweep(crate::sweep_cmd::SweepArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// default, fencing, long-lease, renewal, occ, network-delay, idempotent,
    /// partitioned, clock-drift, lock-delay, service-crash or split-brain.
    #[arg(long, default_value = "default", value_parser = scenario)]
    pub scenario: Scenario,
    /// The one number that reproduces the run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub clients: Option<u32>,
    /// Independent locks (and counters); client i works on lock i mod N.
    #[arg(long)]
    pub locks: Option<u32>,
    /// Virtual time to simulate, like 90s or 10m.
    #[arg(long, value_parser = duration_ms)]
    pub duration: Option<u64>,
    /// The base lease (long-lease runs with four times it), like 750ms.
    #[arg(long, value_parser = duration_ms)]
    pub lease: Option<u64>,
    /// Renew while holding at this fraction of the lease, like 0.5.
    #[arg(long)]
    pub renew_at: Option<f64>,
    /// Tokens sent to and checked by the resource.
    #[arg(long, value_parser = on_off)]
    pub fencing: Option<bool>,
    /// mixed, gc, vm, cgroup, network or none.
    #[arg(long, value_parser = pause_model)]
    pub pauses: Option<PauseModel>,
    /// Chubby's lock-delay after an expiry, like 1s (lock-delay's default).
    #[arg(long, value_parser = duration_ms)]
    pub lock_delay: Option<u64>,
    /// The clock the lock service times leases on: monotonic, or wall (clock-drift's
    /// default), which steps forward now and then.
    #[arg(long, value_parser = service_clock)]
    pub clock: Option<ServiceClock>,
    /// How far one step of the wall clock jumps, like 2s.
    #[arg(long, value_parser = duration_ms)]
    pub clock_step: Option<u64>,
    /// What a crashed lock service restarts from (service-crash): durable, or empty
    /// (its disk lost: the negative control).
    #[arg(long, value_parser = service_restart)]
    pub service_restart: Option<ServiceRestart>,
    /// How split-brain's replicated lock service decides who serves: primary-backup or
    /// majority.
    #[arg(long, value_parser = replication)]
    pub replication: Option<Replication>,
    /// Write every event as a JSON line to this file.
    #[arg(long)]
    pub trace: Option<String>,
    /// Draw the first zombie write (or the first rejected one) as a sequence diagram.
    #[arg(long)]
    pub diagram: bool,
    /// Time the run and print events per second (no trace, no diagram).
    #[arg(long)]
    pub bench: bool,
}

pub fn scenario(s: &str) -> Result<Scenario, String> {
    Scenario::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        format!("unknown scenario '{s}': choose one of {}", names.join(", "))
    })
}

fn service_clock(s: &str) -> Result<ServiceClock, String> {
    ServiceClock::parse(s).ok_or_else(|| format!("unknown clock '{s}': choose monotonic or wall"))
}

fn service_restart(s: &str) -> Result<ServiceRestart, String> {
    ServiceRestart::parse(s).ok_or_else(|| format!("unknown restart '{s}': choose durable or empty"))
}

fn replication(s: &str) -> Result<Replication, String> {
    Replication::parse(s).ok_or_else(|| format!("unknown replication '{s}': choose primary-backup or majority"))
}

fn pause_model(s: &str) -> Result<PauseModel, String> {
    PauseModel::parse(s).ok_or_else(|| {
        let names: Vec<&str> = PauseModel::ALL.iter().map(|s| s.name()).collect();
        format!("unknown pause model '{s}': choose one of {}", names.join(", "))
    })
}

impl RunArgs {
    /// The scenario's defaults with the flags laid over them.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut c = Config::new(self.scenario, self.seed);
        if let Some(l) = self.lease {
            c = c.with_base_lease(l);
        }
        if let Some(n) = self.clients {
            c.clients = n;
            if self.scenario == Scenario::Partitioned {
                c.locks = n; // one key per worker, unless --locks says otherwise
            }
        }
        if let Some(n) = self.locks {
            c.locks = n;
        }
        if let Some(d) = self.duration {
            c.duration_ms = d;
        }
        if let Some(f) = self.renew_at {
            c.renew_fraction = Some(f);
        }
        if let Some(f) = self.fencing {
            c.fencing = f;
        }
        if let Some(p) = self.pauses {
            c.pauses = p;
        }
        if let Some(d) = self.lock_delay {
            c.lock_delay_ms = d;
        }
        if let Some(k) = self.clock {
            c.clock = k;
        }
        if let Some(d) = self.clock_step {
            c.clock_step_ms = d;
        }
        if let Some(r) = self.service_restart {
            c.service_restart = r;
        }
        if let Some(r) = self.replication {
            c.replication = Some(r);
        }
        c.validate().map_err(|e| BadArgument::error(e.field, e.message))?;
        Ok(c)
    }
}

pub fn run(a: SimArgs, g: &Global) -> anyhow::Result<ExitCode> {
    if let Some(SimSub::Sweep(s)) = a.sub {
        return crate::sweep_cmd::run(s, g);
    }
    let a = a.run;
    let cfg = a.config()?;
    if a.bench {
        return bench(&cfg, g);
    }
    // One run serves the trace file and the diagram alike.
    let mut records: Option<Vec<Record>> = a.diagram.then(Vec::new);
    let summary = match &a.trace {
        Some(path) => {
            let file = File::create(path).with_context(|| format!("cannot create the trace file {path}"))?;
            let mut sink = (JsonLines::new(BufWriter::new(file)), records.take());
            let s = fenced_sim::run(&cfg, &mut sink)?;
            let (json, kept) = sink;
            json.finish().with_context(|| format!("writing the trace to {path}"))?;
            records = kept;
            s
        }
        None if records.is_some() => fenced_sim::run(&cfg, &mut records)?,
        None => fenced_sim::run(&cfg, &mut ())?,
    };
    let mut out = std::io::stdout().lock();
    if g.json() {
        writeln!(out, "{}", summary.to_json())?;
    } else {
        write!(out, "{}", text(&summary))?;
    }
    if a.diagram {
        let d = fenced_sim::diagram::render(records.as_deref().unwrap_or_default(), &summary);
        if g.json() {
            eprint!("{d}");
        } else {
            write!(out, "\n{d}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(cfg: &Config, g: &Global) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let s = fenced_sim::run(cfg, &mut ())?;
    let secs = started.elapsed().as_secs_f64();
    let rate = s.events as f64 / secs;
    if g.json() {
        println!(
            r#"{{"scenario":"{}","seed":{},"clients":{},"locks":{},"duration_ms":{},"events":{},"wall_s":{:.3},"events_per_s":{:.0}}}"#,
            cfg.scenario.name(),
            cfg.seed,
            cfg.clients,
            cfg.locks,
            cfg.duration_ms,
            s.events,
            secs,
            rate
        );
    } else {
        println!(
            "{} events in {:.3} s: {:.2} million events/s ({} clients, {} locks, {} ms virtual)",
            s.events,
            secs,
            rate / 1e6,
            cfg.clients,
            cfg.locks,
            cfg.duration_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The human summary.
pub fn text(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let renew = s.renew_fraction.map_or("no renewal".into(), |f| format!("renew at {f} of the lease"));
    let _ = writeln!(o, "scenario {}: {}", s.scenario.name(), s.scenario.describe());
    let _ = writeln!(
        o,
        "seed {}, {} clients, {} lock(s), {} ms virtual, lease {} ms, {}, fencing {}, pauses {}",
        s.seed,
        s.clients,
        s.locks,
        s.duration_ms,
        s.lease_ms,
        renew,
        if s.fencing { "on" } else { "off" },
        s.pause_model.name()
    );
    let _ = writeln!(o);
    let rows = [
        ("grants", s.grants, ""),
        ("lease expiries", s.lease_expiries, "holders whose lease ran out"),
        ("pauses", s.pauses, "GC, migration, throttling, held packets"),
        ("writes attempted", s.writes_attempted, ""),
        ("writes accepted", s.writes_accepted, ""),
        ("late writes", s.late_writes, "reached the resource after the writer's lease expired"),
        ("zombie writes", s.zombie_writes, "accepted under a token older than one already seen"),
        ("stale writes rejected", s.stale_writes_rejected, "refused by the fence gate"),
        ("lost updates", s.lost_updates, "acknowledged increments missing from the counter"),
    ];
    for (k, v, why) in rows {
        let line = format!("  {k:<22} {v:>8}   {why}");
        let _ = writeln!(o, "{}", line.trim_end());
    }
    for (k, v) in s.extras() {
        let why = match k {
            "delayed_messages" => "held in the network past their usual delay",
            "duplicates_absorbed" => "second copies of writes the resource did not apply again",
            "writes_per_s" => "writes accepted per virtual second",
            "clock_steps" => "forward steps of the lock service's wall clock",
            "early_expiries" => "leases ended sooner than their TTL after their last sign of life",
            "service_crashes" => "lock service crashes, each followed by a restart",
            "duplicate_tokens" => "grants of a token already granted for the same lock",
            "failovers" => "replicas that took over serving clients",
            _ => "",
        };
        let line = format!("  {:<22} {:>8}   {why}", k.replace('_', " "), v.trim_matches('"'));
        let _ = writeln!(o, "{}", line.trim_end());
    }
    let _ = writeln!(o, "  {:<22} {:>8}   acknowledged {}", "final counter", s.final_value, s.acknowledged);
    let _ = writeln!(o);
    match s.zombies.first() {
        None if s.is_safe() => {
            let _ = writeln!(o, "verdict: safe (no zombie write, no lost update)");
        }
        None => {
            let _ = writeln!(o, "verdict: UNSAFE: {} lost updates", s.lost_updates);
        }
        Some(z) => {
            let _ = writeln!(
                o,
                "verdict: UNSAFE. First zombie write at t={} ms: c{} wrote with token {} after the resource had seen {} (it had been paused {} ms).",
                z.t_ms, z.client, z.token, z.highest_seen, z.pause_ms
            );
            if let Some(m) = s.zombie_pause_ms_min {
                let _ = writeln!(
                    o,
                    "         The shortest pause behind a zombie write: {m} ms ({:.2} leases).",
                    m as f64 / s.lease_ms as f64
                );
            }
        }
    }
    o
}
