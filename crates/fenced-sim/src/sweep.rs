//! Sweeps: the same scenario over one knob and seeds, fencing off and on, to show a
//! point with numbers. Over lease lengths (the seed's point): longer leases make zombie
//! writes rarer, never zero; fencing makes them zero at every lease. Over Chubby's
//! lock-delay: rarer again, never zero. Over the size of a wall-clock step: once a step
//! outgrows what is left of a lease, zombie writes climb.

use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::trace::StopFlag;
use crate::{Config, ConfigError, Scenario, Summary};

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

/// The columns after the knob's own.
const COLUMNS: &str =
    "lease_ms,fencing,seeds,grants,late_writes,zombie_writes,stale_writes_rejected,lost_updates,unsafe_runs";

fn columns(rows: &[Row]) -> String {
    let axis = rows.first().map_or(Axis::Lease, |r| r.axis);
    format!("{},{COLUMNS}", axis.column())
}

fn fields(r: &Row) -> [String; 10] {
    [
        r.value.to_string(),
        r.lease_ms.to_string(),
        if r.fencing { "on" } else { "off" }.to_string(),
        r.seeds.to_string(),
        r.grants.to_string(),
        r.late_writes.to_string(),
        r.zombie_writes.to_string(),
        r.stale_writes_rejected.to_string(),
        r.lost_updates.to_string(),
        r.unsafe_runs.to_string(),
    ]
}

pub fn to_csv(rows: &[Row]) -> String {
    let mut s = format!("{}\n", columns(rows));
    for r in rows {
        let _ = writeln!(s, "{}", fields(r).join(","));
    }
    s
}

pub fn to_json(rows: &[Row]) -> String {
    let columns = columns(rows);
    let names: Vec<&str> = columns.split(',').collect();
    let objects: Vec<String> = rows
        .iter()
        .map(|r| {
            let f = fields(r);
            let pairs: Vec<String> = names
                .iter()
                .zip(f.iter())
                .map(|(k, v)| if *k == "fencing" { format!(r#""{k}":"{v}""#) } else { format!(r#""{k}":{v}"#) })
                .collect();
            format!("{{{}}}", pairs.join(","))
        })
        .collect();
    format!("[{}]\n", objects.join(","))
}

pub fn to_text(rows: &[Row]) -> String {
    let mut s = String::new();
    let axis = rows.first().map_or(Axis::Lease, |r| r.axis);
    let head = match axis {
        Axis::Lease => "lease",
        Axis::LockDelay => "delay",
        Axis::ClockStep => "step",
    };
    let _ = writeln!(
        s,
        "{:>8} {:>9} {:>8} {:>7} {:>12} {:>14} {:>13} {:>12}",
        head, "fencing", "seeds", "grants", "late writes", "zombie writes", "stale refused", "lost updates"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>6}ms {:>9} {:>8} {:>7} {:>12} {:>14} {:>13} {:>12}",
            knob_ms(r),
            if r.fencing { "on" } else { "off" },
            r.seeds,
            r.grants,
            r.late_writes,
            r.zombie_writes,
            r.stale_writes_rejected,
            r.lost_updates
        );
    }
    s
}

/// The knob's value in milliseconds, as the table and the chart show it.
fn knob_ms(r: &Row) -> u64 {
    match r.axis {
        Axis::Lease => r.lease_ms,
        Axis::LockDelay | Axis::ClockStep => r.value,
    }
}

/// A line chart of zombie writes against the knob, fencing off and on.
pub fn to_svg(rows: &[Row], title: &str) -> String {
    let axis = rows.first().map_or(Axis::Lease, |r| r.axis);
    let (x_label, note) = match axis {
        Axis::Lease => ("lease length", ["longer leases:", "rarer, never zero"]),
        Axis::LockDelay => ("lock-delay", ["longer delays:", "rarer, never zero"]),
        Axis::ClockStep => ("wall-clock step", ["bigger steps:", "more zombie writes"]),
    };
    let off: Vec<&Row> = rows.iter().filter(|r| !r.fencing).collect();
    let on: Vec<&Row> = rows.iter().filter(|r| r.fencing).collect();
    let y_max = rows.iter().map(|r| r.zombie_writes).max().unwrap_or(0).max(1) as f64;
    let c = Chart { w: 720.0, h: 420.0, left: 70.0, right: 180.0, top: 50.0, bottom: 60.0, n: off.len().max(1), y_max };
    let (w, h, left) = (c.w, c.h, c.left);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{left}" y="28" font-size="15" font-weight="bold">{}</text>"#, escape(title));
    c.axes(&mut s, &off, x_label);
    for (series, color, label) in [(&off, "#d62728", "fencing off"), (&on, "#2ca02c", "fencing on")] {
        c.series(&mut s, series, color, label, x_label);
    }
    c.legend(&mut s, note);
    s.push_str("</svg>\n");
    s
}

/// The chart's size, margins and scales.
struct Chart {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    /// Points on the x axis.
    n: usize,
    /// The top of the y axis.
    y_max: f64,
}

impl Chart {
    fn x(&self, i: usize) -> f64 {
        let n = self.n;
        self.left + (self.w - self.left - self.right) * if n == 1 { 0.5 } else { i as f64 / (n - 1) as f64 }
    }

    fn y(&self, v: u64) -> f64 {
        self.top + (self.h - self.top - self.bottom) * (1.0 - v as f64 / self.y_max)
    }

    /// The grid, the y axis's figures and label, and the knob's values under the x axis.
    fn axes(&self, s: &mut String, off: &[&Row], x_label: &str) {
        let (w, h, left, right, bottom) = (self.w, self.h, self.left, self.right, self.bottom);
        for k in 0..=4 {
            let v = (self.y_max * k as f64 / 4.0).round() as u64;
            let yy = self.y(v);
            let _ =
                writeln!(s, r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##, w - right);
            let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"#, left - 8.0, yy + 4.0);
        }
        let _ = writeln!(
            s,
            r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">zombie writes (all seeds)</text>"#,
            h / 2.0,
            h / 2.0
        );
        for (i, r) in off.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} ms</text>"#,
                self.x(i),
                h - bottom + 20.0,
                knob_ms(r)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{x_label}</text>"#,
            (left + w - right) / 2.0,
            h - 14.0
        );
    }

    /// One series: its line, a point per row with its figures, and (fencing off) its
    /// count above each point.
    fn series(&self, s: &mut String, series: &[&Row], color: &str, label: &str, x_label: &str) {
        let points: Vec<String> = series
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{:.1},{:.1}", self.x(i), self.y(r.zombie_writes)))
            .collect();
        let _ =
            writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2.5" points="{}"/>"#, points.join(" "));
        for (i, r) in series.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{label}, {x_label} {} ms: {} zombie writes, {} lost updates</title></circle>"#,
                self.x(i),
                self.y(r.zombie_writes),
                knob_ms(r),
                r.zombie_writes,
                r.lost_updates
            );
            if !r.fencing {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{color}">{}</text>"#,
                    self.x(i),
                    self.y(r.zombie_writes) - 9.0,
                    r.zombie_writes
                );
            }
        }
    }

    /// The legend, right of the plot, and the note under it.
    fn legend(&self, s: &mut String, note: [&str; 2]) {
        let (lx, top) = (self.w - self.right + 16.0, self.top);
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{top}" width="14" height="4" fill="#d62728"/><text x="{:.1}" y="{:.1}">fencing off</text>"##,
            lx + 20.0,
            top + 6.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{:.1}" width="14" height="4" fill="#2ca02c"/><text x="{:.1}" y="{:.1}">fencing on: 0</text>"##,
            top + 22.0,
            lx + 20.0,
            top + 28.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{lx}" y="{:.1}" fill="#555">{}</text><text x="{lx}" y="{:.1}" fill="#555">{}</text>"##,
            top + 60.0,
            note[0],
            top + 76.0,
            note[1]
        );
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
