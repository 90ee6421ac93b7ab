//! issue 29: signed grants at the gates. A service with `grant_signing_key` signs every
//! grant (HTTP and the wire protocol); a gate given its keys (`Client::grant_keys`)
//! refuses a token without a valid signature for the lock that guards the key: a
//! [`Verified`] SQLite gate, and the server's own store for keys under
//! `signed_key_prefix`. The same gate without keys takes the attacker's token: the
//! control that shows what the check stops.

use std::process::Command;

use fenced_client::resource::sqlite::SqliteKv;
use fenced_client::{Error, Fenced, SignedToken, Token, Verified};

use crate::support::{Server, TempDir};

/// A server that signs grants, with keys under `acct/` taking signed tokens only; its
/// wire listener too.
async fn signing_server(dir: &TempDir) -> Server {
    let key = dir.path().join("grant.pem");
    let out = Command::new("openssl").args(["genpkey", "-algorithm", "ed25519", "-out"]).arg(&key).output();
    let out = out.expect("openssl (installed by .ci/run)");
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    let config = dir.path().join("fenced.toml");
    let toml = format!("grant_signing_key = {:?}\nsigned_key_prefix = \"acct/\"\n", key.display().to_string());
    std::fs::write(&config, toml).unwrap();
    Server::start_wire(&["--config".to_string(), config.display().to_string()]).await
}

fn forged(of: &SignedToken, token: u64) -> SignedToken {
    SignedToken { token: Token::new(token).unwrap(), ..of.clone() }
}

#[tokio::test]
async fn a_verified_gate_refuses_forged_and_borrowed_tokens_and_the_unverified_one_takes_them() {
    let dir = TempDir::new("signed");
    let server = signing_server(&dir).await;
    let client = server.client();
    let keys = client.grant_keys().await.expect("GET /v1/keys");
    let real = client.lock("acct/1").acquire().await.expect("lock");
    let other = client.lock("unrelated").acquire().await.expect("lock");
    let (real_t, other_t) = (real.signed().expect("signed"), other.signed().expect("signed"));
    assert!(other_t.token > real_t.token, "one counter: the unrelated lock's token is higher");
    assert!(keys.verifies("acct/1", real_t.token, &real_t.signature));

    let gate = Verified::same_name(SqliteKv::open(dir.path().join("v.sqlite"), "kv").unwrap(), keys.clone());
    // Another lock's real, higher, signed token; a forged number with a real signature.
    for attack in [other_t.clone(), forged(&real_t, u64::MAX >> 1)] {
        match gate.write("acct/1", &attack, b"hijack").await {
            Err(Error::BadSignature { token, lock }) => assert_eq!((token, lock.as_str()), (attack.token, "acct/1")),
            r => panic!("expected a BadSignature refusal, got {r:?}"),
        }
        assert!(matches!(gate.read("acct/1", &attack).await, Err(Error::BadSignature { .. })));
    }
    assert_eq!(gate.write("acct/1", &real_t, b"100").await.unwrap(), Fenced::Accepted(()));
    assert_eq!(gate.read("acct/1", &real_t).await.unwrap(), Fenced::Accepted(Some(b"100".to_vec())));
    // One lock guarding every key: acct/1's signature opens another key too.
    let one = Verified::one_lock(SqliteKv::open(dir.path().join("o.sqlite"), "kv").unwrap(), keys, "acct/1");
    assert!(one.write("rows/7", &real_t, b"x").await.unwrap().is_accepted());
    assert!(matches!(one.write("rows/7", &other_t, b"x").await, Err(Error::BadSignature { .. })));

    // The control: the same SQLite gate without keys takes the unrelated lock's token,
    // and then refuses the real holder.
    use fenced_client::FencedResource;
    let plain = SqliteKv::open(dir.path().join("p.sqlite"), "kv").unwrap();
    assert!(plain.write("acct/1", other_t.token, b"hijack").await.unwrap().is_accepted());
    assert!(!plain.write("acct/1", real_t.token, b"100").await.unwrap().is_accepted(), "the holder is shut out");
}

#[tokio::test]
async fn the_servers_store_takes_signed_tokens_only_under_its_prefix() {
    let dir = TempDir::new("signed-store");
    let server = signing_server(&dir).await;
    let client = server.client();
    let store = client.store();
    let real = client.lock("acct/2").acquire().await.expect("lock");
    let other = client.lock("elsewhere").acquire().await.expect("lock");
    let (real_t, other_t) = (real.signed().unwrap(), other.signed().unwrap());
    match store.put_signed("acct/2", &other_t, b"hijack").await {
        Err(Error::BadSignature { token, lock }) => assert_eq!((token, lock.as_str()), (other_t.token, "acct/2")),
        r => panic!("expected BadSignature, got {r:?}"),
    }
    assert!(matches!(store.put("acct/2", real_t.token, b"unsigned").await, Err(Error::BadSignature { .. })));
    assert!(matches!(
        store.put_signed("acct/2", &forged(&real_t, real_t.token.get() + 5), b"f").await,
        Err(Error::BadSignature { .. })
    ));
    assert!(store.put_signed("acct/2", &real_t, b"100").await.unwrap().is_accepted());
    let read = store.get_signed("acct/2", &real_t).await.unwrap();
    assert!(matches!(read, Fenced::Accepted(r) if r.value.as_deref() == Some(&b"100"[..])));
    // Outside the prefix, fenced as ever: the other lock's token goes (the control).
    assert!(store.put("plain/2", other_t.token, b"x").await.unwrap().is_accepted());
}

#[tokio::test]
async fn grants_over_the_wire_carry_their_signatures() {
    let dir = TempDir::new("signed-wire");
    let server = signing_server(&dir).await;
    let keys = server.client().grant_keys().await.unwrap();
    let wire = server.wire_client();
    let one = wire.lock("w/one").acquire().await.expect("lock over the wire");
    let t = one.signed().expect("the wire grant frame carries the signature");
    assert!(keys.verifies("w/one", t.token, &t.signature));
    let set = wire.lock_all(["w/a", "w/b", "w/c"]).acquire().await.expect("a set over the wire");
    let signed = set.signed_tokens();
    assert_eq!(signed.len(), 3);
    for s in &signed {
        assert!(keys.verifies(s.lock.as_str(), s.token, &s.signature), "{s:?}");
    }
    assert!(!keys.verifies("w/a", signed[1].token, &signed[1].signature), "each signature is its own lock's");
    // A signed store call on the wire is refused here, with the reason, before it is sent.
    let err = wire.store().put_signed("acct/9", &t, b"x").await.unwrap_err();
    assert!(err.to_string().contains("wire protocol"), "{err}");
    // A server that does not sign: unsigned grants, and no keys.
    let plain = Server::start().await;
    assert!(plain.client().lock("u").acquire().await.unwrap().signed().is_none());
    assert!(matches!(plain.client().grant_keys().await, Err(Error::NotFound(_))));
}
