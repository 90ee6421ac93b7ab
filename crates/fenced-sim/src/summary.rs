//! What a run found, in the design's words, and its JSON form.

use std::fmt::Write as _;

use crate::{PauseModel, Replication, Scenario, ServiceClock};

/// The fields of every run's JSON (`Summary::to_json`, `fenced sim --json`) that the
/// design names: the console's schema requires them, the tests look for them.
pub const SUMMARY_FIELDS: &[&str] = &[
    "scenario",
    "seed",
    "clients",
    "duration_ms",
    "lease_ms",
    "fencing",
    "renew_fraction",
    "grants",
    "lease_expiries",
    "pauses",
    "writes_attempted",
    "writes_accepted",
    "late_writes",
    "zombie_writes",
    "stale_writes_rejected",
    "lost_updates",
    "events",
    "safe",
];

/// One zombie write and what let it happen.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ZombieProof {
    pub t_ms: u64,
    /// The write's record in the trace.
    pub seq: u64,
    pub client: u32,
    pub token: u64,
    pub highest_seen: u64,
    /// The longest pause of the writer while it believed it held the lock.
    pub pause_ms: u64,
}

/// The result of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub scenario: Scenario,
    pub seed: u64,
    pub clients: u32,
    pub locks: u32,
    pub duration_ms: u64,
    pub lease_ms: u64,
    pub fencing: bool,
    pub renew_fraction: Option<f64>,
    pub pause_model: PauseModel,
    pub grants: u64,
    pub lease_expiries: u64,
    pub pauses: u64,
    pub crashes: u64,
    pub writes_attempted: u64,
    pub writes_accepted: u64,
    /// Writes skipped by clients that had learned their lease was gone.
    pub writes_aborted: u64,
    pub late_writes: u64,
    pub zombie_writes: u64,
    pub stale_writes_rejected: u64,
    pub lost_updates: u64,
    pub token_regressions: u64,
    pub overlapping_holders: u64,
    /// Increments acknowledged to clients, and the counters' final sum.
    pub acknowledged: u64,
    pub final_value: u64,
    /// Simulator events processed.
    pub events: u64,
    /// The first zombie writes (at most `Summary::ZOMBIES_KEPT`).
    pub zombies: Vec<ZombieProof>,
    /// The shortest pause behind any zombie write.
    pub zombie_pause_ms_min: Option<u64>,
    /// The first write the gate refused, as (t_ms, trace seq).
    pub first_rejection: Option<(u64, u64)>,
    /// The knobs and counts of the misconception scenarios; in the JSON and the text
    /// only where the run has them (see [`Summary::extras`]).
    pub lock_delay_ms: u64,
    pub clock: ServiceClock,
    pub clock_step_ms: u64,
    /// Wall-clock steps taken.
    pub clock_steps: u64,
    /// Lease expiries sooner after the lease's last sign of life than its TTL, in true
    /// (simulated) time.
    pub early_expiries: u64,
    /// Messages a network hold kept past their ordinary delay.
    pub delayed_messages: u64,
    /// Second copies of writes that the resource recognised and did not apply again.
    pub duplicates_absorbed: u64,
    /// Lock service crashes, and whether it restarted from its durable state (its
    /// snapshot and log) or from nothing.
    pub service_crashes: Option<u64>,
    pub service_restart_durable: bool,
    pub replication: Option<Replication>,
    /// Grants of a token that had already been granted for the same lock.
    pub duplicate_tokens: u64,
    /// Replicas that took over serving clients.
    pub failovers: u64,
}

impl Summary {
    pub const ZOMBIES_KEPT: usize = 100;

    /// Writes accepted per second of virtual time.
    pub fn writes_per_s(&self) -> f64 {
        self.writes_accepted as f64 * 1_000.0 / self.duration_ms as f64
    }

    /// The fields only some runs have, in a fixed order, as JSON values. Runs of the
    /// first five scenarios have none unless a flag adds one (`--lock-delay`, `--clock
    /// wall`), so their output is what it always was.
    pub fn extras(&self) -> Vec<(&'static str, String)> {
        let mut e = Vec::new();
        if self.scenario == Scenario::NetworkDelay {
            e.push(("delayed_messages", self.delayed_messages.to_string()));
        }
        if self.scenario == Scenario::Idempotent {
            e.push(("duplicates_absorbed", self.duplicates_absorbed.to_string()));
        }
        if self.scenario == Scenario::Partitioned {
            e.push(("writes_per_s", format!("{:.1}", self.writes_per_s())));
        }
        if self.lock_delay_ms > 0 {
            e.push(("lock_delay_ms", self.lock_delay_ms.to_string()));
        }
        if self.scenario == Scenario::ClockDrift || self.clock == ServiceClock::Wall {
            e.push(("clock", format!(r#""{}""#, self.clock.name())));
            e.push(("clock_step_ms", self.clock_step_ms.to_string()));
            e.push(("clock_steps", self.clock_steps.to_string()));
            e.push(("early_expiries", self.early_expiries.to_string()));
        }
        if let Some(n) = self.service_crashes {
            let from = if self.service_restart_durable { "durable" } else { "empty" };
            e.push(("service_crashes", n.to_string()));
            e.push(("service_restart", format!(r#""{from}""#)));
            e.push(("duplicate_tokens", self.duplicate_tokens.to_string()));
        }
        if let Some(r) = self.replication {
            e.push(("replication", format!(r#""{}""#, r.name())));
            e.push(("failovers", self.failovers.to_string()));
            e.push(("duplicate_tokens", self.duplicate_tokens.to_string()));
        }
        e
    }

    /// The design's *safe*.
    pub fn is_safe(&self) -> bool {
        self.zombie_writes == 0 && self.lost_updates == 0
    }

    /// One JSON object, fields in a fixed order.
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(1024);
        let renew = self.renew_fraction.map_or("null".to_string(), |f| format!("{f}"));
        let _ = write!(
            s,
            r#"{{"scenario":"{}","seed":{},"clients":{},"locks":{},"duration_ms":{},"lease_ms":{},"fencing":{},"renew_fraction":{},"pause_model":"{}","#,
            self.scenario.name(),
            self.seed,
            self.clients,
            self.locks,
            self.duration_ms,
            self.lease_ms,
            self.fencing,
            renew,
            self.pause_model.name()
        );
        let counts = [
            ("grants", self.grants),
            ("lease_expiries", self.lease_expiries),
            ("pauses", self.pauses),
            ("crashes", self.crashes),
            ("writes_attempted", self.writes_attempted),
            ("writes_accepted", self.writes_accepted),
            ("writes_aborted", self.writes_aborted),
            ("late_writes", self.late_writes),
            ("zombie_writes", self.zombie_writes),
            ("stale_writes_rejected", self.stale_writes_rejected),
            ("lost_updates", self.lost_updates),
            ("token_regressions", self.token_regressions),
            ("overlapping_holders", self.overlapping_holders),
            ("acknowledged", self.acknowledged),
            ("final_value", self.final_value),
            ("events", self.events),
        ];
        for (k, v) in counts {
            let _ = write!(s, r#""{k}":{v},"#);
        }
        for (k, v) in self.extras() {
            let _ = write!(s, r#""{k}":{v},"#);
        }
        let _ = write!(s, r#""safe":{},"#, self.is_safe());
        let opt = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
        let _ = write!(s, r#""zombie_pause_ms_min":{},"#, opt(self.zombie_pause_ms_min));
        let rejection =
            self.first_rejection.map_or("null".to_string(), |(t, seq)| format!(r#"{{"t_ms":{t},"seq":{seq}}}"#));
        let _ = write!(s, r#""first_rejection":{rejection},"zombies":["#);
        for (i, z) in self.zombies.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                r#"{{"t_ms":{},"seq":{},"client":{},"token":{},"highest_seen":{},"pause_ms":{}}}"#,
                z.t_ms, z.seq, z.client, z.token, z.highest_seen, z.pause_ms
            );
        }
        s.push_str("]}");
        s
    }
}
