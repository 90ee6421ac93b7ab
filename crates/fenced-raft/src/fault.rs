//! Test-only faults in the leader's clock: compiled only with the `fault-injection`
//! feature (never in a default build) and switched on at run time, so that the torture
//! harness can show its checkers catch a cluster that breaks its promises.
//!
//! - `FENCED_BREAK=clock-fast`: this node's clock runs three times as fast from the
//!   start; as leader it expires every lease at a third of its TTL in real time.
//! - `FENCED_BREAK=jump-on-failover`: a node that takes office moves the replicated
//!   timeline a minute ahead once its first entry is committed, as a leader that took
//!   lease time from its own wall clock after a clock step would: every lease it
//!   inherits expires at once.
//! - `FENCED_BREAK=leader-restore`: a member of several that restarts as leader takes
//!   office again in its old term without an election (openraft's leader restore), as
//!   every member did before the kill nemesis caught it: a leader that lost entries its
//!   followers hold writes others under the same index and term.
//! - the file `fault-log-delay-ms` in the data directory: this member's log writes take
//!   that much longer (see `log_store`), so its followers hold entries before it does.
//! - the file `fault-clock-rate` in the data directory (the `clock` nemesis): a rate
//!   (`1.08`, `0.5`) that this node's clock runs at from now on, read every 100 ms.
//!
//! `FENCED_BREAK` takes several names separated by commas.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// Whether `FENCED_BREAK` names `what`.
pub fn broken(what: &str) -> bool {
    std::env::var("FENCED_BREAK").is_ok_and(|v| v.split(',').any(|p| p.trim() == what))
}

/// How far `jump-on-failover` moves the timeline when a node takes office.
pub fn office_jump_ms() -> u64 {
    if broken("jump-on-failover") {
        60_000
    } else {
        0
    }
}

/// A clock rate that can change while the node runs: the local clock is piecewise
/// linear in real time, continuous and never going back.
pub struct Rate {
    file: PathBuf,
    rate: f64,
    read_at: Option<Instant>,
    /// The real and scaled milliseconds at the last rate change.
    base_raw_ms: u64,
    base_ms: u64,
}

impl Rate {
    pub fn new(dir: &Path) -> Rate {
        let rate = if broken("clock-fast") { 3.0 } else { 1.0 };
        Rate { file: dir.join("fault-clock-rate"), rate, read_at: None, base_raw_ms: 0, base_ms: 0 }
    }

    /// `raw_ms` of real time since the node started, on this node's clock.
    pub fn scale(&mut self, raw_ms: u64) -> u64 {
        if self.read_at.is_none_or(|t| t.elapsed().as_millis() >= 100) {
            self.read_at = Some(Instant::now());
            let fixed = broken("clock-fast").then_some(3.0);
            let from_file = std::fs::read_to_string(&self.file).ok().and_then(|s| s.trim().parse::<f64>().ok());
            let rate = fixed.or(from_file).filter(|r| r.is_finite() && *r > 0.0 && *r <= 100.0).unwrap_or(1.0);
            if rate != self.rate {
                self.base_ms = self.at(raw_ms);
                self.base_raw_ms = raw_ms.max(self.base_raw_ms);
                self.rate = rate;
                tracing::warn!(rate, "fault injection: this node's clock runs at {rate}x");
            }
        }
        self.at(raw_ms)
    }

    fn at(&self, raw_ms: u64) -> u64 {
        self.base_ms + (raw_ms.saturating_sub(self.base_raw_ms) as f64 * self.rate) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_file_bends_the_clock_without_a_step_back() {
        let dir = std::env::temp_dir().join(format!("fenced-fault-rate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = Rate::new(&dir);
        assert_eq!(r.scale(1_000), 1_000);
        std::fs::write(dir.join("fault-clock-rate"), "2").unwrap();
        r.read_at = None;
        assert_eq!(r.scale(1_000), 1_000, "continuous at the change");
        assert_eq!(r.scale(1_500), 2_000);
        std::fs::write(dir.join("fault-clock-rate"), "0.5").unwrap();
        r.read_at = None;
        assert_eq!(r.scale(2_000), 3_000);
        assert_eq!(r.scale(3_000), 3_500);
        std::fs::write(dir.join("fault-clock-rate"), "nonsense").unwrap();
        r.read_at = None;
        assert_eq!(r.scale(4_000), 4_000, "a bad rate is 1");
        assert_eq!(r.scale(5_000), 5_000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
