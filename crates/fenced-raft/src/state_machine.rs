//! The lock table as openraft's state machine.
//!
//! Applying an entry is the only place the lock service changes: a `Normal` entry's
//! commands run through `LockTable::apply_into` at the entry's timestamp (a leader's
//! first batch in office carries `Command::Promote`), a `Blank` entry changes nothing,
//! a `Membership` entry is recorded. Every replica applies the same entries in the same
//! order at the same timestamps, so every replica holds the same table; nothing here
//! reads a clock.
//!
//! What an apply produced goes to the node's [`Applied`] sink: the server routes
//! answers to the callers waiting on this node and publishes events. The table's
//! `Persist` requests are dropped: in the replicated service the log is what is durable.
//!
//! The table lives in memory. Snapshots (the serialized table, its last applied log id
//! and membership, taken under one lock so they agree) are kept in `raft.redb`; after a
//! restart the table is the last snapshot with the log after it applied again.

use std::io::{self, Cursor};
use std::sync::{Arc, Mutex, MutexGuard};

use fenced_core::{Command, Limits, LockTable, Output, RequestId};
use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::Notify;

use crate::log_store::Db;
use crate::{io_err, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// The request id of commands nobody waits for (`Tick`, `Promote`).
pub const NO_REQUEST: RequestId = RequestId(0);

/// Where the output of applied commands goes. Called under the state machine's lock,
/// in log order: it must not block, and must not read the table back.
pub trait Applied: Send + Sync + 'static {
    /// One command was applied. `queued` is the command's request when it is an acquire
    /// that got no answer yet: it waits in the lock's queue.
    fn applied(&self, out: &mut Output, queued: Option<RequestId>);

    /// The state was replaced (opened from disk, or a snapshot installed): the effects
    /// applied next follow position `effects_seq`, and the ones before it were not seen
    /// here. Called under the state machine's lock.
    fn reset(&self, _effects_seq: u64) {}
}

/// The replicated state, and where the log stands.
pub struct SmState {
    pub table: LockTable,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

/// A digest of the replicated state at an applied index ([`StateMachine::digest`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StateDigest {
    pub applied_index: Option<u64>,
    pub state_hash: String,
}

/// The state machine handle (cheap clones share one state).
#[derive(Clone)]
pub struct StateMachine {
    state: Arc<Mutex<SmState>>,
    db: Arc<Db>,
    sink: Arc<dyn Applied>,
    limits: Limits,
    /// Woken after every applied entry: the leader's timer re-reads the next deadline.
    pub(crate) applied_notify: Arc<Notify>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotBody {
    table: LockTable,
}

pub(crate) fn encode_table(table: &LockTable) -> io::Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Ref<'t> {
        table: &'t LockTable,
    }
    serde_json::to_vec(&Ref { table }).map_err(io_err)
}

pub(crate) fn decode_table(bytes: &[u8], limits: &Limits) -> io::Result<LockTable> {
    let body: SnapshotBody = serde_json::from_slice(bytes).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("a lock-table snapshot does not decode: {e}"))
    })?;
    let mut table = body.table;
    table.set_limits(limits.clone());
    Ok(table)
}

/// Whether `bytes` decode as a snapshot of the lock table: a peer's snapshot is checked
/// before it is handed to openraft, whose install would stop the log on a bad one.
pub fn check_snapshot(bytes: &[u8]) -> io::Result<()> {
    decode_table(bytes, &Limits::default()).map(drop)
}

impl StateMachine {
    /// The state after the last snapshot in `db` (or the migrated base state, or a fresh
    /// table); openraft applies the log after it.
    pub fn open(db: Arc<Db>, limits: Limits, sink: Arc<dyn Applied>) -> io::Result<StateMachine> {
        let state = match db.snapshot()? {
            Some((meta, data)) => {
                let meta: SnapshotMeta = serde_json::from_slice(&meta).map_err(io_err)?;
                SmState {
                    table: decode_table(&data, &limits)?,
                    last_applied: meta.last_log_id,
                    membership: meta.last_membership,
                }
            }
            None => SmState {
                table: match db.base()? {
                    Some(data) => decode_table(&data, &limits)?,
                    None => LockTable::new(limits.clone()),
                },
                last_applied: None,
                membership: StoredMembership::default(),
            },
        };
        sink.reset(state.table.effects_seq());
        Ok(StateMachine {
            state: Arc::new(Mutex::new(state)),
            db,
            sink,
            limits,
            applied_notify: Arc::new(Notify::new()),
        })
    }

    /// Writes the state a fresh log starts from (a table migrated from the single-node
    /// format): before the log is ever used.
    pub fn write_base(db: &Db, table: &LockTable) -> io::Result<()> {
        db.put_base(&encode_table(table)?)
    }

    /// Where applied output goes (the test-only faults answer through it too).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn sink(&self) -> &dyn Applied {
        &*self.sink
    }

    /// The state, locked. Views read the table here; they never change it.
    pub fn state(&self) -> MutexGuard<'_, SmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The replicated state's digest and the index it was taken at: replicas that
    /// applied the same log agree on it (the torture's replica-agreement check). The
    /// table is hashed in a canonical form: its JSON with object keys sorted and the
    /// timer heap's entries sorted (a heap's layout depends on how it was built, a
    /// snapshot restore included; its contents do not). Serializes the whole table
    /// under the lock: for checks, not for every request.
    pub fn digest(&self) -> io::Result<StateDigest> {
        use std::hash::{Hash, Hasher};
        let (mut value, applied_index) = {
            let st = self.state();
            (serde_json::to_value(&st.table).map_err(io_err)?, st.last_applied.map(|l| l.index))
        };
        if let Some(heap) = value.pointer_mut("/timers/heap").and_then(|h| h.as_array_mut()) {
            heap.sort_by_cached_key(|e| e.to_string());
        }
        // serde_json's maps are ordered by key (no `preserve_order` in this build).
        let mut h = std::hash::DefaultHasher::new();
        value.to_string().hash(&mut h);
        Ok(StateDigest { applied_index, state_hash: format!("{:016x}", h.finish()) })
    }

    fn apply_batch(&self, st: &mut SmState, items: Vec<(RequestId, Command)>, now_ms: u64, out: &mut Output) {
        // Never backwards, whatever the proposer stamped: the replicated timeline.
        let now_ms = now_ms.max(st.table.now_ms());
        for (request, cmd) in items {
            let acquire = matches!(cmd, Command::Acquire(_));
            st.table.apply_into(request, cmd, now_ms, out);
            out.persist.clear();
            let queued = (acquire && !out.answers.iter().any(|(r, _)| *r == request)).then_some(request);
            self.sink.applied(out, queued);
            out.clear();
        }
    }

    fn snapshot_now(&self) -> io::Result<Snapshot> {
        let (meta, data) = {
            let st = self.state();
            let meta = SnapshotMeta { last_log_id: st.last_applied, last_membership: st.membership.clone() };
            (meta, encode_table(&st.table)?)
        };
        if !self.db.put_snapshot(&meta, &data)? {
            tracing::info!(index = ?meta.last_log_id, "a newer snapshot is kept; this one was not stored");
        }
        Ok(Snapshot { meta, snapshot: Cursor::new(data) })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.snapshot_now()).await.map_err(io_err)?
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let st = self.state();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut out = Output::default();
        while let Some((entry, responder)) = entries.try_next().await? {
            {
                let mut st = self.state();
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(batch) => self.apply_batch(&mut st, batch.items, batch.now_ms, &mut out),
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(entry.log_id), m);
                    }
                }
                st.last_applied = Some(entry.log_id);
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        self.applied_notify.notify_one();
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Cursor<Vec<u8>>) -> Result<(), io::Error> {
        let data = snapshot.into_inner();
        let table = decode_table(&data, &self.limits)?;
        let db = self.db.clone();
        let kept = meta.clone();
        tokio::task::spawn_blocking(move || db.put_snapshot(&kept, &data)).await.map_err(io_err)??;
        let mut st = self.state();
        self.sink.reset(table.effects_seq());
        st.table = table;
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let Some((meta, data)) = self.db.snapshot()? else { return Ok(None) };
        let meta: SnapshotMeta = serde_json::from_slice(&meta).map_err(io_err)?;
        Ok(Some(Snapshot { meta, snapshot: Cursor::new(data) }))
    }
}
