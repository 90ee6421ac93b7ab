//! The history checker: one judge for the simulator, the fault-injection harness and
//! the tests.
//!
//! A history is the counter workload on one lock and one resource, as seen from
//! outside: grants and lease ends as the lock service decided them, pauses, and every
//! operation as it reached the resource. The checker streams over it (constant work per
//! event) and reports the design's words: late writes, zombie writes, stale writes
//! rejected, lost updates, token regressions and overlapping holders, each finding with
//! the index of the event that proves it.

pub mod linearizable;

use crate::Token;

/// What a client's write did at the resource.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    Accepted,
    /// Refused by the gate (or by a version check under optimistic concurrency).
    Rejected,
    /// The client never learned (a crash, a time-out): may or may not have applied.
    Unknown,
}

/// One thing that happened. `t_ms` is when it happened where it happened: a grant on the
/// lock service, a write at the resource.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Event {
    pub t_ms: u64,
    pub client: u32,
    pub kind: EventKind,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EventKind {
    /// The lock service granted `token` to the client.
    Granted { token: Token },
    /// The lock service expired the lease under which `token` was held.
    LeaseExpired { token: Token },
    /// The holder released `token`.
    Released { token: Token },
    /// The client stopped for `duration_ms` (GC, migration, throttling, or its packets
    /// held in the network).
    Paused { duration_ms: u64 },
    /// A read reached the resource. `held` is the token the client acts under (whether
    /// or not it was sent), `fenced` whether it was sent.
    Read { held: Option<Token>, fenced: bool, value: u64, outcome: Outcome },
    /// A write of `value` reached the resource, which held `value_before` at that moment
    /// when the history knows it.
    Write { held: Option<Token>, fenced: bool, value: u64, value_before: Option<u64>, outcome: Outcome },
}

/// What a finding is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FindingKind {
    /// An accepted write under a token lower than one the resource had already seen.
    ZombieWrite { token: Token, highest_seen: Token, pause_ms: u64 },
    /// A write that reached the resource after its writer's lease expired.
    LateWrite { token: Token, expired_at_ms: u64, pause_ms: u64 },
    /// A write the gate refused.
    StaleWriteRejected { token: Option<Token> },
    /// An accepted write that overwrote `lost` acknowledged increments (some may come
    /// back when another stale writer writes a higher value; `Report::lost_updates`
    /// is the net count, the increments missing from the counter).
    LostUpdate { lost: u64, value: u64, value_before: u64 },
    /// A grant whose token is not above every earlier one.
    TokenRegression { token: Token, previous: Token },
    /// A grant while another grant of the lock was still live.
    OverlappingHolders { token: Token, live: Token },
}

/// One finding and the event that proves it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Finding {
    /// Index of the proving event in the history.
    pub event: usize,
    pub t_ms: u64,
    pub client: u32,
    pub kind: FindingKind,
}

/// Totals over a history, in the design's words.
#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct Report {
    pub events: u64,
    pub grants: u64,
    pub lease_expiries: u64,
    pub pauses: u64,
    pub writes_attempted: u64,
    pub writes_accepted: u64,
    pub late_writes: u64,
    pub zombie_writes: u64,
    pub stale_writes_rejected: u64,
    pub lost_updates: u64,
    pub token_regressions: u64,
    pub overlapping_holders: u64,
    /// Every zombie write, lost update, regression and overlap; late writes and
    /// rejections only up to `Checker::NOTABLE_MAX` each, to bound memory.
    pub findings: Vec<Finding>,
}

impl Report {
    /// The design's *safe*: no zombie write and no lost update.
    pub fn is_safe(&self) -> bool {
        self.zombie_writes == 0 && self.lost_updates == 0
    }

    /// The first violation of safety or of the lock service's own guarantees.
    pub fn first_violation(&self) -> Option<&Finding> {
        self.findings
            .iter()
            .find(|f| !matches!(f.kind, FindingKind::LateWrite { .. } | FindingKind::StaleWriteRejected { .. }))
    }
}

#[derive(Clone, Copy, Default, Debug)]
struct ClientState {
    /// The grant the client acts under.
    token: Option<Token>,
    /// When the lock service expired that grant.
    expired_at_ms: Option<u64>,
    /// Longest pause since that grant.
    longest_pause_ms: u64,
}

/// Streams over a history; see the module documentation.
#[derive(Default, Debug)]
pub struct Checker {
    report: Report,
    clients: Vec<ClientState>,
    last_grant: Option<Token>,
    /// The live grant of the lock, as the lock service sees it.
    live: Option<Token>,
    /// Highest token of any operation that reached the resource and was let through.
    highest_seen: Option<Token>,
    /// Increments acknowledged minus increments in the counter, over writes that know
    /// the value they overwrote.
    net_lost: i128,
    late_kept: usize,
    rejected_kept: usize,
    index: usize,
}

impl Checker {
    /// Late writes and rejections kept as findings (the counts are always exact).
    pub const NOTABLE_MAX: usize = 1_000;

    pub fn new() -> Checker {
        Checker::default()
    }

    /// Checks a whole history.
    pub fn check(history: &[Event]) -> Report {
        let mut c = Checker::new();
        history.iter().for_each(|e| c.observe(e));
        c.finish()
    }

    /// The report so far.
    pub fn report(&self) -> &Report {
        &self.report
    }

    pub fn finish(self) -> Report {
        self.report
    }

    pub fn observe(&mut self, e: &Event) {
        let index = self.index;
        self.index += 1;
        self.report.events += 1;
        let slot = e.client as usize;
        if self.clients.len() <= slot {
            self.clients.resize(slot + 1, ClientState::default());
        }
        let finding = |kind| Finding { event: index, t_ms: e.t_ms, client: e.client, kind };
        match e.kind {
            EventKind::Granted { token } => {
                self.report.grants += 1;
                if let Some(previous) = self.last_grant.filter(|p| token <= *p) {
                    self.report.token_regressions += 1;
                    self.report.findings.push(finding(FindingKind::TokenRegression { token, previous }));
                }
                if let Some(live) = self.live {
                    self.report.overlapping_holders += 1;
                    self.report.findings.push(finding(FindingKind::OverlappingHolders { token, live }));
                }
                self.last_grant = Some(self.last_grant.map_or(token, |p| p.max(token)));
                self.live = Some(token);
                self.clients[slot] = ClientState { token: Some(token), expired_at_ms: None, longest_pause_ms: 0 };
            }
            EventKind::LeaseExpired { token } => {
                self.report.lease_expiries += 1;
                self.end_live(token);
                let c = &mut self.clients[slot];
                if c.token == Some(token) {
                    c.expired_at_ms = Some(e.t_ms);
                }
            }
            EventKind::Released { token } => self.end_live(token),
            EventKind::Paused { duration_ms } => {
                self.report.pauses += 1;
                let c = &mut self.clients[slot];
                c.longest_pause_ms = c.longest_pause_ms.max(duration_ms);
            }
            EventKind::Read { held, outcome, .. } => {
                if outcome == Outcome::Accepted {
                    self.saw(held);
                }
            }
            EventKind::Write { held, value, value_before, outcome, .. } => {
                self.report.writes_attempted += 1;
                let c = self.clients[slot];
                let held_now = held.filter(|t| c.token == Some(*t));
                let late = held_now.and(c.expired_at_ms).filter(|at| *at <= e.t_ms);
                if let (Some(token), Some(expired_at_ms)) = (held_now, late) {
                    self.report.late_writes += 1;
                    if self.late_kept < Self::NOTABLE_MAX {
                        self.late_kept += 1;
                        let pause_ms = c.longest_pause_ms;
                        self.report.findings.push(finding(FindingKind::LateWrite { token, expired_at_ms, pause_ms }));
                    }
                }
                match outcome {
                    Outcome::Accepted => {
                        self.report.writes_accepted += 1;
                        if let (Some(token), Some(highest_seen)) = (held, self.highest_seen) {
                            if token < highest_seen {
                                self.report.zombie_writes += 1;
                                let pause_ms = c.longest_pause_ms;
                                let kind = FindingKind::ZombieWrite { token, highest_seen, pause_ms };
                                self.report.findings.push(finding(kind));
                            }
                        }
                        if let Some(before) = value_before {
                            // Each accepted write should add exactly one. What it adds
                            // short of one is lost for now; a later write of a higher
                            // stale value can bring it back, so the count is the net.
                            self.net_lost += before as i128 + 1 - value as i128;
                            self.report.lost_updates = self.net_lost.max(0) as u64;
                            let lost = (before + 1).saturating_sub(value);
                            if lost > 0 {
                                let kind = FindingKind::LostUpdate { lost, value, value_before: before };
                                self.report.findings.push(finding(kind));
                            }
                        }
                        self.saw(held);
                    }
                    Outcome::Rejected => {
                        self.report.stale_writes_rejected += 1;
                        if self.rejected_kept < Self::NOTABLE_MAX {
                            self.rejected_kept += 1;
                            self.report.findings.push(finding(FindingKind::StaleWriteRejected { token: held }));
                        }
                    }
                    Outcome::Unknown => {}
                }
            }
        }
    }

    fn end_live(&mut self, token: Token) {
        if self.live == Some(token) {
            self.live = None;
        }
    }

    fn saw(&mut self, held: Option<Token>) {
        if let Some(t) = held {
            self.highest_seen = Some(self.highest_seen.map_or(t, |h| h.max(t)));
        }
    }
}

#[cfg(test)]
mod tests;
