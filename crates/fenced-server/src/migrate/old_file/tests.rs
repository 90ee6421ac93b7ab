//! Tests of the reader of the old single-node file: its records decoded, a corrupt one an error.

use super::*;

/// The file a single-node server of that format left (written by its own store
/// code, `tests/fixtures/single-node-format`), read from a copy.
#[test]
fn the_single_node_fixture_reads_as_it_was_written() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/single-node-format/fenced.redb");
    let dir = std::env::temp_dir().join(format!("fenced-old-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fenced.redb");
    std::fs::copy(fixture, &path).unwrap();
    let old = OldFile::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((old.token_ceiling, old.ttl_ms_hwm, old.clean_grace_ms), (1_000, 500, None));
    assert_eq!(old.lock_delays, [(LockName::new("delayed").unwrap(), 20_000)]);
    let t = Token::new(900);
    let records = [
        ("k".to_string(), Record { mark: t, value: Some(b"old".to_vec()) }),
        ("marked".to_string(), Record { mark: t, value: None }),
    ];
    assert_eq!(old.records, records);
    // Tokens go on from the ceiling; the grace is the TTL mark; the delay follows it.
    let table = old.table(Limits::default());
    assert_eq!((table.highest_issued(), table.grace_left_ms(0)), (Token::new(999), 500));
    let blocked = table.lock(&LockName::new("delayed").unwrap()).and_then(|l| l.blocked_until_ms);
    assert_eq!(blocked, Some(20_500));
}

#[test]
fn records_decode_and_a_corrupt_one_is_an_error_not_an_empty_mark() {
    let mut raw = 7u64.to_le_bytes().to_vec();
    raw.push(1);
    raw.extend_from_slice(b"v");
    assert_eq!(decode("k", &raw), Ok(Record { mark: Token::new(7), value: Some(b"v".to_vec()) }));
    raw.truncate(8);
    raw.push(0);
    assert_eq!(decode("k", &raw), Ok(Record { mark: Token::new(7), value: None }));
    for raw in [vec![], vec![7, 0, 0], vec![7, 0, 0, 0, 0, 0, 0, 0, 2], vec![7, 0, 0, 0, 0, 0, 0, 0, 0, 1]] {
        let e = decode("k", &raw).unwrap_err();
        assert!(e.contains("'k' is corrupt"), "{e}");
    }
}
