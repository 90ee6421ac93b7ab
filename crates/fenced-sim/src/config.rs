//! Scenarios and the knobs of a run, with the defaults that tell the seeds' story.

use std::fmt;

/// The first seed's four runs, plus optimistic concurrency.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scenario {
    /// Fencing off: zombie writes climb.
    Default,
    /// Same seed, fencing on: zero zombie writes, stale writes rejected.
    Fencing,
    /// Four times the lease, fencing off: rarer, never zero over enough seeds.
    LongLease,
    /// Renew at half the lease, fencing off: safe against pauses under half a lease.
    Renewal,
    /// No lock at all: a version check on the resource.
    Occ,
}

impl Scenario {
    pub const ALL: [Scenario; 5] =
        [Scenario::Default, Scenario::Fencing, Scenario::LongLease, Scenario::Renewal, Scenario::Occ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Default => "default",
            Scenario::Fencing => "fencing",
            Scenario::LongLease => "long-lease",
            Scenario::Renewal => "renewal",
            Scenario::Occ => "occ",
        }
    }

    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|x| x.name() == s)
    }

    /// One line for `--help` and the console.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::Default => "fencing off: a paused holder wakes up and writes; zombie writes climb",
            Scenario::Fencing => "same seed, fencing on: the resource refuses stale tokens; zero zombie writes",
            Scenario::LongLease => "four times the lease, fencing off: zombie writes rarer, never zero",
            Scenario::Renewal => "renew at half the lease, fencing off: safe only against pauses under half a lease",
            Scenario::Occ => "no lock: a version check on the resource; zero lost updates",
        }
    }

    /// How many times the base lease this scenario runs with.
    pub fn lease_multiple(self) -> u64 {
        if self == Scenario::LongLease {
            4
        } else {
            1
        }
    }
}

/// Where pauses come from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PauseModel {
    Mixed,
    Gc,
    Vm,
    Cgroup,
    Network,
    None,
}

impl PauseModel {
    pub const ALL: [PauseModel; 6] =
        [PauseModel::Mixed, PauseModel::Gc, PauseModel::Vm, PauseModel::Cgroup, PauseModel::Network, PauseModel::None];

    pub fn name(self) -> &'static str {
        match self {
            PauseModel::Mixed => "mixed",
            PauseModel::Gc => "gc",
            PauseModel::Vm => "vm",
            PauseModel::Cgroup => "cgroup",
            PauseModel::Network => "network",
            PauseModel::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<PauseModel> {
        PauseModel::ALL.into_iter().find(|x| x.name() == s)
    }
}

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
}

/// Base lease for every scenario unless `--lease` says otherwise.
pub const LEASE_MS_DEFAULT: u64 = 1_000;

impl Config {
    /// The scenario's defaults, with `lease_ms` the base lease.
    pub fn new(scenario: Scenario, seed: u64) -> Config {
        Config {
            scenario,
            seed,
            clients: 4,
            locks: 1,
            duration_ms: 60_000,
            lease_ms: LEASE_MS_DEFAULT * scenario.lease_multiple(),
            renew_fraction: (scenario == Scenario::Renewal).then_some(0.5),
            fencing: scenario == Scenario::Fencing,
            pauses: PauseModel::Mixed,
            pause_chance: 0.25,
            crash_chance: 0.002,
            restart_ms: 2_000,
            work_ms: (10, 100),
            think_ms: (0, 50),
            net_ms: (2, 5),
            wait_ms: 30_000,
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
            if self.scenario == Scenario::Occ {
                return bad("--renew-at", "occ takes no lock, so there is no lease to renew".into());
            }
        }
        if self.fencing && self.scenario == Scenario::Occ {
            return bad("--fencing", "occ takes no lock and has no token to fence with".into());
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
