//! The lock service's own faults on one node: a wall clock that steps forward, and
//! crashes with a restart from the service's snapshot and its log, as the server
//! restarts: the table of the last snapshot, every batch after it applied again through
//! the core's one apply, then `Command::Promote` as the first batch (every lease its
//! full TTL again, queued acquires withdrawn).
//!
//! Each node is a real `LockTable` reading its own clock: the simulator's time plus a
//! skew. A wall-clock step adds to the skew. A restarted node's clock goes on from the
//! last batch in its log (the server's leader anchors its clock there), so the time the
//! service was down is not time any lease lived.

use fenced_core::{Batch, Command, LockTable, Output, Token};

use super::{Ev, World};
use crate::trace::{Actor, Detail, Kind, TraceSink};
use crate::{Config, Scenario, ServiceClock, ServiceRestart};

/// How long a crashed service stays down, uniform in this range.
const SERVICE_DOWN_MS: (u64, u64) = (200, 2_000);

/// A crashing service takes a snapshot of its table once its log holds this many
/// batches, and keeps only the batches after it (the server compacts its log the same
/// way, on a larger bound).
pub(super) const SNAPSHOT_EVERY_BATCHES: usize = 1_024;

/// One lock service process: its table and the clock it reads, and its log. Public as
/// `fenced_sim::Replica` so that a test can drive the simulator's replica with the
/// batches it drives the server's state machine with.
pub struct Node {
    pub(super) table: LockTable,
    /// Added to the simulator's time to give this node's clock.
    pub(super) skew: i64,
    /// When its timer event is armed, in simulator time.
    pub(super) timer_at: Option<u64>,
    /// Every batch it applied (one command each), in log order: in replicated runs all
    /// of them, in crash runs those after `snapshot`.
    pub(super) log: Vec<Batch>,
    /// Crash runs: the table as of the last snapshot, which the log continues.
    pub(super) snapshot: Option<LockTable>,
}

impl Node {
    pub fn new(table: LockTable) -> Node {
        Node { table, skew: 0, timer_at: None, log: Vec::new(), snapshot: None }
    }

    /// The replica's table.
    pub fn table(&self) -> &LockTable {
        &self.table
    }

    /// A follower applies one entry of its leader's log through the core's one apply;
    /// what it answers goes nowhere (its callers are the leader's).
    pub fn follow(&mut self, batch: Batch) {
        self.log.push(batch.clone());
        self.table.apply_batch(batch, &mut Output::default(), |_| {});
    }

    /// Crash runs: the batch is in the log before it is applied (the server answers
    /// nothing before its entry is durable); a long log is folded into a snapshot.
    pub(super) fn append(&mut self, batch: &Batch) {
        let Some(snapshot) = self.snapshot.as_mut() else { return };
        if self.log.len() >= SNAPSHOT_EVERY_BATCHES {
            *snapshot = self.table.clone();
            self.log.clear();
        }
        self.log.push(batch.clone());
    }

    /// What a restart reads: the snapshot with the log after it applied again. Asserts
    /// that it is the table the crashed process held (the log missed nothing).
    fn restored(&self) -> Node {
        let snapshot = self.snapshot.as_ref().expect("crash runs keep a snapshot");
        let mut node = Node::new(snapshot.clone());
        for batch in &self.log {
            node.table.apply_batch(batch.clone(), &mut Output::default(), |_| {});
        }
        let view = |t: &LockTable| {
            (t.now_ms(), t.last_token(), t.effects_seq(), t.lease_count(), t.lock_count(), t.waiter_count())
        };
        assert_eq!(view(&node.table), view(&self.table), "a restart from snapshot and log lost state");
        node.snapshot = Some(snapshot.clone());
        node.log = self.log.clone();
        node
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

    /// The service starts again: from its snapshot and its log, its clock going on from
    /// the last batch, and `Promote` as its first batch, as the server does; or (the
    /// negative control) from nothing, its clock at 0, having forgotten every grant.
    pub(super) fn on_service_restart(&mut self) {
        let durable = self.cfg.service_restart == ServiceRestart::Durable;
        let forgotten = if durable { Vec::new() } else { self.holders(0) };
        self.nodes[0] = if durable {
            let mut node = self.nodes[0].restored();
            node.skew = node.table.now_ms() as i64 - self.now as i64;
            node
        } else {
            let mut node = Node::new(LockTable::new(self.limits.clone()));
            node.snapshot = Some(node.table.clone());
            node.skew = -(self.now as i64);
            node
        };
        self.down = false;
        self.record_service(Kind::ServiceRestart, Detail::None);
        // The grants a restart from nothing forgot end, for the checker, as it starts
        // (it may grant those locks again at once).
        for (client, token) in forgotten {
            self.expired(client, token);
        }
        if durable {
            self.service(0, Command::Promote);
            self.after_service_call(0);
        }
        self.arm_timer(0);
        let every = self.cfg.service_crash_every_ms.expect("crash runs only");
        let t = self.fault_rng.exponential(every as f64);
        self.push(self.now + t, Ev::ServiceCrash);
    }

    /// The holders `node`'s table knows, lock by lock: each one's client and token.
    fn holders(&self, node: usize) -> Vec<(u32, Token)> {
        let table = &self.nodes[node].table;
        let held = self.names.iter().filter_map(|name| table.lock(name).and_then(|l| l.holder));
        held.map(|(token, lease)| (Self::client_of(lease.id).0, token)).collect()
    }

    /// A grant ended by expiry: the trace and the checker.
    pub(super) fn expired(&mut self, client: u32, token: Token) {
        self.record(Actor::Lock, Kind::Expired, client, Some(token), None, Detail::None);
        self.history(client, fenced_core::checker::EventKind::LeaseExpired { token });
    }
}
