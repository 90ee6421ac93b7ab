//! What moves between the simulated parties (events in virtual time, the messages of
//! clients, service and resource) and what a client is doing.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Phase {
    Thinking,
    Acquiring,
    Reading,
    Working,
    Writing,
    Releasing,
    Crashed,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Wake {
    Acquire,
    WriteDue,
    Renew,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Ev {
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
pub(super) enum ServiceMsg {
    Acquire,
    Keepalive,
    Release,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum ResourceMsg {
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
pub(super) enum ClientMsg {
    Granted { lease_n: u32, token: Token },
    NotGranted { lease_n: u32 },
    KeepaliveReply { lease_n: u32, ok: bool },
    ReleaseAck,
    ReadReply { ok: bool, value: u64, version: u64 },
    WriteReply { ok: bool },
}

pub(super) struct Client {
    pub(super) phase: Phase,
    /// Bumped on every crash and on every change that makes pending timers stale.
    pub(super) gen: u32,
    /// Bumped on every acquire: the lease of this attempt.
    pub(super) lease_n: u32,
    pub(super) lock: u32,
    pub(super) token: Option<Token>,
    /// The lease is known to be gone (a keepalive came back "not found").
    pub(super) lost: bool,
    /// Process pause: nothing runs before this.
    pub(super) paused_until: u64,
    /// Network delay: nothing this client sends arrives before this.
    pub(super) net_held_until: u64,
    /// What the last read returned.
    pub(super) read_value: u64,
    pub(super) read_version: u64,
}

impl Client {
    /// A client thinking before its first cycle on `lock`.
    pub(super) fn new(lock: u32) -> Client {
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
