//! Durable state of the Fenced server: what the lock table asks to keep (`Persist`: the
//! token ceiling, the TTL high-water mark, lock-delay records), the clean-shutdown
//! record, and the fenced key-value store (each value with its `highest_seen` mark, in
//! one record, so that both change in the same transaction).
//!
//! The storage engine sits behind the narrow [`Backend`] trait: [`RedbBackend`] (the
//! default, durable: every commit returns after fsync) and [`MemoryBackend`] (tests,
//! measurements). One writer thread owns every write transaction and batches the
//! requests that queue while a commit is in flight into the next transaction (group
//! commit). Replies are sent only after the commit returned, so nothing is
//! acknowledged before it is durable.

mod backend;
mod memory;
mod redb_backend;

pub use backend::{Backend, Txn};
pub use memory::MemoryBackend;
pub use redb_backend::RedbBackend;

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use fenced_core::gate::{admit, Admission, Op};
use fenced_core::{Durable, LockName, Persist, Token};
use tokio::sync::oneshot;

const TOKEN_CEILING: &str = "token_ceiling";
const TTL_MS_HWM: &str = "ttl_ms_hwm";
/// Present only between a clean shutdown and the next start.
const CLEAN_GRACE_MS: &str = "clean_grace_ms";
/// Followed by a lock name: the lock-delay that lock may owe after a restart.
const LOCK_DELAY: &str = "lock_delay/";

/// The most requests one group commit carries.
const BATCH_MAX: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Db(String),
    #[error("the store is closed")]
    Closed,
    /// The write would take the store past one of its quotas; nothing was written.
    #[error("the fenced store holds its limit of {limit} {what}")]
    Full { what: &'static str, limit: u64 },
    /// A record that cannot be read back intact: never taken for "no mark".
    #[error("the record of key '{key}' is corrupt ({why}); it is refused rather than read as unwritten")]
    Corrupt { key: String, why: &'static str },
}

pub(crate) fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

/// The result of a fenced-store operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreAnswer {
    pub admission: Admission,
    /// The value, for reads that were admitted.
    pub value: Option<Vec<u8>>,
}

enum Request {
    Put {
        key: String,
        token: Option<Token>,
        value: Vec<u8>,
        reply: oneshot::Sender<Result<StoreAnswer, StoreError>>,
    },
    FencedRead {
        key: String,
        token: Token,
        reply: oneshot::Sender<Result<StoreAnswer, StoreError>>,
    },
    /// A write past the gate, for keys the server keeps unfenced: no mark, last writer wins.
    PutUnfenced {
        key: String,
        value: Vec<u8>,
        reply: Reply,
    },
    /// What the lock table asked to keep, in order.
    Persist {
        items: Vec<Persist>,
        reply: Reply,
    },
}

/// The answer to a write that returns no value.
type Reply = oneshot::Sender<Result<(), StoreError>>;

/// Bounds on the fenced store's size: the replicated store's own type (a write that
/// would pass one is refused, [`StoreError::Full`], and changes nothing).
pub use fenced_core::Quotas;

/// What the fenced store holds now, as the writer counts it.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    keys: u64,
    bytes: u64,
}

/// The handle the server holds. Dropping every clone ends the writer thread, which
/// closes the database.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    tx: mpsc::Sender<Request>,
}

impl Store {
    /// Opens (or creates) `dir/fenced.redb`, reads what the last run left, and starts
    /// the writer thread. Join the returned handle after dropping every `Store`.
    pub fn open(dir: &Path) -> Result<(Store, Durable, JoinHandle<()>), StoreError> {
        Store::open_with(dir, Quotas::default())
    }

    /// [`open`](Store::open) with quotas on the fenced store.
    pub fn open_with(dir: &Path, quotas: Quotas) -> Result<(Store, Durable, JoinHandle<()>), StoreError> {
        Store::with_backend_and(Arc::new(RedbBackend::open(dir)?), quotas)
    }

    /// The same over any backend.
    pub fn with_backend(backend: Arc<dyn Backend>) -> Result<(Store, Durable, JoinHandle<()>), StoreError> {
        Store::with_backend_and(backend, Quotas::default())
    }

    /// The same over any backend, with quotas.
    pub fn with_backend_and(
        backend: Arc<dyn Backend>,
        quotas: Quotas,
    ) -> Result<(Store, Durable, JoinHandle<()>), StoreError> {
        let mut recovered = None;
        backend.transact(&mut |t| {
            let mut lock_delays = Vec::new();
            for (key, delay_ms) in t.meta_scan(LOCK_DELAY)? {
                // A record whose name no longer parses (a lowered limit) is kept as is:
                // the lock it names cannot be taken under the current limits either.
                if let Ok(name) = LockName::new(&key[LOCK_DELAY.len()..]) {
                    lock_delays.push((name, delay_ms));
                }
            }
            recovered = Some(Durable {
                token_ceiling: t.meta_get(TOKEN_CEILING)?.unwrap_or(1).max(1),
                ttl_ms_hwm: t.meta_get(TTL_MS_HWM)?.unwrap_or(0),
                clean_grace_ms: t.meta_get(CLEAN_GRACE_MS)?,
                lock_delays,
            });
            Ok(())
        })?;
        let recovered = recovered.expect("the body ran");
        // Counted once at start (one scan), then kept by the writer as it writes.
        let usage = backend.kv_scan("", usize::MAX)?.iter().fold(Usage::default(), |u, (k, v)| Usage {
            keys: u.keys + 1,
            bytes: u.bytes + (k.len() + v.len()) as u64,
        });
        let (tx, rx) = mpsc::channel();
        let writer_backend = backend.clone();
        let handle = std::thread::Builder::new()
            .name("fenced-store".into())
            .spawn(move || writer(&*writer_backend, rx, quotas, usage))
            .map_err(db_err)?;
        Ok((Store { backend, tx }, recovered, handle))
    }

    /// A fenced write: admitted iff `token >= highest_seen`; value and mark commit together.
    pub async fn put(&self, key: String, token: Option<Token>, value: Vec<u8>) -> Result<StoreAnswer, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::Put { key, token, value, reply }).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// An unfenced write: stores `value` with no mark (dropping any mark the key had),
    /// durably, whatever token wrote before. Only for keys the server is configured to
    /// leave unfenced; the gate does not see it.
    pub async fn put_unfenced(&self, key: String, value: Vec<u8>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Request::PutUnfenced { key, value, reply: tx }).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// A fenced read: admitted iff `token >= highest_seen`, and then the mark moves up
    /// durably before the value is returned.
    pub async fn fenced_read(&self, key: String, token: Token) -> Result<StoreAnswer, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::FencedRead { key, token, reply }).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// A plain read: no token, the mark does not move.
    pub async fn read(&self, key: String) -> Result<StoreAnswer, StoreError> {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || {
            let raw = backend.kv_get(&key)?;
            let (mark, value) = decode(&key, raw.as_deref())?;
            Ok(StoreAnswer { admission: admit(mark, None, Op::Read), value: value.map(<[u8]>::to_vec) })
        })
        .await
        .map_err(db_err)?
    }

    /// Keys starting with `prefix`, in order, at most `limit`: each with its mark and
    /// the size of its value (`None` for a key fenced by a read but never written).
    pub async fn list(&self, prefix: String, limit: usize) -> Result<Vec<KeyInfo>, StoreError> {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || {
            let rows = backend.kv_scan(&prefix, limit)?;
            rows.into_iter()
                .map(|(key, raw)| {
                    let (highest_seen, value) = decode(&key, Some(&raw))?;
                    Ok(KeyInfo { key, highest_seen, value_bytes: value.map(|v| v.len()) })
                })
                .collect()
        })
        .await
        .map_err(db_err)?
    }

    /// Every key with its mark and value, in key order: what a data directory of the
    /// format before the store joined the replicated log brings into it.
    pub fn records(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.backend
            .kv_scan("", usize::MAX)?
            .into_iter()
            .map(|(key, raw)| {
                let (mark, value) = decode(&key, Some(&raw))?;
                let value = value.map(<[u8]>::to_vec);
                Ok((key, mark, value))
            })
            .collect()
    }

    /// Makes what the lock table asked to keep durable, from async code.
    pub async fn persist(&self, items: Vec<Persist>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Request::Persist { items, reply: tx }).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

/// A key, its mark and its value, as [`Store::records`] reads them.
pub type KeyRecord = (String, Option<Token>, Option<Vec<u8>>);

/// One key of the fenced store, as `Store::list` sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    pub key: String,
    /// The mark: the highest token any write or fenced read of the key carried.
    pub highest_seen: Option<Token>,
    /// The value's length, `None` when only a fenced read ever touched the key.
    pub value_bytes: Option<usize>,
}

/// Record layout: 8 bytes of mark (little-endian, 0 for none), 1 byte "has a value",
/// then the value.
fn encode(mark: Option<Token>, value: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + value.map_or(0, <[u8]>::len));
    out.extend_from_slice(&mark.map_or(0, Token::get).to_le_bytes());
    out.push(value.is_some() as u8);
    out.extend_from_slice(value.unwrap_or_default());
    out
}

/// An absent record is "never written"; a record that is not one this code wrote is
/// [`StoreError::Corrupt`], never "no mark" (which would admit any token).
fn decode<'r>(key: &str, raw: Option<&'r [u8]>) -> Result<(Option<Token>, Option<&'r [u8]>), StoreError> {
    let Some(raw) = raw else { return Ok((None, None)) };
    let corrupt = |why| Err(StoreError::Corrupt { key: key.to_string(), why });
    if raw.len() < 9 {
        return corrupt("shorter than its 9-byte header");
    }
    let mark = Token::new(u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")));
    match raw[8] {
        0 if raw.len() == 9 => Ok((mark, None)),
        0 => corrupt("bytes after a header that says 'no value'"),
        1 => Ok((mark, Some(&raw[9..]))),
        _ => corrupt("a value flag that is neither 0 nor 1"),
    }
}

/// The writer thread: one transaction per batch of queued requests.
fn writer(backend: &dyn Backend, rx: mpsc::Receiver<Request>, quotas: Quotas, mut usage: Usage) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        match apply(backend, &batch, quotas, &mut usage) {
            Ok(answers) => {
                for (req, answer) in batch.into_iter().zip(answers) {
                    match req {
                        Request::Put { reply, .. } | Request::FencedRead { reply, .. } => {
                            drop(reply.send(answer.map(|a| a.expect("store ops answer"))))
                        }
                        Request::PutUnfenced { reply, .. } | Request::Persist { reply, .. } => {
                            drop(reply.send(answer.map(drop)))
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store commit failed");
                for req in batch {
                    let err = || StoreError::Db(e.to_string());
                    match req {
                        Request::Put { reply, .. } | Request::FencedRead { reply, .. } => drop(reply.send(Err(err()))),
                        Request::PutUnfenced { reply, .. } | Request::Persist { reply, .. } => {
                            drop(reply.send(Err(err())))
                        }
                    }
                }
            }
        }
    }
    tracing::debug!("store writer done");
}

/// One request's result inside a batch: a corrupt record or a full store refuses that
/// request alone.
type Answer = Result<Option<StoreAnswer>, StoreError>;

/// Runs a batch in one durable transaction; one answer per request (`None` for meta
/// and unfenced writes). `usage` moves on only when the batch commits.
fn apply(
    backend: &dyn Backend,
    batch: &[Request],
    quotas: Quotas,
    usage: &mut Usage,
) -> Result<Vec<Answer>, StoreError> {
    let mut answers = Vec::with_capacity(batch.len());
    let mut after = *usage;
    backend.transact(&mut |t| {
        answers.clear();
        after = *usage;
        let mut kv = Kv { t, quotas, usage: &mut after };
        for req in batch {
            answers.push(match apply_one(&mut kv, req) {
                Err(e @ (StoreError::Corrupt { .. } | StoreError::Full { .. })) => Err(e),
                other => Ok(other?),
            });
        }
        Ok(())
    })?;
    *usage = after;
    Ok(answers)
}

/// The kv table inside a transaction, counted against the quotas.
struct Kv<'a, 't> {
    t: &'a mut (dyn Txn + 't),
    quotas: Quotas,
    usage: &'a mut Usage,
}

impl Kv<'_, '_> {
    /// Writes `record` over `old` (the key's record before, if any), unless that would
    /// take the store past a quota; a write that takes no new room always goes on.
    fn put(&mut self, key: &str, old: Option<&[u8]>, record: &[u8]) -> Result<(), StoreError> {
        let keys = self.usage.keys + old.is_none() as u64;
        let size = |r: &[u8]| (key.len() + r.len()) as u64;
        let bytes = self.usage.bytes - old.map_or(0, size) + size(record);
        if keys > self.usage.keys && keys > self.quotas.keys_max {
            return Err(StoreError::Full { what: "keys", limit: self.quotas.keys_max });
        }
        if bytes > self.usage.bytes && bytes > self.quotas.bytes_max {
            return Err(StoreError::Full { what: "bytes", limit: self.quotas.bytes_max });
        }
        self.t.kv_put(key, record)?;
        *self.usage = Usage { keys, bytes };
        Ok(())
    }
}

fn apply_one(kv: &mut Kv<'_, '_>, req: &Request) -> Result<Option<StoreAnswer>, StoreError> {
    let t = &mut *kv.t;
    Ok(match req {
        Request::Put { key, token, value, .. } => {
            let old = t.kv_get(key)?;
            let (mark, _) = decode(key, old.as_deref())?;
            let admission = admit(mark, *token, Op::Write);
            if let Admission::Accepted { token, .. } = admission {
                assert!(mark.is_none_or(|m| token >= m), "store mark would regress");
                kv.put(key, old.as_deref(), &encode(Some(token), Some(value)))?;
            }
            Some(StoreAnswer { admission, value: None })
        }
        Request::FencedRead { key, token, .. } => {
            let old = t.kv_get(key)?;
            let (mark, value) = decode(key, old.as_deref())?;
            let admission = admit(mark, Some(*token), Op::Read);
            let admitted = matches!(admission, Admission::Accepted { .. });
            if admitted && mark != Some(*token) {
                kv.put(key, old.as_deref(), &encode(Some(*token), value))?;
            }
            Some(StoreAnswer { admission, value: value.filter(|_| admitted).map(<[u8]>::to_vec) })
        }
        Request::PutUnfenced { key, value, .. } => {
            let old = t.kv_get(key)?;
            kv.put(key, old.as_deref(), &encode(None, Some(value)))?;
            None
        }
        Request::Persist { items, .. } => {
            for item in items {
                match item {
                    Persist::TokenCeiling(c) => t.meta_put(TOKEN_CEILING, *c)?,
                    Persist::TtlMsHwm(h) => t.meta_put(TTL_MS_HWM, *h)?,
                    Persist::LockDelay { name, lock_delay_ms: Some(d) } => {
                        t.meta_put(&format!("{LOCK_DELAY}{name}"), *d)?
                    }
                    Persist::LockDelay { name, lock_delay_ms: None } => {
                        t.meta_delete(&format!("{LOCK_DELAY}{name}"))?
                    }
                }
            }
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let t = Token::new(7);
        assert_eq!(decode("k", Some(&encode(t, Some(b"v")))).unwrap(), (t, Some(&b"v"[..])));
        assert_eq!(decode("k", Some(&encode(t, None))).unwrap(), (t, None));
        assert_eq!(decode("k", None).unwrap(), (None, None));
    }

    #[test]
    fn a_corrupt_record_is_an_error_not_an_empty_mark() {
        // Review defect 6: a record shorter than its header was read as never written.
        for raw in [vec![], vec![7, 0, 0], vec![7, 0, 0, 0, 0, 0, 0, 0, 2], vec![7, 0, 0, 0, 0, 0, 0, 0, 0, 1]] {
            assert!(matches!(decode("k", Some(&raw)), Err(StoreError::Corrupt { .. })));
        }
    }

    #[tokio::test]
    async fn a_write_over_a_corrupt_record_is_refused_and_changes_nothing() {
        let backend = Arc::new(MemoryBackend::default());
        backend.transact(&mut |t| t.kv_put("k", &[9, 0, 0])).unwrap();
        let (store, _, h) = Store::with_backend(backend.clone()).unwrap();
        let put = store.put("k".into(), Token::new(1), b"v".to_vec()).await;
        assert!(matches!(put, Err(StoreError::Corrupt { .. })), "{put:?}");
        let read = store.fenced_read("k".into(), Token::new(1).unwrap()).await;
        assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
        // Other requests of the same batch still go through.
        assert!(store.put("other".into(), Token::new(1), b"v".to_vec()).await.unwrap().admission.is_accepted());
        assert_eq!(backend.kv_get("k").unwrap(), Some(vec![9, 0, 0]));
        drop(store);
        h.join().unwrap();
    }

    /// The fence rule through the store's public surface, on any backend.
    async fn check_gate(store: &Store) {
        let put = |t: u64, v: &str| store.put("k".into(), Token::new(t), v.as_bytes().to_vec());
        assert!(put(5, "five").await.unwrap().admission.is_accepted());
        assert!(matches!(put(4, "four").await.unwrap().admission, Admission::Rejected { .. }));
        let none = store.put("k".into(), None, b"x".to_vec()).await.unwrap();
        assert!(matches!(none.admission, Admission::TokenRequired { .. }));
        let r = store.fenced_read("k".into(), Token::new(9).unwrap()).await.unwrap();
        assert_eq!(r.value.as_deref(), Some(&b"five"[..]));
        assert!(matches!(put(8, "eight").await.unwrap().admission, Admission::Rejected { .. }));
        let r = store.fenced_read("k".into(), Token::new(8).unwrap()).await.unwrap();
        assert_eq!((r.value, r.admission.is_accepted()), (None, false));
        let r = store.read("k".into()).await.unwrap();
        assert_eq!((r.value.as_deref(), r.admission.highest_seen()), (Some(&b"five"[..]), Token::new(9)));
        // A fenced read of an absent key leaves a mark and no value.
        let r = store.fenced_read("absent".into(), Token::new(3).unwrap()).await.unwrap();
        assert_eq!(r.value, None);
        assert_eq!(store.read("absent".into()).await.unwrap().admission.highest_seen(), Token::new(3));
        // An unfenced write: last writer wins, no mark kept (a mark it finds is dropped).
        store.put_unfenced("absent".into(), b"u1".to_vec()).await.unwrap();
        store.put_unfenced("absent".into(), b"u2".to_vec()).await.unwrap();
        let r = store.read("absent".into()).await.unwrap();
        assert_eq!((r.value.as_deref(), r.admission.highest_seen()), (Some(&b"u2"[..]), None));
    }

    #[test]
    fn a_failed_transaction_leaves_nothing_on_either_backend() {
        let dir = std::env::temp_dir().join(format!("fenced-store-abort-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let backends: [Arc<dyn Backend>; 2] =
            [Arc::new(MemoryBackend::default()), Arc::new(RedbBackend::open(&dir).unwrap())];
        for b in backends {
            let r = b.transact(&mut |t| {
                t.kv_put("k", b"v")?;
                t.meta_put("m", 1)?;
                assert_eq!(t.kv_get("k")?, Some(b"v".to_vec()), "a transaction reads its own writes");
                Err(StoreError::Closed)
            });
            assert!(r.is_err());
            assert_eq!(b.kv_get("k").unwrap(), None);
            b.transact(&mut |t| {
                assert_eq!(t.meta_get("m")?, None);
                Ok(())
            })
            .unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn quotas_refuse_what_needs_new_room_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("fenced-store-quota-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let quotas = Quotas { keys_max: 2, bytes_max: 100 };
        let full = |r: Result<StoreAnswer, StoreError>| matches!(r, Err(StoreError::Full { .. }));
        {
            let (store, _, h) = Store::open_with(&dir, quotas).unwrap();
            let put = |k: &str, t: u64, v: &[u8]| store.put(k.into(), Token::new(t), v.to_vec());
            assert!(put("a", 1, b"1").await.unwrap().admission.is_accepted());
            assert!(put("b", 1, b"1").await.unwrap().admission.is_accepted());
            let r = put("c", 1, b"1").await;
            assert!(matches!(r, Err(StoreError::Full { what: "keys", limit: 2 })), "{r:?}");
            // A fenced read that would mark a new key needs room too.
            assert!(full(store.fenced_read("d".into(), Token::new(1).unwrap()).await));
            // Overwrites of existing keys go on; growing past the bytes is refused.
            assert!(put("a", 2, b"22").await.unwrap().admission.is_accepted());
            let r = put("a", 3, &[7; 90]).await;
            assert!(matches!(r, Err(StoreError::Full { what: "bytes", limit: 100 })), "{r:?}");
            assert_eq!(store.read("a".into()).await.unwrap().value.as_deref(), Some(&b"22"[..]), "refused: unchanged");
            drop(store);
            h.join().unwrap();
        }
        // Reopened, the store counts what it holds again.
        let (store, _, h) = Store::open_with(&dir, quotas).unwrap();
        assert!(full(store.put("e".into(), Token::new(4), b"x".to_vec()).await));
        drop(store);
        h.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_gate_on_both_backends() {
        let (mem, _, h1) = Store::with_backend(Arc::new(MemoryBackend::default())).unwrap();
        check_gate(&mem).await;
        let dir = std::env::temp_dir().join(format!("fenced-store-gate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (disk, _, h2) = Store::open(&dir).unwrap();
        check_gate(&disk).await;
        drop((mem, disk));
        h1.join().unwrap();
        h2.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn marks_and_meta_survive_reopen() {
        let dir = std::env::temp_dir().join(format!("fenced-store-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let (store, rec, handle) = Store::open(&dir).unwrap();
            assert_eq!(rec, Durable { token_ceiling: 1, ..Durable::default() });
            let a = store.put("k".into(), Token::new(5), b"five".to_vec()).await.unwrap();
            assert!(a.admission.is_accepted());
            let a = store.put("k".into(), Token::new(4), b"four".to_vec()).await.unwrap();
            assert!(matches!(a.admission, Admission::Rejected { .. }));
            let r = store.fenced_read("k".into(), Token::new(9).unwrap()).await.unwrap();
            assert_eq!(r.value.as_deref(), Some(&b"five"[..]));
            store.persist(vec![Persist::TokenCeiling(1000)]).await.unwrap();
            store.persist(vec![Persist::TtlMsHwm(5000)]).await.unwrap();
            let delay = |name: &str, d| Persist::LockDelay { name: LockName::new(name).unwrap(), lock_delay_ms: d };
            store.persist(vec![delay("x", Some(30_000)), delay("y", Some(5)), delay("y", None)]).await.unwrap();
            drop(store);
            handle.join().unwrap();
        }
        let (store, rec, handle) = Store::open(&dir).unwrap();
        let lock_delays = vec![(LockName::new("x").unwrap(), 30_000)];
        assert_eq!(rec, Durable { token_ceiling: 1000, ttl_ms_hwm: 5000, clean_grace_ms: None, lock_delays });
        let r = store.read("k".into()).await.unwrap();
        assert_eq!(r.value.as_deref(), Some(&b"five"[..]));
        assert_eq!(r.admission.highest_seen(), Token::new(9));
        drop(store);
        handle.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
