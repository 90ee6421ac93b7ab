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
//! after the first starts with a [`Kind::State`] record (vote, commit mark, purge mark
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

/// The bytes before a record's body.
const HEADER: usize = 4 + 4 + 8 + 8;
/// The size of a new log's first segment, and of the first after a restart.
pub const FIRST_SEGMENT: u64 = 1 << 20;
/// The largest segment made ahead of need (a write larger than that gets one of its size).
pub const MAX_SEGMENT: u64 = 64 << 20;
/// The file a segment is prepared in before it is needed.
const SPARE: &str = "spare.tmp";
/// Marks the last record of a write.
const END: u8 = 0x80;
/// Every record's last byte: never zero, so a record cut short (zeros where the rest of
/// it should be) is told from one edited (see [`torn_by_zeros`]).
const TRAILER: u8 = 0xa5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// The vote, the commit mark and the purge mark, at the start of a segment.
    State = 1,
    /// A log entry: its index, then its record (`entry_format`).
    Entry = 2,
    Vote = 3,
    Commit = 4,
    /// Removes the entries from an index on.
    Truncate = 5,
    /// Removes the entries up to an index, and records the purge mark.
    Purge = 6,
}

impl Kind {
    fn of(byte: u8) -> Option<Kind> {
        Some(match byte & !END {
            1 => Kind::State,
            2 => Kind::Entry,
            3 => Kind::Vote,
            4 => Kind::Commit,
            5 => Kind::Truncate,
            6 => Kind::Purge,
            _ => return None,
        })
    }
}

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

/// The first record of the first segment that a purge reads as keeping.
fn purge_keeps_from(payload: &[u8]) -> Result<u64, String> {
    u64_at(payload, 8)
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
        let _ = std::fs::remove_file(dir.join(SPARE));
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
            file.set_len(needed + header)?;
        }
        sync_dir(&self.dir)?;
        self.size = size.max(needed + header);
        self.file = file;
        self.pos = 0;
        self.segments.push_back(Segment { path, first_seq: self.next_seq, max_index: None });
        self.spare = Spare::start(&self.dir, (size * 2).min(MAX_SEGMENT));
        Ok(())
    }

    /// How many segments from the front a purge up to `upto` deletes: those whose
    /// entries are all at or below it, never the open one.
    fn droppable(&self, upto: u64) -> usize {
        let open = self.segments.len() - 1;
        self.segments.iter().take(open).take_while(|s| s.max_index.is_none_or(|m| m <= upto)).count()
    }

    /// The first record kept by a purge up to `upto`.
    fn keeps_from(&self, upto: u64) -> u64 {
        self.segments[self.droppable(upto)].first_seq
    }

    /// Deletes the segments a purge up to `upto` no longer needs ([`Self::droppable`]):
    /// the state at the start of the next says what they knew.
    fn drop_segments(&mut self, upto: u64) -> io::Result<()> {
        let n = self.droppable(upto);
        let mut dropped = false;
        for _ in 0..n {
            let seg = self.segments.pop_front().expect("checked");
            std::fs::remove_file(&seg.path)?;
            dropped = true;
        }
        if dropped {
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

fn damaged(path: &Path, at: u64, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "the raft log is damaged: {} at byte {at}: {why}. Nothing was changed; restore this member from its peers \
             (remove its data directory and add it again) or from a backup (docs/operations.md)",
            path.display()
        ),
    )
}

fn starts_with_state(path: &Path) -> io::Result<bool> {
    let mut head = [0u8; HEADER + 1];
    File::open(path)?.read_exact_at(&mut head, 0)?;
    Ok(Kind::of(head[HEADER]) == Some(Kind::State))
}

/// One record read back.
struct Read<'a> {
    seq: u64,
    group: u64,
    kind: Kind,
    end: bool,
    payload: &'a [u8],
    len: usize,
}

/// The record at `at` in `bytes`, if one that checks is there.
fn record_at(bytes: &[u8], at: usize) -> Option<Read<'_>> {
    let head = bytes.get(at..at + HEADER + 1)?;
    let len = u32::from_le_bytes(head[0..4].try_into().ok()?) as usize;
    let sum = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let body = bytes.get(at + HEADER..at + HEADER + len)?;
    if len < 2 || crc(&bytes[at + 8..at + HEADER + len]) != sum {
        return None;
    }
    Some(Read {
        seq: u64::from_le_bytes(head[8..16].try_into().ok()?),
        group: u64::from_le_bytes(head[16..24].try_into().ok()?),
        kind: Kind::of(body[0])?,
        end: body[0] & END != 0,
        payload: &body[1..len - 1],
        len: HEADER + len,
    })
}

/// Replays one segment into `rec`; returns it and where its records end.
fn read_segment(
    path: &Path,
    first: u64,
    next_seq: &mut u64,
    last: bool,
    rec: &mut Recovered,
) -> io::Result<(Segment, u64)> {
    let bytes = std::fs::read(path)?;
    if first != *next_seq {
        return Err(damaged(
            path,
            0,
            &format!("it starts at record {first}, the log expected {next_seq}: a segment is missing"),
        ));
    }
    let mut seg = Segment { path: path.to_path_buf(), first_seq: first, max_index: None };
    let (mut at, mut open_group) = (0usize, None::<u64>);
    while let Some(r) = record_at(&bytes, at).filter(|r| r.seq == *next_seq) {
        let change = decode(&r).map_err(|why| damaged(path, at as u64, &why))?;
        match change {
            Some(Change::Entry { index, .. }) => seg.max_index = seg.max_index.max(Some(index)),
            Some(Change::Purge { .. }) => {
                let from = purge_keeps_from(r.payload).map_err(|why| damaged(path, at as u64, &why))?;
                rec.state.kept_from = rec.state.kept_from.max(from);
            }
            None => {
                rec.state = decode_state(r.payload).map_err(|why| damaged(path, at as u64, &why))?;
                if let Some((upto, _)) = &rec.state.purged {
                    rec.entries = rec.entries.split_off(&(upto + 1));
                }
            }
            _ => {}
        }
        if let Some(change) = &change {
            rec.apply(change);
        }
        open_group = (!r.end).then_some(r.group);
        *next_seq += 1;
        at += r.len;
    }
    let stop = at;
    if bytes[stop..].iter().all(|b| *b == 0) {
        return Ok((seg, stop as u64));
    }
    // The write that stopped the replay: the one left open, else one starting there.
    let torn_group = open_group.unwrap_or(*next_seq);
    let later = (stop + 1..bytes.len())
        .find_map(|i| record_at(&bytes, i).filter(|r| r.seq >= *next_seq && r.group <= r.seq && r.group != torn_group));
    if !last || later.is_some() {
        return Err(damaged(path, stop as u64, "a record does not check, and records written after it do"));
    }
    if !torn_by_zeros(&bytes, stop) {
        return Err(damaged(
            path,
            stop as u64,
            "the last write's record does not check, and no sector of it is unwritten (zeros): an edit or a bit \
             flip, not a crash, so it may have been acknowledged",
        ));
    }
    // A torn tail: nothing of that write was acknowledged. The whole records before the
    // damage are kept (a prefix of a write is a log like any other: entries come before
    // the commit mark that names them); the rest is zeroed, so nothing of it is read later.
    tracing::warn!(segment = %path.display(), at = stop, "the raft log ends in a torn write (a crash before its fsync): cut there");
    zero_from(path, stop as u64, bytes.len() as u64)?;
    rec.torn = Some((path.to_path_buf(), stop as u64));
    Ok((seg, stop as u64))
}

/// The disk's sector: the unit a crash leaves written or not.
const SECTOR: usize = 512;

/// Whether the record that stops the replay at `stop` is torn the way a crash tears a
/// write into a zero-filled segment, leaving zeros (what the segment held before) where
/// the write did not land:
/// - its header's first bytes are zeros, or a sector of its header is;
/// - a 512-byte sector's share of it, 8 bytes or more, is all zeros (a sector unwritten);
/// - it ends in a zero where its trailer should be, and the segment is zeros after it
///   (cut short).
///
/// Garbage, or a changed byte with every sector written and the trailer in place, is
/// damage: the caller refuses it rather than cut an entry that may have been
/// acknowledged.
fn torn_by_zeros(bytes: &[u8], stop: usize) -> bool {
    let zero = |a: usize, b: usize| bytes[a..b].iter().all(|x| *x == 0);
    let len = bytes.get(stop..stop + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    let whole = len > 0 && stop + HEADER + len <= bytes.len();
    let (end, min_run) = if whole { (stop + HEADER + len, 8) } else { ((stop + HEADER).min(bytes.len()), 1) };
    let mut sector = stop / SECTOR * SECTOR;
    while sector < end {
        let (a, b) = (sector.max(stop), (sector + SECTOR).min(end));
        if b - a >= min_run && zero(a, b) {
            return true;
        }
        sector += SECTOR;
    }
    whole && bytes[end - 1] == 0 && zero(end, bytes.len())
}

fn zero_from(path: &Path, from: u64, to: u64) -> io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let zeros = vec![0u8; (to - from).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_data()
}

fn kind_of(change: &Change) -> Kind {
    match change {
        Change::Entry { .. } => Kind::Entry,
        Change::Vote(_) => Kind::Vote,
        Change::Commit(_) => Kind::Commit,
        Change::Truncate { .. } => Kind::Truncate,
        Change::Purge { .. } => Kind::Purge,
    }
}

fn payload_len(change: &Change) -> usize {
    match change {
        Change::Entry { bytes, .. } => 8 + bytes.len(),
        Change::Vote(b) | Change::Commit(b) => b.len(),
        Change::Truncate { .. } => 8,
        Change::Purge { mark, .. } => 16 + mark.len(),
    }
}

/// A change's payload; a purge's carries `keep_from` ([`State::kept_from`]).
fn put_payload(out: &mut Vec<u8>, change: &Change, keep_from: u64) {
    match change {
        Change::Entry { index, bytes } => {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(bytes);
        }
        Change::Vote(b) | Change::Commit(b) => out.extend_from_slice(b),
        Change::Truncate { from } => out.extend_from_slice(&from.to_le_bytes()),
        Change::Purge { upto, mark } => {
            out.extend_from_slice(&upto.to_le_bytes());
            out.extend_from_slice(&keep_from.to_le_bytes());
            out.extend_from_slice(mark);
        }
    }
}

fn state_len(state: &State) -> usize {
    let field = |b: &Option<Vec<u8>>| 1 + 4 + b.as_ref().map_or(0, Vec::len);
    field(&state.vote) + field(&state.committed) + 8 + field(&state.purged.as_ref().map(|(_, m)| m.clone())) + 8
}

fn put_state(out: &mut Vec<u8>, state: &State) {
    let put = |out: &mut Vec<u8>, b: Option<&Vec<u8>>| {
        out.push(b.is_some() as u8);
        let b = b.map_or(&[][..], Vec::as_slice);
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    put(out, state.vote.as_ref());
    put(out, state.committed.as_ref());
    out.extend_from_slice(&state.purged.as_ref().map_or(0, |(upto, _)| *upto).to_le_bytes());
    put(out, state.purged.as_ref().map(|(_, mark)| mark));
    out.extend_from_slice(&state.kept_from.to_le_bytes());
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, String> {
    bytes
        .get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| "a record is cut short".into())
}

/// The change a record holds (`None` for the state at a segment's start).
fn decode<'a>(r: &Read<'a>) -> Result<Option<Change<'a>>, String> {
    let p = r.payload;
    Ok(Some(match r.kind {
        Kind::State => return Ok(None),
        Kind::Entry => Change::Entry { index: u64_at(p, 0)?, bytes: &p[8..] },
        Kind::Vote => Change::Vote(p),
        Kind::Commit => Change::Commit(p),
        Kind::Truncate => Change::Truncate { from: u64_at(p, 0)? },
        Kind::Purge => Change::Purge { upto: u64_at(p, 0)?, mark: p.get(16..).ok_or("a purge record is cut short")? },
    }))
}

fn decode_state(p: &[u8]) -> Result<State, String> {
    let mut at = 0;
    let field = |at: &mut usize| -> Result<Option<Vec<u8>>, String> {
        let present = *p.get(*at).ok_or("the state record is cut short")? == 1;
        let len = p.get(*at + 1..*at + 5).ok_or("the state record is cut short")?;
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let bytes = p.get(*at + 5..*at + 5 + len).ok_or("the state record is cut short")?;
        *at += 5 + len;
        Ok(present.then(|| bytes.to_vec()))
    };
    let vote = field(&mut at)?;
    let committed = field(&mut at)?;
    let upto = u64_at(p, at)?;
    at += 8;
    let purged = field(&mut at)?.map(|mark| (upto, mark));
    let kept_from = u64_at(p, at)?;
    Ok(State { vote, committed, purged, kept_from })
}

#[cfg(test)]
mod tests;
