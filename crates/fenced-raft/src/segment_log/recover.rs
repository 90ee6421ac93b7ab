//! Reading a segment back at open: replay to the first record that does not check, then
//! decide whether that is the clean end, a torn tail to cut, or damage to refuse (the
//! rules: [`super`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::record::{decode, decode_state, purge_keeps_from, record_at, Kind, HEADER};
use super::{Change, Recovered, Segment};

pub(super) fn damaged(path: &Path, at: u64, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "the raft log is damaged: {} at byte {at}: {why}. The log was left as it is; restore this member from its peers \
             (remove its data directory and add it again) or from a backup (docs/operations.md)",
            path.display()
        ),
    )
}

pub(super) fn starts_with_state(path: &Path) -> io::Result<bool> {
    let mut head = [0u8; HEADER + 1];
    File::open(path)?.read_exact_at(&mut head, 0)?;
    Ok(Kind::of(head[HEADER]) == Some(Kind::State))
}

/// Replays one segment into `rec`; returns it and where its records end.
pub(super) fn read_segment(
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
    // A record of another write after the stop is damage in the middle. The torn write
    // is the one left open, or the one that starts at the stop's sequence.
    let expected = *next_seq;
    let later = || {
        (stop + 1..bytes.len()).find_map(|i| {
            plausible_at(&bytes, i, expected)
                .then(|| record_at(&bytes, i))
                .flatten()
                .filter(|r| r.group <= r.seq && r.group != torn_group && r.group != expected)
        })
    };
    if !last || later().is_some() {
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
pub(super) const SECTOR: usize = 512;

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
pub(super) fn torn_by_zeros(bytes: &[u8], stop: usize) -> bool {
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
    // Cut short: zeros where the trailer should be, and the rest of that sector's share
    // of the record, or the segment after it, zeros too.
    let last_sector = ((end - 1) / SECTOR * SECTOR).max(stop);
    whole && bytes[end - 1] == 0 && (zero(last_sector, end) || zero(end, bytes.len()))
}

/// Whether the header at `at` could be a record at or after `next_seq` (checked before
/// its checksum, so the scan after a damaged record costs little per byte).
fn plausible_at(bytes: &[u8], at: usize, next_seq: u64) -> bool {
    let Some(head) = bytes.get(at..at + HEADER) else { return false };
    let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as usize;
    let seq = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
    len >= 2 && at + HEADER + len <= bytes.len() && seq >= next_seq && seq - next_seq < 1 << 32
}

pub(super) fn zero_from(path: &Path, from: u64, to: u64) -> io::Result<()> {
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
