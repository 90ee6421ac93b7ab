//! The event loop: clients running the counter workload, the lock service (the real
//! `LockTable`) and the resource (the real fence gate), joined by a network with
//! random delays, all in virtual time. The faults of the lock service itself (a wall
//! clock that steps, crashes, a replicated service cut in two) are in `service.rs` and
//! `replicas.rs`; the clients' side in `clients.rs`, their calls to the service in
//! `calls.rs`, the resource in `resource.rs`.

mod calls;
mod clients;
mod events;
mod replicas;
mod resource;
mod service;

pub use service::Node as Replica;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, DefaultHasher};

use fenced_core::checker::{Checker, Event, EventKind, FindingKind, Outcome};
use fenced_core::gate::{FenceGate, Op};
use fenced_core::{
    Acquire, Answer, Batch, Command, Effect, Error, LeaseId, LeaseRef, Limits, LockName, LockTable, Output,
    ReleaseReason, RequestId, Token,
};

use crate::pauses::{self, PauseCause};
use crate::queue::Queue;
use crate::rng::Rng;
use crate::trace::{Actor, Detail, Kind, Record, TraceSink};
use crate::{Config, ConfigError, Scenario, ServiceRestart, Summary, ZombieProof};
use events::*;
use replicas::Cut;
use service::Node;

/// How often a run asks its sink whether to stop (a power of two).
const STOP_CHECK_EVENTS: u64 = 4_096;

/// Runs one simulation and returns what the checker found. Records go to `sink`; a
/// sink that says `stopped` ends the run early (its summary then covers only what ran).
pub fn run<S: TraceSink>(cfg: &Config, sink: &mut S) -> Result<Summary, ConfigError> {
    cfg.validate()?;
    let mut w = World::new(cfg, sink);
    w.start();
    while let Some((t_ms, ev)) = w.queue.pop() {
        if t_ms > cfg.duration_ms || (w.events & (STOP_CHECK_EVENTS - 1) == 0 && w.sink.stopped()) {
            break;
        }
        w.now = t_ms;
        w.events += 1;
        w.dispatch(ev);
    }
    Ok(w.finish())
}

struct World<'a, S: TraceSink> {
    cfg: &'a Config,
    sink: &'a mut S,
    rng: Rng,
    now: u64,
    queue: Queue<Ev>,
    events: u64,
    records: u64,
    limits: Limits,
    /// The lock service: one node, or the replicas of a replicated one.
    nodes: Vec<Node>,
    /// Faults of the lock service come from their own stream, so that they fall at the
    /// same moments whatever the clients do, and a run without them draws nothing.
    fault_rng: Rng,
    /// The lock service is down (crash runs).
    down: bool,
    /// Replicated runs: the replica that leads, and the cut between replicas if any.
    leader: usize,
    cut: Option<Cut>,
    /// Tokens granted per lock, when duplicates are counted.
    granted_tokens: Vec<HashSet<u64>>,
    /// When each client's current lease last showed life at the lock service.
    lease_alive_at: Vec<u64>,
    /// Idempotency keys: the next write's, and those the resource has applied.
    next_write: u64,
    written: HashSet<u64>,
    /// Reused buffer for the table's effects (no allocation per service call).
    effects: Vec<Effect>,
    /// Answers to queued acquires that ended, by request.
    answers: Vec<(RequestId, Result<Answer, Error>)>,
    /// The id of the next command's request.
    next_request: u64,
    /// Queued acquires: which client and attempt each waiter is, and the node it waits on.
    waiters: HashMap<RequestId, (u32, u32, usize), BuildHasherDefault<DefaultHasher>>,
    names: Vec<LockName>,
    gate: FenceGate<u32>,
    values: Vec<u64>,
    versions: Vec<u64>,
    clients: Vec<Client>,
    checkers: Vec<Checker>,
    summary: Summary,
}

/// The summary of a run before its first event: the settings, every count at zero.
fn new_summary(cfg: &Config) -> Summary {
    Summary {
        scenario: cfg.scenario,
        seed: cfg.seed,
        clients: cfg.clients,
        locks: cfg.locks,
        duration_ms: cfg.duration_ms,
        lease_ms: cfg.lease_ms,
        fencing: cfg.fencing,
        renew_fraction: cfg.renew_fraction,
        pause_model: cfg.pauses,
        grants: 0,
        lease_expiries: 0,
        pauses: 0,
        crashes: 0,
        writes_attempted: 0,
        writes_accepted: 0,
        writes_aborted: 0,
        late_writes: 0,
        zombie_writes: 0,
        stale_writes_rejected: 0,
        lost_updates: 0,
        token_regressions: 0,
        overlapping_holders: 0,
        acknowledged: 0,
        final_value: 0,
        events: 0,
        zombies: Vec::new(),
        zombie_pause_ms_min: None,
        first_rejection: None,
        lock_delay_ms: cfg.lock_delay_ms,
        clock: cfg.clock,
        clock_step_ms: cfg.clock_step_ms,
        clock_steps: 0,
        early_expiries: 0,
        delayed_messages: 0,
        duplicates_absorbed: 0,
        service_crashes: cfg.service_crash_every_ms.map(|_| 0),
        service_restart_durable: cfg.service_restart == ServiceRestart::Durable,
        replication: cfg.replication,
        duplicate_tokens: 0,
        failovers: 0,
    }
}

/// The simulated table's limits: none that a scenario could reach.
fn unbounded_limits() -> Limits {
    Limits {
        leases_max: usize::MAX,
        locks_max: usize::MAX,
        waiters_max: usize::MAX,
        waiters_per_lock_max: usize::MAX,
        ttl_ms_min: 1,
        ttl_ms_max: u64::MAX / 4,
        wait_ms_max: u64::MAX / 4,
        lock_delay_ms_max: u64::MAX / 4,
    }
}

impl<'a, S: TraceSink> World<'a, S> {
    fn new(cfg: &'a Config, sink: &'a mut S) -> Self {
        let limits = unbounded_limits();
        let locks = cfg.locks as usize;
        let replicas = cfg.replication.map_or(1, replicas::count);
        let mut nodes = vec![Node::new(LockTable::new(limits.clone()))];
        if cfg.service_crash_every_ms.is_some() {
            // A crashing service restarts from a snapshot and its log: a fresh log
            // starts from the empty table.
            nodes[0].snapshot = Some(LockTable::new(limits.clone()));
        }
        for _ in 1..replicas {
            nodes.push(Node::new(LockTable::new(limits.clone())));
        }
        World {
            cfg,
            sink,
            rng: Rng::new(cfg.seed),
            now: 0,
            queue: Queue::new(),
            events: 0,
            records: 0,
            limits,
            nodes,
            fault_rng: Rng::new(cfg.seed ^ 0x5eed_fa17_0000_0001),
            down: false,
            leader: 0,
            cut: None,
            granted_tokens: vec![HashSet::new(); if service::counts_duplicates(cfg) { locks } else { 0 }],
            lease_alive_at: vec![0; cfg.clients as usize],
            next_write: 0,
            written: HashSet::new(),
            effects: Vec::new(),
            answers: Vec::new(),
            next_request: 0,
            waiters: HashMap::default(),
            names: (0..locks).map(|k| LockName::new(&format!("counter/{k}")).expect("valid name")).collect(),
            gate: FenceGate::new(),
            values: vec![0; locks],
            versions: vec![0; locks],
            clients: (0..cfg.clients).map(|i| Client::new(i % cfg.locks)).collect(),
            checkers: (0..locks).map(|_| Checker::new()).collect(),
            summary: new_summary(cfg),
        }
    }

    fn occ(&self) -> bool {
        self.cfg.scenario == Scenario::Occ
    }

    /// No lock: `occ` and `partitioned`.
    fn lockless(&self) -> bool {
        self.cfg.scenario.lockless()
    }

    fn start(&mut self) {
        for c in 0..self.cfg.clients {
            let t = self.rng.between(self.cfg.think_ms.0, self.cfg.think_ms.1);
            self.wake(c, t, Wake::Acquire);
        }
        self.start_faults();
    }

    fn push(&mut self, t_ms: u64, ev: Ev) {
        self.queue.push(t_ms, ev);
    }

    fn wake(&mut self, client: u32, after_ms: u64, what: Wake) {
        let gen = self.clients[client as usize].gen;
        self.push(self.now + after_ms, Ev::Wake { client, gen, what });
    }

    /// When a message sent now by `client` arrives: a random delay, after any network
    /// hold on the client's packets.
    fn arrival(&mut self, client: u32) -> u64 {
        let d = self.rng.between(self.cfg.net_ms.0, self.cfg.net_ms.1);
        let held_until = self.clients[client as usize].net_held_until;
        if held_until > self.now {
            self.summary.delayed_messages += 1;
        }
        self.now.max(held_until) + d
    }

    fn send_service(&mut self, client: u32, msg: ServiceMsg) {
        let at = self.arrival(client);
        let lease_n = self.clients[client as usize].lease_n;
        self.push(at, Ev::ToService { client, lease_n, sent_ms: self.now, msg });
    }

    fn send_resource(&mut self, client: u32, msg: ResourceMsg) {
        let at = self.arrival(client);
        let gen = self.clients[client as usize].gen;
        self.push(at, Ev::ToResource { client, gen, sent_ms: self.now, msg });
    }

    /// Replies travel back without the client's own network hold.
    fn reply(&mut self, client: u32, gen: u32, msg: ClientMsg) {
        let d = self.rng.between(self.cfg.net_ms.0, self.cfg.net_ms.1);
        self.push(self.now + d, Ev::ToClient { client, gen, msg });
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        actor: Actor,
        kind: Kind,
        client: u32,
        token: Option<Token>,
        sent_ms: Option<u64>,
        detail: Detail,
    ) {
        if S::ENABLED {
            let lock = self.clients[client as usize].lock;
            let r = Record {
                t_ms: self.now,
                seq: self.records,
                actor,
                kind,
                client,
                lock,
                token: token.map(Token::get),
                sent_ms,
                detail,
            };
            self.sink.record(&r);
        }
        self.records += 1;
    }

    fn history(&mut self, client: u32, kind: EventKind) {
        let lock = self.clients[client as usize].lock as usize;
        // Each lock's checker numbers its own clients densely (client i is the
        // (i / locks)-th on lock i % locks), so its per-client table stays small.
        let local = client / self.cfg.locks;
        self.checkers[lock].observe(&Event { t_ms: self.now, client: local, kind });
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Wake { client, gen, what } => {
                if self.deferred(client, gen, ev) {
                    return;
                }
                self.on_wake(client, what);
            }
            Ev::ToClient { client, gen, msg } => {
                if self.deferred(client, gen, ev) {
                    return;
                }
                self.on_client_msg(client, msg);
            }
            Ev::Pause { client, gen, cause, duration_ms } => {
                if self.clients[client as usize].gen != gen {
                    return;
                }
                self.summary.pauses += 1;
                let c = &mut self.clients[client as usize];
                match cause {
                    PauseCause::NetworkDelay => c.net_held_until = self.now + duration_ms,
                    _ => c.paused_until = self.now + duration_ms,
                }
                let token = c.token;
                let detail = Detail::Pause { duration_ms, cause: cause.name() };
                self.record(Actor::Client(client), Kind::Pause, client, token, None, detail);
                self.history(client, EventKind::Paused { duration_ms });
            }
            Ev::Crash { client, gen } => {
                let c = &mut self.clients[client as usize];
                if c.gen != gen {
                    return;
                }
                c.gen += 1;
                c.phase = Phase::Crashed;
                let token = c.token.take();
                self.summary.crashes += 1;
                self.record(Actor::Client(client), Kind::Crash, client, token, None, Detail::None);
                self.push(self.now + self.cfg.restart_ms, Ev::Restart { client });
            }
            Ev::Restart { client } => {
                let c = &mut self.clients[client as usize];
                c.phase = Phase::Thinking;
                c.paused_until = 0;
                c.net_held_until = 0;
                self.record(Actor::Client(client), Kind::Restart, client, None, None, Detail::None);
                self.wake(client, 0, Wake::Acquire);
            }
            Ev::ToService { client, lease_n, sent_ms, msg } => self.on_service(client, lease_n, sent_ms, msg),
            Ev::ToResource { client, gen, sent_ms, msg } => self.on_resource(client, gen, sent_ms, msg),
            Ev::ServiceTimer { node } => {
                let node = node as usize;
                if self.nodes[node].timer_at == Some(self.now) {
                    self.nodes[node].timer_at = None;
                }
                if self.serving(node) {
                    self.service(node, Command::Tick);
                    self.after_service_call(node);
                }
            }
            Ev::ClockStep => self.on_clock_step(),
            Ev::ServiceCrash => self.on_service_crash(),
            Ev::ServiceRestart => self.on_service_restart(),
            Ev::Partition => self.on_partition(),
            Ev::TakeOver => self.on_take_over(),
            Ev::Heal => self.on_heal(),
            Ev::Replicate { from, to, index } => self.on_replicate(from as usize, to as usize, index as usize),
        }
    }

    /// Drops events of a crashed incarnation and holds events of a paused client until
    /// it runs again. True when the event was taken care of.
    fn deferred(&mut self, client: u32, gen: u32, ev: Ev) -> bool {
        let c = &self.clients[client as usize];
        if c.gen != gen || c.phase == Phase::Crashed {
            return true;
        }
        if self.now < c.paused_until {
            let at = c.paused_until;
            self.push(at, ev);
            return true;
        }
        false
    }

    fn finish(mut self) -> Summary {
        let mut s = self.summary;
        for c in self.checkers.drain(..) {
            let r = c.finish();
            s.lease_expiries += r.lease_expiries;
            s.writes_attempted += r.writes_attempted;
            s.writes_accepted += r.writes_accepted;
            s.late_writes += r.late_writes;
            s.zombie_writes += r.zombie_writes;
            s.stale_writes_rejected += r.stale_writes_rejected;
            s.lost_updates += r.lost_updates;
            s.token_regressions += r.token_regressions;
            s.overlapping_holders += r.overlapping_holders;
        }
        s.final_value = self.values.iter().sum();
        s.events = self.events;
        s
    }
}
