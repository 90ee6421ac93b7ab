//! The raft log's own file format: segments written front to back, one contiguous
//! write and one `fdatasync` per group of changes (data directory format 5, in the
//! directory `log/`). Until format 4 the log was a table in `raft.redb`, whose
//! copy-on-write B-tree wrote about ten scattered pages per commit and grew to two or
//! three times the store (BENCHMARKS.md, *The log in segments of its own*).
//!
//! A segment is a file named by the sequence number of its first record
//! (`00000000000000000001.seg`), created ahead of need by a background thread at its
//! full size and filled with zeros, so that an append never grows a file (an
//! `fdatasync` then writes the data alone, not the file's size and new blocks). Sizes
//! start at [`FIRST_SEGMENT`] and double up to [`MAX_SEGMENT`]: an idle member's log
//! costs 2 MiB, a busy one rolls every few seconds at most.
//!
//! A record:
//!
//! ```text
//! len    u32 LE  the body's length
//! crc    u32 LE  CRC-32C of seq, group and body
//! seq    u64 LE  one more than the record before it, across segments
//! group  u64 LE  the seq of the first record of its write
//! body   len bytes: kind (u8, high bit set on the last record of a write), payload,
//!        and 0xa5 (never zero: a record cut short ends in zeros, a whole one does not)
//! ```
//!
//! Nothing is ever rewritten in place: a truncation of a conflicting suffix, a purge, a
//! vote and a commit mark are records too, replayed in order at open. Every segment
//! after the first starts with a state record (vote, commit mark, purge mark
//! as they stood), so a purge deletes whole segments from the front and what the log
//! knows survives in the ones kept.
//!
//! **Recovery** reads every segment and stops at the first record that does not check
//! (length, checksum, sequence). What follows decides what it was:
//! - zeros to the end of the last segment: the clean end;
//! - the rest of the same write (records of its group) or garbage: a **torn tail**, a
//!   write that a crash interrupted before its `fdatasync` returned, so nothing in it was
//!   acknowledged; it is cut (the bytes zeroed, so that they cannot be read later) and
//!   the log continues from the last whole record;
//! - a record of a later write, or any damage in a segment before the last: **damage in
//!   the middle** of what was durable. Open fails with an error naming the segment and
//!   the byte; the log is never silently shortened past an acknowledged entry.
//!
//! Writes are sequential (the next one starts after the last one's `fdatasync`
//! returned), which is what makes "a record of a later write after the damage" proof of
//! damage in the middle.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::codec::crc;
use record::{kind_of, payload_len, put_payload, put_state, state_len, Kind, END, HEADER, TRAILER};
use recover::{damaged, read_segment, starts_with_state};

mod record;
mod recover;

/// The size of a new log's first segment, and of the first after a restart.
pub const FIRST_SEGMENT: u64 = 1 << 20;
/// The largest segment made ahead of need (a write larger than that gets one of its size).
pub const MAX_SEGMENT: u64 = 64 << 20;
#[cfg(test)]
thread_local! {
    /// The fuzzer's negative control: a purge deletes one segment more than it may.
    static BROKEN_PURGE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
/// The file a segment is prepared in before it is needed.
const SPARE: &str = "spare.tmp";
/// What the log knows besides its entries: each as the bytes its owner encoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub vote: Option<Vec<u8>>,
    pub committed: Option<Vec<u8>>,
    /// The index purged up to, and the purge mark.
    pub purged: Option<(u64, Vec<u8>)>,
    /// The first record of the first segment a purge kept (segments before it were
    /// deleted): a log whose first segment starts later lost one.
    pub kept_from: u64,
}

/// One change to write.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<'a> {
    Entry { index: u64, bytes: &'a [u8] },
    Vote(&'a [u8]),
    Commit(&'a [u8]),
    Truncate { from: u64 },
    Purge { upto: u64, mark: &'a [u8] },
}

/// What a log held at open.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Each entry's record, by index.
    pub entries: BTreeMap<u64, Vec<u8>>,
    pub state: State,
    /// Where a torn tail was cut, if one was: the segment and the byte.
    pub torn: Option<(PathBuf, u64)>,
}

impl Recovered {
    /// What a change written after the open does to what was recovered.
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::Entry { index, bytes } => drop(self.entries.insert(*index, bytes.to_vec())),
            Change::Vote(v) => self.state.vote = Some(v.to_vec()),
            Change::Commit(c) => self.state.committed = Some(c.to_vec()),
            Change::Truncate { from } => drop(self.entries.split_off(from)),
            Change::Purge { upto, mark } => {
                self.entries = self.entries.split_off(&(upto + 1));
                self.state.purged = Some((*upto, mark.to_vec()));
            }
        }
    }
}

struct Segment {
    path: PathBuf,
    first_seq: u64,
    /// The highest entry index it holds.
    max_index: Option<u64>,
}

/// The log's writer: the open segment, and the ones before it.
pub struct SegmentLog {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    file: File,
    pos: u64,
    size: u64,
    next_seq: u64,
    state: State,
    spare: Spare,
    buf: Vec<u8>,
    /// Set when a write failed: what it left on disk is unknown, and nothing more is
    /// written (openraft stops, and the server with it).
    failed: bool,
}

impl SegmentLog {
    /// Opens the log in `dir` (created when absent), recovering what it holds.
    pub fn open(dir: &Path) -> io::Result<(SegmentLog, Recovered)> {
        std::fs::create_dir_all(dir)?;
        let names = segment_names(dir)?;
        let mut rec = Recovered::default();
        let mut segments = VecDeque::new();
        let mut next_seq = names.first().map_or(1, |(seq, _)| *seq);
        let mut tail = None;
        for (i, (first, path)) in names.iter().enumerate() {
            let last = i + 1 == names.len();
            let (seg, end) = read_segment(path, *first, &mut next_seq, last, &mut rec)?;
            segments.push_back(seg);
            if last {
                tail = Some(end);
            }
        }
        if let Some((first, path)) = names.first() {
            if *first > rec.state.kept_from.max(1) || (*first > 1 && !starts_with_state(path)?) {
                return Err(damaged(
                    path,
                    0,
                    "the log's first segment starts after what its purges deleted: a segment is missing",
                ));
            }
        }
        // Only once the segments checked: a log refused as damaged is left as it was.
        let _ = std::fs::remove_file(dir.join(SPARE));
        let (file, pos, size) = match (segments.back(), tail) {
            (Some(seg), Some(end)) => {
                let file = std::fs::OpenOptions::new().read(true).write(true).open(&seg.path)?;
                let size = file.metadata()?.len();
                (file, end, size)
            }
            _ => {
                let path = dir.join(segment_name(1));
                prepare(&dir.join(SPARE), FIRST_SEGMENT)?;
                std::fs::rename(dir.join(SPARE), &path)?;
                sync_dir(dir)?;
                segments.push_back(Segment { path: path.clone(), first_seq: 1, max_index: None });
                (std::fs::OpenOptions::new().read(true).write(true).open(&path)?, 0, FIRST_SEGMENT)
            }
        };
        let spare = Spare::start(dir, FIRST_SEGMENT.max(size));
        let log = SegmentLog {
            dir: dir.to_path_buf(),
            segments,
            file,
            pos,
            size,
            next_seq,
            state: rec.state.clone(),
            spare,
            buf: Vec::new(),
            failed: false,
        };
        Ok((log, rec))
    }

    /// Writes `changes` as one write and waits for its `fdatasync`: durable when this
    /// returns. A purge's whole segments are deleted after.
    pub fn write(&mut self, changes: &[Change]) -> io::Result<()> {
        if self.failed {
            return Err(io::Error::other("an earlier write of the raft log failed: nothing more is written"));
        }
        if changes.is_empty() {
            return Ok(());
        }
        let needed: u64 = changes.iter().map(|c| (HEADER + 2 + payload_len(c)) as u64).sum();
        let head = if self.pos == 0 && self.next_seq > 1 { (HEADER + 2 + state_len(&self.state)) as u64 } else { 0 };
        if self.pos + head + needed > self.size {
            if let Err(e) = self.roll(needed) {
                self.failed = true;
                return Err(e);
            }
        }
        let group = self.next_seq;
        if self.pos == 0 && self.next_seq > 1 {
            let state = self.state.clone();
            self.push(Kind::State, group, false, |out| put_state(out, &state));
        }
        let keep_from = changes.iter().rev().find_map(|c| {
            if let Change::Purge { upto, .. } = c {
                Some(self.keeps_from(*upto))
            } else {
                None
            }
        });
        for (i, change) in changes.iter().enumerate() {
            let end = i + 1 == changes.len();
            self.push(kind_of(change), group, end, |out| put_payload(out, change, keep_from.unwrap_or(0)));
        }
        let result = self.file.write_all_at(&self.buf, self.pos).and_then(|()| self.file.sync_data());
        let written = self.buf.len() as u64;
        self.buf.clear();
        if let Err(e) = result {
            self.failed = true;
            return Err(e);
        }
        self.pos += written;
        for change in changes {
            self.absorb(change);
        }
        if let Some(from) = keep_from {
            self.state.kept_from = self.state.kept_from.max(from);
        }
        if let Some(upto) =
            changes.iter().rev().find_map(|c| if let Change::Purge { upto, .. } = c { Some(*upto) } else { None })
        {
            self.drop_segments(upto)?;
        }
        Ok(())
    }

    fn push(&mut self, kind: Kind, group: u64, end: bool, body: impl FnOnce(&mut Vec<u8>)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 8]);
        self.buf.extend_from_slice(&self.next_seq.to_le_bytes());
        self.buf.extend_from_slice(&group.to_le_bytes());
        self.buf.push(kind as u8 | if end { END } else { 0 });
        body(&mut self.buf);
        self.buf.push(TRAILER);
        let len = (self.buf.len() - start - HEADER) as u32;
        let sum = crc(&self.buf[start + 8..]);
        self.buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[start + 4..start + 8].copy_from_slice(&sum.to_le_bytes());
        self.next_seq += 1;
    }

    /// What a written change does to the state and to the open segment's entries.
    fn absorb(&mut self, change: &Change) {
        match change {
            Change::Entry { index, .. } => {
                let seg = self.segments.back_mut().expect("an open segment");
                seg.max_index = seg.max_index.max(Some(*index));
            }
            Change::Vote(v) => self.state.vote = Some(v.to_vec()),
            Change::Commit(c) => self.state.committed = Some(c.to_vec()),
            Change::Truncate { .. } => {}
            Change::Purge { upto, mark } => self.state.purged = Some((*upto, mark.to_vec())),
        }
    }

    /// Moves to the next segment: the spare, renamed (larger when `needed` would not
    /// fit it), then the next spare is started.
    fn roll(&mut self, needed: u64) -> io::Result<()> {
        let header = (HEADER + 2 + state_len(&self.state)) as u64;
        let size = self.spare.take()?;
        let path = self.dir.join(segment_name(self.next_seq));
        std::fs::rename(self.dir.join(SPARE), &path)?;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path)?;
        if size < needed + header {
            // Grown past its zeros: the new size is made durable before any data.
            file.set_len(needed + header)?;
            file.sync_all()?;
        }
        sync_dir(&self.dir)?;
        self.size = size.max(needed + header);
        self.file = file;
        if self.pos == 0 {
            // The open segment held no record, so it bore the same name: the rename
            // replaced it, and it is no segment of the log any more.
            self.segments.pop_back();
        }
        self.pos = 0;
        self.segments.push_back(Segment { path, first_seq: self.next_seq, max_index: None });
        self.spare = Spare::start(&self.dir, (size * 2).min(MAX_SEGMENT));
        Ok(())
    }

    /// How many segments from the front a purge up to `upto` deletes: those whose
    /// entries are all at or below it, never the open one.
    fn droppable(&self, upto: u64) -> usize {
        let open = self.segments.len() - 1;
        let n = self.segments.iter().take(open).take_while(|s| s.max_index.is_none_or(|m| m <= upto)).count();
        #[cfg(test)]
        if BROKEN_PURGE.with(|b| b.get()) {
            return (n + 1).min(open);
        }
        n
    }

    /// The first record kept by a purge up to `upto`.
    fn keeps_from(&self, upto: u64) -> u64 {
        self.segments[self.droppable(upto)].first_seq
    }

    /// Deletes the segments a purge up to `upto` no longer needs ([`Self::droppable`]):
    /// the state at the start of the next says what they knew.
    fn drop_segments(&mut self, upto: u64) -> io::Result<()> {
        // Oldest first, each made durable before the next: a crash never leaves a gap.
        for _ in 0..self.droppable(upto) {
            let seg = self.segments.pop_front().expect("checked");
            std::fs::remove_file(&seg.path)?;
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The bytes of the log's segments on disk (written or prepared).
    pub fn disk_bytes(dir: &Path) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
        entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()
    }
}

/// A segment being prepared (zeros, flushed) on a thread of its own.
struct Spare {
    path: PathBuf,
    size: u64,
    job: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl Spare {
    fn start(dir: &Path, size: u64) -> Spare {
        let path = dir.join(SPARE);
        let at = path.clone();
        let job = std::thread::Builder::new().name("fenced-raft-spare".into()).spawn(move || prepare(&at, size));
        if let Err(e) = &job {
            tracing::warn!(error = %e, "cannot start the thread that prepares log segments; prepared when needed");
        }
        Spare { path, size, job: job.ok() }
    }

    /// Waits for the spare to be ready (it usually is) and returns its size.
    fn take(&mut self) -> io::Result<u64> {
        let started = std::time::Instant::now();
        match self.job.take() {
            Some(job) => job.join().map_err(|_| io::Error::other("the thread preparing a log segment panicked"))??,
            None => prepare(&self.path, self.size)?,
        }
        if started.elapsed() > std::time::Duration::from_millis(50) {
            tracing::warn!(
                waited_ms = started.elapsed().as_millis() as u64,
                "the raft log waited for its next segment"
            );
        }
        Ok(self.size)
    }
}

/// Writes a file of `size` zeros at `path`, flushed.
fn prepare(path: &Path, size: u64) -> io::Result<()> {
    let file = File::create(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn segment_name(seq: u64) -> String {
    format!("{seq:020}.seg")
}

/// The segments in `dir`, by their first sequence number.
fn segment_names(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Some(seq) = name.strip_suffix(".seg").and_then(|s| s.parse::<u64>().ok()) {
            names.push((seq, path));
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests;
