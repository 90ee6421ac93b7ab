//! Backups: the replicated state at one applied index, in a file that says what it holds
//! and proves it is whole (`fenced snapshot save|status|restore`).
//!
//! ```text
//! fenced snapshot 2\n                 the magic line and the file format
//! {"format":2,...}\n                  the header: one JSON object (`Header`)
//! <header.table_bytes bytes>          the lock table, as in a raft snapshot
//! \nsha256 <64 hex digits>\n          SHA-256 of every byte before this line
//! ```
//!
//! The checksum covers the header and the table, so a file cut short, padded, or with
//! one byte changed is refused before anything reads it; the table must then decode and
//! agree with the header's counts. Membership is not in the file: a restored cluster is
//! a new cluster, whose members are those its servers are started with (`--peers`), as
//! etcd's restore takes `--initial-cluster`.
//!
//! A restore writes the table as the *base* of an empty log (the state a log with no
//! snapshot starts from, as a migrated single-node directory does): every member of the
//! new cluster restores the same file, so all start from the same state, and the first
//! leader snapshots it so that members added later receive it. Its first batch carries
//! `Promote`, as after every election: held locks keep their holders, each lease with a
//! full TTL counted from then.

use std::io;
use std::path::Path;

use fenced_core::{Limits, LockTable, Token};

use crate::log_store::Db;
use crate::state_machine::{decode_table, encode_table, StateMachine};
use crate::LogId;

/// The file format this release writes and reads: 2, whose table is a snapshot of
/// `snapshot_format`'s binary format.
pub const FILE_FORMAT: u32 = 2;

/// The earliest file format this release reads: 1, whose table is the JSON snapshot of
/// the releases before the binary format (it decodes either).
pub const FILE_FORMAT_MIN: u32 = 1;
const MAGIC: &[u8] = b"fenced snapshot ";
const TRAILER: &[u8] = b"\nsha256 ";
/// `\nsha256 ` + 64 hex digits + `\n`.
const TRAILER_LEN: usize = TRAILER.len() + 64 + 1;

/// What a snapshot file says about itself (`fenced snapshot status`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// The file format ([`FILE_FORMAT`]).
    pub format: u32,
    /// The release that wrote it.
    pub release: String,
    /// The member that served it, and when (its wall clock, Unix milliseconds).
    pub saved_by_node: u64,
    pub saved_at_unix_ms: u64,
    /// The last log entry the state reflects.
    pub last_index: u64,
    pub last_term: u64,
    /// Every token the service may have issued is at most this (0: none yet).
    pub highest_token: u64,
    pub leases: u64,
    pub locks: u64,
    pub waiters: u64,
    pub store_keys: u64,
    pub store_bytes: u64,
    /// The length of the table that follows the header.
    pub table_bytes: u64,
}

/// A snapshot file read back and verified.
#[derive(Debug)]
pub struct Backup {
    pub header: Header,
    /// The hex SHA-256 the file ends with (the same for every copy of one save).
    pub checksum: String,
    pub table: LockTable,
}

/// Why a file is not a snapshot this release can use.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadSnapshot(pub String);

fn bad(msg: impl Into<String>) -> BadSnapshot {
    BadSnapshot(msg.into())
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn header_of(table: &LockTable, last: Option<LogId>, node: u64, table_bytes: usize) -> Header {
    let (store_keys, store_bytes) = table.store().usage();
    Header {
        format: FILE_FORMAT,
        release: env!("CARGO_PKG_VERSION").to_string(),
        saved_by_node: node,
        saved_at_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        last_index: last.map_or(0, |l| l.index),
        last_term: last.map_or(0, |l| l.leader_id.term),
        highest_token: table.highest_issued().map_or(0, Token::get),
        leases: table.lease_count() as u64,
        locks: table.lock_count() as u64,
        waiters: table.waiter_count() as u64,
        store_keys,
        store_bytes,
        table_bytes: table_bytes as u64,
    }
}

/// The whole file for the state `sm` holds now, taken under its lock: one applied
/// index, one table. The caller makes it current first (a linearizable read).
pub fn save(sm: &StateMachine, node: u64) -> io::Result<Vec<u8>> {
    let st = sm.copy();
    encode_file(&st.table, st.last_applied, node)
}

fn encode_file(table: &LockTable, last: Option<LogId>, node: u64) -> io::Result<Vec<u8>> {
    let bytes = encode_table(table);
    Ok(assemble(FILE_FORMAT, &header_of(table, last, node, bytes.len()), &bytes))
}

/// The file of `format` around a header and a table's bytes.
fn assemble(format: u32, header: &Header, table: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(table.len() + 1024);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(format!("{format}\n").as_bytes());
    serde_json::to_writer(&mut out, header).expect("a header serializes");
    out.push(b'\n');
    out.extend_from_slice(table);
    let sum = sha256_hex(&out);
    out.extend_from_slice(TRAILER);
    out.extend_from_slice(sum.as_bytes());
    out.push(b'\n');
    out
}

/// Reads a snapshot file's bytes: refused unless whole, of a format this release reads,
/// and a table that decodes and agrees with its header.
pub fn parse(bytes: &[u8]) -> Result<Backup, BadSnapshot> {
    let rest = bytes.strip_prefix(MAGIC).ok_or_else(|| {
        bad("not a Fenced snapshot (it does not start with 'fenced snapshot'): give the file `fenced snapshot save` wrote")
    })?;
    let line_end =
        rest.iter().position(|b| *b == b'\n').ok_or_else(|| bad("the snapshot ends inside its first line"))?;
    let format: u32 = std::str::from_utf8(&rest[..line_end])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("the snapshot's first line does not name a format"))?;
    if !(FILE_FORMAT_MIN..=FILE_FORMAT).contains(&format) {
        return Err(bad(format!(
            "the snapshot is in file format {format}; this release ({}) reads formats {FILE_FORMAT_MIN} to \
             {FILE_FORMAT}{}",
            env!("CARGO_PKG_VERSION"),
            if format > FILE_FORMAT { ": use the release that saved it, or a later one" } else { "" }
        )));
    }
    if bytes.len() < MAGIC.len() + line_end + 1 + TRAILER_LEN {
        return Err(bad(format!("the snapshot is cut short ({} bytes): no checksum at its end", bytes.len())));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let sum = trailer
        .strip_prefix(TRAILER)
        .and_then(|t| t.strip_suffix(b"\n"))
        .and_then(|t| std::str::from_utf8(t).ok())
        .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| bad("the snapshot does not end with its checksum: it is cut short or was changed"))?;
    let actual = sha256_hex(body);
    if actual != sum.to_ascii_lowercase() {
        return Err(bad(format!(
            "the snapshot's checksum does not match (the file says {sum}, its bytes give {actual}): the file is damaged"
        )));
    }
    let after_magic = &body[MAGIC.len() + line_end + 1..];
    let header_end =
        after_magic.iter().position(|b| *b == b'\n').ok_or_else(|| bad("the snapshot's header has no end"))?;
    let header: Header = serde_json::from_slice(&after_magic[..header_end])
        .map_err(|e| bad(format!("the snapshot's header does not read: {e}")))?;
    let table_bytes = &after_magic[header_end + 1..];
    if table_bytes.len() as u64 != header.table_bytes {
        return Err(bad(format!(
            "the snapshot's table is {} bytes, its header says {}",
            table_bytes.len(),
            header.table_bytes
        )));
    }
    let table = decode_table(table_bytes, &Limits::default())
        .map_err(|e| bad(format!("the snapshot's lock table does not decode: {e}")))?;
    let again = header_of(&table, None, header.saved_by_node, table_bytes.len());
    let counts = |h: &Header| (h.highest_token, h.leases, h.locks, h.waiters, h.store_keys, h.store_bytes);
    if counts(&again) != counts(&header) {
        return Err(bad(format!(
            "the snapshot's table does not agree with its header (token, leases, locks, waiters, keys, bytes: \
             {:?} in the table, {:?} in the header)",
            counts(&again),
            counts(&header)
        )));
    }
    Ok(Backup { header, checksum: actual, table })
}

/// Makes `dir` (empty or absent) the data of a member that starts from `backup`: a log
/// with no entry whose base state is the saved table, its tokens raised to at least
/// `tokens_above` (for tokens an old cluster may have issued after the save).
pub fn restore(dir: &Path, backup: Backup, tokens_above: Option<Token>) -> io::Result<()> {
    let db = Db::open(dir)?;
    if !db.is_empty()? {
        return Err(io::Error::other(format!("{} holds a log already: restore into a new directory", dir.display())));
    }
    // The base state is the file's table as it is, alike on every member restored from
    // it; the floor goes through the log (the first leader's first entry), so that
    // members given different floors cannot hold different states.
    StateMachine::write_base(&db, &backup.table)?;
    if let Some(floor) = tokens_above {
        let path = dir.join(TOKENS_ABOVE_FILE);
        let mut f = std::fs::File::create(&path)?;
        std::io::Write::write_all(&mut f, format!("{}\n", floor.get()).as_bytes())?;
        f.sync_all()?;
    }
    Ok(())
}

/// In a restored directory given `--tokens-above N`: N, until the raise is applied. A
/// member that takes office with it proposes `Command::RaiseTokens` in its first batch.
pub const TOKENS_ABOVE_FILE: &str = "TOKENS_ABOVE";

/// The floor a restored directory still waits for, if any.
pub fn pending_tokens_above(dir: &Path) -> io::Result<Option<Token>> {
    match std::fs::read_to_string(dir.join(TOKENS_ABOVE_FILE)) {
        Ok(text) => text.trim().parse::<u64>().ok().and_then(Token::new).map(Some).ok_or_else(|| {
            io::Error::other(format!("{}: not a token: {:?}", dir.join(TOKENS_ABOVE_FILE).display(), text.trim()))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_core::{Acquire, Command, LeaseId, LeaseRef, LockName, RequestId};

    fn table_with_a_holder() -> LockTable {
        let mut t = LockTable::new(Limits::default());
        let lease = LeaseRef::Implicit { id: LeaseId(7), ttl_ms: 10_000 };
        let name = LockName::new("orders/42").unwrap();
        let acquire = Acquire { name, lease, wait_ms: 0, lock_delay_ms: 0, holder: None };
        let out = t.apply(RequestId(1), Command::Acquire(acquire), 1_000);
        assert_eq!(out.answers.len(), 1);
        t
    }

    fn file(t: &LockTable) -> Vec<u8> {
        encode_file(t, None, 3).unwrap()
    }

    /// A file of format 1 (its table the JSON snapshot of the releases before the
    /// binary one) still reads, to the same table.
    #[test]
    fn a_file_of_format_1_still_reads() {
        let t = table_with_a_holder();
        let json = crate::snapshot_format::to_legacy_json(&t);
        let header = Header { format: 1, ..header_of(&t, None, 3, json.len()) };
        let b = parse(&assemble(1, &header, &json)).unwrap();
        assert_eq!(b.header.format, 1);
        assert_eq!(b.table.image(), t.image());
    }

    #[test]
    fn a_saved_file_reads_back_with_its_counts() {
        let t = table_with_a_holder();
        let bytes = file(&t);
        let b = parse(&bytes).unwrap();
        assert_eq!((b.header.locks, b.header.leases, b.header.highest_token), (1, 1, 1));
        assert_eq!(b.header.saved_by_node, 3);
        assert_eq!(b.table.highest_issued(), t.highest_issued());
        assert_eq!(b.checksum.len(), 64);
    }

    #[test]
    fn a_damaged_truncated_or_foreign_file_is_refused() {
        let bytes = file(&table_with_a_holder());
        let cut = &bytes[..bytes.len() - 10];
        assert!(parse(cut).unwrap_err().0.contains("checksum"), "{}", parse(cut).unwrap_err());
        let half = &bytes[..bytes.len() / 2];
        assert!(parse(half).is_err());
        for at in [20, bytes.len() / 2, bytes.len() - TRAILER_LEN - 1] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x01;
            let e = parse(&flipped).unwrap_err().0;
            assert!(e.contains("checksum") || e.contains("format"), "byte {at}: {e}");
        }
        assert!(parse(b"{\"table\":{}}").unwrap_err().0.contains("not a Fenced snapshot"));
        let newer = [b"fenced snapshot 3\n".as_slice(), &bytes[18..]].concat();
        assert!(parse(&newer).unwrap_err().0.contains("file format 3"));
    }

    #[test]
    fn a_header_that_lies_about_the_table_is_refused_even_with_a_good_checksum() {
        let bytes = file(&table_with_a_holder());
        let body = &bytes[..bytes.len() - TRAILER_LEN];
        let at = body.windows(9).position(|w| w == b"\"locks\":1").expect("the header counts the locks");
        let mut out = body.to_vec();
        out[at + 8] = b'2';
        let sum = sha256_hex(&out);
        out.extend_from_slice(TRAILER);
        out.extend_from_slice(sum.as_bytes());
        out.push(b'\n');
        assert!(parse(&out).unwrap_err().0.contains("does not agree"));
    }

    #[test]
    fn a_restore_refuses_a_directory_with_a_log_and_keeps_the_floor_aside_for_the_log() {
        let t = table_with_a_holder();
        let dir = std::env::temp_dir().join(format!("fenced-raft-restore-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        restore(&dir, parse(&file(&t)).unwrap(), Token::new(500)).unwrap();
        let db = Db::open(&dir).unwrap();
        // The base state is the file's, alike on every member; the floor waits for the
        // first leader to propose it.
        let base = decode_table(&db.base().unwrap().unwrap(), &Limits::default()).unwrap();
        assert_eq!(base.highest_issued(), t.highest_issued());
        assert_eq!(base.lock_count(), 1);
        assert_eq!(pending_tokens_above(&dir).unwrap(), Token::new(500));
        drop(db);
        let again = restore(&dir, parse(&file(&t)).unwrap(), None).unwrap_err().to_string();
        assert!(again.contains("holds a log already"), "{again}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
