//! Sweeps: the same scenario over one knob and seeds, fencing off and on, to show a
//! point with numbers. Over lease lengths (the seed's point): longer leases make zombie
//! writes rarer, never zero; fencing makes them zero at every lease. Over Chubby's
//! lock-delay: rarer again, never zero. Over the size of a wall-clock step: once a step
//! outgrows what is left of a lease, zombie writes climb.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::trace::StopFlag;
use crate::{Config, ConfigError, Scenario, Summary};

mod svg;
mod table;

pub use svg::to_svg;
pub use table::{to_csv, to_json, to_text};

/// The knob a sweep turns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Axis {
    /// Lease lengths, as multiples of the base lease.
    Lease,
    /// Chubby's lock-delay, in ms (0: none).
    LockDelay,
    /// How far the lock service's wall clock steps, in ms.
    ClockStep,
}

impl Axis {
    pub const ALL: [Axis; 3] = [Axis::Lease, Axis::LockDelay, Axis::ClockStep];

    pub fn name(self) -> &'static str {
        match self {
            Axis::Lease => "lease",
            Axis::LockDelay => "lock-delay",
            Axis::ClockStep => "clock-step",
        }
    }

    pub fn parse(s: &str) -> Option<Axis> {
        Axis::ALL.into_iter().find(|a| a.name() == s)
    }

    /// The first column of the CSV and JSON rows.
    fn column(self) -> &'static str {
        match self {
            Axis::Lease => "lease_multiple",
            Axis::LockDelay => "lock_delay_ms",
            Axis::ClockStep => "clock_step_ms",
        }
    }

    /// The scenario whose settings a sweep over this knob keeps, unless told otherwise.
    pub fn scenario(self) -> Scenario {
        match self {
            Axis::Lease => Scenario::Default,
            Axis::LockDelay => Scenario::LockDelay,
            Axis::ClockStep => Scenario::ClockDrift,
        }
    }

    /// The values swept unless told otherwise.
    pub fn values(self) -> Vec<u64> {
        match self {
            Axis::Lease => vec![1, 2, 4, 8, 16],
            Axis::LockDelay => vec![0, 250, 500, 1_000, 2_000, 4_000],
            Axis::ClockStep => vec![250, 500, 1_000, 2_000, 4_000],
        }
    }
}

/// What to sweep.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Every other knob comes from here (its lease is the base lease).
    pub base: Config,
    pub axis: Axis,
    /// The knob's values: lease multiples, or milliseconds.
    pub values: Vec<u64>,
    pub seeds: RangeInclusive<u64>,
}

/// Totals for one value of the knob and one fencing setting, over all seeds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub axis: Axis,
    /// The knob's value: a lease multiple, or milliseconds.
    pub value: u64,
    pub lease_ms: u64,
    pub fencing: bool,
    pub seeds: u64,
    pub grants: u64,
    pub late_writes: u64,
    pub zombie_writes: u64,
    pub stale_writes_rejected: u64,
    pub lost_updates: u64,
    /// Seeds with at least one zombie write.
    pub unsafe_runs: u64,
}

impl Spec {
    /// Checks every configuration the sweep will run before running any.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.base.scenario.lockless() {
            let message = format!("{} takes no lock: there is no lease to sweep", self.base.scenario.name());
            return Err(ConfigError { field: "--scenario", message });
        }
        let none_zero = self.axis != Axis::LockDelay;
        if self.values.is_empty() || (none_zero && self.values.contains(&0)) {
            let (field, message) = match self.axis {
                Axis::Lease => ("--leases", "give one or more positive multiples, like 1,2,4,8"),
                _ => ("--values", "give one or more durations, like 250ms,1s,2s (a clock step above 0)"),
            };
            return Err(ConfigError { field, message: message.into() });
        }
        if self.seeds.is_empty() || self.seeds.end() - self.seeds.start() >= 100_000 {
            return Err(ConfigError {
                field: "--seeds",
                message: "give a range of 1 to 100000 seeds, like 1..20".into(),
            });
        }
        for v in &self.values {
            self.config(*v, false, *self.seeds.start()).validate()?;
        }
        Ok(())
    }

    pub fn runs(&self) -> u64 {
        self.values.len() as u64 * 2 * (self.seeds.end() - self.seeds.start() + 1)
    }

    fn config(&self, value: u64, fencing: bool, seed: u64) -> Config {
        let mut c = self.base.clone();
        match self.axis {
            Axis::Lease => c.lease_ms = self.base.lease_ms.saturating_mul(value),
            Axis::LockDelay => c.lock_delay_ms = value,
            Axis::ClockStep => {
                c.clock = crate::ServiceClock::Wall;
                c.clock_step_ms = value;
            }
        }
        c.fencing = fencing;
        c.seed = seed;
        c
    }
}

/// Runs the sweep on `threads` threads; `progress` is called after every run. Rows come
/// out in a fixed order (lease multiple, then fencing off before on) whatever the
/// threads did.
pub fn run(spec: &Spec, threads: usize, progress: &(dyn Fn() + Sync)) -> Result<Vec<Row>, ConfigError> {
    run_until(spec, threads, progress, &AtomicBool::new(false))
}

/// [`run`], ending early (runs and the sweep) once `stop` is set; the rows then cover
/// only what ran, and the caller, which gave up, discards them.
pub fn run_until(
    spec: &Spec,
    threads: usize,
    progress: &(dyn Fn() + Sync),
    stop: &AtomicBool,
) -> Result<Vec<Row>, ConfigError> {
    spec.validate()?;
    let cells: Vec<(u64, bool)> = spec.values.iter().flat_map(|m| [(*m, false), (*m, true)]).collect();
    let seeds: Vec<u64> = spec.seeds.clone().collect();
    let jobs: Vec<(usize, u64)> = (0..cells.len()).flat_map(|c| seeds.iter().map(move |s| (c, *s))).collect();
    let results: Mutex<Vec<Vec<Summary>>> = Mutex::new(vec![Vec::new(); cells.len()]);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(cell, seed)) = jobs.get(i) else { break };
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let (m, fencing) = cells[cell];
                let s = crate::run(&spec.config(m, fencing, seed), &mut StopFlag(stop)).expect("validated above");
                results.lock().expect("no panics while holding").get_mut(cell).expect("cell").push(s);
                progress();
            });
        }
    });
    let results = results.into_inner().expect("threads joined");
    Ok(cells
        .iter()
        .zip(results)
        .map(|(&(m, fencing), runs)| {
            let sum = |f: fn(&Summary) -> u64| runs.iter().map(f).sum::<u64>();
            Row {
                axis: spec.axis,
                value: m,
                lease_ms: spec.config(m, fencing, 0).lease_ms,
                fencing,
                seeds: runs.len() as u64,
                grants: sum(|s| s.grants),
                late_writes: sum(|s| s.late_writes),
                zombie_writes: sum(|s| s.zombie_writes),
                stale_writes_rejected: sum(|s| s.stale_writes_rejected),
                lost_updates: sum(|s| s.lost_updates),
                unsafe_runs: runs.iter().filter(|s| s.zombie_writes > 0).count() as u64,
            }
        })
        .collect())
}
