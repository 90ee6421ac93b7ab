//! The lock service's own faults on one node: a wall clock that steps forward, and
//! crashes with a restart from what the service made durable (`LockTable::recover`,
//! the server's own start-up path).
//!
//! Each node is a real `LockTable` reading its own clock: the simulator's time plus a
//! skew. A wall-clock step adds to the skew; a restarted node's clock starts at 0, as a
//! restarted server's monotonic clock does.

use fenced_core::{Batch, Command, Durable, Effect, LockTable, Output, Persist, RequestId, Token};

use super::{Ev, World};
use crate::trace::{Actor, Detail, Kind, TraceSink};
use crate::{Config, Scenario, ServiceClock, ServiceRestart};

/// Tokens a crashing service mints under one durable ceiling (the server's default is
/// a million; a smaller block keeps the simulator's tokens short). A restart continues
/// above the ceiling, so it skips at most this many.
pub(super) const TOKEN_BLOCK: u64 = 100;

/// How long a crashed service stays down, uniform in this range.
const SERVICE_DOWN_MS: (u64, u64) = (200, 2_000);

/// One lock service process: its table and the clock it reads, and in replicated runs
/// its log. Public as `fenced_sim::Replica` so that a test can drive the simulator's
/// replica with the batches it drives the server's state machine with.
pub struct Node {
    pub(super) table: LockTable,
    /// Added to the simulator's time to give this node's clock.
    pub(super) skew: i64,
    /// When its timer event is armed, in simulator time.
    pub(super) timer_at: Option<u64>,
    /// Replicated runs: every batch it applied (one command each), in log order.
    pub(super) log: Vec<Batch>,
    /// Replicated runs: acquires it queued as a follower that nothing has answered yet.
    pub(super) queued: std::collections::BTreeSet<RequestId>,
}

impl Node {
    pub fn new(table: LockTable) -> Node {
        Node { table, skew: 0, timer_at: None, log: Vec::new(), queued: Default::default() }
    }

    /// The replica's table.
    pub fn table(&self) -> &LockTable {
        &self.table
    }

    /// A follower applies one entry of its leader's log through the core's one apply;
    /// what it answers goes nowhere, but it remembers the acquires it queued, which it
    /// must withdraw if it takes over.
    pub fn follow(&mut self, batch: Batch) {
        self.log.push(batch.clone());
        let queued = &mut self.queued;
        self.table.apply_batch(batch, &mut Output::default(), |out| {
            queued.extend(out.queued.drain(..));
            for (r, _) in &out.answers {
                queued.remove(r);
            }
            for e in &out.effects {
                if let Effect::WaitEnded { request, .. } = e {
                    queued.remove(request);
                }
            }
        });
    }
}

/// Records what the table asked to make durable, as the server's store would.
pub(super) fn make_durable(d: &mut Durable, persist: Vec<Persist>) {
    for p in persist {
        match p {
            Persist::TokenCeiling(c) => d.token_ceiling = c,
            Persist::TtlMsHwm(t) => d.ttl_ms_hwm = t,
            Persist::LockDelay { name, lock_delay_ms } => {
                d.lock_delays.retain(|(n, _)| *n != name);
                if let Some(ms) = lock_delay_ms {
                    d.lock_delays.push((name, ms));
                }
            }
        }
    }
}

/// Runs whose lock service could grant one token twice count the duplicates.
pub(super) fn counts_duplicates(cfg: &Config) -> bool {
    cfg.service_crash_every_ms.is_some() || cfg.replication.is_some() || cfg.scenario == Scenario::SplitBrain
}

impl<S: TraceSink> World<'_, S> {
    /// A node's clock now.
    pub(super) fn node_now(&self, node: usize) -> u64 {
        (self.now as i64 + self.nodes[node].skew).max(0) as u64
    }

    /// Arms a node's timer at its table's next deadline, in simulator time.
    pub(super) fn arm_timer(&mut self, node: usize) {
        let Some(t) = self.nodes[node].table.poll_timeout() else { return };
        let at = (t as i64 - self.nodes[node].skew).max(0) as u64;
        if self.nodes[node].timer_at.is_none_or(|s| at < s) {
            self.nodes[node].timer_at = Some(at);
            self.push(at.max(self.now), Ev::ServiceTimer { node: node as u8 });
        }
    }

    /// A record about the service as a whole (client and lock 0).
    pub(super) fn record_service(&mut self, kind: Kind, detail: Detail) {
        self.record(Actor::Lock, kind, 0, None, None, detail);
    }

    /// Schedules the first of each fault the configuration asks for.
    pub(super) fn start_faults(&mut self) {
        if self.cfg.clock == ServiceClock::Wall {
            let t = self.fault_rng.exponential(self.cfg.clock_step_every_ms as f64);
            self.push(t, Ev::ClockStep);
        }
        if let Some(every) = self.cfg.service_crash_every_ms {
            let t = self.fault_rng.exponential(every as f64);
            self.push(t, Ev::ServiceCrash);
        }
        if self.cfg.replication.is_some() {
            self.schedule_partition();
        }
    }

    /// The wall clock jumps forward: every lease is suddenly older than it is, and the
    /// node expires at once those the jump carried past their end.
    pub(super) fn on_clock_step(&mut self) {
        let step_ms = self.cfg.clock_step_ms;
        self.nodes[0].skew += step_ms as i64;
        self.summary.clock_steps += 1;
        self.record_service(Kind::ClockStep, Detail::Step { step_ms });
        self.nodes[0].timer_at = None;
        if self.serving(0) {
            self.service(0, Command::Tick);
            self.after_service_call(0);
        }
        let t = self.fault_rng.exponential(self.cfg.clock_step_every_ms as f64);
        self.push(self.now + t, Ev::ClockStep);
    }

    /// The service dies: its memory is gone, every open request fails, and the holders
    /// it knew keep believing they hold.
    pub(super) fn on_service_crash(&mut self) {
        if let Some(n) = self.summary.service_crashes.as_mut() {
            *n += 1;
        }
        self.record_service(Kind::ServiceCrash, Detail::None);
        for name in self.names.clone() {
            if let Some((token, lease)) = self.nodes[0].table.lock(&name).and_then(|l| l.holder) {
                let (client, _) = Self::client_of(lease.id);
                self.orphans.push((client, token));
            }
        }
        let mut waiting: Vec<_> = self.waiters.drain().collect();
        waiting.sort_by_key(|(request, _)| *request);
        for (_, (client, lease_n, _)) in waiting {
            let gen = self.clients[client as usize].gen;
            self.reply(client, gen, super::ClientMsg::NotGranted { lease_n });
        }
        self.down = true;
        self.nodes[0].timer_at = None;
        let down_ms = self.fault_rng.between(SERVICE_DOWN_MS.0, SERVICE_DOWN_MS.1);
        self.push(self.now + down_ms, Ev::ServiceRestart);
    }

    /// The service starts again, from its durable state or (the negative control) from
    /// nothing, with its clock at 0.
    pub(super) fn on_service_restart(&mut self) {
        if self.cfg.service_restart == ServiceRestart::Empty {
            self.durable = Durable::default();
        }
        let (table, persist) = LockTable::recover(self.limits.clone(), TOKEN_BLOCK, self.durable.clone());
        make_durable(&mut self.durable, persist);
        let grace_ms = table.grace_left_ms(0);
        let mut node = Node::new(table);
        node.skew = -(self.now as i64);
        self.nodes[0] = node;
        self.down = false;
        self.record_service(Kind::ServiceRestart, Detail::None);
        self.expire_orphans_if_open();
        self.arm_timer(0);
        let every = self.cfg.service_crash_every_ms.expect("crash runs only");
        let t = self.fault_rng.exponential(every as f64);
        self.push(self.now + grace_ms + t, Ev::ServiceCrash);
    }

    /// The grants the crash forgot end when the restarted service's grace is over on
    /// its own clock (which a wall-clock step can bring early): from then on it grants
    /// again. Called before the effects of every call to the service.
    pub(super) fn expire_orphans_if_open(&mut self) {
        if self.orphans.is_empty() || self.down || self.nodes[0].table.grace_left_ms(self.node_now(0)) > 0 {
            return;
        }
        for (client, token) in std::mem::take(&mut self.orphans) {
            self.expired(client, token);
        }
    }

    /// A grant ended by expiry: the trace and the checker.
    pub(super) fn expired(&mut self, client: u32, token: Token) {
        self.record(Actor::Lock, Kind::Expired, client, Some(token), None, Detail::None);
        self.history(client, fenced_core::checker::EventKind::LeaseExpired { token });
    }
}
