//! The model: its configuration, its state, its actions and its properties.

use fenced_core::gate::{admit, Admission, Op};
use fenced_core::{Answer, Effect, Error, Output, Token};
use stateright::{Model, Property};

use crate::log::{client_of, lease_of, replay, request_of, Cmd, Entry, Renewals, NONE_RENEWED};

/// Members of the group.
pub const REPLICAS: usize = 3;
/// Clients, each with one lease, contending for one lock.
pub const CLIENTS: usize = 2;
const MAJORITY: usize = REPLICAS / 2 + 1;

/// A deliberately broken protocol, for the negative controls; `Correct` is the design.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Variant {
    Correct,
    /// A leader stamps entries with its own local clock instead of continuing from the
    /// last applied entry's time (no anchor): the timeline jumps at a failover.
    LocalClock,
    /// A leader's timer decides expiry on its own local clock: it compares deadlines with
    /// it and stamps its `Tick` with it, while other entries keep the timeline.
    TickOnLocalClock,
    /// A leader answers a keepalive or an acquire as soon as it appended the entry, before
    /// a majority has it.
    AckBeforeCommit,
    /// A new leader's first entry is not `Promote`.
    NoPromote,
    /// A replica is elected without Raft's up-to-date check on its log: a leader that
    /// lacks committed entries.
    StaleLeader,
    /// A gate that accepts every token (no mark).
    GateWithoutMark,
    /// A leader answers a keepalive from memory at once, without the quorum round that
    /// confirms it still leads.
    KeepaliveUnconfirmed,
}

/// The bounds of the model and the variant it runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Every lease's TTL, in model milliseconds.
    pub ttl_ms: u64,
    /// Real time runs from 0 to this.
    pub time_max: u64,
    /// Client requests and ticks are appended only while a log is shorter than this (a
    /// new leader's blank and `Promote` always are).
    pub log_max: usize,
    /// Requests each client sends, at most (by client).
    pub requests_max: [u8; CLIENTS],
    pub leader_changes_max: u8,
    /// Each replica's monotonic clock reads real time plus this: clocks of different
    /// machines agree in rate, never in origin.
    pub clock_offsets_ms: [u64; REPLICAS],
    pub variant: Variant,
}

impl Config {
    /// The bounds the tests check the design with: three replicas, two clients, up to
    /// two leader changes.
    pub fn bounded(variant: Variant) -> Config {
        Config {
            ttl_ms: 2,
            time_max: 3,
            log_max: 7,
            requests_max: [1, 2],
            leader_changes_max: 2,
            clock_offsets_ms: [0, 1, 3],
            variant,
        }
    }

    /// Wider bounds, for a run outside the test suite (`examples/wide.rs`): both clients
    /// send two requests, logs of up to 8 entries.
    pub fn wide(variant: Variant) -> Config {
        Config { log_max: 8, requests_max: [2, 2], ..Config::bounded(variant) }
    }
}

/// What a replica believes it is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Role {
    Follower,
    Leader {
        /// Set once this term's blank entry is committed: (the applied table's time
        /// then, real time then). The leader's stamp is `table + (now − then)`.
        anchor: Option<(u64, u64)>,
        /// Takes client requests: its `Promote` is committed.
        serving: bool,
    },
}

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Replica {
    /// The highest term this replica has seen.
    pub term: u8,
    pub log: Vec<Entry>,
    pub role: Role,
    /// How much of its log a leader knows is committed (0 for followers: unused).
    pub commit: usize,
    /// A leader's applied table's next deadline (`poll_timeout`): a function of `log` and
    /// `commit`, kept only to spare a replay per state.
    pub due_at: Option<u64>,
    /// A leader's keepalives answered from memory and not yet in its log
    /// (`Node::keepalive_here`): its next entry carries them.
    pub renewals: Renewals,
}

/// What a client asked.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Keepalive,
    Acquire,
}

/// A request appended by a leader, waiting for its answer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Pending {
    pub kind: Kind,
    /// Real time the client sent it.
    pub sent_at: u64,
    pub leader: u8,
    pub term: u8,
    pub index: usize,
    /// A keepalive answered from memory, waiting for the quorum round that confirms its
    /// leader still leads (`index` is unused).
    pub confirming: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Client {
    /// The client-side rule: the send time of the last acknowledged keepalive (or the
    /// lease's grant) plus the TTL. Past it the client holds nothing, whatever it heard.
    pub valid_until: u64,
    /// The token of the last grant acknowledged to it; it may write with it any time
    /// (a paused client wakes with it).
    pub token: Option<Token>,
    /// Told its lease is gone.
    pub lease_gone: bool,
    pub pending: Option<Pending>,
    /// Requests sent so far.
    pub sent: u8,
    /// History: the latest real time a new leader took office plus the TTL, while this
    /// client's lease was live.
    pub grace_until: u64,
}

/// History variables: what happened, for the properties.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct History {
    /// The longest log prefix ever committed.
    pub committed_len: usize,
    /// The last token minted by a committed entry.
    pub last_token: Option<Token>,
    pub token_regressed: bool,
    /// A lease expired in the committed state before its holder's client-side deadline.
    pub expired_early: bool,
    /// A lease expired within a TTL of a new leader taking office.
    pub expired_in_failover: bool,
    /// The highest token the gate let through, and whether a lower one came after.
    pub gate_accepted_max: Option<Token>,
    pub gate_regressed: bool,
    pub expired: bool,
    pub gate_refused: bool,
    /// A keepalive was answered from memory, and a renewal reached a log entry.
    pub answered_from_memory: bool,
    pub renewal_appended: bool,
}

/// A state of the whole system.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct State {
    /// Real (model) time.
    pub now: u64,
    pub replicas: [Replica; REPLICAS],
    pub clients: [Client; CLIENTS],
    pub leader_changes: u8,
    /// The resource's gate: its `highest_seen`.
    pub gate_mark: Option<Token>,
    pub history: History,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Action {
    /// Real time moves on by one millisecond on every clock.
    Advance,
    /// A client sends a request to a replica that serves as leader, which appends it.
    Request { client: u8, to: u8, kind: Kind },
    /// A leader brings a replica's log in line with its own (AppendEntries), or learns
    /// of a newer term from it and steps down.
    Sync { leader: u8, to: u8 },
    /// `candidate` wins a new term with `voter`'s vote.
    Elect { candidate: u8, voter: u8 },
    /// A client writes to the resource with a token lower than the gate's mark: a client
    /// paused past its lease wakes up. (A client writes with a grant the moment it is
    /// acknowledged, as part of that step.)
    ZombieWrite { client: u8 },
    /// `voter` acknowledges the heartbeat of `leader`'s quorum round, begun after the
    /// keepalives waiting on it arrived: with the leader itself, a majority confirms it
    /// still leads, and those keepalives are answered. A voter that has seen a newer
    /// term refuses, and the leader steps down.
    Confirm { leader: u8, voter: u8 },
}

/// The protocol under `Config`.
pub struct ProtocolModel {
    pub config: Config,
}

/// The names of the properties, for tests and reports.
pub mod names {
    pub const LEASE_OUTLIVES_KEEPALIVE: &str = "no lease expires before TTL after its last acknowledged keepalive";
    pub const FAILOVER_GRACE: &str = "a new leader gives every live lease a full TTL";
    pub const TOKENS_RISE: &str = "tokens rise in commit order";
    pub const GATE_MONOTONIC: &str = "the gate never accepts a lower token after a higher one";
    pub const MUTUAL_EXCLUSION: &str = "no two clients hold the lock at once";
    pub const SOME_GRANT: &str = "a grant is acknowledged";
    pub const SOME_LEADER_CHANGE: &str = "a leader change happens";
    pub const SOME_TWO_LEADER_CHANGES: &str = "two leader changes happen";
    pub const SOME_EXPIRY: &str = "a lease expires";
    pub const SOME_GATE_REFUSAL: &str = "the gate refuses a stale token";
    pub const SOME_REQUEST_TO_DEPOSED: &str = "a deposed leader that has not heard of it takes a request";
    pub const SOME_KEEPALIVE_FROM_MEMORY: &str = "a keepalive is answered from memory";
    pub const SOME_RENEWAL_LOGGED: &str = "a keepalive answered from memory reaches a committed entry";
}

impl State {
    /// The same state with the replicas in a canonical order (by content), for symmetry
    /// reduction: with clocks that agree in rate only their offsets tell replicas apart,
    /// and only the two local-clock variants read those.
    pub fn representative(&self) -> State {
        let mut order = [0, 1, 2];
        order.sort_by(|&a, &b| self.replicas[a].cmp(&self.replicas[b]));
        let mut s = self.clone();
        for (new, &old) in order.iter().enumerate() {
            s.replicas[new] = self.replicas[old].clone();
        }
        for c in &mut s.clients {
            if let Some(p) = &mut c.pending {
                p.leader = order.iter().position(|&o| o == p.leader as usize).expect("a permutation") as u8;
            }
        }
        s
    }

    /// Forgets deadlines already past: they can no longer matter, and states that differ
    /// only in them are one.
    fn forget_past(&mut self) {
        for c in &mut self.clients {
            if c.valid_until <= self.now {
                c.valid_until = 0;
            }
            if c.grace_until <= self.now {
                c.grace_until = 0;
            }
        }
    }
}

impl ProtocolModel {
    pub fn new(config: Config) -> ProtocolModel {
        ProtocolModel { config }
    }

    /// The leader's stamp for an entry proposed now.
    fn stamp(&self, s: &State, leader: usize) -> u64 {
        match (self.config.variant, s.replicas[leader].role) {
            (Variant::LocalClock, _) => s.now + self.config.clock_offsets_ms[leader],
            (_, Role::Leader { anchor: Some((table_ms, at)), .. }) => table_ms + (s.now - at),
            _ => unreachable!("only an anchored leader stamps"),
        }
    }

    fn serving(r: &Replica) -> bool {
        matches!(r.role, Role::Leader { serving: true, .. })
    }

    /// A replica stops leading: the requests waiting on it are refused (the client
    /// learns nothing of their outcome).
    fn step_down(s: &mut State, who: usize, term: u8) {
        let r = &mut s.replicas[who];
        r.term = r.term.max(term);
        r.role = Role::Follower;
        r.commit = 0;
        r.due_at = None;
        r.renewals = NONE_RENEWED;
        for c in &mut s.clients {
            if c.pending.is_some_and(|p| p.leader as usize == who) {
                c.pending = None;
            }
        }
    }

    /// Client `c` gets `answer` to a request sent at `sent_at`; a grant is written
    /// with at once.
    fn answer(&self, s: &mut State, c: usize, kind: Kind, sent_at: u64, answer: Option<Result<Answer, Error>>) {
        let client = &mut s.clients[c];
        match (kind, answer) {
            (Kind::Keepalive, Some(Ok(Answer::Lease(_)))) => {
                client.valid_until = client.valid_until.max(sent_at + self.config.ttl_ms);
            }
            (Kind::Acquire, Some(Ok(Answer::Granted(g)))) => {
                client.token = Some(g.token);
                self.gate_write(s, g.token);
            }
            (_, Some(Err(Error::LeaseNotFound))) => client.lease_gone = true,
            _ => {}
        }
    }

    /// A write with `token` reaches the resource's gate.
    fn gate_write(&self, s: &mut State, token: Token) {
        let accepted = match self.config.variant {
            Variant::GateWithoutMark => true,
            _ => matches!(admit(s.gate_mark, Some(token), Op::Write), Admission::Accepted { .. }),
        };
        let h = &mut s.history;
        if accepted {
            h.gate_regressed |= h.gate_accepted_max.is_some_and(|max| token < max);
            h.gate_accepted_max = Some(h.gate_accepted_max.map_or(token, |m| m.max(token)));
            s.gate_mark = Some(token);
        } else {
            h.gate_refused = true;
        }
    }

    /// Every serving leader's timer: it appends `Tick` as soon as its applied table has a
    /// deadline due on its stamp, one in flight at a time (`timer_loop`). Run after every
    /// step; a later tick would only make expiry later, and any command applied at a
    /// stamp runs the timers due first anyway, so the order of a tick and a request at
    /// one stamp does not matter.
    fn timers(&self, s: &mut State) {
        for l in 0..REPLICAS {
            let r = &s.replicas[l];
            if !Self::serving(r) || r.log.len() >= self.config.log_max {
                continue;
            }
            let tick_in_flight = r.log[r.commit..].iter().any(|e| e.cmd == Cmd::Tick);
            let now_ms = match self.config.variant {
                Variant::TickOnLocalClock => s.now + self.config.clock_offsets_ms[l],
                _ => self.stamp(s, l),
            };
            if !tick_in_flight && r.due_at.is_some_and(|at| at <= now_ms) {
                Self::append(s, l, now_ms, Cmd::Tick);
            }
        }
    }

    /// What committing `outputs[index]` shows the world.
    fn observe(&self, s: &mut State, out: &Output) {
        for effect in &out.effects {
            match effect {
                Effect::Granted { grant, .. } => {
                    let h = &mut s.history;
                    if h.last_token.is_some_and(|last| grant.token <= last) {
                        h.token_regressed = true;
                    }
                    h.last_token = Some(h.last_token.map_or(grant.token, |l| l.max(grant.token)));
                }
                Effect::LeaseExpired { lease, .. } => {
                    let c = &s.clients[client_of(*lease) as usize];
                    s.history.expired = true;
                    s.history.expired_early |= s.now < c.valid_until;
                    s.history.expired_in_failover |= s.now < c.grace_until;
                }
                _ => {}
            }
        }
    }

    /// Leader `l`'s commit index moved to `to`: answers its waiting clients, shows the
    /// newly committed entries, and moves the leader through taking office.
    fn committed(&self, s: &mut State, l: usize, to: usize) {
        let from = s.replicas[l].commit;
        let term = s.replicas[l].term;
        let log = s.replicas[l].log.clone();
        let (table, outputs) = replay(&log[..to], self.config.ttl_ms);
        let first_new = s.history.committed_len;
        for (index, out) in outputs.iter().enumerate().skip(from.min(first_new)) {
            if index >= from {
                for c in 0..CLIENTS {
                    let Some(p) = s.clients[c].pending else { continue };
                    if p.confirming || (p.leader as usize, p.term, p.index) != (l, term, index) {
                        continue;
                    }
                    let answer = out.answers.iter().find(|(r, _)| *r == request_of(index)).map(|(_, a)| a.clone());
                    s.clients[c].pending = None;
                    self.answer(s, c, p.kind, p.sent_at, answer);
                }
            }
            if index >= first_new {
                self.observe(s, out);
            }
        }
        s.history.committed_len = s.history.committed_len.max(to);
        s.replicas[l].commit = to;
        s.replicas[l].due_at = table.poll_timeout();
        let Role::Leader { anchor, serving } = s.replicas[l].role else { return };
        let ours = |cmd: Cmd| log[..to].iter().any(|e| e.term == term && e.cmd == cmd);
        if anchor.is_none() && ours(Cmd::Blank) {
            // Taking office: the clock continues from the last applied entry's time.
            let anchor = Some((table.now_ms(), s.now));
            for c in 0..CLIENTS {
                if table.lease(lease_of(c as u8)).is_some() {
                    let grace = &mut s.clients[c].grace_until;
                    *grace = (*grace).max(s.now + self.config.ttl_ms);
                }
            }
            let promote = self.config.variant != Variant::NoPromote;
            s.replicas[l].role = Role::Leader { anchor, serving: !promote };
            if promote {
                let now_ms = self.stamp(s, l);
                Self::append(s, l, now_ms, Cmd::Promote);
            }
        } else if anchor.is_some() && !serving && ours(Cmd::Promote) {
            s.replicas[l].role = Role::Leader { anchor, serving: true };
        }
    }

    /// Client `c`'s keepalive, answered from memory by leader `l`: the renewal is
    /// recorded at `l`'s time now, and the answer waits for a quorum round (at once in
    /// the broken variant).
    fn keepalive_from_memory(&self, s: &mut State, c: usize, l: usize) {
        let at = self.stamp(s, l);
        let r = &mut s.replicas[l];
        r.renewals[c] = Some(r.renewals[c].map_or(at, |prev| prev.max(at)));
        s.clients[c].sent += 1;
        if self.config.variant == Variant::KeepaliveUnconfirmed {
            let now = s.now;
            self.renewed(s, c, now);
            return;
        }
        let (term, sent_at) = (s.replicas[l].term, s.now);
        let pending = Pending { kind: Kind::Keepalive, sent_at, leader: l as u8, term, index: 0, confirming: true };
        s.clients[c].pending = Some(pending);
    }

    /// Client `c` hears its keepalive sent at `sent_at` was answered from memory.
    fn renewed(&self, s: &mut State, c: usize, sent_at: u64) {
        s.history.answered_from_memory = true;
        let client = &mut s.clients[c];
        client.valid_until = client.valid_until.max(sent_at + self.config.ttl_ms);
    }

    /// `voter` answers leader `l`'s heartbeat: a voter of a newer term deposes `l`;
    /// otherwise it follows `l`'s term, and `l` with it is a majority: the keepalives
    /// waiting on `l` are answered.
    fn confirm(&self, s: &mut State, l: usize, voter: usize) {
        let term = s.replicas[l].term;
        if s.replicas[voter].term > term {
            let newer = s.replicas[voter].term;
            return Self::step_down(s, l, newer);
        }
        if s.replicas[voter].term < term {
            Self::step_down(s, voter, term);
        }
        for c in 0..CLIENTS {
            let Some(p) = s.clients[c].pending else { continue };
            if p.confirming && p.leader as usize == l {
                s.clients[c].pending = None;
                self.renewed(s, c, p.sent_at);
            }
        }
    }

    /// Leader `l` appends `cmd` stamped `now_ms`, carrying its renewals (the drain in
    /// `propose_batch`: every batch takes the renewals answered before it).
    fn append(s: &mut State, l: usize, now_ms: u64, cmd: Cmd) {
        let r = &mut s.replicas[l];
        let renewed = std::mem::replace(&mut r.renewals, NONE_RENEWED);
        s.history.renewal_appended |= renewed.iter().any(Option::is_some);
        r.log.push(Entry { term: r.term, now_ms, cmd, renewed });
    }

    /// Whether serving leader `l` answers client `c`'s keepalive from memory now: its
    /// applied table holds the lease alive past its stamp, or a renewal answered since
    /// does (`Node::renew_in_memory`).
    fn answers_from_memory(&self, s: &State, l: usize, c: usize) -> bool {
        let r = &s.replicas[l];
        let (table, _) = replay(&r.log[..r.commit], self.config.ttl_ms);
        let Some(lease) = table.lease(lease_of(c as u8)) else { return false };
        let renewed = r.renewals[c].map_or(0, |at| at + self.config.ttl_ms);
        lease.expires_at_ms.max(renewed) > self.stamp(s, l)
    }

    /// The longest prefix of `l`'s log a majority holds, if it ends in `l`'s term
    /// (Raft's commit rule).
    fn commit_index(s: &State, l: usize) -> usize {
        let leader = &s.replicas[l];
        (leader.commit + 1..=leader.log.len())
            .rev()
            .find(|&n| {
                let holders = s.replicas.iter().filter(|r| r.log.len() >= n && r.log[..n] == leader.log[..n]).count();
                holders >= MAJORITY && leader.log[n - 1].term == leader.term
            })
            .unwrap_or(leader.commit)
    }

    fn up_to_date(candidate: &[Entry], voter: &[Entry]) -> bool {
        let last = |log: &[Entry]| (log.last().map_or(0, |e| e.term), log.len());
        last(candidate) >= last(voter)
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let log = vec![Entry::new(1, 0, Cmd::Init)];
        let follower = Replica {
            term: 1,
            log: log.clone(),
            role: Role::Follower,
            commit: 0,
            due_at: None,
            renewals: NONE_RENEWED,
        };
        // Replica 0 leads term 1, anchored at 0 and serving; the leases are committed.
        let due_at = replay(&log, self.config.ttl_ms).0.poll_timeout();
        let leader = Replica {
            role: Role::Leader { anchor: Some((0, 0)), serving: true },
            commit: 1,
            due_at,
            ..follower.clone()
        };
        let client = Client {
            valid_until: self.config.ttl_ms,
            token: None,
            lease_gone: false,
            pending: None,
            sent: 0,
            grace_until: 0,
        };
        vec![State {
            now: 0,
            replicas: [leader, follower.clone(), follower],
            clients: [client.clone(), client],
            leader_changes: 0,
            gate_mark: None,
            history: History { committed_len: 1, ..History::default() },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.config.time_max {
            actions.push(Action::Advance);
        }
        for l in 0..REPLICAS {
            let r = &s.replicas[l];
            if !matches!(r.role, Role::Leader { .. }) {
                continue;
            }
            for to in (0..REPLICAS).filter(|&to| to != l && s.replicas[to].log != r.log || s.replicas[to].term > r.term)
            {
                actions.push(Action::Sync { leader: l as u8, to: to as u8 });
            }
            if !Self::serving(r) || r.log.len() >= self.config.log_max {
                continue;
            }
            for (c, client) in s.clients.iter().enumerate() {
                if client.pending.is_some() || client.lease_gone || client.sent >= self.config.requests_max[c] {
                    continue;
                }
                actions.push(Action::Request { client: c as u8, to: l as u8, kind: Kind::Keepalive });
                if client.token.is_none() {
                    actions.push(Action::Request { client: c as u8, to: l as u8, kind: Kind::Acquire });
                }
            }
        }
        for l in 0..REPLICAS {
            let waiting = s.clients.iter().any(|c| c.pending.is_some_and(|p| p.confirming && p.leader as usize == l));
            if waiting {
                for voter in (0..REPLICAS).filter(|&v| v != l) {
                    actions.push(Action::Confirm { leader: l as u8, voter: voter as u8 });
                }
            }
        }
        if s.leader_changes < self.config.leader_changes_max {
            for candidate in 0..REPLICAS {
                for voter in (0..REPLICAS).filter(|&v| v != candidate) {
                    let fit = self.config.variant == Variant::StaleLeader
                        || Self::up_to_date(&s.replicas[candidate].log, &s.replicas[voter].log);
                    if fit {
                        actions.push(Action::Elect { candidate: candidate as u8, voter: voter as u8 });
                    }
                }
            }
        }
        for (c, client) in s.clients.iter().enumerate() {
            if client.token.is_some_and(|t| s.gate_mark.is_some_and(|mark| t < mark)) {
                actions.push(Action::ZombieWrite { client: c as u8 });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Advance => s.now += 1,
            Action::Request { client, to, kind: Kind::Keepalive }
                if self.answers_from_memory(&s, to as usize, client as usize) =>
            {
                self.keepalive_from_memory(&mut s, client as usize, to as usize);
            }
            Action::Request { client, to, kind } => {
                let (c, l) = (client as usize, to as usize);
                let index = s.replicas[l].log.len();
                let cmd = match kind {
                    Kind::Keepalive => Cmd::Keepalive(client),
                    Kind::Acquire => Cmd::Acquire(client),
                };
                let now_ms = self.stamp(&s, l);
                Self::append(&mut s, l, now_ms, cmd);
                s.clients[c].sent += 1;
                if self.config.variant == Variant::AckBeforeCommit {
                    let (_, outputs) = replay(&s.replicas[l].log, self.config.ttl_ms);
                    let answer = outputs[index].answers.iter().find(|(r, _)| *r == request_of(index));
                    let answer = answer.map(|(_, a)| a.clone());
                    let now = s.now;
                    self.answer(&mut s, c, kind, now, answer);
                } else {
                    let term = s.replicas[l].term;
                    let pending = Pending { kind, sent_at: s.now, leader: to, term, index, confirming: false };
                    s.clients[c].pending = Some(pending);
                }
            }
            Action::Sync { leader, to } => {
                let (l, f) = (leader as usize, to as usize);
                if s.replicas[f].term > s.replicas[l].term {
                    let term = s.replicas[f].term;
                    Self::step_down(&mut s, l, term);
                    return Some(s);
                }
                if matches!(s.replicas[f].role, Role::Leader { .. }) {
                    let term = s.replicas[l].term;
                    Self::step_down(&mut s, f, term);
                }
                let leader_replica = s.replicas[l].clone();
                let follower = &mut s.replicas[f];
                follower.term = leader_replica.term;
                follower.log = leader_replica.log;
                let to = Self::commit_index(&s, l);
                if to > s.replicas[l].commit {
                    self.committed(&mut s, l, to);
                }
            }
            Action::Elect { candidate, voter } => {
                let (c, v) = (candidate as usize, voter as usize);
                let term = s.replicas.iter().map(|r| r.term).max().unwrap_or(0) + 1;
                for who in [c, v] {
                    Self::step_down(&mut s, who, term);
                }
                let r = &mut s.replicas[c];
                r.role = Role::Leader { anchor: None, serving: false };
                r.log.push(Entry::new(term, 0, Cmd::Blank));
                s.leader_changes += 1;
            }
            Action::ZombieWrite { client } => {
                let token = s.clients[client as usize].token.expect("only a client with a token writes");
                self.gate_write(&mut s, token);
            }
            Action::Confirm { leader, voter } => self.confirm(&mut s, leader as usize, voter as usize),
        }
        self.timers(&mut s);
        s.forget_past();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        use names::*;
        vec![
            Property::always(LEASE_OUTLIVES_KEEPALIVE, |_, s: &State| !s.history.expired_early),
            Property::always(FAILOVER_GRACE, |_, s: &State| !s.history.expired_in_failover),
            Property::always(TOKENS_RISE, |_, s: &State| !s.history.token_regressed),
            Property::always(GATE_MONOTONIC, |_, s: &State| !s.history.gate_regressed),
            Property::always(MUTUAL_EXCLUSION, |_, s: &State| {
                let holds = |c: &Client| c.token.is_some() && s.now < c.valid_until;
                !s.clients.iter().all(holds)
            }),
            Property::sometimes(SOME_GRANT, |_, s: &State| s.history.last_token.is_some()),
            Property::sometimes(SOME_LEADER_CHANGE, |_, s: &State| s.leader_changes >= 1),
            Property::sometimes(SOME_TWO_LEADER_CHANGES, |_, s: &State| s.leader_changes >= 2),
            Property::sometimes(SOME_EXPIRY, |_, s: &State| s.history.expired),
            Property::sometimes(SOME_GATE_REFUSAL, |_, s: &State| s.history.gate_refused),
            Property::sometimes(SOME_KEEPALIVE_FROM_MEMORY, |_, s: &State| s.history.answered_from_memory),
            Property::sometimes(SOME_RENEWAL_LOGGED, |_, s: &State| {
                let committed = |r: &Replica| r.log[..r.commit].iter().any(|e| e.renewed.iter().any(Option::is_some));
                s.replicas.iter().any(committed)
            }),
            Property::sometimes(SOME_REQUEST_TO_DEPOSED, |_, s: &State| {
                let newest = s.replicas.iter().map(|r| r.term).max().unwrap_or(0);
                s.clients.iter().any(|c| c.pending.is_some_and(|p| p.term < newest))
            }),
        ]
    }
}
