use fenced_core::{LeaseId, LockName, Quotas};
use std::collections::{BTreeMap, BTreeSet};

use super::*;

fn lease(n: u128) -> LeaseId {
    LeaseId(n.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
}

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

fn quotas() -> Quotas {
    Quotas { keys_max: 10_000, bytes_max: u64::MAX }
}

/// One of every command, with optional fields both present and absent.
fn every_command() -> Vec<Command> {
    let t = |n| Token::new(n).unwrap();
    let acquire = |holder: Option<&str>, lease_ref| {
        Command::Acquire(Acquire {
            name: name("orders/42"),
            lease: lease_ref,
            wait_ms: 5_000,
            lock_delay_ms: 0,
            holder: holder.map(str::to_string),
        })
    };
    vec![
        Command::GrantLease { lease: lease(1), ttl_ms: 10_000 },
        Command::Keepalive { lease: lease(2) },
        Command::Renewed { leases: vec![(lease(2), 1_234), (lease(8), u64::MAX)] },
        Command::Renewed { leases: vec![] },
        acquire(Some("worker-7 ✓"), LeaseRef::Existing(lease(3))),
        acquire(None, LeaseRef::Implicit { id: lease(4), ttl_ms: u64::MAX }),
        Command::AcquireAll(AcquireAll {
            names: vec![name("a"), name("b"), name(&"n".repeat(LockName::LEN_MAX))],
            lease: LeaseRef::Existing(lease(5)),
            wait_ms: 0,
            lock_delay_ms: 60_000,
            holder: Some(String::new()),
        }),
        Command::Release { name: name("a"), lease: lease(6) },
        Command::Revoke { lease: lease(7) },
        Command::RevokeLock { name: name("b"), token: Some(t(u64::MAX)) },
        Command::RevokeLock { name: name("b"), token: None },
        Command::Cancel { request: RequestId(u64::MAX) },
        Command::Tick,
        Command::Promote,
        Command::RaiseTokens { floor: t(1 << 40) },
        Command::Store(StoreCommand::Write {
            key: "acct".into(),
            token: t(21),
            value: b"balance=1000".to_vec(),
            foreign: false,
            quotas: quotas(),
        }),
        Command::Store(StoreCommand::FencedRead { key: "k".into(), token: t(1), foreign: true, quotas: quotas() }),
        Command::Store(StoreCommand::WriteUnfenced { key: String::new(), value: vec![0, 255, 128], quotas: quotas() }),
        Command::Store(StoreCommand::Import {
            records: vec![
                ("x".into(), Record { mark: Some(t(3)), value: Some(vec![]) }),
                ("y".into(), Record { mark: None, value: None }),
            ],
        }),
        Command::SetLimits(fenced_core::Limits {
            leases_max: usize::MAX,
            locks_max: 0,
            ttl_ms_max: u64::MAX,
            ..fenced_core::Limits::default()
        }),
    ]
}

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    LogId::new(LeaderIdOf::<TypeConfig>::new_committed(term, node), index)
}

fn batch_entry(index: u64, commands: Vec<Command>) -> Entry {
    let items = commands.into_iter().enumerate().map(|(i, c)| (RequestId(i as u64 * 1_000_003), c)).collect();
    Entry { log_id: log_id(7, 3, index), payload: EntryPayload::Normal(Batch { items, now_ms: 1_733_000_000_123 }) }
}

fn every_entry() -> Vec<Entry> {
    let nodes = BTreeMap::from([(1, openraft::BasicNode { addr: "https://10.0.0.1:7001".into() })]);
    let membership = openraft::Membership::new(vec![BTreeSet::from([1])], nodes).unwrap();
    vec![
        Entry { log_id: log_id(1, 1, 0), payload: EntryPayload::Blank },
        Entry { log_id: log_id(u64::MAX, u64::MAX, u64::MAX), payload: EntryPayload::Blank },
        batch_entry(5, every_command()),
        batch_entry(6, vec![]),
        Entry::new_membership(log_id(2, 1, 9), membership),
    ]
}

fn same(a: &Entry, b: &Entry) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

#[test]
fn every_command_and_payload_round_trips() {
    for entry in every_entry() {
        let record = to_vec(&entry);
        assert_eq!(record[0], VERSION);
        let back = decode(&record, entry.index()).unwrap();
        assert!(same(&entry, &back), "{entry:?}\n{back:?}");
    }
}

#[test]
fn a_row_written_by_an_earlier_release_as_json_is_still_read() {
    for entry in every_entry() {
        let json = serde_json::to_vec(&entry).unwrap();
        assert_eq!(json[0], b'{');
        assert!(same(&entry, &decode(&json, entry.index()).unwrap()));
    }
}

#[test]
fn binary_records_are_smaller_than_the_json_they_replace() {
    let size = |e: &Entry| (to_vec(e).len(), serde_json::to_vec(e).unwrap().len());
    // Every command once (a 256-byte name among them): 647 bytes against 1,926.
    let (binary, json) = size(&batch_entry(5, every_command()));
    assert!(binary * 2 < json, "binary {binary} bytes, JSON {json}");
    // The common entry: one acquire under an implicit lease, with a holder label.
    let (binary, json) = size(&batch_entry(5, vec![every_command().swap_remove(3)]));
    assert!(binary * 3 < json, "binary {binary} bytes, JSON {json}");
}

#[test]
fn every_cut_and_every_flipped_bit_is_refused_never_a_panic() {
    for entry in every_entry() {
        let record = to_vec(&entry);
        for len in 0..record.len() {
            assert!(decode(&record[..len], entry.index()).is_err(), "a cut at {len} of {}", record.len());
        }
        for at in 0..record.len() {
            for bit in 0..8 {
                let mut damaged = record.clone();
                damaged[at] ^= 1 << bit;
                let err = decode(&damaged, entry.index()).expect_err("a flipped bit passed");
                assert!(err.to_string().contains(&format!("log entry {} is refused", entry.index())), "{err}");
            }
        }
    }
}

/// The attack: a same-length edit of a closed log turned `balance=1000` into `9000`.
/// The checksum refuses it; the negative control decodes the same bytes without the
/// checksum and gets the forged value, so the edit was well-formed and only the
/// checksum stands between it and the store.
#[test]
fn an_edited_value_is_refused_where_without_the_checksum_it_would_be_served() {
    let entry = batch_entry(5, every_command());
    let mut record = to_vec(&entry);
    let at = record.windows(12).position(|w| w == b"balance=1000").unwrap();
    record[at + 8] = b'9';
    let err = decode(&record, 5).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("checksum does not match"), "{err}");
    let forged = decode_body(&record[HEADER..]).unwrap();
    assert!(format!("{forged:?}").contains(&format!("{:?}", b"balance=9000".to_vec())));
}

#[test]
fn a_record_of_a_newer_version_is_refused_saying_so() {
    let mut record = to_vec(&batch_entry(5, vec![Command::Tick]));
    record[0] = VERSION + 1;
    let err = decode(&record, 5).unwrap_err().to_string();
    assert!(err.contains("format version 2") && err.contains("newer release of Fenced"), "{err}");
}

#[test]
fn a_record_kept_under_another_index_is_refused() {
    let record = to_vec(&batch_entry(5, vec![Command::Tick]));
    let err = decode(&record, 6).unwrap_err().to_string();
    assert!(err.contains("log entry 6") && err.contains("names index 5"), "{err}");
}

/// A count or a length larger than the record could hold is refused before anything
/// is allocated for it (the checksum is recomputed, as a forger would).
#[test]
fn a_count_beyond_the_record_is_refused_before_allocating() {
    for count in [u64::MAX, 1 << 40, 3] {
        let mut body = Vec::new();
        put_u64(&mut body, 1);
        put_u64(&mut body, 1);
        put_u64(&mut body, 5);
        body.push(1);
        put_u64(&mut body, 0);
        put_u64(&mut body, count);
        let mut record = vec![VERSION];
        record.extend_from_slice(&crc(&body).to_le_bytes());
        record.extend_from_slice(&body);
        let err = decode(&record, 5).unwrap_err().to_string();
        assert!(err.contains(&format!("a count of {count}")), "{err}");
    }
}

#[test]
fn varints_cover_the_range_and_refuse_overflow() {
    for v in [0, 1, 127, 128, 16_383, 16_384, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
        let mut out = Vec::new();
        put_u64(&mut out, v);
        let mut r = Reader::new(&out);
        assert_eq!(r.u64(), Ok(v));
        assert_eq!(r.end(), Ok(()));
    }
    let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]);
    assert!(r.u64().is_err(), "65 bits");
    let mut r = Reader::new(&[0x80; 11]);
    assert!(r.u64().is_err(), "eleven bytes");
}
