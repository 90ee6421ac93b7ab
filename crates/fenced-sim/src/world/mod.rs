//! The event loop: clients running the counter workload, the lock service (the real
//! `LockTable`) and the resource (the real fence gate), joined by a network with
//! random delays, all in virtual time. The faults of the lock service itself (a wall
//! clock that steps, crashes, a replicated service cut in two) are in `service.rs` and
//! `replicas.rs`.

mod replicas;
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Thinking,
    Acquiring,
    Reading,
    Working,
    Writing,
    Releasing,
    Crashed,
}

#[derive(Clone, Copy, Debug)]
enum Wake {
    Acquire,
    WriteDue,
    Renew,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    /// A client's own timer. `gen` must match the client's for it to count.
    Wake {
        client: u32,
        gen: u32,
        what: Wake,
    },
    Pause {
        client: u32,
        gen: u32,
        cause: PauseCause,
        duration_ms: u64,
    },
    Crash {
        client: u32,
        gen: u32,
    },
    Restart {
        client: u32,
    },
    ToService {
        client: u32,
        lease_n: u32,
        sent_ms: u64,
        msg: ServiceMsg,
    },
    ToResource {
        client: u32,
        gen: u32,
        sent_ms: u64,
        msg: ResourceMsg,
    },
    ToClient {
        client: u32,
        gen: u32,
        msg: ClientMsg,
    },
    /// A lock service node's timer.
    ServiceTimer {
        node: u8,
    },
    /// The lock service's wall clock steps forward.
    ClockStep,
    ServiceCrash,
    ServiceRestart,
    /// Replicated runs: the replicas are cut apart, a replica takes over, the cut heals,
    /// a log entry reaches a follower.
    Partition,
    TakeOver,
    Heal,
    Replicate {
        from: u8,
        to: u8,
        index: u32,
    },
}

#[derive(Clone, Copy, Debug)]
enum ServiceMsg {
    Acquire,
    Keepalive,
    Release,
}

#[derive(Clone, Copy, Debug)]
enum ResourceMsg {
    Read {
        held: Option<Token>,
    },
    /// `id` is the write's idempotency key: every copy of one write carries the same.
    Write {
        held: Option<Token>,
        value: u64,
        version: u64,
        id: u64,
    },
}

#[derive(Clone, Copy, Debug)]
enum ClientMsg {
    Granted { lease_n: u32, token: Token },
    NotGranted { lease_n: u32 },
    KeepaliveReply { lease_n: u32, ok: bool },
    ReleaseAck,
    ReadReply { ok: bool, value: u64, version: u64 },
    WriteReply { ok: bool },
}

struct Client {
    phase: Phase,
    /// Bumped on every crash and on every change that makes pending timers stale.
    gen: u32,
    /// Bumped on every acquire: the lease of this attempt.
    lease_n: u32,
    lock: u32,
    token: Option<Token>,
    /// The lease is known to be gone (a keepalive came back "not found").
    lost: bool,
    /// Process pause: nothing runs before this.
    paused_until: u64,
    /// Network delay: nothing this client sends arrives before this.
    net_held_until: u64,
    /// What the last read returned.
    read_value: u64,
    read_version: u64,
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

impl Client {
    /// A client thinking before its first cycle on `lock`.
    fn new(lock: u32) -> Client {
        Client {
            phase: Phase::Thinking,
            gen: 0,
            lease_n: 0,
            lock,
            token: None,
            lost: false,
            paused_until: 0,
            net_held_until: 0,
            read_value: 0,
            read_version: 0,
        }
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

    fn on_wake(&mut self, client: u32, what: Wake) {
        let c = &self.clients[client as usize];
        match what {
            Wake::Acquire if self.lockless() => {
                self.clients[client as usize].phase = Phase::Reading;
                self.send_resource(client, ResourceMsg::Read { held: None });
            }
            Wake::Acquire => {
                let c = &mut self.clients[client as usize];
                c.lease_n += 1;
                c.phase = Phase::Acquiring;
                c.token = None;
                c.lost = false;
                self.record(Actor::Client(client), Kind::Acquire, client, None, None, Detail::None);
                self.send_service(client, ServiceMsg::Acquire);
                // While queued, the client library keeps the lease alive.
                self.wake(client, (self.cfg.lease_ms / 3).max(1), Wake::Renew);
            }
            Wake::Renew => {
                let interval = match c.phase {
                    Phase::Acquiring => (self.cfg.lease_ms / 3).max(1),
                    Phase::Reading | Phase::Working | Phase::Writing => match self.cfg.renew_fraction {
                        Some(f) => ((self.cfg.lease_ms as f64 * f) as u64).max(1),
                        None => return,
                    },
                    _ => return,
                };
                self.send_service(client, ServiceMsg::Keepalive);
                self.wake(client, interval, Wake::Renew);
            }
            Wake::WriteDue => {
                if c.phase != Phase::Working {
                    return;
                }
                if c.lost {
                    // It knows: a renewing client heard "lease not found" in time.
                    self.summary.writes_aborted += 1;
                    let token = c.token;
                    self.record(Actor::Client(client), Kind::Aborted, client, token, None, Detail::None);
                    self.release(client);
                    return;
                }
                let held = if self.lockless() { None } else { c.token };
                let id = self.next_write;
                self.next_write += 1;
                let msg = ResourceMsg::Write { held, value: c.read_value + 1, version: c.read_version, id };
                self.clients[client as usize].phase = Phase::Writing;
                // An at-least-once client sends a write again when it cannot tell whether
                // the first copy arrived (`idempotent`): both copies carry the same key.
                for _ in 0..self.cfg.write_copies {
                    self.send_resource(client, msg);
                }
            }
        }
    }

    fn release(&mut self, client: u32) {
        self.clients[client as usize].phase = Phase::Releasing;
        self.send_service(client, ServiceMsg::Release);
    }

    fn think(&mut self, client: u32) {
        let c = &mut self.clients[client as usize];
        c.phase = Phase::Thinking;
        c.gen += 1; // no renewal timer outlives the attempt
        let t = self.rng.between(self.cfg.think_ms.0, self.cfg.think_ms.1);
        self.wake(client, t, Wake::Acquire);
    }

    fn on_client_msg(&mut self, client: u32, msg: ClientMsg) {
        let c = &mut self.clients[client as usize];
        match msg {
            ClientMsg::Granted { lease_n, token } => {
                if c.phase != Phase::Acquiring || c.lease_n != lease_n {
                    return; // a grant for an attempt it gave up; the lease will expire
                }
                c.phase = Phase::Reading;
                c.token = Some(token);
                let held = Some(token);
                self.send_resource(client, ResourceMsg::Read { held });
            }
            ClientMsg::NotGranted { lease_n } => {
                if c.phase == Phase::Acquiring && c.lease_n == lease_n {
                    self.think(client);
                }
            }
            ClientMsg::KeepaliveReply { lease_n, ok } => {
                if !ok && c.lease_n == lease_n {
                    c.lost = true;
                }
            }
            ClientMsg::ReleaseAck => {
                if c.phase == Phase::Releasing {
                    self.think(client);
                }
            }
            ClientMsg::ReadReply { ok, value, version } => {
                if c.phase != Phase::Reading {
                    return;
                }
                if !ok {
                    self.release(client); // a newer holder got there first
                    return;
                }
                c.read_value = value;
                c.read_version = version;
                c.phase = Phase::Working;
                self.start_work(client);
            }
            ClientMsg::WriteReply { ok } => {
                if c.phase != Phase::Writing {
                    return;
                }
                if ok {
                    self.summary.acknowledged += 1;
                }
                if self.lockless() {
                    if ok {
                        self.think(client);
                    } else {
                        self.clients[client as usize].phase = Phase::Reading; // lost the race: read again
                        self.send_resource(client, ResourceMsg::Read { held: None });
                    }
                } else {
                    self.release(client);
                }
            }
        }
    }

    /// The critical section: work for a while, maybe pause, maybe crash, then write.
    fn start_work(&mut self, client: u32) {
        let work = self.rng.between(self.cfg.work_ms.0, self.cfg.work_ms.1);
        let gen = self.clients[client as usize].gen;
        if self.rng.chance(self.cfg.pause_chance) {
            if let Some((cause, duration_ms)) = pauses::draw(self.cfg.pauses, &mut self.rng) {
                let at = self.now + self.rng.between(0, work);
                self.push(at, Ev::Pause { client, gen, cause, duration_ms });
            }
        }
        if self.rng.chance(self.cfg.crash_chance) {
            let at = self.now + self.rng.between(0, work);
            self.push(at, Ev::Crash { client, gen });
        }
        self.wake(client, work, Wake::WriteDue);
    }

    fn lease_id(client: u32, lease_n: u32) -> LeaseId {
        LeaseId(((client as u128) << 32) | lease_n as u128)
    }

    fn client_of(lease: LeaseId) -> (u32, u32) {
        ((lease.0 >> 32) as u32, lease.0 as u32)
    }

    fn on_service(&mut self, client: u32, lease_n: u32, sent_ms: u64, msg: ServiceMsg) {
        let Some(node) = self.route(client) else {
            return self.unavailable(client, lease_n, msg);
        };
        let lease = Self::lease_id(client, lease_n);
        let name = self.names[self.clients[client as usize].lock as usize].clone();
        match msg {
            ServiceMsg::Acquire => {
                // An implicit lease the client names (one per attempt), as the real
                // client acquires: it lives from the grant, and a retry names it again.
                let (wait_ms, lock_delay_ms) = (self.cfg.wait_ms, self.cfg.lock_delay_ms);
                let lease = LeaseRef::Implicit { id: lease, ttl_ms: self.cfg.lease_ms };
                let req = Acquire { name, lease, wait_ms, lock_delay_ms, holder: None };
                let (request, answer) = self.service(node, Command::Acquire(req));
                match answer {
                    None => drop(self.waiters.insert(request, (client, lease_n, node))),
                    // Grants, immediate or later, reach the client through the effects.
                    Some(Ok(Answer::Granted(_))) => {}
                    Some(_) => {
                        let gen = self.clients[client as usize].gen;
                        self.reply(client, gen, ClientMsg::NotGranted { lease_n });
                    }
                }
            }
            ServiceMsg::Keepalive => {
                let ok = matches!(self.service(node, Command::Keepalive { lease }).1, Some(Ok(_)));
                if ok {
                    self.lease_alive_at[client as usize] = self.now;
                }
                let token = self.clients[client as usize].token;
                self.record(Actor::Lock, Kind::Keepalive, client, token, Some(sent_ms), Detail::Keepalive { ok });
                let gen = self.clients[client as usize].gen;
                self.reply(client, gen, ClientMsg::KeepaliveReply { lease_n, ok });
            }
            ServiceMsg::Release => {
                self.service(node, Command::Release { name, lease });
                self.service(node, Command::Revoke { lease });
                let gen = self.clients[client as usize].gen;
                self.reply(client, gen, ClientMsg::ReleaseAck);
            }
        }
        self.after_service_call(node);
    }

    /// No node serves this client now (the service is down, or the client is cut off
    /// from every replica that serves): its connection fails. An acquire is answered
    /// "not granted" (it tries again later), a release "done" (its lease ends anyway),
    /// a keepalive not at all (the client cannot tell whether its lease lives).
    fn unavailable(&mut self, client: u32, lease_n: u32, msg: ServiceMsg) {
        let gen = self.clients[client as usize].gen;
        match msg {
            ServiceMsg::Acquire => self.reply(client, gen, ClientMsg::NotGranted { lease_n }),
            ServiceMsg::Release => self.reply(client, gen, ClientMsg::ReleaseAck),
            ServiceMsg::Keepalive => {}
        }
    }

    /// Applies one command to the lock service now: its effects and the answers to
    /// queued requests are kept for `after_service_call`; its request id and its own
    /// answer are returned (`None` while it waits).
    fn service(&mut self, node: usize, cmd: Command) -> (RequestId, Option<Result<Answer, Error>>) {
        self.next_request += 1;
        let request = RequestId(self.next_request);
        let batch = Batch::one(request, cmd, self.node_now(node));
        if self.cfg.replication.is_some() {
            self.replicate(node, &batch);
        }
        self.nodes[node].append(&batch);
        let mut own = None;
        let (effects, answers) = (&mut self.effects, &mut self.answers);
        self.nodes[node].table.apply_batch(batch, &mut Output::default(), |out| {
            own = out.take_answer(request);
            effects.append(&mut out.effects);
            answers.append(&mut out.answers);
        });
        (request, own)
    }

    /// Carries out the effects of a node's table and re-arms its timer.
    fn after_service_call(&mut self, node: usize) {
        let mut effects = std::mem::take(&mut self.effects);
        let answers = std::mem::take(&mut self.answers);
        for e in effects.drain(..) {
            match e {
                Effect::Granted { grant, request, .. } => {
                    if let Some(w) = request {
                        self.waiters.remove(&w);
                        let answer = answers.iter().find(|(r, _)| *r == w).map(|(_, a)| a);
                        if !matches!(answer, Some(Ok(Answer::Granted(_)))) {
                            // Lost again in the same tick: the table does not answer it
                            // as a grant, so neither does the network.
                            let (client, lease_n) = Self::client_of(grant.lease);
                            let token = grant.token;
                            self.granted(node, client, token);
                            let gen = self.clients[client as usize].gen;
                            self.reply(client, gen, ClientMsg::NotGranted { lease_n });
                            continue;
                        }
                    }
                    let (client, lease_n) = Self::client_of(grant.lease);
                    if lease_n == self.clients[client as usize].lease_n {
                        // The implicit lease's TTL runs from its grant.
                        self.lease_alive_at[client as usize] = self.now;
                    }
                    self.summary.grants += 1;
                    let token = grant.token;
                    self.granted(node, client, token);
                    let gen = self.clients[client as usize].gen;
                    self.reply(client, gen, ClientMsg::Granted { lease_n, token });
                }
                Effect::Released { token, lease, reason, .. } => {
                    let (client, _) = Self::client_of(lease);
                    if reason == ReleaseReason::Expired {
                        if self.now < self.lease_alive_at[client as usize] + self.cfg.lease_ms {
                            self.summary.early_expiries += 1;
                        }
                        self.record(Actor::Lock, Kind::Expired, client, Some(token), None, Detail::None);
                        self.history(client, EventKind::LeaseExpired { token });
                    } else {
                        self.record(Actor::Lock, Kind::Released, client, Some(token), None, Detail::None);
                        self.history(client, EventKind::Released { token });
                    }
                }
                Effect::WaitEnded { request, .. } => {
                    // Timed out, or its lease ended: the client hears "not granted".
                    if let Some((client, lease_n, _)) = self.waiters.remove(&request) {
                        self.record(Actor::Lock, Kind::WaitEnded, client, None, None, Detail::None);
                        let gen = self.clients[client as usize].gen;
                        self.reply(client, gen, ClientMsg::NotGranted { lease_n });
                    }
                }
                Effect::LeaseExpired { .. } | Effect::StoreFenced { .. } => {}
            }
        }
        self.effects = effects;
        self.arm_timer(node);
    }

    /// A grant reached a client's history: the trace, the checker, and the count of
    /// tokens granted twice.
    fn granted(&mut self, node: usize, client: u32, token: Token) {
        let detail =
            if self.cfg.replication.is_some() { Detail::Replica { replica: node as u32 } } else { Detail::None };
        self.record(Actor::Lock, Kind::Granted, client, Some(token), None, detail);
        self.history(client, EventKind::Granted { token });
        let lock = self.clients[client as usize].lock as usize;
        if let Some(seen) = self.granted_tokens.get_mut(lock) {
            if !seen.insert(token.get()) {
                self.summary.duplicate_tokens += 1;
            }
        }
    }

    fn on_resource(&mut self, client: u32, gen: u32, sent_ms: u64, msg: ResourceMsg) {
        let key = self.clients[client as usize].lock;
        let fenced = self.cfg.fencing;
        match msg {
            ResourceMsg::Read { held } => {
                let ok = !fenced || self.gate.admit(key, held, Op::Read).is_accepted();
                let value = self.values[key as usize];
                let version = self.versions[key as usize];
                let outcome = if ok { Outcome::Accepted } else { Outcome::Rejected };
                self.record(
                    Actor::Resource,
                    Kind::Read,
                    client,
                    held,
                    Some(sent_ms),
                    Detail::Read { fenced, value, accepted: ok },
                );
                self.history(client, EventKind::Read { held, fenced, value, outcome });
                self.reply(client, gen, ClientMsg::ReadReply { ok, value, version });
            }
            ResourceMsg::Write { held, value, version, id } => {
                if self.cfg.write_copies > 1 && !self.written.insert(id) {
                    // The idempotency key says: applied already. Nothing changes.
                    self.summary.duplicates_absorbed += 1;
                    self.record(Actor::Resource, Kind::Duplicate, client, held, Some(sent_ms), Detail::None);
                    return;
                }
                let value_before = self.values[key as usize];
                let ok = if self.occ() {
                    version == self.versions[key as usize]
                } else if fenced {
                    self.gate.admit(key, held, Op::Write).is_accepted()
                } else {
                    true
                };
                if ok {
                    self.values[key as usize] = value;
                    self.versions[key as usize] += 1;
                }
                let outcome = if ok { Outcome::Accepted } else { Outcome::Rejected };
                let checker = &self.checkers[key as usize];
                let (zombies_before, late_before) = (checker.report().zombie_writes, checker.report().late_writes);
                self.history(
                    client,
                    EventKind::Write { held, fenced, value, value_before: Some(value_before), outcome },
                );
                let report = self.checkers[key as usize].report();
                let zombie = report.zombie_writes > zombies_before;
                let late = report.late_writes > late_before;
                let seq = self.records;
                if zombie {
                    // This write's findings are the last few: late, zombie, lost update.
                    let kind = report
                        .findings
                        .iter()
                        .rev()
                        .take(3)
                        .map(|f| f.kind)
                        .find(|k| matches!(k, FindingKind::ZombieWrite { .. }));
                    if let Some(FindingKind::ZombieWrite { token, highest_seen, pause_ms }) = kind {
                        let m = &mut self.summary.zombie_pause_ms_min;
                        *m = Some(m.map_or(pause_ms, |m| m.min(pause_ms)));
                        if self.summary.zombies.len() < Summary::ZOMBIES_KEPT {
                            let (token, highest_seen) = (token.get(), highest_seen.get());
                            let proof = ZombieProof { t_ms: self.now, seq, client, token, highest_seen, pause_ms };
                            self.summary.zombies.push(proof);
                        }
                    }
                }
                if !ok && self.summary.first_rejection.is_none() {
                    self.summary.first_rejection = Some((self.now, seq));
                }
                let detail = Detail::Write { fenced, value, value_before, accepted: ok, late, zombie };
                self.record(Actor::Resource, Kind::Write, client, held, Some(sent_ms), detail);
                self.reply(client, gen, ClientMsg::WriteReply { ok });
            }
        }
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
