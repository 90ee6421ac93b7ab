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
