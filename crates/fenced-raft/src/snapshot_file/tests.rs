use super::*;

fn meta_at(index: u64) -> SnapshotMeta {
    let log_id = serde_json::json!({"leader_id": {"term": 1, "node_id": 1}, "index": index});
    SnapshotMeta { last_log_id: Some(serde_json::from_value(log_id).unwrap()), last_membership: Default::default() }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fenced-snapfile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn index_of(kept: &Kept) -> u64 {
    let meta: SnapshotMeta = serde_json::from_slice(&kept.0).unwrap();
    meta.last_log_id.unwrap().index
}

#[test]
fn a_snapshot_reads_back_and_an_older_one_never_replaces_it() {
    let dir = scratch("order");
    let file = SnapshotFile::open(&dir).unwrap();
    assert!(file.read().unwrap().is_none());
    assert!(!file.exists());
    assert!(file.write(&meta_at(10), b"ten").unwrap());
    assert!(!file.write(&meta_at(5), b"five").unwrap());
    let kept = file.read().unwrap().unwrap();
    assert_eq!((index_of(&kept), kept.1.as_slice()), (10, b"ten".as_slice()));
    assert!(file.write(&meta_at(12), b"").unwrap());
    let kept = SnapshotFile::open(&dir).unwrap().read().unwrap().unwrap();
    assert_eq!((index_of(&kept), kept.1.len()), (12, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every cut of the file and every flipped bit is refused with an error naming the
/// file, never read as another snapshot or as none, and never a panic.
#[test]
fn every_cut_and_every_flipped_bit_is_refused() {
    let dir = scratch("damage");
    let file = SnapshotFile::open(&dir).unwrap();
    assert!(file.write(&meta_at(7), b"the table's bytes").unwrap());
    let whole = std::fs::read(dir.join(NAME)).unwrap();
    for len in 0..whole.len() {
        let err = parse(&dir.join(NAME), whole[..len].to_vec()).unwrap_err();
        assert!(err.to_string().contains("the snapshot is refused"), "cut at {len}: {err}");
    }
    for bit in 0..whole.len() * 8 {
        let mut bytes = whole.clone();
        bytes[bit / 8] ^= 1 << (bit % 8);
        assert!(parse(&dir.join(NAME), bytes).is_err(), "bit {bit} flipped was read");
    }
    // The negative control: the same bytes undamaged are read.
    assert_eq!(parse(&dir.join(NAME), whole).unwrap().1, b"the table's bytes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A crash while a snapshot is written leaves `snapshot.tmp` beside the kept one: the
/// kept one is read, and the leftover is removed when the directory is opened again.
#[test]
fn a_snapshot_cut_by_a_crash_leaves_the_one_kept_before() {
    let dir = scratch("crash");
    let file = SnapshotFile::open(&dir).unwrap();
    assert!(file.write(&meta_at(3), b"three").unwrap());
    std::fs::write(dir.join(TMP), b"fenced-k\x01half a snapsh").unwrap();
    let file = SnapshotFile::open(&dir).unwrap();
    assert!(!dir.join(TMP).exists());
    assert_eq!(file.read().unwrap().unwrap().1, b"three");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_of_a_later_version_is_refused_saying_so() {
    let dir = scratch("version");
    let file = SnapshotFile::open(&dir).unwrap();
    assert!(file.write(&meta_at(3), b"three").unwrap());
    let mut bytes = std::fs::read(dir.join(NAME)).unwrap();
    bytes[8] = VERSION + 1;
    std::fs::write(dir.join(NAME), bytes).unwrap();
    let err = file.read().unwrap_err().to_string();
    assert!(err.contains("a later release wrote it"), "{err}");
    // Nor is it overwritten by an older snapshot as if its head read.
    assert!(file.write(&meta_at(1), b"one").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The kept bytes are sent from any offset (a resumed transfer): the rest from there,
/// and an offset past the end gives nothing. Their checksum tells one file's bytes from
/// another's of the same length and log id, and a replaced snapshot is not opened
/// under the meta offered before.
#[test]
fn the_kept_bytes_are_sent_from_any_offset_and_named_by_their_checksum() {
    let dir = scratch("outgoing");
    let file = SnapshotFile::open(&dir).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert!(file.write(&meta_at(7), &data).unwrap());
    let offered = meta_at(7).last_log_id;
    for offset in [0u64, 1, 65_536, 99_999, 100_000, 200_000] {
        let out = file.open_data(offered).unwrap();
        assert_eq!(out.len, 100_000);
        let mut rest = Vec::new();
        out.from(offset).unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, data[(offset as usize).min(data.len())..], "from {offset}");
    }
    let crc = file.open_data(offered).unwrap().crc;
    let mut other = data.clone();
    other[50_000] ^= 1;
    assert!(file.write(&meta_at(7), &other).unwrap());
    assert_ne!(file.open_data(offered).unwrap().crc, crc, "other bytes of one log id have another name");
    assert!(file.write(&meta_at(8), &data).unwrap());
    assert!(file.open_data(offered).is_err(), "a replaced snapshot is not opened under its old meta");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A snapshot received into `snapshot.incoming` (its head, its bytes as they came) is
/// sealed into a whole kept file and adopted by a rename: it reads back as written; an
/// older one is not adopted over a newer kept one (and is removed); a file holding
/// another snapshot than the one installed is refused.
#[test]
fn a_received_snapshot_is_sealed_and_adopted_not_written_again() {
    let dir = scratch("adopt");
    let file = SnapshotFile::open(&dir).unwrap();
    let incoming = dir.join(INCOMING);
    let receive = |index: u64, data: &[u8]| {
        let mut bytes = incoming_head(&meta_at(index)).unwrap();
        bytes.extend_from_slice(data);
        std::fs::write(&incoming, bytes).unwrap();
        assert_eq!(incoming_held(&incoming), Some(data.len() as u64));
        assert_eq!(seal_incoming(&incoming).unwrap(), data);
    };
    receive(10, b"the table at ten");
    assert!(file.adopt(&meta_at(10), &incoming).unwrap());
    assert!(!incoming.exists(), "renamed, not copied");
    let kept = file.read().unwrap().unwrap();
    assert_eq!((index_of(&kept), kept.1.as_slice()), (10, b"the table at ten".as_slice()));
    receive(7, b"older");
    assert!(!file.adopt(&meta_at(7), &incoming).unwrap());
    assert!(!incoming.exists());
    assert_eq!(index_of(&file.read().unwrap().unwrap()), 10);
    receive(12, b"twelve");
    let err = file.adopt(&meta_at(13), &incoming).unwrap_err();
    assert!(err.to_string().contains("not the one installed"), "{err}");
    assert_eq!(index_of(&file.read().unwrap().unwrap()), 10);
    // An incoming file is not removed at open (a receiver resumes it).
    let _ = SnapshotFile::open(&dir).unwrap();
    assert!(incoming.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
