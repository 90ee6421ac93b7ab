//! Durable state of the Fenced server: the token ceiling, the TTL high-water mark, the
//! clean-shutdown record, and the fenced key-value store (each value with its
//! `highest_seen` mark, in one record, so that both change in the same transaction).
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
use fenced_core::Token;
use tokio::sync::oneshot;

const TOKEN_CEILING: &str = "token_ceiling";
const TTL_MS_HWM: &str = "ttl_ms_hwm";
/// Present only between a clean shutdown and the next start.
const CLEAN_GRACE_MS: &str = "clean_grace_ms";

/// The most requests one group commit carries.
const BATCH_MAX: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Db(String),
    #[error("the store is closed")]
    Closed,
}

pub(crate) fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

/// What the previous run left behind, read at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// Every token ever handed out is below this (1 on a fresh directory).
    pub token_ceiling: u64,
    /// The largest TTL of any lease ever created.
    pub ttl_ms_hwm: u64,
    /// Set when the previous run shut down cleanly: the longest a lease of it could
    /// still live, measured at that shutdown.
    pub clean_grace_ms: Option<u64>,
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
    Meta {
        key: &'static str,
        value: Option<u64>,
        reply: Reply,
    },
}

/// Meta writes come from async handlers (a TTL high-water mark) and from inside the
/// lock-table mutex (the token ceiling), where only a blocking wait is possible.
enum Reply {
    Async(oneshot::Sender<Result<(), StoreError>>),
    Blocking(mpsc::SyncSender<Result<(), StoreError>>),
}

impl Reply {
    fn send(self, r: Result<(), StoreError>) {
        match self {
            Reply::Async(tx) => drop(tx.send(r)),
            Reply::Blocking(tx) => drop(tx.send(r)),
        }
    }
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
    pub fn open(dir: &Path) -> Result<(Store, Recovered, JoinHandle<()>), StoreError> {
        Store::with_backend(Arc::new(RedbBackend::open(dir)?))
    }

    /// The same over any backend.
    pub fn with_backend(backend: Arc<dyn Backend>) -> Result<(Store, Recovered, JoinHandle<()>), StoreError> {
        let mut recovered = None;
        backend.transact(&mut |t| {
            recovered = Some(Recovered {
                token_ceiling: t.meta_get(TOKEN_CEILING)?.unwrap_or(1).max(1),
                ttl_ms_hwm: t.meta_get(TTL_MS_HWM)?.unwrap_or(0),
                clean_grace_ms: t.meta_get(CLEAN_GRACE_MS)?,
            });
            Ok(())
        })?;
        let recovered = recovered.expect("the body ran");
        let (tx, rx) = mpsc::channel();
        let writer_backend = backend.clone();
        let handle = std::thread::Builder::new()
            .name("fenced-store".into())
            .spawn(move || writer(&*writer_backend, rx))
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
        self.tx.send(Request::PutUnfenced { key, value, reply: Reply::Async(tx) }).map_err(|_| StoreError::Closed)?;
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
            let (mark, value) = decode(backend.kv_get(&key)?);
            Ok(StoreAnswer { admission: admit(mark, None, Op::Read), value })
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
            Ok(rows
                .into_iter()
                .map(|(key, raw)| {
                    let (highest_seen, value) = decode(Some(raw));
                    KeyInfo { key, highest_seen, value_bytes: value.map(|v| v.len()) }
                })
                .collect())
        })
        .await
        .map_err(db_err)?
    }

    /// Makes a meta value durable, from async code.
    pub async fn set_meta(&self, key: MetaKey, value: Option<u64>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Request::Meta { key: key.name(), value, reply: Reply::Async(tx) })
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Makes a meta value durable, blocking the calling thread until it is.
    pub fn set_meta_blocking(&self, key: MetaKey, value: Option<u64>) -> Result<(), StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.tx
            .send(Request::Meta { key: key.name(), value, reply: Reply::Blocking(tx) })
            .map_err(|_| StoreError::Closed)?;
        rx.recv().map_err(|_| StoreError::Closed)?
    }
}

/// The meta values a caller may set.
#[derive(Clone, Copy, Debug)]
pub enum MetaKey {
    TokenCeiling,
    TtlMsHwm,
    CleanGraceMs,
}

impl MetaKey {
    fn name(self) -> &'static str {
        match self {
            MetaKey::TokenCeiling => TOKEN_CEILING,
            MetaKey::TtlMsHwm => TTL_MS_HWM,
            MetaKey::CleanGraceMs => CLEAN_GRACE_MS,
        }
    }
}

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

fn decode(raw: Option<Vec<u8>>) -> (Option<Token>, Option<Vec<u8>>) {
    let Some(raw) = raw.filter(|r| r.len() >= 9) else { return (None, None) };
    let mark = Token::new(u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")));
    let value = (raw[8] == 1).then(|| raw[9..].to_vec());
    (mark, value)
}

/// The writer thread: one transaction per batch of queued requests.
fn writer(backend: &dyn Backend, rx: mpsc::Receiver<Request>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        match apply(backend, &batch) {
            Ok(answers) => {
                for (req, answer) in batch.into_iter().zip(answers) {
                    match req {
                        Request::Put { reply, .. } | Request::FencedRead { reply, .. } => {
                            drop(reply.send(Ok(answer.expect("store ops answer"))))
                        }
                        Request::Meta { reply, .. } | Request::PutUnfenced { reply, .. } => reply.send(Ok(())),
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store commit failed");
                for req in batch {
                    let err = || StoreError::Db(e.to_string());
                    match req {
                        Request::Put { reply, .. } | Request::FencedRead { reply, .. } => drop(reply.send(Err(err()))),
                        Request::Meta { reply, .. } | Request::PutUnfenced { reply, .. } => reply.send(Err(err())),
                    }
                }
            }
        }
    }
    tracing::debug!("store writer done");
}

/// Runs a batch in one durable transaction; one answer per request (`None` for meta
/// and unfenced writes).
fn apply(backend: &dyn Backend, batch: &[Request]) -> Result<Vec<Option<StoreAnswer>>, StoreError> {
    let mut answers = Vec::with_capacity(batch.len());
    backend.transact(&mut |t| {
        answers.clear();
        for req in batch {
            answers.push(apply_one(t, req)?);
        }
        Ok(())
    })?;
    Ok(answers)
}

fn apply_one(t: &mut dyn Txn, req: &Request) -> Result<Option<StoreAnswer>, StoreError> {
    Ok(match req {
        Request::Put { key, token, value, .. } => {
            let (mark, _) = decode(t.kv_get(key)?);
            let admission = admit(mark, *token, Op::Write);
            if let Admission::Accepted { token, .. } = admission {
                assert!(mark.is_none_or(|m| token >= m), "store mark would regress");
                t.kv_put(key, &encode(Some(token), Some(value)))?;
            }
            Some(StoreAnswer { admission, value: None })
        }
        Request::FencedRead { key, token, .. } => {
            let (mark, value) = decode(t.kv_get(key)?);
            let admission = admit(mark, Some(*token), Op::Read);
            let admitted = matches!(admission, Admission::Accepted { .. });
            if admitted && mark != Some(*token) {
                t.kv_put(key, &encode(Some(*token), value.as_deref()))?;
            }
            Some(StoreAnswer { admission, value: if admitted { value } else { None } })
        }
        Request::PutUnfenced { key, value, .. } => {
            t.kv_put(key, &encode(None, Some(value)))?;
            None
        }
        Request::Meta { key, value, .. } => {
            match value {
                Some(v) => t.meta_put(key, *v)?,
                None => t.meta_delete(key)?,
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
        assert_eq!(decode(Some(encode(t, Some(b"v")))), (t, Some(b"v".to_vec())));
        assert_eq!(decode(Some(encode(t, None))), (t, None));
        assert_eq!(decode(None), (None, None));
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
            assert_eq!(rec, Recovered { token_ceiling: 1, ttl_ms_hwm: 0, clean_grace_ms: None });
            let a = store.put("k".into(), Token::new(5), b"five".to_vec()).await.unwrap();
            assert!(a.admission.is_accepted());
            let a = store.put("k".into(), Token::new(4), b"four".to_vec()).await.unwrap();
            assert!(matches!(a.admission, Admission::Rejected { .. }));
            let r = store.fenced_read("k".into(), Token::new(9).unwrap()).await.unwrap();
            assert_eq!(r.value.as_deref(), Some(&b"five"[..]));
            store.set_meta(MetaKey::TokenCeiling, Some(1000)).await.unwrap();
            store.set_meta_blocking(MetaKey::TtlMsHwm, Some(5000)).unwrap();
            drop(store);
            handle.join().unwrap();
        }
        let (store, rec, handle) = Store::open(&dir).unwrap();
        assert_eq!(rec, Recovered { token_ceiling: 1000, ttl_ms_hwm: 5000, clean_grace_ms: None });
        let r = store.read("k".into()).await.unwrap();
        assert_eq!(r.value.as_deref(), Some(&b"five"[..]));
        assert_eq!(r.admission.highest_seen(), Token::new(9));
        drop(store);
        handle.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
