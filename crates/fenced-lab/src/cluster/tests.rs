//! Tests of what a Fenced cluster's members say of themselves, read and compared.

use super::*;
use serde_json::json;

fn st(id: u64, index: u64, hash: Option<&str>) -> Option<Value> {
    let mut v = json!({"id": id, "state": "follower", "leader_id": 1, "term": 2, "applied_index": index});
    if let Some(h) = hash {
        v["state_hash"] = json!(h);
    }
    Some(v)
}

#[test]
fn replicas_agree_only_at_one_index_with_one_hash() {
    let same = [st(1, 40, Some("ab")), st(2, 40, Some("ab")), st(3, 40, Some("ab"))];
    assert_eq!(compare_replicas(&same), Some(Agreement::Agree { applied_index: 40 }));
    // One replica behind: not yet comparable.
    let behind = [st(1, 40, Some("ab")), st(2, 39, Some("aa")), st(3, 40, Some("ab"))];
    assert_eq!(compare_replicas(&behind), None);
    // One member silent: not yet comparable.
    assert_eq!(compare_replicas(&[st(1, 40, Some("ab")), None]), None);
    // The broken variant: same index, another state.
    let diverged = [st(1, 40, Some("ab")), st(2, 40, Some("ff")), st(3, 40, Some("ab"))];
    let Some(Agreement::Differ { applied_index: 40, hashes }) = compare_replicas(&diverged) else {
        panic!("a diverged replica went unseen");
    };
    assert_eq!(hashes[1], (2, "\"ff\"".to_string()));
    // Members without the field: said so, never called agreement.
    assert_eq!(compare_replicas(&[st(1, 40, None), st(2, 40, None)]), Some(Agreement::NoHash));
}

#[test]
fn the_leader_is_the_self_declared_one_of_the_highest_term() {
    let mut old = st(1, 5, None).unwrap();
    old["state"] = json!("leader");
    old["term"] = json!(2);
    let mut new = st(3, 9, None).unwrap();
    new["state"] = json!("leader");
    new["leader_id"] = json!(3);
    new["term"] = json!(4);
    assert_eq!(leader_of(&[Some(old.clone()), st(2, 9, None), Some(new)]), Some(2));
    assert_eq!(leader_of(&[Some(old), None]), Some(0));
    assert_eq!(leader_of(&[st(2, 9, None), None]), None);
}
