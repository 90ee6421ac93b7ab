//! The replicated log of Fenced: the core's lock table as the state machine of an
//! openraft group. A single server is a group of one, as in etcd: the same log, the same
//! apply, one voter.
//!
//! - [`Batch`] (the core's `replica::Batch`) is the log's payload: commands with the
//!   request ids their answers are routed by, and the leader's timestamp. Applying a
//!   batch (`LockTable::apply_batch`) is the only place tokens are minted, leases expire
//!   and locks change hands ([`state_machine`]).
//! - [`entry_format`] is a log entry on disk: versioned, checksummed, binary, by hand.
//! - [`log_store`] keeps the log, the vote and the snapshots in one redb file; an append
//!   returns to openraft only after fsync, and appends that queue meanwhile share the
//!   next one (group commit).
//! - [`node::Node`] runs openraft and the leader's side of time: the clock stamped into
//!   each batch, the proposer, the timer that proposes `Tick`.
//! - [`network`] carries openraft's RPCs between members over HTTP: JSON, and
//!   [`framing`]'s binary frames for an append's entries and a snapshot's bytes.

pub mod backup;
mod codec;
pub mod entry_format;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod framing;
pub mod log_store;
pub mod metrics;
pub mod network;
pub mod node;
pub mod snapshot_format;
pub mod state_machine;

use std::fmt;
use std::io::Cursor;

/// One log entry's payload: the core's batch, applied by `LockTable::apply_batch`.
pub use fenced_core::Batch;

pub use network::Hello;
pub use node::{ClusterStatus, Member, Node, NodeOptions, NotLeader, Refusals};
pub use openraft;
pub use state_machine::{Applied, SmState, StateDigest};

/// A member's address: the base URL its peer listener answers on.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The openraft types of Fenced's group.
    pub TypeConfig:
        D = Batch,
        R = (),
        Node = openraft::BasicNode,
);

pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Cursor<Vec<u8>>>;

pub(crate) fn io_err(e: impl fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}
