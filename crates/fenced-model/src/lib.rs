//! A model of Fenced's replicated lease protocol, checked with `stateright`.
//!
//! Three replicas, two clients with a lease each, one lock, a fenced resource, and up to
//! two leader changes. The model explores every interleaving of these actions, within
//! bounds on real time and log length:
//!
//! - **Time.** Real time advances one millisecond at a time, by an action of its own, so
//!   how much time passes between any two other actions is nondeterministic. Every
//!   replica's monotonic clock reads real time plus its own offset (clocks agree in rate,
//!   never in origin; a clock that runs fast is outside the model, as it is outside the
//!   design, where the client's margin covers it).
//! - **The leader's stamp.** A leader takes office when its term's blank entry commits;
//!   it anchors then: its stamps continue from the applied table's time, advancing with
//!   its own clock (`fenced-raft`'s `Clock::stamp`). Its first entry after that is
//!   `Promote`, and it serves clients only once `Promote` is committed (`take_office`).
//!   A serving leader appends `Tick` as soon as the applied table's next deadline is due
//!   on its stamp, one at a time (`timer_loop`), within the step that made it due. A
//!   later tick could only make expiry later, and any command applied at a stamp runs
//!   the timers due first, so the order of a tick and a request at one stamp does not
//!   matter.
//! - **Raft, abstracted.** A replica is elected by itself and one voter (a majority of
//!   three), in a term above every term seen, if its log is at least as up to date as the
//!   voter's (last term, then length). A leader syncs a replica's log to its own
//!   (AppendEntries) if that replica's term is not newer, and steps down otherwise. An
//!   entry is committed when a majority holds the leader's log up to it and it is of the
//!   leader's term (Raft's commit rule; earlier entries commit with it). A deposed leader
//!   that has not heard of the new term still appends, but cannot commit. Votes,
//!   messages in flight, crashes and snapshots are not modelled: elections may happen at
//!   any moment, which covers any timing of failures.
//! - **Keepalives from memory.** A serving leader whose applied table holds the lease
//!   alive past its stamp (or a keepalive it answered since does) records the renewal
//!   at its stamp instead of appending an entry, and its next entry carries every
//!   renewal recorded since (`Command::Renewed`, applied before that entry's time
//!   moves: `Node::keepalive_here` and the drain in `propose_batch`). The client is
//!   answered once a `Confirm` step (a voter acknowledging the heartbeat of a quorum
//!   round begun after the keepalive arrived) shows a majority still on the leader's
//!   term; a voter that has seen a newer term deposes it instead. The periodic flush
//!   (a `Tick` every 100 ms while renewals wait) is not a step of its own: the timer's
//!   `Tick`, which comes when a renewal matters to an expiry, carries them.
//! - **Clients.** A client sends a keepalive or a try-lock to a serving leader, which
//!   appends it at once (sending and appending are one step), or answers a keepalive
//!   from memory as above. The answer comes when the
//!   entry is committed by the leader that appended it, still in office; a leader that
//!   steps down refuses what it was waiting on, and the client learns nothing (even if
//!   the entry commits later). The client judges its lease by its own rule: the send
//!   time of its last acknowledged keepalive (or the lease's grant) plus the TTL. It
//!   writes to the resource the moment a grant is acknowledged, and may write again with
//!   that token at any later moment, also long after its lease is gone (a paused client
//!   waking up; only such a write to a gate that has seen a newer token is a separate
//!   step, a repeated write by the newest holder changes nothing).
//! - **The lock table is the real one.** Each entry is one command of a small alphabet
//!   (`log::Cmd`) that `log::replay` turns into `fenced_core::Command`s and applies with
//!   `fenced_core::LockTable` at `max(stamp, table time)`, as `fenced-raft`'s state
//!   machine does. Tokens are minted, leases expire and locks change hands in the core's
//!   own code; the table is recomputed from a log when needed, never stored in a state.
//!   The gate is `fenced_core::gate::admit`.
//!
//! Properties (`always`): no lease expires in the committed state before TTL after its
//! holder's last acknowledged keepalive, in real time; a new leader gives every live
//! lease a full TTL of real time from the moment it takes office; tokens rise in commit
//! order; the gate never accepts a lower token after a higher one; no two clients hold
//! the lock at once by their own rule. `sometimes` properties show the model reaches a
//! grant, one and two leader changes, an expiry, a refusal at the gate, a deposed
//! leader taking a request, a keepalive answered from memory and a renewal committed.
//!
//! Negative controls: each [`Variant`] breaks one rule, and the tests check that the
//! checker finds the counterexample it should.
//!
//! **Bounds** ([`Config::bounded`]): TTL 2 ms, real time 0 to 3 ms, clock offsets 0, 1
//! and 3 ms, logs of at most 7 entries (a new leader's blank and `Promote` always fit),
//! client 0 sends one request and client 1 two (so one can hold the lock while the
//! other keeps its lease alive and takes the lock after an expiry), two leader changes.
//! The design is checked exhaustively within them, depth first with symmetry reduction
//! over the replicas (their clocks' offsets are the only thing that tells them apart,
//! and only the local-clock variants read them); each variant breadth first, so its
//! counterexample is a shortest one.
//! [`Config::wide`] (both clients send two requests, logs of up to 8 entries) is
//! checked by `examples/wide.rs`, outside the test suite: 75 million states, 26 million
//! unique up to symmetry, 6 minutes on one core.
//!
//! **Not modelled**: clocks running at different rates (the client's margin), the
//! leader's stall detection, a leader's check-quorum step-down (a deposed leader here
//! keeps appending until it meets the newer term, which is more adversarial), crashes
//! and restarts (the log is durable; a restart is an election), snapshots, membership
//! changes, queued acquires (try-locks only), releases and revokes, the fenced store.

pub mod log;
mod model;

pub use log::{replay, Cmd, Entry};
pub use model::{
    names, Action, Client, Config, History, Kind, Pending, ProtocolModel, Replica, Role, State, Variant, CLIENTS,
    REPLICAS,
};
