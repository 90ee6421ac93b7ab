//! Scenarios and the knobs of a run, with the defaults that tell the seeds' story.

use std::fmt;

mod knobs;
mod scenario;

pub use knobs::{PauseModel, Replication, ServiceClock, ServiceRestart};
pub use scenario::Scenario;

/// Everything a run depends on. Two runs with equal configs are identical.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub scenario: Scenario,
    pub seed: u64,
    pub clients: u32,
    /// Independent locks (and counters); client `i` works on lock `i % locks`.
    pub locks: u32,
    pub duration_ms: u64,
    /// The lease TTL the clients ask for (already multiplied for `long-lease`).
    pub lease_ms: u64,
    /// Renew the lease while holding it every `renew_fraction * lease_ms`.
    pub renew_fraction: Option<f64>,
    /// Tokens sent and checked by the resource.
    pub fencing: bool,
    pub pauses: PauseModel,
    /// Chance that a critical section contains a pause.
    pub pause_chance: f64,
    /// Chance that a client crashes during a critical section.
    pub crash_chance: f64,
    /// How long a crashed client stays down.
    pub restart_ms: u64,
    /// Work between the read and the write, uniform in this range.
    pub work_ms: (u64, u64),
    /// Time between a release and the next acquire.
    pub think_ms: (u64, u64),
    /// One-way message delay, uniform in this range. The upper bound stays under three
    /// times the lower so that the renewal guarantee is exact (see docs/design.md).
    pub net_ms: (u64, u64),
    /// How long an acquire waits in the queue before giving up.
    pub wait_ms: u64,
    /// Chubby's lock-delay: after a holder's lease expires, nobody gets the lock for
    /// this long.
    pub lock_delay_ms: u64,
    /// The clock the lock service times leases on.
    pub clock: ServiceClock,
    /// How far one step of a wall clock jumps forward.
    pub clock_step_ms: u64,
    /// Mean time between wall-clock steps.
    pub clock_step_every_ms: u64,
    /// Mean time between lock service crashes; `None`: it never crashes.
    pub service_crash_every_ms: Option<u64>,
    /// What a crashed lock service restarts from.
    pub service_restart: ServiceRestart,
    /// A replicated lock service whose replicas are cut apart now and then; `None`:
    /// one node.
    pub replication: Option<Replication>,
    /// Copies of each write the client sends (an at-least-once retry); the resource
    /// applies each write once, by its idempotency key.
    pub write_copies: u32,
}

/// Base lease for every scenario unless `--lease` says otherwise.
pub const LEASE_MS_DEFAULT: u64 = 1_000;

/// `lock-delay`'s delay: one base lease.
pub const LOCK_DELAY_MS_DEFAULT: u64 = 1_000;

/// How far a wall clock steps: two base leases, as a VM resumed after a migration or
/// an NTP correction does.
pub const CLOCK_STEP_MS_DEFAULT: u64 = 2_000;

/// `network-delay` holds some packets of half the critical sections (most holds are
/// short; the tail reaches GitHub's 90 s), and pauses no process.
const NETWORK_DELAY_CHANCE: f64 = 1.0;

impl Config {
    /// The scenario's defaults, with `lease_ms` the base lease.
    pub fn new(scenario: Scenario, seed: u64) -> Config {
        let sc = scenario;
        Config {
            scenario,
            seed,
            clients: 4,
            locks: if sc == Scenario::Partitioned { 4 } else { 1 },
            duration_ms: 60_000,
            lease_ms: LEASE_MS_DEFAULT * scenario.lease_multiple(),
            renew_fraction: (scenario == Scenario::Renewal).then_some(0.5),
            fencing: scenario == Scenario::Fencing,
            pauses: if sc == Scenario::NetworkDelay { PauseModel::Network } else { PauseModel::Mixed },
            pause_chance: if sc == Scenario::NetworkDelay { NETWORK_DELAY_CHANCE } else { 0.25 },
            crash_chance: 0.002,
            restart_ms: 2_000,
            work_ms: (10, 100),
            think_ms: (0, 50),
            net_ms: (2, 5),
            wait_ms: 30_000,
            lock_delay_ms: if sc == Scenario::LockDelay { LOCK_DELAY_MS_DEFAULT } else { 0 },
            clock: if sc == Scenario::ClockDrift { ServiceClock::Wall } else { ServiceClock::Monotonic },
            clock_step_ms: CLOCK_STEP_MS_DEFAULT,
            clock_step_every_ms: 5_000,
            service_crash_every_ms: (sc == Scenario::ServiceCrash).then_some(10_000),
            service_restart: ServiceRestart::Durable,
            replication: (sc == Scenario::SplitBrain).then_some(Replication::PrimaryBackup),
            write_copies: if sc == Scenario::Idempotent { 2 } else { 1 },
        }
    }

    /// Sets the base lease; `long-lease` runs with four times it.
    pub fn with_base_lease(mut self, lease_ms: u64) -> Config {
        self.lease_ms = lease_ms.saturating_mul(self.scenario.lease_multiple());
        self
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, message: String| Err(ConfigError { field, message });
        if !(1..=1_000_000).contains(&self.clients) {
            return bad("--clients", format!("must be 1 to 1000000, not {}", self.clients));
        }
        if self.locks == 0 || self.locks > self.clients {
            return bad(
                "--locks",
                format!("must be 1 to the number of clients ({}), not {}", self.clients, self.locks),
            );
        }
        if !(1..=86_400_000).contains(&self.duration_ms) {
            return bad("--duration", format!("must be 1ms to 24h, not {} ms", self.duration_ms));
        }
        if !(10..=3_600_000).contains(&self.lease_ms) {
            return bad("--lease", format!("must be 10ms to 1h, not {} ms", self.lease_ms));
        }
        if let Some(f) = self.renew_fraction {
            if !(f > 0.0 && f < 1.0) {
                return bad("--renew-at", format!("must be a fraction of the lease between 0 and 1, not {f}"));
            }
            if self.scenario.lockless() {
                let name = self.scenario.name();
                return bad("--renew-at", format!("{name} takes no lock, so there is no lease to renew"));
            }
        }
        if self.fencing && self.scenario.lockless() {
            let name = self.scenario.name();
            return bad("--fencing", format!("{name} takes no lock and has no token to fence with"));
        }
        if self.lock_delay_ms > 0 && self.scenario.lockless() {
            let name = self.scenario.name();
            return bad("--lock-delay", format!("{name} takes no lock, so there is no lock-delay"));
        }
        if self.lock_delay_ms > 3_600_000 {
            return bad("--lock-delay", format!("must be at most 1h, not {} ms", self.lock_delay_ms));
        }
        if self.clock == ServiceClock::Wall && !(1..=3_600_000).contains(&self.clock_step_ms) {
            return bad("--clock-step", format!("must be 1ms to 1h, not {} ms", self.clock_step_ms));
        }
        if self.clock_step_every_ms == 0 || self.service_crash_every_ms == Some(0) {
            return bad("--config", "the mean time between clock steps or crashes must be positive".into());
        }
        if self.replication.is_some() != (self.scenario == Scenario::SplitBrain) {
            return bad("--replication", "only split-brain runs a replicated lock service".into());
        }
        if self.replication.is_some() && self.service_crash_every_ms.is_some() {
            return bad("--replication", "a replicated lock service is not also crashed (one fault at a time)".into());
        }
        if self.replication.is_some() && self.clock == ServiceClock::Wall {
            return bad("--clock", "a replicated lock service runs on the leader's timeline, not a wall clock".into());
        }
        if self.scenario.lockless() && (self.service_crash_every_ms.is_some() || self.clock == ServiceClock::Wall) {
            let name = self.scenario.name();
            return bad("--clock", format!("{name} takes no lock, so there is no lock service to disturb"));
        }
        if !(1..=8).contains(&self.write_copies) {
            return bad("--config", format!("write copies must be 1 to 8, not {}", self.write_copies));
        }
        for (name, p) in [("pause chance", self.pause_chance), ("crash chance", self.crash_chance)] {
            if !(0.0..=1.0).contains(&p) {
                return bad("--config", format!("{name} must be between 0 and 1, not {p}"));
            }
        }
        for (field, (lo, hi)) in [("work", self.work_ms), ("think", self.think_ms), ("network", self.net_ms)] {
            if lo > hi {
                return bad("--config", format!("{field} range {lo}..{hi} is empty"));
            }
        }
        if self.net_ms.0 == 0 {
            return bad("--config", "network delay must be at least 1 ms".into());
        }
        Ok(())
    }
}

/// A setting out of range, named by its command-line flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}
