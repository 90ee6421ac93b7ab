//! The kept snapshot, in a file of its own (`snapshot`) beside the log.
//!
//! Until data directory format 4 the snapshot was a value in `raft.redb`. Keeping a
//! snapshot of hundreds of MiB held redb's one write transaction for seconds, and every
//! append and purge of the log waited behind it: openraft's core awaits a purge before
//! it answers votes and heartbeats, so a leader that snapshotted 640 MiB was deposed
//! (BENCHMARKS.md, *Catch-up*). redb also kept the pages of each replaced snapshot until
//! a later commit freed them, and the file grew to about five times the store.
//!
//! A snapshot is now written to `snapshot.tmp`, flushed with `fdatasync`, renamed over
//! `snapshot` and the directory flushed: a crash leaves the old file or the new one,
//! never a mix, and the log's writer never waits for it. The file's layout:
//!
//! ```text
//! magic     8 bytes  "fenced-k"
//! version   u8       1
//! meta_len  u32 LE   then the snapshot's meta (openraft's `SnapshotMeta`, JSON)
//! data_len  u64 LE   then the snapshot's bytes (`snapshot_format`)
//! crc       u32 LE   CRC-32C of every byte before it
//! ```
//!
//! A file that is cut short, of another version, or whose checksum does not match is
//! refused with an error naming the file; it is never read as no snapshot, which would
//! start the state machine from nothing under a purged log.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{LogId, SnapshotMeta};

const MAGIC: &[u8; 8] = b"fenced-k";
const VERSION: u8 = 1;
const NAME: &str = "snapshot";
const TMP: &str = "snapshot.tmp";
/// Where a snapshot sent by the leader is received before it is installed, in this
/// file's layout ([`incoming_head`], [`seal_incoming`]): once whole it is renamed over
/// the kept snapshot ([`SnapshotFile::adopt`]), not written a second time.
pub const INCOMING: &str = "snapshot.incoming";
/// The name of the bytes [`INCOMING`] holds (the leader's snapshot id), so that a
/// transfer cut by this member's restart resumes too.
pub const INCOMING_ID: &str = "snapshot.incoming.id";
/// Magic, version and the meta's length.
const HEAD: usize = 8 + 1 + 4;
/// A snapshot is flushed to the disk every this many bytes as it is written. One
/// `fdatasync` of hundreds of MiB held the disk for seconds, and the log's own fsyncs
/// (ext4 orders a journal commit after the data it covers) waited behind it: a follower
/// writing its snapshot stopped answering appends and called an election.
const FLUSH_EVERY: usize = 8 << 20;
/// The largest meta read (a membership of many members is a few KiB).
const META_MAX: u32 = 1 << 20;

/// The snapshot file of one data directory. Writes are serialized, so the check that
/// an older snapshot never replaces a newer one and the write are one step.
pub struct SnapshotFile {
    dir: PathBuf,
    write: Mutex<()>,
}

/// A kept snapshot: its meta's JSON and its bytes.
pub type Kept = (Vec<u8>, Vec<u8>);

impl SnapshotFile {
    /// The snapshot file of `dir`. A `snapshot.tmp` left by a crash is removed: it was
    /// never the kept snapshot. A `snapshot.incoming` stays (the receiver resumes it or
    /// starts it again; it is never read as the kept snapshot).
    pub fn open(dir: &Path) -> io::Result<SnapshotFile> {
        for leftover in [TMP] {
            match std::fs::remove_file(dir.join(leftover)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(SnapshotFile { dir: dir.to_path_buf(), write: Mutex::new(()) })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(NAME)
    }

    /// Whether a snapshot is kept (without reading it).
    pub fn exists(&self) -> bool {
        self.path().exists()
    }

    /// The kept snapshot, checked whole, or `None` when there is none.
    pub fn read(&self) -> io::Result<Option<Kept>> {
        let bytes = match std::fs::read(self.path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        parse(&self.path(), bytes).map(Some)
    }

    /// The kept snapshot's meta, read from the file's head alone (not checked against
    /// the checksum: [`SnapshotFile::read`] checks the whole before the bytes are used).
    pub fn meta(&self) -> io::Result<Option<SnapshotMeta>> {
        read_meta(&self.path())
    }

    /// Keeps a received snapshot (a file [`seal_incoming`] made whole, of `meta`) by
    /// renaming it over the kept one, unless that covers more of the log (then it is
    /// removed). Returns whether it was kept.
    pub fn adopt(&self, meta: &SnapshotMeta, path: &Path) -> io::Result<bool> {
        let _one_writer = self.write.lock().unwrap_or_else(|p| p.into_inner());
        if self.meta()?.is_some_and(|kept| kept.last_log_id > meta.last_log_id) {
            let _ = std::fs::remove_file(path);
            return Ok(false);
        }
        let held = read_meta(path)?.map(|m| m.last_log_id);
        if held != Some(meta.last_log_id) {
            return Err(io::Error::other(format!(
                "{} holds the snapshot up to {held:?}, not the one installed (up to {:?})",
                path.display(),
                meta.last_log_id
            )));
        }
        std::fs::rename(path, self.path())?;
        File::open(&self.dir)?.sync_all()?;
        Ok(true)
    }
}

/// The meta at the head of the snapshot file at `path` (`None`: no file).
fn read_meta(path: &Path) -> io::Result<Option<SnapshotMeta>> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut head = [0u8; HEAD];
    file.read_exact(&mut head).map_err(|_| refused(path, "it is cut short"))?;
    let mut meta = vec![0u8; check_head(path, &head)?];
    file.read_exact(&mut meta).map_err(|_| refused(path, "it is cut short"))?;
    let meta = serde_json::from_slice(&meta).map_err(|e| refused(path, &format!("its meta does not read: {e}")))?;
    Ok(Some(meta))
}

/// The head a received snapshot's file starts with, before its bytes: this file's
/// layout, the bytes' length 0 until [`seal_incoming`] writes it.
pub fn incoming_head(meta: &SnapshotMeta) -> io::Result<Vec<u8>> {
    let meta_json = serde_json::to_vec(meta).map_err(crate::io_err)?;
    Ok(head_bytes(&meta_json, 0))
}

fn head_bytes(meta_json: &[u8], data_len: u64) -> Vec<u8> {
    let mut head = Vec::with_capacity(HEAD + meta_json.len() + 8);
    head.extend_from_slice(MAGIC);
    head.push(VERSION);
    head.extend_from_slice(&(meta_json.len() as u32).to_le_bytes());
    head.extend_from_slice(meta_json);
    head.extend_from_slice(&data_len.to_le_bytes());
    head
}

/// How many of the snapshot's bytes a file being received holds after its head
/// (`None`: no file, or no head that reads).
pub fn incoming_held(path: &Path) -> Option<u64> {
    let mut file = File::open(path).ok()?;
    let mut head = [0u8; HEAD];
    file.read_exact(&mut head).ok()?;
    let meta_len = check_head(path, &head).ok()?;
    file.metadata().ok()?.len().checked_sub((HEAD + meta_len + 8) as u64)
}

/// Makes a received file whole in this layout: the bytes' length and the checksum
/// written after them, flushed. Returns the bytes, read back to be decoded.
pub fn seal_incoming(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let mut head = [0u8; HEAD];
    file.read_exact(&mut head).map_err(|_| refused(path, "it is cut short"))?;
    let meta_len = check_head(path, &head)?;
    let mut prefix = vec![0u8; HEAD + meta_len + 8];
    file.read_exact(&mut prefix[HEAD..]).map_err(|_| refused(path, "it is cut short"))?;
    prefix[..HEAD].copy_from_slice(&head);
    let mut data = Vec::new();
    file.read_to_end(&mut data)?;
    let data_len = (data.len() as u64).to_le_bytes();
    prefix[HEAD + meta_len..].copy_from_slice(&data_len);
    file.write_all_at(&data_len, (HEAD + meta_len) as u64)?;
    file.write_all_at(&crc32c(&[&prefix, &data]).to_le_bytes(), (prefix.len() + data.len()) as u64)?;
    file.sync_data()?;
    Ok(data)
}

impl SnapshotFile {
    /// The kept snapshot's bytes, opened to be sent, if it still covers the log up to
    /// `offered` (it may have been replaced since its meta was offered). The file's own
    /// checksum is not checked here (that would read it all): the bytes are in the
    /// snapshot format, whose checksum the receiver checks. The file's checksum, read
    /// from its end, names these bytes ([`Outgoing::crc`]): a cut transfer resumes only
    /// into the bytes of the same file.
    pub fn open_data(&self, offered: Option<LogId>) -> io::Result<Outgoing> {
        let path = self.path();
        let mut file = File::open(&path)?;
        let mut head = [0u8; HEAD];
        file.read_exact(&mut head).map_err(|_| refused(&path, "it is cut short"))?;
        let meta_len = check_head(&path, &head)?;
        let mut meta = vec![0u8; meta_len + 8];
        file.read_exact(&mut meta).map_err(|_| refused(&path, "it is cut short"))?;
        let data_len = u64::from_le_bytes(meta[meta_len..].try_into().expect("eight bytes"));
        let meta: SnapshotMeta = serde_json::from_slice(&meta[..meta_len])
            .map_err(|e| refused(&path, &format!("its meta does not read: {e}")))?;
        if meta.last_log_id != offered {
            return Err(io::Error::other("the kept snapshot was replaced since it was offered"));
        }
        let start = (HEAD + meta_len + 8) as u64;
        if file.metadata()?.len() != start + data_len + 4 {
            return Err(refused(&path, "its length does not match what it says"));
        }
        let mut crc = [0u8; 4];
        file.seek(io::SeekFrom::Start(start + data_len))?;
        file.read_exact(&mut crc)?;
        Ok(Outgoing { file, start, len: data_len, crc: u32::from_le_bytes(crc) })
    }

    /// Keeps a snapshot durably, unless the one kept already covers more of the log (a
    /// snapshot built here can finish after a newer one was installed from the leader,
    /// which purged the log up to it). Returns whether it was kept.
    pub fn write(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<bool> {
        let meta_json = serde_json::to_vec(meta).map_err(crate::io_err)?;
        let _one_writer = self.write.lock().unwrap_or_else(|p| p.into_inner());
        if self.meta()?.is_some_and(|kept| kept.last_log_id > meta.last_log_id) {
            return Ok(false);
        }
        let tmp = self.dir.join(TMP);
        let mut file = File::create(&tmp)?;
        let head = head_bytes(&meta_json, data.len() as u64);
        file.write_all(&head)?;
        for chunk in data.chunks(FLUSH_EVERY) {
            file.write_all(chunk)?;
            file.sync_data()?;
        }
        file.write_all(&crc32c(&[&head, data]).to_le_bytes())?;
        file.sync_data()?;
        drop(file);
        std::fs::rename(&tmp, self.path())?;
        File::open(&self.dir)?.sync_all()?;
        Ok(true)
    }
}

/// A kept snapshot's bytes, opened to be sent from any offset.
pub struct Outgoing {
    file: File,
    /// Where the bytes begin in the file.
    start: u64,
    /// How many bytes.
    pub len: u64,
    /// The file's checksum (of its meta and bytes), which tells this file's bytes from
    /// another's.
    pub crc: u32,
}

impl Outgoing {
    /// The bytes from `offset` (at most [`Outgoing::len`]) to their end.
    pub fn from(mut self, offset: u64) -> io::Result<Box<dyn Read + Send + Sync>> {
        let offset = offset.min(self.len);
        self.file.seek(io::SeekFrom::Start(self.start + offset))?;
        Ok(Box::new(self.file.take(self.len - offset)))
    }
}

/// The size of the snapshot kept in `dir`, in bytes (0: none).
pub fn bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(NAME)).map_or(0, |md| md.len())
}

/// Reads the snapshot file at `path` (a post-mortem reads a copy), checked whole.
pub fn read_path(path: &Path) -> io::Result<Kept> {
    parse(path, std::fs::read(path)?)
}

fn parse(path: &Path, mut bytes: Vec<u8>) -> io::Result<Kept> {
    let meta_len = check_head(path, &bytes)?;
    let body_end = bytes.len().checked_sub(4).filter(|end| *end >= HEAD + meta_len + 8);
    let Some(body_end) = body_end else { return Err(refused(path, "it is cut short")) };
    let sum = u32::from_le_bytes(bytes[body_end..].try_into().expect("four bytes"));
    if crc32c(&[&bytes[..body_end]]) != sum {
        return Err(refused(path, "its checksum does not match (damaged or edited on disk)"));
    }
    let data_at = HEAD + meta_len + 8;
    let data_len = u64::from_le_bytes(bytes[HEAD + meta_len..data_at].try_into().expect("eight bytes"));
    if data_len != (body_end - data_at) as u64 {
        return Err(refused(path, "its length does not match what it says"));
    }
    let meta = bytes[HEAD..HEAD + meta_len].to_vec();
    bytes.truncate(body_end);
    bytes.drain(..data_at);
    Ok((meta, bytes))
}

/// Checks the magic and version at the start of `bytes`; returns the meta's length.
fn check_head(path: &Path, bytes: &[u8]) -> io::Result<usize> {
    if bytes.len() < HEAD {
        return Err(refused(path, "it is cut short"));
    }
    if &bytes[..8] != MAGIC {
        return Err(refused(path, "it does not start with the snapshot file's magic"));
    }
    if bytes[8] != VERSION {
        let why =
            format!("it is of version {}, this release reads version {VERSION} (a later release wrote it)", bytes[8]);
        return Err(refused(path, &why));
    }
    let meta_len = u32::from_le_bytes(bytes[9..HEAD].try_into().expect("four bytes"));
    if meta_len > META_MAX {
        return Err(refused(path, "its meta is longer than any this release writes"));
    }
    Ok(meta_len as usize)
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}: the snapshot is refused: {why}", path.display()))
}

pub(crate) fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for part in parts {
        digest.update(part);
    }
    digest.finalize() as u32
}

#[cfg(test)]
mod tests;
