//! The replicated log of Fenced: the core's lock table as the state machine of an
//! openraft group. A single server is a group of one, as in etcd: the same log, the same
//! apply, one voter.
//!
//! - [`Batch`] (the core's `replica::Batch`) is the log's payload: commands with the
//!   request ids their answers are routed by, and the leader's timestamp. Applying a
//!   batch (`LockTable::apply_batch`) is the only place tokens are minted, leases expire
//!   and locks change hands ([`state_machine`]).
//! - [`entry_format`] is a log entry on disk: versioned, checksummed, binary, by hand.
//! - [`log_store`] keeps the log and the vote in one redb file; an append returns to
//!   openraft only after fsync, and appends that queue meanwhile share the next one
//!   (group commit). [`snapshot_file`] keeps the snapshot in a file of its own.
//! - [`node::Node`] runs openraft and the leader's side of time: the clock stamped into
//!   each batch, the proposer, the timer that proposes `Tick`.
//! - [`network`] carries openraft's RPCs between members over HTTP: JSON, and
//!   [`framing`]'s binary frames for an append's entries and a snapshot's bytes.

pub mod append_stream;
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
pub mod segment_log;
pub mod snapshot_file;
pub mod snapshot_format;
pub mod state_machine;

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;

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
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotBody>;

/// A snapshot's bytes as openraft carries them: in memory (just built, or sent by the
/// leader), or the kept file, read only when they are sent. The leader's replication
/// asks for the current snapshot on every attempt to reach a member that needs one:
/// read eagerly, a member that was down cost the leader a read and a copy of the whole
/// snapshot (450 MiB) every second and a half, until the leader stalled and lost office
/// (`scripts/catchup.py --mib 640`).
pub enum SnapshotBody {
    Bytes(Vec<u8>),
    /// Received from the leader and decoded once, with this member's limits, to check
    /// it before openraft sees it: installed as decoded, not decoded again (a snapshot of
    /// a full store takes seconds to decode).
    /// `file`: where the bytes were received, in the kept file's layout
    /// ([`snapshot_file::seal_incoming`]): renamed over the kept snapshot at install,
    /// not written a second time.
    Checked {
        bytes: Vec<u8>,
        table: Box<fenced_core::LockTable>,
        file: Option<std::path::PathBuf>,
    },
    /// The snapshot kept in `db` that covers the log up to `last_log_id`.
    Kept {
        db: Arc<log_store::Db>,
        last_log_id: Option<LogId>,
    },
}

impl SnapshotBody {
    /// The bytes, read from the file when kept: blocking, call it off the runtime's
    /// threads. A kept snapshot replaced since it was offered is an error (the sender
    /// asks again and gets the new one), never the new bytes under the old meta.
    pub fn into_bytes(self) -> io::Result<Vec<u8>> {
        if let SnapshotBody::Bytes(bytes) | SnapshotBody::Checked { bytes, .. } = self {
            return Ok(bytes);
        }
        let source = self.into_source()?;
        let mut bytes = Vec::with_capacity(source.len() as usize);
        source.from(0)?.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// The bytes opened to be sent from any offset (streamed in chunks, however large,
    /// without reading them into memory), and named by a checksum: a transfer cut
    /// midway resumes where the member's copy ends, if it is of the same bytes. A kept
    /// snapshot replaced since it was offered is an error, as for
    /// [`SnapshotBody::into_bytes`].
    pub fn into_source(self) -> io::Result<SnapshotSource> {
        match self {
            SnapshotBody::Bytes(bytes) | SnapshotBody::Checked { bytes, .. } => Ok(SnapshotSource::Bytes(bytes)),
            SnapshotBody::Kept { db, last_log_id } => Ok(SnapshotSource::Kept(db.snapshot_reader(last_log_id)?)),
        }
    }
}

/// A snapshot's bytes, opened to be sent ([`SnapshotBody::into_source`]).
pub enum SnapshotSource {
    Bytes(Vec<u8>),
    Kept(snapshot_file::Outgoing),
}

impl SnapshotSource {
    /// How many bytes.
    pub fn len(&self) -> u64 {
        match self {
            SnapshotSource::Bytes(bytes) => bytes.len() as u64,
            SnapshotSource::Kept(kept) => kept.len,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A checksum that tells these bytes from another snapshot's of the same length
    /// (computed when asked for bytes in memory; read from a kept file's end).
    pub fn crc(&self) -> u32 {
        match self {
            SnapshotSource::Bytes(bytes) => snapshot_file::crc32c(&[bytes]),
            SnapshotSource::Kept(kept) => kept.crc,
        }
    }

    /// The bytes from `offset` (at most their length) to their end.
    pub fn from(self, offset: u64) -> io::Result<Box<dyn io::Read + Send + Sync>> {
        match self {
            SnapshotSource::Bytes(bytes) => {
                let mut cursor = io::Cursor::new(bytes);
                cursor.set_position(offset.min(cursor.get_ref().len() as u64));
                Ok(Box::new(cursor))
            }
            SnapshotSource::Kept(kept) => kept.from(offset),
        }
    }
}

pub(crate) fn io_err(e: impl fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}
