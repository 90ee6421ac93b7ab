//! issue 29: signed grants. With `grant_signing_key` every grant carries an Ed25519
//! signature over the service, the lock name and the token, with its key id, and
//! `GET /v1/keys` publishes the verifying keys: a verifier given them accepts the
//! real grant and refuses a forged token (the right number for another lock, or a
//! higher one) that has no valid signature. The key is made as a user would
//! (`openssl genpkey -algorithm ed25519`).

use std::path::{Path, PathBuf};
use std::process::Command;

use fenced_server::config::Config;
use fenced_server::signing::GrantSigner;
use ring::signature::{UnparsedPublicKey, ED25519};
use serde_json::Value;

use crate::harness::{scratch_dir, TestServer};

fn openssl_key(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("grant.pem");
    let out = Command::new("openssl").args(["genpkey", "-algorithm", "ed25519", "-out"]).arg(&path).output();
    let out = out.expect("openssl (Debian's openssl, installed by .ci/run)");
    assert!(out.status.success(), "openssl genpkey: {}", String::from_utf8_lossy(&out.stderr));
    path
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// What a resource's verifier does with the published keys: the key the grant names,
/// and the signature over (service, name, token).
fn verifies(keys: &Value, name: &str, token: u64, key_id: &str, signature: &str) -> bool {
    let service = keys["service"].as_str().unwrap();
    let Some(key) = keys["keys"].as_array().unwrap().iter().find(|k| k["key_id"] == key_id) else { return false };
    let public = UnparsedPublicKey::new(&ED25519, unhex(key["public_key"].as_str().unwrap()));
    public.verify(&fenced_core::grant_message(service, name, token), &unhex(signature)).is_ok()
}

#[test]
fn every_grant_is_signed_and_a_forged_token_does_not_verify() {
    let dir = scratch_dir();
    let key = openssl_key(&dir.join("keys"));
    let s = TestServer::with(move |c| {
        c.grant_signing_key = Some(key);
        c.grant_service = "payments-locks".into();
    });
    let (st, keys) = s.call("GET", "/v1/keys", "");
    assert_eq!(st, 200, "{keys}");
    assert_eq!(keys["service"], "payments-locks");
    assert_eq!(keys["keys"][0]["status"], "active");
    let (st, g) = s.acquire("acct", r#"{"ttl_ms":5000}"#);
    assert_eq!(st, 200, "{g}");
    let (token, key_id, sig) =
        (g["token"].as_u64().unwrap(), g["key_id"].as_str().unwrap(), g["signature"].as_str().unwrap());
    assert!(verifies(&keys, "acct", token, key_id, sig), "the real grant verifies");
    assert!(!verifies(&keys, "acct", token + 1, key_id, sig), "a higher token with that signature is refused");
    // The holder of another lock, whose token is higher, cannot pass it off as acct's.
    let (_, other) = s.acquire("unrelated", r#"{"ttl_ms":5000}"#);
    let (t2, s2) = (other["token"].as_u64().unwrap(), other["signature"].as_str().unwrap());
    assert!(t2 > token && verifies(&keys, "unrelated", t2, key_id, s2));
    assert!(!verifies(&keys, "acct", t2, key_id, s2), "a token of another lock is refused for acct");
    // Another service's identity: refused.
    let mut elsewhere = keys.clone();
    elsewhere["service"] = "other-service".into();
    assert!(!verifies(&elsewhere, "acct", token, key_id, sig));
    // A set: each grant signed for its own lock.
    let (st, set) = s.call("POST", "/v1/locks/acquire", r#"{"names":["s/a","s/b"],"ttl_ms":5000}"#);
    assert_eq!(st, 200, "{set}");
    for g in set["grants"].as_array().unwrap() {
        let (n, t) = (g["name"].as_str().unwrap(), g["token"].as_u64().unwrap());
        assert!(verifies(&keys, n, t, g["key_id"].as_str().unwrap(), g["signature"].as_str().unwrap()), "{g}");
    }
}

#[test]
fn without_a_key_grants_are_unsigned_and_keys_say_so() {
    let s = TestServer::start();
    let (_, g) = s.acquire("plain", r#"{"ttl_ms":5000}"#);
    assert!(g.get("signature").is_none() && g.get("key_id").is_none(), "{g}");
    let (st, e) = s.call("GET", "/v1/keys", "");
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("not_signing")), "{e}");
}

#[test]
fn a_rotation_publishes_the_retired_key_until_its_time_and_a_bad_key_is_refused_at_start() {
    let dir = scratch_dir();
    let key = openssl_key(&dir.join("keys"));
    let retired = "ab".repeat(32);
    let later = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3_600;
    let config = |until: u64| Config {
        grant_signing_key: Some(key.clone()),
        grant_retired_key: Some(retired.clone()),
        grant_retired_key_until: until,
        ..Config::default()
    };
    let signer = GrantSigner::load(&config(later)).unwrap().unwrap();
    let view = signer.keys_view(later - 10);
    assert_eq!(view["keys"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(
        (view["keys"][1]["status"].as_str(), view["keys"][1]["public_key"].as_str()),
        (Some("retired"), Some(retired.as_str()))
    );
    assert_eq!(signer.keys_view(later + 1)["keys"].as_array().unwrap().len(), 1, "gone after its time");
    let not_a_key = dir.join("keys/not.pem");
    std::fs::write(&not_a_key, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    let bad = GrantSigner::load(&Config { grant_signing_key: Some(not_a_key), ..Config::default() });
    assert!(bad.unwrap_err().contains("grant_signing_key"));
    let bad_retired = Config { grant_retired_key: Some("xyz".into()), ..config(later) };
    assert!(GrantSigner::load(&bad_retired).unwrap_err().contains("grant_retired_key"));
}

fn put(s: &TestServer, key: &str, token: u64, signature: Option<&str>, value: &[u8]) -> (u16, Value) {
    let t = token.to_string();
    let mut headers = vec![("Fencing-Token", t.as_str())];
    headers.extend(signature.map(|sig| ("Fencing-Signature", sig)));
    let r = s.request("PUT", &format!("/v1/store/{key}"), &headers, value);
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// The built-in store as a signing gate: a key under `signed_key_prefix` is guarded by
/// the lock the rule names, and takes only that lock's signed tokens. The outside
/// test's attack (the holder of an unrelated lock writes `acct/1` with its higher
/// token, so that the real holder is refused) is refused with the rule, and succeeds
/// without it: the control.
#[test]
fn a_signed_key_refuses_another_locks_token_and_a_forged_one_and_takes_its_own() {
    let dir = scratch_dir();
    let key = openssl_key(&dir.join("keys"));
    let k2 = key.clone();
    let s = TestServer::with(move |c| {
        c.grant_signing_key = Some(k2);
        c.signed_key_prefix = "acct/".into();
        c.signed_lock_prefix = "lock/acct/".into();
    });
    let (_, real) = s.acquire("lock/acct/1", r#"{"ttl_ms":5000}"#);
    let (_, other) = s.acquire("unrelated", r#"{"ttl_ms":5000}"#);
    let (t1, sig1) = (real["token"].as_u64().unwrap(), real["signature"].as_str().unwrap().to_string());
    let (t2, sig2) = (other["token"].as_u64().unwrap(), other["signature"].as_str().unwrap().to_string());
    assert!(t2 > t1);

    // Another lock's real, higher, signed token: refused, nothing changes.
    let (st, e) = put(&s, "acct/1", t2, Some(&sig2), b"hijack");
    assert_eq!((st, e["error"]["code"].as_str()), (403, Some("bad_signature")), "{e}");
    assert_eq!((e["error"]["token"].as_u64(), e["error"]["lock"].as_str()), (Some(t2), Some("lock/acct/1")), "{e}");
    // A forged token: the right lock, a number with the real holder's signature.
    let (st, e) = put(&s, "acct/1", t1 + 1, Some(&sig1), b"forged");
    assert_eq!((st, e["error"]["code"].as_str()), (403, Some("bad_signature")), "{e}");
    let (st, e) = put(&s, "acct/1", t1, Some("not hex"), b"junk");
    assert_eq!((st, e["error"]["code"].as_str()), (403, Some("bad_signature")), "{e}");
    // Two signatures, a good one among them: refused in either order.
    let t1s_ = t1.to_string();
    for pair in [[sig1.as_str(), "00"], ["00", sig1.as_str()]] {
        let headers =
            [("Fencing-Token", t1s_.as_str()), ("Fencing-Signature", pair[0]), ("Fencing-Signature", pair[1])];
        let r = s.request("PUT", "/v1/store/acct/1", &headers, b"two");
        assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    }
    // A key whose lock by the rule is no lock name: a clear 400, not a refusal.
    let long = format!("acct/{}", "k".repeat(250));
    let (st, e) = put(&s, &long, t1, Some(&sig1), b"x");
    assert_eq!((st, e["error"]["code"].as_str()), (400, Some("invalid_key")), "{e}");
    // No signature at all: 428, as no token is.
    let (st, e) = put(&s, "acct/1", t1, None, b"unsigned");
    assert_eq!((st, e["error"]["code"].as_str()), (428, Some("signature_required")), "{e}");
    // A fenced read is a decision too (it moves the mark).
    let t2s = t2.to_string();
    let r = s.request("GET", "/v1/store/acct/1", &[("Fencing-Token", &t2s), ("Fencing-Signature", &sig2)], b"");
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(s.get("/v1/store/acct/1").status, 404, "nothing was written, no mark was made");

    // The real holder is served, and its token's signature opens the key.
    let (st, w) = put(&s, "acct/1", t1, Some(&sig1), b"100");
    assert_eq!((st, w["highest_seen"].as_u64()), (200, Some(t1)), "{w}");
    let t1s = t1.to_string();
    let r = s.request("GET", "/v1/store/acct/1", &[("Fencing-Token", &t1s), ("Fencing-Signature", &sig1)], b"");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"100"[..]));
    // Keys outside the prefix are fenced as before.
    assert_eq!(put(&s, "plain", t2, None, b"x").0, 200);
    let metrics = String::from_utf8(s.get("/metrics").body).unwrap();
    assert!(metrics.contains("fenced_bad_signatures_total 6"), "{metrics}");

    // The wire protocol's PUT has no signature: a signed key refuses it, and says why.
    let mut wire = crate::wire::Wire::open(s.wire);
    let req = fenced_wire::Request::Put { key: "acct/1", token: fenced_core::Token::new(t1), value: b"via wire" };
    assert_eq!(wire.call(1, &req).code(), "signature_required");

    // The control: the same attack on a server without the rule succeeds, and shuts
    // the real holder out with a stale_token.
    let plain = TestServer::with(move |c| c.grant_signing_key = Some(key));
    let (_, real) = plain.acquire("acct/1", r#"{"ttl_ms":5000}"#);
    let (_, other) = plain.acquire("unrelated", r#"{"ttl_ms":5000}"#);
    let (t1, t2) = (real["token"].as_u64().unwrap(), other["token"].as_u64().unwrap());
    assert_eq!(put(&plain, "acct/1", t2, None, b"hijack").0, 200, "unsigned keys take another lock's token");
    let (st, e) = put(&plain, "acct/1", t1, None, b"100");
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("stale_token")), "{e}");
}

#[test]
fn a_signed_key_rule_is_checked_at_start() {
    let refused = |file: &str| Config::layered(Some(file), [], &[]).unwrap_err().to_string();
    assert!(refused("signed_key_prefix = \"acct/\"").contains("needs grant_signing_key"));
    assert!(refused("signed_lock_prefix = \"l/\"").contains("needs signed_key_prefix"));
    let overlap = "grant_signing_key = \"k.pem\"\nsigned_key_prefix = \"a/\"\nunfenced_prefix = \"a/demo/\"";
    assert!(refused(overlap).contains("must not overlap"), "{}", refused(overlap));
    let ok = Config::layered(Some("grant_signing_key = \"k.pem\"\nsigned_key_prefix = \"a/\""), [], &[]).unwrap();
    assert_eq!((ok.guarding_lock("a/x").as_deref(), ok.guarding_lock("b/x")), (Some("a/x"), None));
}
