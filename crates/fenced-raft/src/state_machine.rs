//! The lock table as openraft's state machine.
//!
//! Applying an entry is the only place the lock service changes: a `Normal` entry's
//! batch runs through the core's `LockTable::apply_batch` at the entry's timestamp (a leader's
//! first batch in office carries `Command::Promote`), a `Blank` entry changes nothing,
//! a `Membership` entry is recorded. Every replica applies the same entries in the same
//! order at the same timestamps, so every replica holds the same table; nothing here
//! reads a clock.
//!
//! What an apply produced goes to the node's [`Applied`] sink: the server routes
//! answers to the callers waiting on this node and publishes events. The log is what is
//! durable: an entry is applied only once it is committed, and a restart applies it
//! again.
//!
//! The table lives in memory. Snapshots (the serialized table, its last applied log id
//! and membership, taken under one lock so they agree) are kept in the file `snapshot`
//! ([`crate::snapshot_file`]); after a
//! restart the table is the last snapshot with the log after it applied again.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use fenced_core::{Batch, Limits, LockTable, Output, RequestId};
use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::Notify;

use crate::log_store::Db;
use crate::{io_err, LogId, Snapshot, SnapshotBody, SnapshotMeta, StoredMembership, TypeConfig};

/// The request id of commands nobody waits for (`Tick`, `Promote`).
pub const NO_REQUEST: RequestId = RequestId(0);

/// Where the output of applied commands goes. Called under the state machine's lock,
/// in log order: it must not block, and must not read the table back.
pub trait Applied: Send + Sync + 'static {
    /// One command was applied: its answers, its effects, and in `out.queued` the
    /// acquire that now waits in a lock's queue.
    fn applied(&self, out: &mut Output);

    /// The state was replaced (opened from disk, or a snapshot installed): the effects
    /// applied next follow position `effects_seq`, and the ones before it were not seen
    /// here. Called under the state machine's lock.
    fn reset(&self, _effects_seq: u64) {}
}

/// The replicated state, and where the log stands.
#[derive(Clone)]
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
    /// Where each snapshot built or installed is counted.
    metrics: Arc<crate::metrics::LogMetrics>,
}

/// The table's snapshot bytes ([`crate::snapshot_format`]).
pub(crate) fn encode_table(table: &LockTable) -> Vec<u8> {
    crate::snapshot_format::encode(table)
}

/// The table in snapshot bytes of this format or an earlier release's.
pub(crate) fn decode_table(bytes: &[u8], limits: &Limits) -> io::Result<LockTable> {
    crate::snapshot_format::decode(bytes, limits)
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, format!("a lock-table snapshot is refused: {why}")))
}

/// A peer's snapshot, decoded with `limits` (this member's, as its install would):
/// checked before it is handed to openraft, whose install would stop the log on a bad
/// one, and installed as decoded. Blocking: seconds for a full store.
pub fn check_snapshot(bytes: Vec<u8>, limits: &Limits, file: Option<std::path::PathBuf>) -> io::Result<SnapshotBody> {
    let table = Box::new(decode_table(&bytes, limits)?);
    Ok(SnapshotBody::Checked { bytes, table, file })
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
            metrics: Arc::default(),
        })
    }

    /// Counts its snapshots (built here or installed from the leader) into `metrics`.
    pub(crate) fn counting_into(mut self, metrics: Arc<crate::metrics::LogMetrics>) -> StateMachine {
        self.metrics = metrics;
        self
    }

    fn count_snapshot(&self) {
        self.metrics.snapshots.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Writes the state a fresh log starts from (a table migrated from the single-node
    /// format): before the log is ever used.
    pub fn write_base(db: &Db, table: &LockTable) -> io::Result<()> {
        db.put_base(&encode_table(table))
    }

    /// Where applied output goes (the test-only faults answer through it too).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn sink(&self) -> &dyn Applied {
        &*self.sink
    }

    /// This member's configured limits: the table decides with them until the cluster
    /// agrees on limits through the log (`Command::SetLimits`).
    pub fn configured_limits(&self) -> &Limits {
        &self.limits
    }

    /// The state, locked. Views read the table here; they never change it.
    pub fn state(&self) -> MutexGuard<'_, SmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A point-in-time copy of the state, taken under the lock. Copying is a walk of
    /// memory; encoding is many times slower (a snapshot of 750,000 locks held every
    /// apply and view for seconds while it was built under the lock), so a snapshot,
    /// a backup or a digest encodes the copy with the lock released.
    pub fn copy(&self) -> SmState {
        self.state().clone()
    }

    /// The replicated state's digest and the index it was taken at: replicas that
    /// applied the same log agree on it (the torture's replica-agreement check). The
    /// table is hashed in a canonical form: its JSON with object keys sorted and the
    /// timer heap's entries sorted (a heap's layout depends on how it was built, a
    /// snapshot restore included; its contents do not). Serializes a copy of the whole
    /// table: for checks, not for every request.
    pub fn digest(&self) -> io::Result<StateDigest> {
        let st = self.copy();
        let hash = fenced_core::replica::state_hash(&st.table);
        Ok(StateDigest { applied_index: st.last_applied.map(|l| l.index), state_hash: format!("{hash:016x}") })
    }

    fn apply_batch(&self, st: &mut SmState, batch: Batch, out: &mut Output) {
        st.table.apply_batch(batch, out, |out| self.sink.applied(out));
    }

    fn snapshot_now(&self) -> io::Result<Snapshot> {
        let st = self.copy();
        let meta = SnapshotMeta { last_log_id: st.last_applied, last_membership: st.membership };
        let data = encode_table(&st.table);
        drop(st.table);
        match self.db.put_snapshot(&meta, &data)? {
            true => self.count_snapshot(),
            false => tracing::info!(index = ?meta.last_log_id, "a newer snapshot is kept; this one was not stored"),
        }
        Ok(Snapshot { meta, snapshot: SnapshotBody::Bytes(data) })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotBody;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.snapshot_now()).await.map_err(io_err)?
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotBody;
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
                    EntryPayload::Normal(batch) => self.apply_batch(&mut st, batch, &mut out),
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

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotBody) -> Result<(), io::Error> {
        // Decoding and keeping a snapshot of hundreds of MiB takes a second and more:
        // off the runtime's threads, which also send this member's heartbeats.
        let (db, kept, limits) = (self.db.clone(), meta.clone(), self.limits.clone());
        let table = tokio::task::spawn_blocking(move || {
            let (data, table, file) = match snapshot {
                SnapshotBody::Checked { bytes, table, file } => (bytes, *table, file),
                other => {
                    let data = other.into_bytes()?;
                    let table = decode_table(&data, &limits)?;
                    (data, table, None)
                }
            };
            match file {
                Some(file) => db.adopt_snapshot(&kept, &file)?,
                None => db.put_snapshot(&kept, &data)?,
            };
            Ok::<_, io::Error>(table)
        })
        .await
        .map_err(io_err)??;
        let mut st = self.state();
        self.sink.reset(table.effects_seq());
        st.table = table;
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        self.count_snapshot();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        // Only the meta is read here; the bytes when they are sent (`SnapshotBody`).
        let Some(meta) = self.db.snapshot_meta()? else { return Ok(None) };
        let snapshot = SnapshotBody::Kept { db: self.db.clone(), last_log_id: meta.last_log_id };
        Ok(Some(Snapshot { meta, snapshot }))
    }
}

#[cfg(test)]
mod tests {
    //! One apply, three drivers: the same batches through this state machine (its real
    //! `RaftStateMachine::apply`), the model checker's log and the simulator's replica
    //! give the same state hash.

    use fenced_core::replica::state_hash;
    use fenced_core::{Acquire, Command, LeaseId, LeaseRef, LockName, StoreCommand, Token};
    use fenced_model::log::{batch_of, fresh_table};
    use fenced_model::{Cmd, Entry};
    use openraft::entry::RaftEntry;

    use super::*;

    struct Nowhere;
    impl Applied for Nowhere {
        fn applied(&self, out: &mut Output) {
            out.clear();
        }
    }

    /// The workspace's seeded generator, so that a failing seed replays.
    use fenced_core::xorshift::XorShift as Gen;

    fn log_id(index: u64) -> LogId {
        serde_json::from_value(serde_json::json!({"leader_id": {"term": 1, "node_id": 1}, "index": index})).unwrap()
    }

    /// The table this state machine holds after applying `batches` (`None`: a blank
    /// entry) through openraft's entry point, as a running member does.
    async fn through_raft(name: &str, limits: Limits, batches: &[Option<Batch>]) -> LockTable {
        let dir = std::env::temp_dir().join(format!("fenced-one-apply-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = crate::log_store::Db::open(&dir).unwrap();
        let mut sm = StateMachine::open(db, limits, Arc::new(Nowhere)).unwrap();
        let entries: Vec<Result<EntryResponder<TypeConfig>, io::Error>> = batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let id = log_id(i as u64 + 1);
                let entry = match b {
                    Some(b) => crate::Entry::new_normal(id, b.clone()),
                    None => crate::Entry::new_blank(id),
                };
                Ok((entry, None))
            })
            .collect();
        sm.apply(futures_util::stream::iter(entries)).await.unwrap();
        let table = std::mem::replace(&mut sm.state().table, LockTable::new(Limits::default()));
        let _ = std::fs::remove_dir_all(&dir);
        table
    }

    fn through_sim(table: LockTable, batches: &[Option<Batch>]) -> fenced_sim::Replica {
        let mut replica = fenced_sim::Replica::new(table);
        for b in batches {
            replica.follow(b.clone().unwrap_or_default());
        }
        replica
    }

    /// A model log: leases first, then keepalives, try-locks, ticks, blank entries and
    /// new terms, stamped forward with now and then a stamp behind the table's time.
    fn model_log(g: &mut Gen, len: usize) -> Vec<Entry> {
        let mut now = 0u64;
        let mut log = vec![Entry::new(1, 0, Cmd::Init)];
        for _ in 1..len {
            now += g.below(4);
            let c = g.below(2) as u8;
            let cmd = [Cmd::Keepalive(c), Cmd::Acquire(c), Cmd::Tick, Cmd::Tick, Cmd::Blank, Cmd::Promote]
                [g.below(6) as usize];
            let stamp = if g.below(5) == 0 { now.saturating_sub(3) } else { now };
            // Now and then a keepalive answered from memory rides the entry (never a
            // blank one: openraft appends those, not the proposer).
            let renewal = (cmd != Cmd::Blank && g.below(4) == 0).then(|| stamp.saturating_sub(g.below(3)));
            let renewed = if g.below(2) == 0 { [renewal, None] } else { [None, renewal] };
            log.push(Entry { renewed, ..Entry::new(1, stamp, cmd) });
        }
        log
    }

    fn the_batches_of(log: &[Entry], ttl_ms: u64) -> Vec<Option<Batch>> {
        log.iter().enumerate().map(|(i, e)| (e.cmd != Cmd::Blank).then(|| batch_of(i, e, ttl_ms))).collect()
    }

    #[tokio::test]
    async fn the_model_the_simulator_and_the_state_machine_apply_a_log_to_one_state() {
        let ttl_ms = 6;
        let mut distinct = std::collections::BTreeSet::new();
        for seed in 1..=40u64 {
            let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let log = model_log(&mut g, 40);
            let batches = the_batches_of(&log, ttl_ms);
            let model = fenced_model::replay(&log, ttl_ms).0;
            let raft = through_raft("model", model.limits().clone(), &batches).await;
            let sim = through_sim(fresh_table(ttl_ms), &batches);
            let want = state_hash(&model);
            assert_eq!(state_hash(&raft), want, "seed {seed}: the state machine differs from the model");
            assert_eq!(state_hash(sim.table()), want, "seed {seed}: the simulator differs from the model");
            distinct.insert((want, model.last_token().map(Token::get)));
        }
        assert!(distinct.len() > 30, "the logs must lead to different states: {}", distinct.len());
        assert!(distinct.iter().filter(|(_, t)| t.is_some()).count() > 10, "tokens minted: {distinct:?}");
    }

    fn name(g: &mut Gen) -> LockName {
        LockName::new(["a", "b", "c"][g.below(3) as usize]).unwrap()
    }

    /// A command the model's alphabet has no word for: waiting acquires, implicit
    /// leases, releases, revokes, cancels and fenced store writes.
    fn rich_command(g: &mut Gen, next_request: u64) -> Command {
        let lease = LeaseId(u128::from(g.below(4)) + 1);
        match g.below(9) {
            0 => Command::GrantLease { lease, ttl_ms: 200 + g.below(400) },
            1 => Command::Keepalive { lease },
            2 | 3 => Command::Acquire(Acquire {
                name: name(g),
                lease: if g.below(2) == 0 {
                    LeaseRef::Existing(lease)
                } else {
                    LeaseRef::Implicit { id: LeaseId(100 + u128::from(g.below(4))), ttl_ms: 300 }
                },
                wait_ms: [0, 50, 500][g.below(3) as usize],
                lock_delay_ms: [0, 30][g.below(2) as usize],
                holder: None,
            }),
            4 => Command::Release { name: name(g), lease },
            5 => Command::Revoke { lease },
            6 => Command::Cancel { request: RequestId(next_request.saturating_sub(1 + g.below(6))) },
            7 => Command::Store(StoreCommand::Write {
                key: "k".into(),
                token: Token::new(1 + g.below(8)).unwrap(),
                value: vec![g.below(256) as u8],
                foreign: false,
                quotas: Default::default(),
            }),
            _ => Command::Tick,
        }
    }

    #[tokio::test]
    async fn the_simulator_and_the_state_machine_apply_queues_stores_and_implicit_leases_alike() {
        let limits = Limits::default();
        for seed in 1..=20u64 {
            let mut g = Gen(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
            let (mut now, mut request) = (0u64, 0u64);
            let mut batches = Vec::new();
            for _ in 0..60 {
                now += g.below(120);
                let items = (0..1 + g.below(4))
                    .map(|_| {
                        request += 1;
                        (RequestId(request), rich_command(&mut g, request))
                    })
                    .collect();
                batches.push((g.below(10) != 0).then_some(Batch { items, now_ms: now }));
            }
            let raft = through_raft("rich", limits.clone(), &batches).await;
            let sim = through_sim(LockTable::new(limits.clone()), &batches);
            assert_eq!(state_hash(&raft), state_hash(sim.table()), "seed {seed}");
            assert!(raft.effects_seq() > 0, "seed {seed}: the batches did something");
        }
    }

    /// The negative control: a replica that drops `Promote`, as the simulator's
    /// replicas once did, is told apart by the hash.
    #[tokio::test]
    async fn a_replica_that_skips_promote_is_caught() {
        let ttl_ms = 6;
        let mut caught = 0;
        for seed in 1..=40u64 {
            let mut g = Gen(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let log = model_log(&mut g, 40);
            let skipping: Vec<Entry> =
                log.iter().map(|e| if e.cmd == Cmd::Promote { Entry { cmd: Cmd::Blank, ..*e } } else { *e }).collect();
            let model = fenced_model::replay(&log, ttl_ms).0;
            let broken = through_sim(fresh_table(ttl_ms), &the_batches_of(&skipping, ttl_ms));
            if state_hash(&model) != state_hash(broken.table()) {
                caught += 1;
            }
        }
        assert!(caught >= 20, "the hash tells a replica without Promote apart in {caught} of 40 logs");
    }

    /// A snapshot for a member of an earlier release (the JSON it reads) still carries
    /// the fields of the retired durability model that such releases require, and
    /// decodes here to the same state.
    #[test]
    fn a_legacy_snapshot_carries_the_retired_fields_earlier_releases_require() {
        let mut table = LockTable::new(Limits::default());
        let lease = fenced_core::LeaseId(7);
        table.apply(RequestId(1), fenced_core::Command::GrantLease { lease, ttl_ms: 1_000 }, 5);
        let bytes = crate::snapshot_format::to_legacy_json(&table);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for field in ["ceiling", "token_block", "ttl_ms_hwm", "delay_records", "first_token", "leases"] {
            assert!(v["table"].get(field).is_some(), "{field} in {v}");
        }
        let back = super::decode_table(&bytes, &Limits::default()).unwrap();
        assert_eq!(state_hash(&back), state_hash(&table));
    }
}
