//! issue 29: signed grants at the gates. A service with `grant_signing_key` signs every
//! grant (HTTP and the wire protocol); a gate given its keys (`Client::grant_keys`)
//! refuses a token without a valid signature for the lock that guards the key: a
//! [`Verified`] SQLite gate, and the server's own store for keys under
//! `signed_key_prefix`. The same gate without keys takes the attacker's token: the
//! control that shows what the check stops.

use std::process::Command;

#[cfg(feature = "sqlite")]
use fenced_client::resource::sqlite::SqliteKv;
use fenced_client::{Error, Fenced, FencedResource, SignedToken, Token, Verified};

use crate::support::{Server, TempDir};

/// A server that signs grants, with keys under `acct/` taking signed tokens only; its
/// wire listener too.
pub async fn signing_server(dir: &TempDir) -> Server {
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

/// The scenario every adapter runs (SQLite here; PostgreSQL, S3 and DynamoDB in their
/// own files): behind [`Verified`], another lock's real, higher, signed token and a
/// forged number with a real signature are refused before the resource is touched, and
/// the holder's own token is taken; the same gate without keys (`inner()`) takes the
/// unrelated lock's token, and then refuses the real holder (the control).
pub async fn a_forged_token_is_refused_with_keys_and_taken_without<R: FencedResource + Sync>(gate: R, tag: &str) {
    let dir = TempDir::new("signed");
    let server = signing_server(&dir).await;
    let client = server.client();
    let keys = client.grant_keys().await.expect("GET /v1/keys");
    let lock = format!("signed/{tag}");
    let real = client.lock(&lock).acquire().await.expect("lock");
    let other = client.lock("unrelated").acquire().await.expect("lock");
    let (real_t, other_t) = (real.signed().expect("signed"), other.signed().expect("signed"));
    assert!(other_t.token > real_t.token, "one counter: the unrelated lock's token is higher");
    assert!(keys.verifies(&lock, real_t.token, &real_t.signature));

    let gate = Verified::one_lock(gate, keys.clone(), &lock);
    let key = format!("{tag}-acct");
    for attack in [other_t.clone(), forged(&real_t, (u64::MAX >> 1) - 1)] {
        match gate.write(&key, &attack, b"hijack").await {
            Err(Error::BadSignature { token, lock: l }) => {
                assert_eq!((token, l.as_str()), (attack.token, lock.as_str()))
            }
            r => panic!("expected a BadSignature refusal, got {r:?}"),
        }
        assert!(matches!(gate.read(&key, &attack).await, Err(Error::BadSignature { .. })));
    }
    assert_eq!(gate.write(&key, &real_t, b"100").await.unwrap(), Fenced::Accepted(()));
    assert_eq!(gate.read(&key, &real_t).await.unwrap(), Fenced::Accepted(Some(b"100".to_vec())));

    let plain = gate.inner();
    let control = format!("{tag}-control");
    assert!(plain.write(&control, other_t.token, b"hijack").await.unwrap().is_accepted());
    assert!(!plain.write(&control, real_t.token, b"100").await.unwrap().is_accepted(), "the holder is shut out");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_verified_sqlite_gate_refuses_forged_and_borrowed_tokens() {
    let dir = TempDir::new("signed-sqlite");
    let kv = SqliteKv::open(dir.path().join("v.sqlite"), "kv").unwrap();
    a_forged_token_is_refused_with_keys_and_taken_without(kv, "sqlite").await;
    // The rule naming a key's lock: the key's own name.
    let server = signing_server(&dir).await;
    let client = server.client();
    let keys = client.grant_keys().await.unwrap();
    let g = client.lock("rows/7").acquire().await.unwrap().signed().unwrap();
    let same = Verified::same_name(SqliteKv::open(dir.path().join("s.sqlite"), "kv").unwrap(), keys);
    assert!(same.write("rows/7", &g, b"x").await.unwrap().is_accepted());
    assert!(matches!(same.write("rows/8", &g, b"x").await, Err(Error::BadSignature { .. })), "another key's lock");
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
