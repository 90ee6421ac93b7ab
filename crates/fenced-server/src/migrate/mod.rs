//! Data directories of earlier formats, brought into the replicated log once.
//!
//! Two formats came before the one where everything lives in `raft.redb`:
//!
//! - **Single node, before the replicated log**: `fenced.redb` held the token ceiling,
//!   the TTL high-water mark, lock-delays owed, and the fenced store (`old_file.rs`
//!   reads it; nothing else in the server knows that format). Its table is rebuilt
//!   (tokens continue above the ceiling; leases lived in memory then, so grants wait one
//!   maximal TTL, the old rule's grace) and, with the store's records, becomes the state
//!   the log starts from.
//! - **The log beside a separate store**: `raft.redb` held the locks while the fenced
//!   store stayed in `fenced.redb`. Its records are proposed into the log as one
//!   `Import` once the node leads; keys the log's store already has keep their record.
//!
//! Either way the old file is then renamed `fenced.redb.migrated` (kept, not deleted).
//! Only a lone server migrates: a member of a cluster would bring state that is its own,
//! not the log's, so it refuses to start, with the way over in the message.

mod old_file;

use std::path::PathBuf;

use fenced_core::{Command, LockTable, Output, Record, RequestId, StoreCommand, Token};

use crate::config::Config;
use crate::ServerError;
use old_file::OldFile;

const OLD_FILE: &str = "fenced.redb";

/// What an old `fenced.redb` held.
pub struct Old {
    path: PathBuf,
    /// The state a fresh log starts from (the first format).
    pub base: Option<LockTable>,
    /// Records to bring into an existing log (the second format).
    pub import: Vec<(String, Record)>,
    /// Whether the file held anything at all.
    pub has_content: bool,
}

/// Reads `fenced.redb` in the data directory, if there is one.
pub fn read(config: &Config) -> Result<Option<Old>, ServerError> {
    let path = config.data_dir.join(OLD_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let mut old = OldFile::read(&path).map_err(ServerError::Setup)?;
    let records = std::mem::take(&mut old.records);
    let has_content = old.has_table() || !records.is_empty();
    if config.data_dir.join("raft.redb").exists() {
        return Ok(Some(Old { path, base: None, import: records, has_content }));
    }
    if !has_content {
        return Ok(Some(Old { path, base: None, import: Vec::new(), has_content }));
    }
    let mut table = if old.has_table() { old.table(config.limits()) } else { LockTable::new(config.limits()) };
    let keys = records.len();
    if !records.is_empty() {
        let mut out = Output::default();
        table.apply_into(RequestId(0), Command::Store(StoreCommand::Import { records }), 0, &mut out);
        if let Some((_, Err(e))) = out.answers.pop() {
            return Err(ServerError::Setup(format!("cannot bring {} into the log: {e}", path.display())));
        }
    }
    tracing::warn!(
        highest_issued = table.highest_issued().map_or(0, Token::get),
        grace_ms = table.grace_left_ms(0),
        store_keys = keys,
        "migrating a single-node data directory to the replicated log"
    );
    Ok(Some(Old { path, base: Some(table), import: Vec::new(), has_content }))
}

impl Old {
    /// The old file is in the log now: keep it aside, out of the next start's way.
    pub fn retire(self) -> Result<(), ServerError> {
        let to = self.path.with_extension("redb.migrated");
        std::fs::rename(&self.path, &to)
            .map_err(|e| ServerError::Setup(format!("cannot rename {} to {}: {e}", self.path.display(), to.display())))
    }
}
