//! The reader of `fenced.redb`, the file of the data-directory formats before the
//! replicated log held everything. It is read once, to migrate it (`migrate.rs`), and
//! never written. Its layout, as the single-node server (and then the fenced store
//! beside the log) wrote it:
//!
//! - table `meta` (name to `u64`): `token_ceiling` (every token issued is below it),
//!   `ttl_ms_hwm` (no lease that could hold a lock had a longer TTL), `clean_grace_ms`
//!   (only after a clean shutdown: the longest a lease of that run could still live),
//!   and `lock_delay/NAME` (the lock-delay lock `NAME` may owe);
//! - table `kv` (key to bytes): the fenced store, each record 8 bytes of mark
//!   (little-endian, 0 for none), 1 byte "has a value", then the value.
//!
//! The token ceiling, the TTL mark and the lock-delay records were the durability model
//! of that format. The lock table now lives in the replicated log, so they exist only
//! here: this module turns them into the table a migrated log starts from.

use std::path::Path;

use fenced_core::{Limits, LockName, LockTable, Record, Resume, Token};
use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition, TableError};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const TOKEN_CEILING: &str = "token_ceiling";
const TTL_MS_HWM: &str = "ttl_ms_hwm";
const CLEAN_GRACE_MS: &str = "clean_grace_ms";
/// Followed by a lock name.
const LOCK_DELAY: &str = "lock_delay/";

/// What an old `fenced.redb` holds.
#[derive(Debug, PartialEq, Eq)]
pub struct OldFile {
    /// Every token issued before is below this (1 when no token was issued).
    pub token_ceiling: u64,
    /// The largest TTL of any lease that could have held a lock.
    pub ttl_ms_hwm: u64,
    /// Set when the old run shut down cleanly: the longest a lease of it could still
    /// live, measured at that shutdown.
    pub clean_grace_ms: Option<u64>,
    /// Locks that may owe a lock-delay, and its length.
    pub lock_delays: Vec<(LockName, u64)>,
    /// The fenced store's keys, in key order, each with its mark and value.
    pub records: Vec<(String, Record)>,
}

impl OldFile {
    /// Reads the file at `path`. A record that does not decode is an error naming its
    /// key, never "no mark" (which would admit any token).
    pub fn read(path: &Path) -> Result<OldFile, String> {
        let err = |e: &dyn std::fmt::Display| format!("cannot read {}: {e}", path.display());
        // Read-only, so that a start refused after reading it leaves the file as it was;
        // a file left open by a crash needs redb's repair, which only a writable open does.
        // Both kept until the function returns: the transaction reads through them.
        let (read_only, writable);
        let db: &dyn ReadableDatabase = match ReadOnlyDatabase::open(path) {
            Ok(db) => {
                read_only = db;
                &read_only
            }
            Err(_) => {
                writable = Database::open(path).map_err(|e| err(&e))?;
                &writable
            }
        };
        let txn = db.begin_read().map_err(|e| err(&e))?;
        let mut old =
            OldFile { token_ceiling: 1, ttl_ms_hwm: 0, clean_grace_ms: None, lock_delays: vec![], records: vec![] };
        match txn.open_table(META) {
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(err(&e)),
            Ok(meta) => {
                let get = |name: &str| meta.get(name).map(|v| v.map(|v| v.value()));
                old.token_ceiling = get(TOKEN_CEILING).map_err(|e| err(&e))?.unwrap_or(1).max(1);
                old.ttl_ms_hwm = get(TTL_MS_HWM).map_err(|e| err(&e))?.unwrap_or(0);
                old.clean_grace_ms = get(CLEAN_GRACE_MS).map_err(|e| err(&e))?;
                for row in meta.range(LOCK_DELAY..).map_err(|e| err(&e))? {
                    let (name, delay_ms) = row.map_err(|e| err(&e))?;
                    let Some(name) = name.value().strip_prefix(LOCK_DELAY) else { break };
                    // A name that no longer parses (a lowered limit) cannot be taken
                    // under the current limits either.
                    if let Ok(name) = LockName::new(name) {
                        old.lock_delays.push((name, delay_ms.value()));
                    }
                }
            }
        }
        match txn.open_table(KV) {
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(err(&e)),
            Ok(kv) => {
                for row in kv.iter().map_err(|e| err(&e))? {
                    let (key, raw) = row.map_err(|e| err(&e))?;
                    let key = key.value().to_string();
                    let record = decode(&key, raw.value()).map_err(|why| err(&why))?;
                    old.records.push((key, record));
                }
            }
        }
        Ok(old)
    }

    /// Whether it held lock-table state: tokens issued, or lock-delays owed.
    pub fn has_table(&self) -> bool {
        self.token_ceiling > 1 || !self.lock_delays.is_empty()
    }

    /// The table a fresh log starts from. Tokens continue from the ceiling. Every lease
    /// of the old run lived in memory and is gone, and any of them may still be held
    /// by a process that believes it holds a lock: nothing is granted for the old
    /// rule's grace (one maximal TTL, or the grace recorded at a clean shutdown), and a
    /// lock that may owe a lock-delay stays blocked for its delay past that.
    pub fn table(&self, limits: Limits) -> LockTable {
        let grace_ms = self.clean_grace_ms.unwrap_or(self.ttl_ms_hwm);
        let blocked_until = self.lock_delays.iter().map(|(name, delay_ms)| (name.clone(), grace_ms + delay_ms));
        LockTable::resume(
            limits,
            Resume {
                next_token: Token::new(self.token_ceiling).expect("at least 1"),
                grants_resume_at_ms: grace_ms,
                blocked_until: blocked_until.collect(),
            },
        )
    }
}

/// A record of the `kv` table.
fn decode(key: &str, raw: &[u8]) -> Result<Record, String> {
    let corrupt =
        |why| Err(format!("the record of key '{key}' is corrupt ({why}); it is refused rather than read as unwritten"));
    if raw.len() < 9 {
        return corrupt("shorter than its 9-byte header");
    }
    let mark = Token::new(u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")));
    match raw[8] {
        0 if raw.len() == 9 => Ok(Record { mark, value: None }),
        0 => corrupt("bytes after a header that says 'no value'"),
        1 => Ok(Record { mark, value: Some(raw[9..].to_vec()) }),
        _ => corrupt("a value flag that is neither 0 nor 1"),
    }
}

#[cfg(test)]
mod tests;
