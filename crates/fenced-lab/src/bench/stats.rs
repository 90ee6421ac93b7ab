//! What a bench run measures besides counting: latency histograms, per-client tallies
//! and processes' CPU time.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Microseconds, 1 µs to 10 minutes, three significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` in `h`, clamped into its range.
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).clamp(1, h.high());
    h.record(us).expect("a clamped value fits");
}

/// What one bench client did.
#[derive(Debug)]
pub struct Tally {
    /// Latency of each completed operation (from its intended start in an open loop).
    pub latency: Histogram<u64>,
    /// Latency of each acquire alone, for the lock workloads.
    pub acquire: Histogram<u64>,
    /// Open loop: how long after its due time each operation was sent (the client's
    /// own lateness, which the latencies include).
    pub lag: Histogram<u64>,
    /// Completed operations (a cycle, a write, a keepalive).
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally { latency: histogram(), acquire: histogram(), lag: histogram(), ops: 0, errors: 0, first_error: None }
    }
}

impl Tally {
    pub fn failed(&mut self, e: &anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }
}

/// User plus system CPU time of a process so far, from `/proc/PID/stat`; `None` when
/// it cannot be read (the process is gone, or this is not Linux).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|&t| t > 0)?;
    Some(Duration::from_micros((utime + stime) * 1_000_000 / ticks))
}

/// Percentiles of `h` in µs: p50, p99, p99.9, max (zeros when empty).
pub fn percentiles(h: &Histogram<u64>) -> [u64; 4] {
    if h.is_empty() {
        return [0; 4];
    }
    [h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.value_at_quantile(0.999), h.max()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ordered_and_cpu_is_readable() {
        let mut h = histogram();
        for us in 1..=10_000u64 {
            record(&mut h, Duration::from_micros(us));
        }
        let [p50, p99, p999, max] = percentiles(&h);
        assert!(p50 <= p99 && p99 <= p999 && p999 <= max, "{p50} {p99} {p999} {max}");
        assert_eq!(percentiles(&histogram()), [0; 4]);
        assert!(cpu_time(std::process::id()).is_some());
    }
}
