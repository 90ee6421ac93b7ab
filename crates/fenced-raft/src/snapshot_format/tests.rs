use fenced_core::{Acquire, AcquireAll, Command, LeaseId, LeaseRef, LockName, Quotas, StoreCommand, Token};

use super::*;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

fn acquire(n: &str, lease: u128, wait_ms: u64, holder: Option<&str>) -> Command {
    Command::Acquire(Acquire {
        name: name(n),
        lease: LeaseRef::Existing(LeaseId(lease)),
        wait_ms,
        lock_delay_ms: 250,
        holder: holder.map(str::to_string),
    })
}

/// Every kind of state the format carries: leases (an implicit one pending for its
/// queued request), held locks with labels, waiters of one lock and of a set, a
/// lock-delay, every timer kind, store records with and without marks and values,
/// and (when `agreed`) limits agreed through the log.
fn busy(agreed: bool) -> LockTable {
    let limits = Limits { waiters_per_lock_max: 9, ..Limits::default() };
    let mut t = LockTable::new(limits.clone());
    let mut r = 0;
    let mut run = |t: &mut LockTable, cmd: Command, now: u64| {
        r += 1;
        t.apply(RequestId(r), cmd, now)
    };
    for lease in 1..=4 {
        run(&mut t, Command::GrantLease { lease: LeaseId(lease << 100 | lease), ttl_ms: 5_000 }, 10);
    }
    let l = |n: u128| n << 100 | n;
    run(&mut t, acquire("a", l(1), 0, Some("worker ✓")), 20);
    run(&mut t, acquire("b", l(2), 0, None), 20);
    run(&mut t, acquire("a", l(3), 4_000, Some("next")), 30);
    let set = AcquireAll {
        names: vec![name("a"), name("b"), name("c")],
        lease: LeaseRef::Existing(LeaseId(l(4))),
        wait_ms: 4_000,
        lock_delay_ms: 0,
        holder: None,
    };
    run(&mut t, Command::AcquireAll(set), 30);
    let implicit = Acquire {
        name: name("b"),
        lease: LeaseRef::Implicit { id: LeaseId(99), ttl_ms: 2_000 },
        wait_ms: 3_000,
        lock_delay_ms: 0,
        holder: None,
    };
    run(&mut t, Command::Acquire(implicit), 40);
    run(&mut t, acquire("d", l(2), 0, None), 40);
    let t5 = Token::new(3).unwrap();
    for (key, value) in [("k1", b"one".to_vec()), ("k2", vec![]), ("k3", vec![0, 255])] {
        let cmd = StoreCommand::Write { key: key.into(), token: t5, value, foreign: false, quotas: Quotas::default() };
        run(&mut t, Command::Store(cmd), 50);
    }
    run(
        &mut t,
        Command::Store(StoreCommand::FencedRead {
            key: "k4".into(),
            token: t5,
            foreign: false,
            quotas: Quotas::default(),
        }),
        50,
    );
    if agreed {
        run(&mut t, Command::SetLimits(Limits { locks_max: 77, ..limits }), 60);
    }
    assert!(t.waiter_count() >= 3 && t.lock_count() >= 4 && t.store().usage().0 == 4, "{:?}", t.image());
    t
}

#[test]
fn a_snapshot_round_trips_every_kind_of_state() {
    for agreed in [false, true] {
        let t = busy(agreed);
        let bytes = encode(&t);
        assert!(bytes.starts_with(MAGIC) && bytes[MAGIC.len()] == VERSION);
        let back = decode(&bytes, &Limits::default()).unwrap();
        assert_eq!(back.image(), t.image());
        assert_eq!(back.limits_agreed(), agreed);
        assert_eq!(encode(&back), bytes, "the same table gives the same bytes");
    }
}

/// A snapshot of an earlier release (the table's JSON) is still read, to the same
/// state; a member of such a release is sent that JSON, which it reads.
#[test]
fn the_json_snapshot_of_earlier_releases_is_still_read_and_still_written_for_them() {
    let t = busy(false);
    let json = to_legacy_json(&t);
    assert!(is_legacy(&json) && !is_legacy(&encode(&t)));
    assert_eq!(decode(&json, &Limits::default()).unwrap().image(), t.image());
}

#[test]
fn the_binary_snapshot_is_smaller_than_the_json() {
    let t = busy(false);
    let (binary, json) = (encode(&t).len(), to_legacy_json(&t).len());
    assert!(binary * 3 < json, "binary {binary} bytes, JSON {json}");
}

#[test]
fn every_cut_and_every_flipped_bit_is_refused_never_a_panic() {
    let bytes = encode(&busy(true));
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut], &Limits::default()).is_err(), "cut at {cut}");
    }
    for bit in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        assert!(decode(&b, &Limits::default()).is_err(), "bit {bit} flipped");
    }
}

/// The negative control: the same edit read without the checksum is taken, so it is
/// the checksum that refuses it.
#[test]
fn an_edited_value_is_refused_where_without_the_checksum_it_would_be_taken() {
    let bytes = encode(&busy(false));
    let at = bytes.windows(3).position(|w| w == b"one").expect("k1's value is in the snapshot");
    let mut edited = bytes.clone();
    edited[at..at + 3].copy_from_slice(b"two");
    let e = decode(&edited, &Limits::default()).unwrap_err();
    assert!(e.contains("checksum does not match"), "{e}");
    let forged = read_image(&edited[HEADER..]).unwrap();
    assert_eq!(forged.records[0].1.value.as_deref(), Some(&b"two"[..]));
}

#[test]
fn a_snapshot_of_a_newer_version_is_refused_saying_so() {
    let mut bytes = encode(&busy(false));
    bytes[MAGIC.len()] = VERSION + 1;
    let e = decode(&bytes, &Limits::default()).unwrap_err();
    assert!(e.contains("version 2") && e.contains("newer release"), "{e}");
    assert!(decode(b"neither", &Limits::default()).unwrap_err().contains("not a lock-table snapshot"));
}

/// A snapshot whose checksum is right but whose table breaks an invariant (one a peer
/// could send) is refused by the table's own check, not applied.
#[test]
fn a_well_formed_snapshot_of_a_broken_table_is_refused() {
    let mut image = busy(false).image();
    image.locks[0].queue.push(RequestId(12_345));
    let mut bytes = MAGIC.to_vec();
    bytes.push(VERSION);
    bytes.extend_from_slice(&[0; 4]);
    put_image(&mut bytes, &image);
    let sum = crc(&bytes[HEADER..]);
    bytes[MAGIC.len() + 1..HEADER].copy_from_slice(&sum.to_le_bytes());
    let e = decode(&bytes, &Limits::default()).unwrap_err();
    assert!(e.contains("not a waiter"), "{e}");
}

/// A transfer resumed into the bytes of another snapshot (a forged or mistaken name:
/// the first `k` bytes of one, the rest of the other) is refused at every splice that
/// is neither snapshot whole: the receiver never installs a mix of two tables.
#[test]
fn the_bytes_of_two_snapshots_spliced_at_any_offset_are_refused() {
    let (a, b) = (encode(&busy(false)), encode(&busy(true)));
    assert_ne!(a, b);
    let mut refused = 0;
    for k in 0..=a.len().min(b.len()) {
        let spliced = [&a[..k], &b[k..]].concat();
        if spliced != a && spliced != b {
            assert!(decode(&spliced, &Limits::default()).is_err(), "spliced at {k}");
            refused += 1;
        }
    }
    assert!(refused > a.len() / 2, "only {refused} splices differ from both");
}
