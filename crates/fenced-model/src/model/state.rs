//! The state the model explores: the replicas, the clients, what happened so far, and the
//! actions that move it.

use super::*;

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
