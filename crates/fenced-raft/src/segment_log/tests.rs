//! The segment log's recovery: round trips, purges across segments, and the torn-write
//! injector (a crash's cut or garbage at every kind of offset of the last write is cut
//! back to whole records; damage before it is an error, never skipped).

use super::record;
use super::recover::{zero_from, SECTOR};
use super::*;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fenced-seglog-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The workspace's seeded generator, so that a failing seed replays.
use fenced_core::xorshift::XorShift as Rng;

fn entry_bytes(index: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (index as usize * 31 + i) as u8).collect()
}

/// Appends entries `from..from + n` (each `len` bytes) and a commit mark, as one write.
fn append(log: &mut SegmentLog, from: u64, n: u64, len: usize) {
    let rows: Vec<(u64, Vec<u8>)> = (from..from + n).map(|i| (i, entry_bytes(i, len))).collect();
    let mark = format!("commit {}", from + n - 1).into_bytes();
    let mut changes: Vec<Change> = rows.iter().map(|(index, bytes)| Change::Entry { index: *index, bytes }).collect();
    changes.push(Change::Commit(&mark));
    log.write(&changes).unwrap();
}

#[test]
fn what_is_written_is_read_back_across_segments_and_purges() {
    let dir = temp("roundtrip");
    let (mut log, rec) = SegmentLog::open(&dir).unwrap();
    assert!(rec.entries.is_empty() && rec.state == State::default());
    log.write(&[Change::Vote(b"vote 1")]).unwrap();
    // 300 entries of 10 KiB: over 3 MiB, so several segments.
    for i in 0..30 {
        append(&mut log, 1 + i * 10, 10, 10 << 10);
    }
    assert!(log.segments.len() >= 2, "{} segments", log.segments.len());
    log.write(&[Change::Truncate { from: 295 }, Change::Entry { index: 295, bytes: b"again" }]).unwrap();
    let kept_before = log.segments.len();
    log.write(&[Change::Purge { upto: 200, mark: b"purged 200" }]).unwrap();
    assert!(log.segments.len() < kept_before, "the purge deleted no segment");
    log.write(&[Change::Vote(b"vote 2")]).unwrap();
    drop(log);
    let (_, rec) = SegmentLog::open(&dir).unwrap();
    assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), (201..=295).collect::<Vec<_>>());
    assert_eq!(rec.entries[&250], entry_bytes(250, 10 << 10));
    assert_eq!(rec.entries[&295], b"again");
    assert_eq!(rec.state.vote.as_deref(), Some(&b"vote 2"[..]));
    assert_eq!(rec.state.committed.as_deref(), Some(&b"commit 300"[..]));
    assert_eq!(rec.state.purged, Some((200, b"purged 200".to_vec())));
    assert!(rec.torn.is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where each write of a log ended: its segment and the byte after it.
fn write_groups(dir: &Path, groups: u64, rng: &mut Rng) -> Vec<(PathBuf, u64, u64)> {
    let (mut log, _) = SegmentLog::open(dir).unwrap();
    let mut ends = Vec::new();
    let mut next = 1;
    for _ in 0..groups {
        let n = 1 + rng.below(6);
        let len = 1 + rng.below(3000) as usize;
        let start = log.pos;
        append(&mut log, next, n, len);
        let start = if log.pos < start { 0 } else { start };
        ends.push((log.segments.back().unwrap().path.clone(), start, log.pos));
        next += n;
    }
    ends
}

/// Copies a log directory.
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The entries a log holds once its first `groups` writes are durable.
fn entries_after(ends: &[(PathBuf, u64, u64)], dir: &Path, groups: usize) -> BTreeMap<u64, Vec<u8>> {
    let check = dir.with_extension("expect");
    copy_dir(dir, &check);
    let (path, _, end) = &ends[groups - 1];
    let path = check.join(path.file_name().unwrap());
    let len = std::fs::metadata(&path).unwrap().len();
    zero_from(&path, *end, len).unwrap();
    // Later segments (the last write rolled into one) go too.
    for e in std::fs::read_dir(&check).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "seg") && p.file_name() > path.file_name() {
            std::fs::remove_file(p).unwrap();
        }
    }
    let (_, rec) = SegmentLog::open(&check).unwrap();
    let _ = std::fs::remove_dir_all(&check);
    rec.entries
}

/// The torn-write injector, 300 rounds on the last write of a log, three ways a crash
/// or a disk leaves it:
/// - cut at a random byte, the rest still zeros (nothing after that byte reached the disk);
/// - a random subset of its 512-byte sectors written, the others still zeros (a write the
///   disk had not finished: sectors land in any order);
/// - garbage of random length at a random byte (not what a crash leaves; an edit).
///
/// Recovery keeps every entry of the writes before it and keeps of the last write only
/// whole records, never a damaged byte; garbage is refused at open (it is not what a
/// crash leaves, and the write may have been acknowledged). After recovery the log goes on being written and read.
#[test]
fn a_torn_last_write_is_cut_back_to_whole_records() {
    let mut rng = Rng(0x5eed_1234_abcd);
    let dir = temp("torn");
    let ends = write_groups(&dir, 60, &mut rng);
    let before = entries_after(&ends, &dir, ends.len() - 1);
    let all = entries_after(&ends, &dir, ends.len());
    let (last_path, start, end) = ends.last().unwrap().clone();
    assert!(end - start > 3 * SECTOR as u64, "the last write spans {} bytes", end - start);
    let trial = dir.with_extension("trial");
    let (mut cut_short, mut kept_part, mut refused, mut refused_cuts) = (0, 0, 0, 0);
    for round in 0..300 {
        copy_dir(&dir, &trial);
        let path = trial.join(last_path.file_name().unwrap());
        let at = start + rng.below(end - start);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        match round % 3 {
            0 => zero_from(&path, at, end).unwrap(),
            1 => {
                let mut sector = start / SECTOR as u64 * SECTOR as u64;
                while sector < end {
                    if rng.below(2) == 0 {
                        let (a, b) = (sector.max(start), (sector + SECTOR as u64).min(end));
                        file.write_all_at(&vec![0u8; (b - a) as usize], a).unwrap();
                    }
                    sector += SECTOR as u64;
                }
            }
            _ => {
                let garbage: Vec<u8> = (0..1 + rng.below(600)).map(|_| 1 | rng.next() as u8).collect();
                file.write_all_at(&garbage, at).unwrap();
            }
        }
        let (mut log, rec) = match SegmentLog::open(&trial) {
            Ok(opened) => opened,
            Err(e) if round % 3 != 1 => {
                assert!(e.to_string().contains("an edit or a bit flip"), "round {round}: {e}");
                if round % 3 == 0 {
                    refused_cuts += 1;
                } else {
                    refused += 1;
                }
                continue;
            }
            Err(e) => panic!("round {round}, byte {at}: a torn write was refused: {e}"),
        };
        for (index, bytes) in &before {
            assert_eq!(rec.entries.get(index), Some(bytes), "round {round}: acknowledged entry {index} lost");
        }
        for (index, bytes) in &rec.entries {
            assert_eq!(all.get(index), Some(bytes), "round {round}: entry {index} read damaged");
        }
        if rec.entries.len() < all.len() {
            cut_short += 1;
        }
        if rec.entries.len() > before.len() && rec.entries.len() < all.len() {
            kept_part += 1;
        }
        // The log goes on from there, and reads back what it wrote next.
        let next = rec.entries.keys().last().map_or(1, |i| i + 1);
        append(&mut log, next, 2, 100);
        drop(log);
        let (_, again) = SegmentLog::open(&trial).unwrap();
        assert_eq!(again.entries.len(), rec.entries.len() + 2, "round {round}");
        assert!(again.torn.is_none(), "round {round}: the cut tail was read again");
    }
    assert!(cut_short > 150, "the injector damaged the last write only {cut_short} times of 300");
    assert!(kept_part > 0, "no trial kept a prefix of the torn write");
    assert!(refused > 80, "garbage was refused only {refused} times of 100");
    assert_eq!(refused_cuts, 0, "cuts were taken for edits");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&trial);
}

/// Damage before the last write (a flipped byte in a write that was acknowledged) is an
/// error at open, naming the segment and the byte, at any of 100 random offsets: the log
/// is never silently cut back past an acknowledged entry.
#[test]
fn damage_before_the_last_write_is_an_error_never_a_cut() {
    let mut rng = Rng(0x00de_adbe_ef77);
    let dir = temp("middle");
    let ends = write_groups(&dir, 40, &mut rng);
    let trial = dir.with_extension("trial");
    for round in 0..100 {
        copy_dir(&dir, &trial);
        // A write with at least one after it in the same segment.
        let g = rng.below(ends.len() as u64 - 1) as usize;
        let (path, start, end) = &ends[g];
        if ends[g + 1].0 != *path {
            continue;
        }
        let path = trial.join(path.file_name().unwrap());
        let at = start + rng.below(end - start);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ (1 << rng.below(8))], at).unwrap();
        let err = SegmentLog::open(&trial).err().unwrap_or_else(|| panic!("round {round}: damage at {at} was read"));
        assert!(err.to_string().contains("the raft log is damaged"), "{err}");
    }
    // The negative control: the same log undamaged opens.
    copy_dir(&dir, &trial);
    assert!(SegmentLog::open(&trial).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&trial);
}

/// A segment missing from the middle (or the front, unpurged) is an error.
#[test]
fn a_missing_segment_is_an_error() {
    let dir = temp("missing");
    let (mut log, _) = SegmentLog::open(&dir).unwrap();
    for i in 0..30 {
        append(&mut log, 1 + i * 10, 10, 10 << 10);
    }
    let paths: Vec<PathBuf> = log.segments.iter().map(|s| s.path.clone()).collect();
    drop(log);
    assert!(paths.len() >= 3);
    std::fs::remove_file(&paths[1]).unwrap();
    let err = SegmentLog::open(&dir).err().expect("a gap was read");
    assert!(err.to_string().contains("a segment is missing"), "{err}");
    std::fs::remove_file(&paths[0]).unwrap();
    let err = SegmentLog::open(&dir).err().expect("a log without its front was read");
    assert!(err.to_string().contains("a segment is missing") || err.to_string().contains("does not start"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write larger than the open segment while that segment holds no record (a new log,
/// as the move out of `raft.redb` writes it, or a roll left empty by a crash): the
/// rename replaces the empty segment, and a purge in the same write must not delete the
/// file just written (found by review: the whole log was lost).
#[test]
fn a_first_write_larger_than_its_segment_survives_a_purge() {
    let dir = temp("bigfirst");
    let (mut log, _) = SegmentLog::open(&dir).unwrap();
    let rows: Vec<(u64, Vec<u8>)> = (11..=400).map(|i| (i, entry_bytes(i, 8 << 10))).collect();
    let mut changes = vec![Change::Purge { upto: 10, mark: b"purged 10" }, Change::Vote(b"vote")];
    changes.extend(rows.iter().map(|(index, bytes)| Change::Entry { index: *index, bytes }));
    changes.push(Change::Commit(b"commit 400"));
    log.write(&changes).unwrap();
    assert_eq!(log.segments.len(), 1, "the empty segment was replaced, not kept beside");
    log.write(&[Change::Purge { upto: 20, mark: b"purged 20" }]).unwrap();
    drop(log);
    let (_, rec) = SegmentLog::open(&dir).unwrap();
    assert_eq!(rec.entries.len(), 380);
    assert_eq!(rec.state.vote.as_deref(), Some(&b"vote"[..]));
    assert_eq!(rec.state.purged, Some((20, b"purged 20".to_vec())));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A torn write whose first records were kept (a prefix with no end of write), then
/// another write torn by a second crash: the second is a torn tail too, not damage
/// (found by review: the second open refused).
#[test]
fn a_second_torn_write_after_a_kept_prefix_is_cut_too() {
    let dir = temp("twice");
    let (mut log, _) = SegmentLog::open(&dir).unwrap();
    append(&mut log, 1, 3, 100);
    let start = log.pos;
    append(&mut log, 4, 3, 2000);
    let path = log.segments.back().unwrap().path.clone();
    drop(log);
    // The second write loses everything after its first record.
    let first_end = start as usize + record::HEADER + 2 + 8 + 2000;
    let len = std::fs::metadata(&path).unwrap().len();
    zero_from(&path, first_end as u64 + 10, len).unwrap();
    let (mut log, rec) = SegmentLog::open(&dir).unwrap();
    assert_eq!(rec.entries.len(), 4, "the torn write's first whole record is kept");
    let start = log.pos;
    append(&mut log, 5, 4, 1500);
    drop(log);
    // The next write's first sector is lost, a later one landed.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let first_sector_end = (start as usize / SECTOR + 1) * SECTOR;
    file.write_all_at(&vec![0u8; first_sector_end - start as usize], start).unwrap();
    let (_, rec) = SegmentLog::open(&dir).unwrap_or_else(|e| panic!("a crash's tear was refused: {e}"));
    assert_eq!(rec.entries.len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a log should hold, kept by the fuzzer below with no code of the log's own.
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    entries: BTreeMap<u64, Vec<u8>>,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<(u64, Vec<u8>)>,
}

impl Model {
    fn apply(&mut self, change: &Change) {
        match change {
            Change::Entry { index, bytes } => {
                self.entries.insert(*index, bytes.to_vec());
            }
            Change::Vote(v) => self.vote = Some(v.to_vec()),
            Change::Commit(c) => self.committed = Some(c.to_vec()),
            Change::Truncate { from } => self.entries.retain(|i, _| i < from),
            Change::Purge { upto, mark } => {
                self.entries.retain(|i, _| i > upto);
                self.purged = Some((*upto, mark.to_vec()));
            }
        }
    }

    fn of(rec: &Recovered) -> Model {
        let s = &rec.state;
        Model {
            entries: rec.entries.clone(),
            vote: s.vote.clone(),
            committed: s.committed.clone(),
            purged: s.purged.clone(),
        }
    }

    fn next_index(&self) -> u64 {
        self.entries.keys().last().map(|i| i + 1).or(self.purged.as_ref().map(|(upto, _)| upto + 1)).unwrap_or(1)
    }
}

/// One random write, as raft's storage makes them: entries appended after the last
/// (now and then larger than a segment) with a commit mark, a vote, a conflicting
/// suffix truncated and written again, a purge up to an entry held, or an append and a
/// purge in one write.
fn random_write(rng: &mut Rng, model: &Model, step: u64) -> Vec<(u8, u64, Vec<u8>)> {
    let next = model.next_index();
    let first = model.entries.keys().next().copied();
    let entries = |rng: &mut Rng, from: u64| -> Vec<(u8, u64, Vec<u8>)> {
        (from..from + 1 + rng.below(8))
            .map(|i| {
                let len = if rng.below(40) == 0 { (1 << 20) + rng.below(1 << 20) } else { 1 + rng.below(4000) };
                (b'e', i, entry_bytes(i ^ step, len as usize))
            })
            .collect()
    };
    let commit = |rows: &mut Vec<(u8, u64, Vec<u8>)>| rows.push((b'c', 0, format!("commit at {step}").into_bytes()));
    match (rng.below(10), first) {
        (0, _) => vec![(b'v', 0, format!("vote {step}").into_bytes())],
        (1, Some(first)) => {
            let from = first + rng.below(next - first);
            let mut rows = vec![(b't', from, Vec::new())];
            rows.extend(entries(rng, from));
            commit(&mut rows);
            rows
        }
        (2, Some(first)) => vec![(b'p', first + rng.below(next - first), format!("purged at {step}").into_bytes())],
        (3, Some(first)) => {
            // Appended, and purged in the same write (the writer joins what comes at once).
            let mut rows = entries(rng, next);
            commit(&mut rows);
            rows.push((b'p', first + rng.below(next - first), format!("purged at {step}").into_bytes()));
            rows
        }
        _ => {
            let mut rows = entries(rng, next);
            commit(&mut rows);
            rows
        }
    }
}

fn as_changes(rows: &[(u8, u64, Vec<u8>)]) -> Vec<Change<'_>> {
    rows.iter()
        .map(|(kind, n, bytes)| match kind {
            b'e' => Change::Entry { index: *n, bytes },
            b'v' => Change::Vote(bytes),
            b'c' => Change::Commit(bytes),
            b't' => Change::Truncate { from: *n },
            _ => Change::Purge { upto: *n, mark: bytes },
        })
        .collect()
}

/// The stateful fuzzer: 12 seeds of 150 random writes each (appends, some larger than a
/// segment, votes, truncations of a suffix, purges), with a clean reopen now and then
/// and a crash that tears the last write at a random byte. After a clean reopen the
/// log holds exactly what the model says; after a tear, what it said before that write
/// with a prefix of the write's changes (whole records only, never a damaged byte);
/// never an error. A purge that deleted segments is not torn: its record is durable
/// before any segment goes, so no crash leaves it torn with its segments gone.
#[test]
fn random_writes_reopens_and_torn_writes_keep_what_the_model_says() {
    let (reopens, tears, partial) = fuzz("fuzz", 1..=12);
    assert!(reopens > 50 && tears > 50, "{reopens} reopens, {tears} tears");
    assert!(partial > 0, "no tear kept a prefix of its write");
}

/// The fuzzer's negative control: a purge that deletes one segment too many (test-only
/// switch) is caught, as entries the model holds are gone at the next reopen.
#[test]
fn the_fuzzer_catches_a_purge_that_deletes_a_segment_too_many() {
    BROKEN_PURGE.with(|b| b.set(true));
    let caught = std::panic::catch_unwind(|| fuzz("fuzz-broken", 1..=12));
    BROKEN_PURGE.with(|b| b.set(false));
    assert!(caught.is_err(), "the fuzzer passed a log whose purges delete a live segment");
}

/// Runs the fuzzer over `seeds`, in directories named after `name` (the fuzzer and its
/// control run at once, in one process): the reopens, the tears, and the tears that
/// kept a part of their write. Panics at the first difference from the model.
fn fuzz(name: &str, seeds: std::ops::RangeInclusive<u64>) -> (u32, u32, u32) {
    let (mut reopens, mut tears, mut partial) = (0, 0, 0);
    for seed in seeds {
        let dir = temp(&format!("{name}-{seed}"));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let (mut log, _) = SegmentLog::open(&dir).unwrap();
        let mut model = Model::default();
        for step in 0..150u64 {
            let rows = random_write(&mut rng, &model, step);
            let changes = as_changes(&rows);
            let (start, path, first_segment) =
                (log.pos, log.segments.back().unwrap().path.clone(), log.segments.front().unwrap().path.clone());
            log.write(&changes).unwrap();
            let before = model.clone();
            changes.iter().for_each(|c| model.apply(c));
            let rolled = log.segments.back().unwrap().path != path;
            let deleted = log.segments.front().unwrap().path != first_segment;
            match rng.below(12) {
                0 => {
                    drop(log);
                    let (again, rec) = SegmentLog::open(&dir).unwrap();
                    assert_eq!(Model::of(&rec), model, "seed {seed} step {step}: a clean reopen");
                    assert!(rec.torn.is_none(), "seed {seed} step {step}");
                    (log, reopens) = (again, reopens + 1);
                }
                1 if !deleted => {
                    let (path, start) =
                        if rolled { (log.segments.back().unwrap().path.clone(), 0) } else { (path, start) };
                    let end = log.pos;
                    drop(log);
                    let at = start + rng.below(end - start);
                    zero_from(&path, at, end).unwrap();
                    let (again, rec) = SegmentLog::open(&dir)
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: a torn write refused: {e}"));
                    let found = Model::of(&rec);
                    let kept = (0..=changes.len()).find(|k| {
                        let mut m = before.clone();
                        changes[..*k].iter().for_each(|c| m.apply(c));
                        m == found
                    });
                    let kept = kept.unwrap_or_else(|| {
                        panic!("seed {seed} step {step}: after a tear at byte {at} the log holds neither what it held before the write nor a prefix of it")
                    });
                    if kept > 0 && kept < changes.len() {
                        partial += 1;
                    }
                    model = found;
                    (log, tears) = (again, tears + 1);
                }
                _ => {}
            }
        }
        drop(log);
        let (_, rec) = SegmentLog::open(&dir).unwrap();
        assert_eq!(Model::of(&rec), model, "seed {seed}: the last reopen");
        let _ = std::fs::remove_dir_all(&dir);
    }
    (reopens, tears, partial)
}
