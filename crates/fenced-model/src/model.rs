//! The model: its configuration, its state, its actions and its properties.

use fenced_core::gate::{admit, Admission, Op};
use fenced_core::{Answer, Effect, Error, Output, Token};
use stateright::{Model, Property};

use crate::log::{client_of, lease_of, replay, request_of, Cmd, Entry, Renewals, NONE_RENEWED};

mod state;
mod steps;

pub use state::*;

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
