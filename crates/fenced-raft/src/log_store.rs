//! The log, the vote and the commit and purge marks, in segments of their own (`log/`,
//! [`crate::segment_log`], data directory format 5); the kept snapshot in a file of its
//! own beside them ([`crate::snapshot_file`]), so that the log's writer never waits for
//! a snapshot of hundreds of MiB; `raft.redb` keeps only the base state of a restored or
//! migrated directory (and, until the first open of this format, what format 4 kept).
//!
//! Reads are served from memory: the entries since the last purge (the snapshot policy
//! keeps that window small), read from the segments at start. Every change goes to one
//! writer thread that folds the changes queued meanwhile into one write and one
//! `fdatasync`, and only then does openraft hear that an append is flushed (group
//! commit: one fsync for every entry that arrived during the last one, and for those of
//! the wave still arriving: see [`Linger`]).
//! A vote, a truncation and a purge are durable when their call returns. The commit mark
//! rides along: openraft's `save_committed` only updates memory, and the next write
//! carries the latest mark (openraft allows it to lag; a standalone write would cost an
//! fsync of its own after every group commit).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, LogState, OptionalSend, RaftLogReader};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use crate::entry_format;
use crate::metrics::LogMetrics;
use crate::segment_log::{Change, Recovered, SegmentLog};
use crate::snapshot_file::SnapshotFile;
use crate::{io_err, Entry, LogId, NodeId, SnapshotMeta, TypeConfig, Vote};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";
/// Where data directories before format 4 kept the snapshot in `raft.redb` (moved to the
/// snapshot file at open): its meta, its bytes, and their CRC-32C.
const SNAPSHOT_META: &str = "snapshot_meta";
const SNAPSHOT_DATA: &str = "snapshot_data";
const SNAPSHOT_SUM: &str = "snapshot_crc32c";
/// The state the log starts from when there is no snapshot: a migrated lock table.
const BASE: &str = "base";

/// The most changes one transaction carries.
const BATCH_MAX: usize = 1024;

/// The log's segments, the redb file beside them, and the snapshot file.
pub struct Db {
    /// The log as opened, until [`LogStore::open`] takes it.
    log: Mutex<Option<(SegmentLog, Recovered)>>,
    // Fields drop in order: the file is closed before `closed` says so.
    db: Database,
    closed: Closed,
    snap: SnapshotFile,
    /// Where the file is (test-only faults read their switches there).
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    dir: std::path::PathBuf,
}

/// Set once the database is closed (its file lock released): a strong count of zero
/// alone does not say that, the last holder may still be inside redb's close.
struct Closed(Arc<AtomicBool>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// redb's page cache and write buffer, together.
const DB_CACHE_BYTES: usize = 64 << 20;

impl Db {
    /// Opens or creates `dir/raft.redb` and the snapshot file beside it; a snapshot an
    /// earlier format kept in `raft.redb` is moved to the file first.
    pub fn open(dir: &Path) -> io::Result<Arc<Db>> {
        std::fs::create_dir_all(dir)?;
        // redb caches up to 1 GiB of pages by default; the log is read from memory
        // (`Mem`), so the cache serves little but the write buffer.
        let mut db =
            Database::builder().set_cache_size(DB_CACHE_BYTES).create(dir.join("raft.redb")).map_err(io_err)?;
        let txn = db.begin_write().map_err(io_err)?;
        txn.open_table(LOG).map_err(io_err)?;
        txn.open_table(META).map_err(io_err)?;
        txn.commit().map_err(io_err)?;
        let snap = SnapshotFile::open(dir)?;
        move_snapshot_out(&mut db, &snap)?;
        let log = Mutex::new(Some(move_log_out(&db, dir)?));
        Ok(Arc::new(Db { log, db, closed: Closed(Arc::new(AtomicBool::new(false))), snap, dir: dir.to_path_buf() }))
    }

    fn log(&self) -> MutexGuard<'_, Option<(SegmentLog, Recovered)>> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A flag set once this database is closed.
    pub fn closed_flag(&self) -> Arc<AtomicBool> {
        self.closed.0.clone()
    }

    fn meta(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        let txn = self.db.begin_read().map_err(io_err)?;
        let table = txn.open_table(META).map_err(io_err)?;
        Ok(table.get(key).map_err(io_err)?.map(|v| v.value().to_vec()))
    }

    fn put_meta(&self, rows: &[(&str, &[u8])]) -> io::Result<()> {
        let txn = self.db.begin_write().map_err(io_err)?;
        {
            let mut table = txn.open_table(META).map_err(io_err)?;
            for (k, v) in rows {
                table.insert(*k, *v).map_err(io_err)?;
            }
        }
        txn.commit().map_err(io_err)
    }

    /// `--force-new-cluster`: makes this member the only voter, keeping its log and
    /// state. Appends a membership entry naming only `id` (at `addr`) after the last
    /// entry (or the snapshot), in a term above every term seen, with this node's vote
    /// for itself in that term, in one durable transaction. Started alone, the member
    /// elects itself and commits everything its log holds, the new membership
    /// included. Returns the new entry's index.
    pub fn force_single_member(&self, id: NodeId, addr: String) -> io::Result<u64> {
        use openraft::vote::RaftLeaderIdExt;
        let mut guard = self.log();
        let (log, rec) = guard.as_mut().ok_or_else(|| io::Error::other("the log is open already"))?;
        let last_entry: Option<Entry> =
            rec.entries.last_key_value().map(|(k, v)| entry_format::decode(v, *k)).transpose()?;
        let last_id: Option<LogId> = match last_entry {
            Some(e) => Some(e.log_id),
            None => match self.snapshot()? {
                Some((meta, _)) => decode::<SnapshotMeta>(&meta, "snapshot meta")?.last_log_id,
                None => None,
            },
        };
        let vote: Option<Vote> = rec.state.vote.as_deref().map(|b| decode(b, "vote")).transpose()?;
        let term = vote.map_or(0, |v| v.leader_id.term).max(last_id.map_or(0, |l| l.leader_id.term)) + 1;
        let index = last_id.map_or(0, |l| l.index + 1);
        let log_id = LogId::new(openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(term, id), index);
        let membership =
            openraft::Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, openraft::BasicNode { addr })]))
                .map_err(io_err)?;
        let entry = Entry::new_membership(log_id, membership);
        let (bytes, vote) = (entry_format::to_vec(&entry), encode(&Vote::new(term, id))?);
        let changes = [Change::Entry { index, bytes: &bytes }, Change::Vote(&vote)];
        log.write(&changes)?;
        changes.iter().for_each(|c| rec.apply(c));
        Ok(index)
    }

    /// True when the log has never been written: no vote, no entry, no snapshot.
    pub fn is_empty(&self) -> io::Result<bool> {
        let log_empty = match self.log().as_ref() {
            Some((_, rec)) => rec.entries.is_empty() && rec.state == Default::default(),
            None => return Err(io::Error::other("the log is open already")),
        };
        let txn = self.db.begin_read().map_err(io_err)?;
        let meta = txn.open_table(META).map_err(io_err)?;
        Ok(log_empty && meta.first().map_err(io_err)?.is_none() && !self.has_snapshot())
    }

    /// The last snapshot taken or installed: its meta and its bytes, checked whole.
    pub fn snapshot(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.snap.read()
    }

    /// Whether a snapshot is kept, without reading it.
    pub fn has_snapshot(&self) -> bool {
        self.snap.exists()
    }

    /// The kept snapshot's bytes, opened to be sent, if it still covers the log up to
    /// `offered` ([`SnapshotFile::open_data`]).
    pub fn snapshot_reader(&self, offered: Option<LogId>) -> io::Result<crate::snapshot_file::Outgoing> {
        self.snap.open_data(offered)
    }

    /// The kept snapshot's meta, without reading its bytes.
    pub fn snapshot_meta(&self) -> io::Result<Option<SnapshotMeta>> {
        self.snap.meta()
    }

    /// Keeps a snapshot durably, unless the one kept already covers more of the log: a
    /// snapshot built here can finish after a newer one was installed from the leader
    /// (which purged the log up to it), and must not put the older state back under a
    /// log that no longer holds what came between. Returns whether it was kept.
    pub fn put_snapshot(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<bool> {
        self.snap.write(meta, data)
    }

    /// Keeps a snapshot received into `file` in the kept layout by renaming it
    /// ([`SnapshotFile::adopt`]), with the same rule as [`Db::put_snapshot`].
    pub fn adopt_snapshot(&self, meta: &SnapshotMeta, file: &Path) -> io::Result<bool> {
        self.snap.adopt(meta, file)
    }

    /// The state a log with no snapshot starts from, when it is not a fresh table.
    pub fn base(&self) -> io::Result<Option<Vec<u8>>> {
        self.meta(BASE)
    }

    pub fn put_base(&self, data: &[u8]) -> io::Result<()> {
        self.put_meta(&[(BASE, data)])
    }
}

/// Moves a snapshot that a data directory before format 4 kept in `raft.redb` to the
/// snapshot file: written there durably first, then removed from `raft.redb`, whose
/// file is then compacted (the snapshot's pages were most of it). A crash between the
/// two leaves it in both, and the next open finishes the move. A snapshot whose
/// checksum does not match is refused, as it was when read from `raft.redb`.
fn move_snapshot_out(db: &mut Database, snap: &SnapshotFile) -> io::Result<()> {
    let (meta, data) = {
        let txn = db.begin_read().map_err(io_err)?;
        let table = txn.open_table(META).map_err(io_err)?;
        let get = |key| table.get(key).map(|v| v.map(|v| v.value().to_vec())).map_err(io_err);
        let (Some(meta), Some(data), sum) = (get(SNAPSHOT_META)?, get(SNAPSHOT_DATA)?, get(SNAPSHOT_SUM)?) else {
            return Ok(());
        };
        // A snapshot kept by a release before the checksum has none, and is read as is.
        if sum.is_some_and(|sum| sum != snapshot_sum(&meta, &data)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "raft.redb: the snapshot is refused: its checksum does not match (damaged or edited on disk)",
            ));
        }
        (meta, data)
    };
    let meta: SnapshotMeta = decode(&meta, "snapshot meta")?;
    snap.write(&meta, &data)?;
    let txn = db.begin_write().map_err(io_err)?;
    {
        let mut table = txn.open_table(META).map_err(io_err)?;
        for key in [SNAPSHOT_META, SNAPSHOT_DATA, SNAPSHOT_SUM] {
            table.remove(key).map_err(io_err)?;
        }
    }
    txn.commit().map_err(io_err)?;
    tracing::info!(
        bytes = data.len(),
        "the snapshot moved from raft.redb to a file of its own (data directory format 4)"
    );
    db.compact().map_err(io_err)?;
    Ok(())
}

/// The checksum kept beside a snapshot in `raft.redb` before format 4: CRC-32C over its
/// meta's length, its meta and its bytes, little-endian.
fn snapshot_sum(meta: &[u8], data: &[u8]) -> [u8; 4] {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    digest.update(&(meta.len() as u64).to_le_bytes());
    digest.update(meta);
    digest.update(data);
    (digest.finalize() as u32).to_le_bytes()
}

/// The directory of the log's segments.
pub const LOG_DIR: &str = "log";

/// Opens the log's segments; a log that a data directory before format 5 kept in
/// `raft.redb` is moved there first: written whole to `log.moving`, flushed, renamed to
/// `log`, then removed from `raft.redb`. A crash before the rename leaves it in
/// `raft.redb` (moved again at the next open); after it, the next open finds `log` and
/// only removes what `raft.redb` still holds.
fn move_log_out(db: &Database, dir: &Path) -> io::Result<(SegmentLog, Recovered)> {
    let target = dir.join(LOG_DIR);
    if !target.exists() {
        let moving = dir.join("log.moving");
        let _ = std::fs::remove_dir_all(&moving);
        let (rows, vote, committed, purged) = {
            let txn = db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            let meta = txn.open_table(META).map_err(io_err)?;
            let get = |key| meta.get(key).map(|v| v.map(|v| v.value().to_vec())).map_err(io_err);
            let rows = log.iter().map_err(io_err)?.map(|r| r.map(|(k, v)| (k.value(), v.value().to_vec())));
            (rows.collect::<Result<Vec<_>, _>>().map_err(io_err)?, get(VOTE)?, get(COMMITTED)?, get(LAST_PURGED)?)
        };
        if !rows.is_empty() || vote.is_some() || committed.is_some() || purged.is_some() {
            let (mut log, _) = SegmentLog::open(&moving)?;
            let mut changes = Vec::new();
            if let Some(p) = &purged {
                let upto = decode::<LogId>(p, "purge mark")?.index;
                changes.push(Change::Purge { upto, mark: p });
            }
            changes.extend(vote.as_deref().map(Change::Vote));
            changes.extend(rows.iter().map(|(index, bytes)| Change::Entry { index: *index, bytes }));
            changes.extend(committed.as_deref().map(Change::Commit));
            log.write(&changes)?;
            drop(log);
            tracing::info!(
                entries = rows.len(),
                "the raft log moved from raft.redb to segments of its own (data directory format 5)"
            );
        } else {
            std::fs::create_dir_all(&moving)?;
        }
        std::fs::rename(&moving, &target)?;
        std::fs::File::open(dir)?.sync_all()?;
    }
    let txn = db.begin_write().map_err(io_err)?;
    let mut leftovers = false;
    {
        let mut log = txn.open_table(LOG).map_err(io_err)?;
        leftovers |= log.first().map_err(io_err)?.is_some();
        log.retain(|_, _| false).map_err(io_err)?;
        let mut meta = txn.open_table(META).map_err(io_err)?;
        for key in [VOTE, COMMITTED, LAST_PURGED] {
            leftovers |= meta.remove(key).map_err(io_err)?.is_some();
        }
    }
    if leftovers {
        txn.commit().map_err(io_err)?;
    } else {
        txn.abort().map_err(io_err)?;
    }
    SegmentLog::open(&target)
}

/// What readers see: the log since the last purge, the vote, the purge and commit marks.
#[derive(Default)]
struct Mem {
    entries: BTreeMap<u64, Entry>,
    /// Each entry's encoded size, and their sum: what the log weighs in memory and on
    /// disk, which the node bounds by snapshotting and purging ([`LogStore::bytes`]).
    sizes: BTreeMap<u64, u64>,
    bytes: u64,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

impl Mem {
    /// Entry `index` now weighs `len` bytes (an entry written again replaces its size).
    fn sized(&mut self, index: u64, len: usize) {
        let old = self.sizes.insert(index, len as u64).unwrap_or(0);
        self.bytes = self.bytes - old + len as u64;
    }
}

enum Op {
    Append {
        rows: Vec<(u64, Vec<u8>)>,
        done: IOFlushed<TypeConfig>,
    },
    /// Removes entries with index `>= from`.
    Truncate {
        from: u64,
        done: oneshot::Sender<io::Result<()>>,
    },
    /// Removes entries with index `<= upto` and records the purge mark.
    Purge {
        upto: u64,
        mark: Vec<u8>,
        done: oneshot::Sender<io::Result<()>>,
    },
    Vote {
        value: Vec<u8>,
        done: oneshot::Sender<io::Result<()>>,
    },
}

impl Op {
    /// An append of entries: client data, which may wait a little to share a commit.
    fn is_append(&self) -> bool {
        matches!(self, Op::Append { .. })
    }
}

/// How the writer gathers a group of changes into one commit (BENCHMARKS.md, *What this
/// disk rewards*). After the first change it takes whatever is queued; then, while
/// appends keep arriving, each within a tenth of the last commit's time, it waits for
/// more, up to `frac` of that time. Closed-loop clients otherwise fall into two
/// alternating groups, each commit waiting for the group in flight and then its own;
/// waiting for the wave of arrivals makes them one. It needs no knowledge of the load:
/// a lone client pays at most a tenth of a commit. A vote, a truncation or a purge is
/// never held: one queued ends the wait at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Linger {
    /// The longest wait, as a fraction of the last commit's time (0: none).
    pub frac: f64,
}

impl Linger {
    /// The server's default (`log_linger_percent` 0): none. On this project's 2-core
    /// machine the server at 16 clients is bound by CPU, not by its fsync, and a wait
    /// of half a commit cost it about 10% (BENCHMARKS.md, *The adaptive linger in the
    /// server*), although the zero-work ceiling gains 43% from it.
    pub const DEFAULT: Linger = Linger { frac: 0.0 };
    /// Half the last commit: the fraction measured best on this disk with no other work.
    pub const HALF: Linger = Linger { frac: 0.5 };

    /// The group that starts with `first`, after the last commit took `last_commit`.
    fn gather(self, first: Op, rx: &mpsc::Receiver<Op>, last_commit: Duration) -> Vec<Op> {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        if self.frac <= 0.0 || !batch.iter().all(Op::is_append) {
            return batch;
        }
        let until = Instant::now() + last_commit.mul_f64(self.frac);
        let gap = last_commit / 10;
        while batch.len() < BATCH_MAX {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Ok(op) = rx.recv_timeout(gap.min(left)) else { break };
            let urgent = !op.is_append();
            batch.push(op);
            if urgent {
                break;
            }
        }
        batch
    }
}

/// openraft's log storage and log reader (cheap clones share one log).
#[derive(Clone)]
pub struct LogStore {
    mem: Arc<Mutex<Mem>>,
    tx: mpsc::Sender<Op>,
    /// The writer's figures: each commit's duration, entries written, failures.
    pub metrics: Arc<LogMetrics>,
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("the raft log: the {what} does not decode: {e}"))
    })
}

fn encode<T: serde::Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(io_err)
}

impl LogStore {
    /// Reads the log into memory and starts the writer thread (it ends when the last
    /// clone is dropped).
    pub fn open(db: Arc<Db>, linger: Linger) -> io::Result<LogStore> {
        let (seglog, rec) = db.log().take().ok_or_else(|| io::Error::other("the log is open already"))?;
        let mut mem = Mem::default();
        for (index, bytes) in &rec.entries {
            mem.entries.insert(*index, entry_format::decode(bytes, *index)?);
            mem.sized(*index, bytes.len());
        }
        mem.vote = rec.state.vote.as_deref().map(|b| decode(b, "vote")).transpose()?;
        mem.committed = rec.state.committed.as_deref().map(|b| decode(b, "commit mark")).transpose()?;
        mem.last_purged = rec.state.purged.as_ref().map(|(_, b)| decode(b, "purge mark")).transpose()?;
        drop(rec);
        let (tx, rx) = mpsc::channel();
        let mem = Arc::new(Mutex::new(mem));
        let marks = mem.clone();
        let metrics = Arc::new(LogMetrics::default());
        let figures = metrics.clone();
        std::thread::Builder::new()
            .name("fenced-raft-log".into())
            .spawn(move || writer(&db, seglog, &marks, &figures, linger, rx))?;
        Ok(LogStore { mem, tx, metrics })
    }

    fn mem(&self) -> MutexGuard<'_, Mem> {
        self.mem.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, op: Op) -> io::Result<()> {
        self.tx.send(op).map_err(|_| io::Error::other("the raft log writer stopped"))
    }

    async fn durable(&self, op: impl FnOnce(oneshot::Sender<io::Result<()>>) -> Op) -> io::Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(op(done))?;
        rx.await.map_err(|_| io::Error::other("the raft log writer stopped"))?
    }

    /// The members named by the last membership entry still in the log, if any.
    pub fn last_membership(&self) -> Option<BTreeSet<NodeId>> {
        self.mem().entries.values().rev().find_map(|e| match &e.payload {
            EntryPayload::Membership(m) => Some(m.nodes().map(|(id, _)| *id).collect()),
            _ => None,
        })
    }

    /// The encoded bytes of the entries in the log (held in memory, and on disk).
    pub fn bytes(&self) -> u64 {
        self.mem().bytes
    }

    /// The encoded bytes of the entries after `index`.
    pub fn bytes_after(&self, index: u64) -> u64 {
        self.mem().sizes.range(index + 1..).map(|(_, n)| n).sum()
    }

    /// The index of the last entry in the log (0 when none).
    pub fn last_index(&self) -> u64 {
        self.mem().entries.last_key_value().map_or(0, |(k, _)| *k)
    }
}

/// The writer thread: one durable transaction for every run of queued changes, which
/// also carries the commit mark when it moved since the last one written.
fn writer(
    #[cfg_attr(not(feature = "fault-injection"), allow(unused_variables))] db: &Db,
    mut log: SegmentLog,
    mem: &Mutex<Mem>,
    metrics: &LogMetrics,
    linger: Linger,
    rx: mpsc::Receiver<Op>,
) {
    let (mut written, mut durable) = {
        let m = mem.lock().unwrap_or_else(|p| p.into_inner());
        let last = m.entries.last_key_value().map(|(k, _)| *k);
        (m.committed, last.max(m.last_purged.map(|l| l.index)).unwrap_or(0))
    };
    #[cfg(feature = "fault-injection")]
    let mut disk_faults = DiskFaults::default();
    let mut last_commit = Duration::ZERO;
    while let Ok(first) = rx.recv() {
        let batch = linger.gather(first, &rx, last_commit);
        #[cfg(feature = "fault-injection")]
        let failing = disk_faults.wait(&db.dir);
        #[cfg(not(feature = "fault-injection"))]
        let failing = false;
        let committed = mem.lock().unwrap_or_else(|p| p.into_inner()).committed;
        let after = durable_after(durable, &batch);
        let mark = mark_to_write(committed, written, after).and_then(|c| encode(&c).ok());
        let started = Instant::now();
        let result = match failing {
            true => Err("this disk fails: the fault file `fault-log-fail` is in the data directory".to_string()),
            false => commit(&mut log, &batch, mark.as_deref()).map_err(|e| e.to_string()),
        };
        last_commit = started.elapsed();
        metrics.observe_commit(last_commit);
        if last_commit >= SLOW_COMMIT {
            warn_slow(&batch, last_commit);
        }
        if result.is_ok() {
            if mark.is_some() {
                written = committed;
            }
            durable = after;
            let entries: usize =
                batch.iter().map(|op| if let Op::Append { rows, .. } = op { rows.len() } else { 0 }).sum();
            metrics.entries_written.fetch_add(entries as u64, std::sync::atomic::Ordering::Relaxed);
        }
        if let Err(e) = &result {
            metrics.commit_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(error = %e, "the raft log could not be written");
        }
        for op in batch {
            let r = result.clone().map_err(io::Error::other);
            match op {
                Op::Append { done, .. } => done.io_completed(r),
                Op::Truncate { done, .. } | Op::Purge { done, .. } | Op::Vote { done, .. } => drop(done.send(r)),
            }
        }
    }
}

/// A commit of the log this slow is logged (etcd warns of an fdatasync over a second
/// too): heartbeats wait behind it, and an election follows one of about a second.
const SLOW_COMMIT: Duration = Duration::from_millis(500);

fn warn_slow(batch: &[Op], took: Duration) {
    let (mut appends, mut bytes, mut other) = (0usize, 0usize, Vec::new());
    for op in batch {
        match op {
            Op::Append { rows, .. } => {
                appends += rows.len();
                bytes += rows.iter().map(|(_, b)| b.len()).sum::<usize>();
            }
            Op::Truncate { .. } => other.push("truncate"),
            Op::Purge { .. } => other.push("purge"),
            Op::Vote { .. } => other.push("vote"),
        }
    }
    tracing::warn!(
        took_ms = took.as_millis() as u64,
        appends,
        bytes,
        ?other,
        "a slow commit of the raft log: the disk is saturated or slow"
    );
}

/// Test-only (the `fault-injection` feature): the log's disk made faulty by files in the
/// data directory (read every 100 ms). `fault-log-delay-ms`: this many milliseconds slow
/// on every log write; a leader with a slow disk replicates entries its followers make
/// durable before it does: what a leader that restarts must not forget.
/// `fault-log-fail`: every log write fails, as a disk that errors would.
#[cfg(feature = "fault-injection")]
#[derive(Default)]
struct DiskFaults {
    read_at: Option<std::time::Instant>,
    delay_ms: u64,
    failing: bool,
}

#[cfg(feature = "fault-injection")]
impl DiskFaults {
    /// Sleeps this disk's delay; true: its writes fail. The fault files are read at
    /// most every 100 ms.
    fn wait(&mut self, dir: &Path) -> bool {
        if self.read_at.is_none_or(|t| t.elapsed().as_millis() >= 100) {
            self.read_at = Some(std::time::Instant::now());
            let file = std::fs::read_to_string(dir.join("fault-log-delay-ms")).ok();
            self.delay_ms = file.and_then(|s| s.trim().parse().ok()).unwrap_or(0).min(10_000);
            self.failing = dir.join("fault-log-fail").exists();
        }
        if self.delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.delay_ms));
        }
        self.failing
    }
}

/// The highest index the log holds (or its purge mark covers) once `batch` is durable,
/// from `last` before it.
fn durable_after(mut last: u64, batch: &[Op]) -> u64 {
    for op in batch {
        match op {
            Op::Append { rows, .. } => last = rows.last().map_or(last, |(index, _)| last.max(*index)),
            Op::Truncate { from, .. } => last = last.min(from.saturating_sub(1)),
            Op::Purge { upto, .. } => last = last.max(*upto),
            Op::Vote { .. } => {}
        }
    }
    last
}

/// The commit mark a transaction carries, if any: the latest when it moved since the
/// last one written, and only once the log holds (up to `durable`) the entry it names.
/// A leader learns an index is committed when its followers flushed it, maybe before its
/// own slow disk did: a mark written ahead of its entries and a crash left a log that
/// openraft refused at start (it re-applies up to the mark, and the entries were not
/// there). Held back, the mark lags, which openraft allows.
fn mark_to_write(committed: Option<LogId>, written: Option<LogId>, durable: u64) -> Option<Option<LogId>> {
    let names_held = committed.is_none_or(|c| c.index <= durable);
    (committed != written && names_held).then_some(committed)
}

/// Writes `batch` as one write of the log, the commit mark (if it moved) last, so that
/// a write cut short never keeps a mark without the entries it names.
fn commit(log: &mut SegmentLog, batch: &[Op], committed: Option<&[u8]>) -> io::Result<()> {
    let mut changes = Vec::with_capacity(batch.len() + 1);
    for op in batch {
        match op {
            Op::Append { rows, .. } => {
                changes.extend(rows.iter().map(|(index, bytes)| Change::Entry { index: *index, bytes }));
            }
            Op::Truncate { from, .. } => changes.push(Change::Truncate { from: *from }),
            Op::Purge { upto, mark, .. } => changes.push(Change::Purge { upto: *upto, mark }),
            Op::Vote { value, .. } => changes.push(Change::Vote(value)),
        }
    }
    changes.extend(committed.map(Change::Commit));
    log.write(&changes)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self.mem().entries.range(range).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.mem().vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let mem = self.mem();
        let last_purged_log_id = mem.last_purged;
        let last_log_id = mem.entries.last_key_value().map(|(_, e)| e.log_id()).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let value = encode(vote)?;
        self.mem().vote = Some(*vote);
        self.durable(|done| Op::Vote { value, done }).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Lazy: the next transaction writes it (see the writer). A lost or lagging mark
        // only means entries are applied again from the snapshot after a restart, which
        // is what happens without one.
        self.mem().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.mem().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut rows = Vec::new();
        {
            let mut mem = self.mem();
            for entry in entries {
                let row = entry_format::to_vec(&entry);
                mem.sized(entry.index(), row.len());
                rows.push((entry.index(), row));
                mem.entries.insert(entry.index(), entry);
            }
        }
        self.send(Op::Append { rows, done: callback })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        {
            let mut mem = self.mem();
            drop(mem.entries.split_off(&from));
            let cut = mem.sizes.split_off(&from);
            mem.bytes -= cut.values().sum::<u64>();
        }
        self.durable(|done| Op::Truncate { from, done }).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let upto = log_id.index();
        let mark = encode(&log_id)?;
        let dropped = {
            let mut mem = self.mem();
            let kept = mem.entries.split_off(&(upto + 1));
            let dropped = std::mem::replace(&mut mem.entries, kept);
            let kept = mem.sizes.split_off(&(upto + 1));
            let purged = std::mem::replace(&mut mem.sizes, kept);
            mem.bytes -= purged.values().sum::<u64>();
            mem.last_purged = Some(log_id);
            dropped
        };
        // Freed outside the lock (a purge can free hundreds of MiB of entries).
        drop(dropped);
        self.durable(|done| Op::Purge { upto, mark, done }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_at(index: u64) -> SnapshotMeta {
        let log_id = serde_json::json!({"leader_id": {"term": 1, "node_id": 1}, "index": index});
        SnapshotMeta { last_log_id: Some(serde_json::from_value(log_id).unwrap()), last_membership: Default::default() }
    }

    fn append(index: u64) -> Op {
        Op::Append { rows: vec![(index, vec![])], done: IOFlushed::noop() }
    }

    fn vote() -> Op {
        let (done, _) = oneshot::channel();
        Op::Vote { value: vec![], done }
    }

    /// Sends `ops` one by one, each after its pause.
    fn arrivals(ops: Vec<(u64, Op)>) -> (mpsc::Receiver<Op>, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let sender = std::thread::spawn(move || {
            for (pause_ms, op) in ops {
                std::thread::sleep(Duration::from_millis(pause_ms));
                let _ = tx.send(op);
            }
        });
        (rx, sender)
    }

    #[test]
    fn the_linger_gathers_a_wave_and_ends_when_it_stops() {
        // The last commit took 400 ms: arrivals 10 ms apart (within a tenth of it) join
        // the group; the one 150 ms after the last does not.
        let ops = vec![(10, append(2)), (10, append(3)), (10, append(4)), (150, append(5))];
        let (rx, sender) = arrivals(ops);
        let started = Instant::now();
        let group = Linger::HALF.gather(append(1), &rx, Duration::from_millis(400));
        let waited = started.elapsed();
        assert_eq!(group.len(), 4, "the wave of three joins the first");
        assert!(
            waited < Duration::from_millis(150),
            "the wait ended 40 ms after the wave, not at its bound: {waited:?}"
        );
        sender.join().unwrap();
        // Without the linger only what is already queued is taken.
        let (rx, sender) = arrivals(vec![(10, append(2))]);
        assert_eq!(Linger::DEFAULT.gather(append(1), &rx, Duration::from_millis(400)).len(), 1);
        sender.join().unwrap();
    }

    #[test]
    fn the_linger_is_bounded_by_its_fraction_of_the_last_commit() {
        // Arrivals every 5 ms forever (within a tenth of 100 ms): the wait ends at half.
        let ops = (2..200).map(|i| (5, append(i))).collect();
        let (rx, sender) = arrivals(ops);
        let started = Instant::now();
        let group = Linger::HALF.gather(append(1), &rx, Duration::from_millis(100));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_millis(90), "waited {waited:?}");
        assert!((5..=12).contains(&group.len()), "{} in the group", group.len());
        drop(rx);
        sender.join().unwrap();
    }

    #[test]
    fn a_vote_is_never_held_by_the_linger() {
        // A vote queued behind an append ends the wait at once, however long it may be.
        let (rx, sender) = arrivals(vec![(5, vote()), (5, append(3))]);
        let started = Instant::now();
        let group = Linger { frac: 1.0 }.gather(append(1), &rx, Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_millis(500), "the vote waited {:?}", started.elapsed());
        assert!(matches!(group.as_slice(), [Op::Append { .. }, Op::Vote { .. }]));
        sender.join().unwrap();
        // A vote first is written without any wait.
        let (rx, sender) = arrivals(vec![(50, append(2))]);
        let started = Instant::now();
        assert_eq!(Linger { frac: 1.0 }.gather(vote(), &rx, Duration::from_secs(10)).len(), 1);
        assert!(started.elapsed() < Duration::from_millis(40));
        sender.join().unwrap();
    }

    /// A commit mark is written only once the log holds the entry it names: never
    /// ahead of its entries (the slow-disk leader of `cluster::every_member_killed_at_once`
    /// crashed with a mark past its log and could not start).
    #[test]
    fn the_commit_mark_is_never_written_ahead_of_its_entries() {
        use openraft::vote::RaftLeaderIdExt;
        let at = |index: u64| Some(LogId::new(openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(1, 1), index));
        assert_eq!(durable_after(4, &[append(5), append(6)]), 6);
        assert_eq!(durable_after(9, &[Op::Truncate { from: 7, done: oneshot::channel().0 }, append(7)]), 7);
        assert_eq!(mark_to_write(at(6), at(3), 6), Some(at(6)));
        assert_eq!(mark_to_write(at(8), at(3), 6), None, "a mark ahead of the log waits");
        assert_eq!(mark_to_write(at(6), at(6), 9), None, "an unmoved mark is not written again");
        assert_eq!(mark_to_write(None, at(3), 0), Some(None));
    }

    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = std::env::temp_dir().join(format!("fenced-raft-snap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = Db::open(&dir).unwrap();
        assert!(db.put_snapshot(&meta_at(10), b"ten").unwrap());
        // Built before, finished after: not kept.
        assert!(!db.put_snapshot(&meta_at(5), b"five").unwrap());
        let (meta, data) = db.snapshot().unwrap().unwrap();
        let meta: SnapshotMeta = serde_json::from_slice(&meta).unwrap();
        assert_eq!((meta.last_log_id.map(|l| l.index), data.as_slice()), (Some(10), b"ten".as_slice()));
        assert!(db.put_snapshot(&meta_at(12), b"twelve").unwrap());
        assert_eq!(db.snapshot().unwrap().unwrap().1, b"twelve");
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Replaces the only occurrence of `from` in `dir/file` with `to` (same length).
    fn edit_file(dir: &Path, file: &str, from: &[u8], to: &[u8]) {
        let path = dir.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let hits: Vec<usize> =
            bytes.windows(from.len()).enumerate().filter(|(_, w)| *w == from).map(|(i, _)| i).collect();
        assert_eq!(hits.len(), 1, "{} copies of the bytes to edit", hits.len());
        bytes[hits[0]..hits[0] + to.len()].copy_from_slice(to);
        std::fs::write(&path, bytes).unwrap();
    }

    /// The outside test's attack on a closed log: a same-length edit of a store write
    /// inside a log entry (`balance=1000` to `9000`) is refused when the log is opened,
    /// naming the segment and the byte; so is an edit inside the snapshot. Before the
    /// records had checksums, both were served.
    #[test]
    fn an_edit_of_a_closed_log_or_snapshot_is_refused_at_open() {
        use fenced_core::{Batch, Command, Quotas, RequestId, StoreCommand, Token};
        use openraft::vote::RaftLeaderIdExt;
        let dir = std::env::temp_dir().join(format!("fenced-raft-edit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let db = Db::open(&dir).unwrap();
        let write = StoreCommand::Write {
            key: "acct".into(),
            token: Token::new(21).unwrap(),
            value: b"balance=1000".to_vec(),
            foreign: false,
            quotas: Quotas::default(),
        };
        let batch = Batch::one(RequestId(1), Command::Store(write), 5);
        let leader = openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(1, 1);
        let entry = Entry { log_id: LogId::new(leader, 3), payload: EntryPayload::Normal(batch) };
        let bytes = entry_format::to_vec(&entry);
        db.log().as_mut().unwrap().0.write(&[Change::Entry { index: 3, bytes: &bytes }]).unwrap();
        assert!(db.put_snapshot(&meta_at(2), b"{\"store\":\"mark=0017\"}").unwrap());
        drop(db);
        // Untouched, both read back.
        let db = Db::open(&dir).unwrap();
        assert!(db.snapshot().unwrap().is_some());
        let store = LogStore::open(db, Linger::DEFAULT).unwrap();
        assert_eq!(store.mem().entries.len(), 1);
        drop(store);
        std::thread::sleep(Duration::from_millis(100));
        let segment = "log/00000000000000000001.seg";
        edit_file(&dir, segment, b"balance=1000", b"balance=9000");
        let err = Db::open(&dir).err().expect("the edited entry was read");
        assert!(err.to_string().contains("the raft log is damaged") && err.to_string().contains("an edit"), "{err}");
        edit_file(&dir, segment, b"balance=9000", b"balance=1000");
        edit_file(&dir, "snapshot", b"mark=0017", b"mark=0011");
        let err = Db::open(&dir).unwrap().snapshot().unwrap_err();
        assert!(err.to_string().contains("the snapshot is refused"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Writes a snapshot where data directories before format 4 kept it: in `raft.redb`.
    fn put_legacy_snapshot(dir: &Path, meta: &SnapshotMeta, data: &[u8], sum: Option<[u8; 4]>) {
        let db = Database::create(dir.join("raft.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(META).unwrap();
            let meta = serde_json::to_vec(meta).unwrap();
            table.insert(SNAPSHOT_META, meta.as_slice()).unwrap();
            table.insert(SNAPSHOT_DATA, data).unwrap();
            let sum = sum.unwrap_or_else(|| snapshot_sum(&meta, data));
            table.insert(SNAPSHOT_SUM, sum.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }

    /// A snapshot that an earlier format kept in `raft.redb` is moved to the snapshot
    /// file at open (and gone from `raft.redb`); one whose checksum does not match is
    /// refused, not moved, not dropped.
    #[test]
    fn a_snapshot_kept_in_raft_redb_moves_to_its_file() {
        let dir = std::env::temp_dir().join(format!("fenced-raft-move-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        put_legacy_snapshot(&dir, &meta_at(9), &vec![7u8; 1 << 20], None);
        let before = std::fs::metadata(dir.join("raft.redb")).unwrap().len();
        let db = Db::open(&dir).unwrap();
        let (meta, data) = db.snapshot().unwrap().unwrap();
        let meta: SnapshotMeta = serde_json::from_slice(&meta).unwrap();
        assert_eq!((meta.last_log_id.map(|l| l.index), data.len()), (Some(9), 1 << 20));
        assert!(db.meta(SNAPSHOT_DATA).unwrap().is_none(), "still in raft.redb");
        drop(db);
        let after = std::fs::metadata(dir.join("raft.redb")).unwrap().len();
        assert!(after < before / 2, "raft.redb kept its size: {before} -> {after} bytes");
        // Damaged where it was kept: refused, and left where it was.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        put_legacy_snapshot(&dir, &meta_at(9), b"table", Some([0; 4]));
        let err = Db::open(&dir).err().expect("a damaged snapshot was moved");
        assert!(err.to_string().contains("the snapshot is refused"), "{err}");
        assert!(!dir.join("snapshot").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
