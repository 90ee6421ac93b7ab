//! Tests of `store`.

use super::*;

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

fn write(key: &str, token: u64, value: &[u8]) -> StoreCommand {
    StoreCommand::Write {
        key: key.into(),
        token: t(token),
        value: value.to_vec(),
        foreign: false,
        quotas: Quotas::default(),
    }
}

fn read(key: &str, token: u64) -> StoreCommand {
    StoreCommand::FencedRead { key: key.into(), token: t(token), foreign: false, quotas: Quotas::default() }
}

#[test]
fn the_gate_rule_over_the_store() {
    let mut s = Store::default();
    let issued = Some(t(40));
    assert_eq!(s.apply(write("k", 33, b"a"), issued), Ok(StoreAnswer::Written { mark: t(33) }));
    assert_eq!(s.apply(write("k", 34, b"b"), issued), Ok(StoreAnswer::Written { mark: t(34) }));
    // The zombie wakes up with 33: refused, nothing changes.
    assert_eq!(
        s.apply(write("k", 33, b"zombie"), issued),
        Err(Error::StaleToken { token: t(33), highest_seen: t(34) })
    );
    assert_eq!(s.get("k").unwrap().value.as_deref(), Some(&b"b"[..]));
    // A fenced read of an absent key leaves a mark and no value.
    assert_eq!(s.apply(read("fresh", 35), issued), Ok(StoreAnswer::Read { mark: t(35), value: None }));
    assert_eq!(s.apply(write("fresh", 34, b"x"), issued), Err(Error::StaleToken { token: t(34), highest_seen: t(35) }));
    // A fenced read moves the mark up and returns the value.
    assert_eq!(s.apply(read("k", 36), issued), Ok(StoreAnswer::Read { mark: t(36), value: Some(b"b".to_vec()) }));
    assert_eq!(s.get("k").unwrap().mark, Some(t(36)));
}

#[test]
fn tokens_never_issued_are_refused_unless_foreign() {
    let mut s = Store::default();
    assert_eq!(
        s.apply(write("k", 5, b"a"), Some(t(4))),
        Err(Error::TokenNotIssued { token: t(5), highest_issued: Some(t(4)) })
    );
    assert_eq!(s.apply(read("k", 1), None), Err(Error::TokenNotIssued { token: t(1), highest_issued: None }));
    assert!(s.get("k").is_none(), "a refusal changes nothing");
    let foreign = StoreCommand::Write {
        key: "etcd/k".into(),
        token: t(900),
        value: b"v".to_vec(),
        foreign: true,
        quotas: Quotas::default(),
    };
    assert_eq!(s.apply(foreign, None), Ok(StoreAnswer::Written { mark: t(900) }));
}

#[test]
fn unfenced_writes_drop_the_mark() {
    let mut s = Store::default();
    s.apply(write("k", 3, b"a"), Some(t(3))).unwrap();
    let w = StoreCommand::WriteUnfenced { key: "k".into(), value: b"u".to_vec(), quotas: Quotas::default() };
    assert_eq!(s.apply(w, None), Ok(StoreAnswer::Done));
    assert_eq!(s.get("k"), Some(&Record { mark: None, value: Some(b"u".to_vec()) }));
}

#[test]
fn quotas_refuse_what_needs_new_room_and_nothing_else() {
    let mut s = Store::default();
    let q = Quotas { keys_max: 1, bytes_max: 1 + RECORD_OVERHEAD + 4 };
    let w = |key: &str, value: &[u8]| StoreCommand::Write {
        key: key.into(),
        token: t(1),
        value: value.to_vec(),
        foreign: false,
        quotas: q,
    };
    assert!(s.apply(w("k", b"abcd"), Some(t(1))).is_ok());
    assert_eq!(s.apply(w("j", b""), Some(t(1))), Err(Error::StoreFull { quota: Quota::Keys, limit: 1 }));
    assert_eq!(
        s.apply(w("k", b"abcde"), Some(t(1))),
        Err(Error::StoreFull { quota: Quota::Bytes, limit: q.bytes_max })
    );
    // An overwrite that takes no new room goes on, and frees what it no longer needs.
    assert!(s.apply(w("k", b"ab"), Some(t(1))).is_ok());
    assert_eq!(s.usage(), (1, 1 + RECORD_OVERHEAD + 2));
    // A fenced read that would mark a new key needs room too.
    let r = StoreCommand::FencedRead { key: "new".into(), token: t(1), foreign: false, quotas: q };
    assert_eq!(s.apply(r, Some(t(1))), Err(Error::StoreFull { quota: Quota::Keys, limit: 1 }));
}

/// A copy shares every value with the store (no value is copied), and a write
/// after the copy leaves the copy as it was.
#[test]
fn a_copy_shares_the_values_and_keeps_its_own_point_in_time() {
    let mut s = Store::default();
    s.apply(write("k", 1, &[7; 4096]), Some(t(9))).unwrap();
    let copy = s.clone();
    assert!(Arc::ptr_eq(&s.records["k"], &copy.records["k"]), "the value is shared, not copied");
    s.apply(write("k", 2, b"new"), Some(t(9))).unwrap();
    assert_eq!(copy.get("k").unwrap().value.as_deref(), Some(&[7; 4096][..]));
    assert_eq!(s.get("k").unwrap().value.as_deref(), Some(&b"new"[..]));
}

#[test]
fn import_keeps_what_the_log_has() {
    let mut s = Store::default();
    s.apply(write("a", 7, b"new"), Some(t(7))).unwrap();
    let records = vec![
        ("a".to_string(), Record { mark: Some(t(2)), value: Some(b"old".to_vec()) }),
        ("b".to_string(), Record { mark: Some(t(3)), value: None }),
    ];
    s.apply(StoreCommand::Import { records }, None).unwrap();
    assert_eq!(s.get("a").unwrap().value.as_deref(), Some(&b"new"[..]));
    assert_eq!(s.get("b").unwrap().mark, Some(t(3)));
    assert_eq!(s.usage().0, 2);
    let listed: Vec<_> = s.list("", 10).into_iter().map(|k| k.key).collect();
    assert_eq!(listed, ["a", "b"]);
    assert_eq!(s.list("b", 10).len(), 1);
    assert_eq!(s.list("a", 0).len(), 0);
}
