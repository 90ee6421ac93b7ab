//! `unfenced_prefix`: keys under it take writes without a token (last writer wins);
//! every other key stays fenced, and with no prefix (the default) nothing changes.

use crate::harness::{Resp, TestServer};

fn put(s: &TestServer, key: &str, token: Option<u64>, body: &str) -> Resp {
    let t = token.map(|t| t.to_string());
    let h: Vec<(&str, &str)> = t.iter().map(|t| ("Fencing-Token", t.as_str())).collect();
    s.request("PUT", &format!("/v1/store/{key}"), &h, body.as_bytes())
}

fn get(s: &TestServer, key: &str, token: Option<u64>) -> Resp {
    let t = token.map(|t| t.to_string());
    let h: Vec<(&str, &str)> = t.iter().map(|t| ("Fencing-Token", t.as_str())).collect();
    s.request("GET", &format!("/v1/store/{key}"), &h, b"")
}

fn code(r: &Resp) -> (u16, Option<String>) {
    (r.status, r.json()["error"]["code"].as_str().map(String::from))
}

#[test]
fn without_a_prefix_every_write_needs_a_token() {
    let s = TestServer::start();
    assert_eq!(code(&put(&s, "scratch/k", None, "v")), (428, Some("token_required".into())));
}

#[test]
fn keys_under_the_prefix_take_writes_without_a_token() {
    let s = TestServer::with(|c| c.unfenced_prefix = "scratch/".into());
    s.mint_tokens(7);
    let r = put(&s, "scratch/counter", None, "1");
    assert_eq!((r.status, r.json()), (200, serde_json::json!({"key": "scratch/counter", "unfenced": true})));
    // Last writer wins, whatever it held: no mark is kept.
    assert_eq!(put(&s, "scratch/counter", None, "2").status, 200);
    let r = get(&s, "scratch/counter", None);
    assert_eq!((r.status, r.text().as_str(), r.header("fencing-highest-seen")), (200, "2", None));
    // A token on an unfenced key is refused, not ignored: it would protect nothing.
    let r = put(&s, "scratch/counter", Some(5), "3");
    assert_eq!(code(&r), (400, Some("unfenced_key".into())));
    assert_eq!(r.json()["error"]["unfenced_prefix"], "scratch/");
    assert_eq!(code(&get(&s, "scratch/counter", Some(5))), (400, Some("unfenced_key".into())));
    assert_eq!(get(&s, "scratch/counter", None).text(), "2", "the refusals changed nothing");
    // Every other key is fenced as before, including the prefix without its slash.
    assert_eq!(code(&put(&s, "scratch", None, "v")), (428, Some("token_required".into())));
    assert_eq!(code(&put(&s, "counter", None, "v")), (428, Some("token_required".into())));
    assert_eq!(put(&s, "counter", Some(7), "a").status, 200);
    assert_eq!(code(&put(&s, "counter", Some(6), "zombie")), (409, Some("stale_token".into())));
}

/// `foreign_token_prefix`: keys under it guard resources locked by another lock service
/// (etcd, ZooKeeper, Redis), so a token this server never minted is judged by the gate
/// rule alone; every other key still refuses such a token.
#[test]
fn keys_under_the_foreign_prefix_take_tokens_this_server_never_issued() {
    let s = TestServer::with(|c| c.foreign_token_prefix = "etcd/".into());
    // Nothing minted here at all, yet an etcd create_revision is taken and becomes the mark.
    let r = put(&s, "etcd/counter", Some(4_294_967_301), "1");
    assert_eq!((r.status, r.json()["highest_seen"].as_u64()), (200, Some(4_294_967_301)));
    // The gate rule holds as for any key: lower refused with the mark, equal or higher taken.
    let r = put(&s, "etcd/counter", Some(135), "zombie");
    assert_eq!(code(&r), (409, Some("stale_token".into())));
    assert_eq!(r.json()["error"]["highest_seen"].as_u64(), Some(4_294_967_301));
    assert_eq!(code(&get(&s, "etcd/counter", Some(135))), (409, Some("stale_token".into())));
    assert_eq!(get(&s, "etcd/counter", Some(4_294_967_302)).text(), "1");
    // The foreign prefix is no unfenced prefix: a write still needs its token.
    assert_eq!(code(&put(&s, "etcd/counter", None, "v")), (428, Some("token_required".into())));
    // Elsewhere a token never issued is still refused.
    assert_eq!(code(&put(&s, "counter", Some(135), "v")), (409, Some("token_not_issued".into())));
}
