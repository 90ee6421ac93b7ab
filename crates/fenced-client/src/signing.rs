//! Verifying signed grants offline. With `grant_signing_key` the service signs every
//! grant: an Ed25519 signature over its identity, the lock's name and the token
//! ([`fenced_core::grant_message`]). A resource given the verifying keys
//! ([`GrantKeys`], from `GET /v1/keys` once, or from configuration) can tell a token
//! the service issued for the lock that guards it from a forged number or another
//! lock's token, without asking the service. A signature proves the service issued
//! that token for that lock; it does not prove the holder still holds it: the
//! resource's mark does that, so a gate checks both.

use std::time::{SystemTime, UNIX_EPOCH};

use fenced_core::{unhex, Token};
use ring::signature::{UnparsedPublicKey, ED25519};
use serde_json::Value;

use crate::error::Error;

/// A verifying key and until when (Unix seconds) it verifies; `None`: while published.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    public: Vec<u8>,
    until_unix: Option<u64>,
}

/// The keys that verify one service's grant signatures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantKeys {
    service: String,
    keys: Vec<Key>,
}

impl GrantKeys {
    /// The keys of `service` (its `grant_service`), each an Ed25519 public key as 64
    /// hex digits (`GET /v1/keys`'s `public_key`).
    pub fn new<'a>(service: &str, public_keys: impl IntoIterator<Item = &'a str>) -> Result<GrantKeys, Error> {
        let keys = public_keys.into_iter().map(|k| Ok(Key { public: public_key(k)?, until_unix: None }));
        GrantKeys::checked(service, keys.collect::<Result<Vec<_>, Error>>()?)
    }

    /// The body of `GET /v1/keys`: the service and its keys, a retired one verifying
    /// until its `valid_until_unix`.
    pub fn from_json(body: &Value) -> Result<GrantKeys, Error> {
        let bad = |what: &str| Error::BadRequest(format!("not a /v1/keys document: {what}"));
        let service = body["service"].as_str().ok_or_else(|| bad("no service"))?;
        let keys = body["keys"].as_array().ok_or_else(|| bad("no keys"))?;
        let keys = keys.iter().map(|k| {
            if k["algorithm"] != "ed25519" {
                return Err(bad("a key that is not ed25519"));
            }
            let public = public_key(k["public_key"].as_str().ok_or_else(|| bad("a key without public_key"))?)?;
            Ok(Key { public, until_unix: k["valid_until_unix"].as_u64() })
        });
        GrantKeys::checked(service, keys.collect::<Result<Vec<_>, Error>>()?)
    }

    fn checked(service: &str, keys: Vec<Key>) -> Result<GrantKeys, Error> {
        if keys.is_empty() || service.is_empty() {
            return Err(Error::BadRequest("grant keys need a service and at least one key".into()));
        }
        Ok(GrantKeys { service: service.to_string(), keys })
    }

    /// Whether `signature` (hex) is the service's for `token` of lock `lock`, by a key
    /// that verifies now.
    pub fn verifies(&self, lock: &str, token: Token, signature: &str) -> bool {
        let Some(sig) = unhex(signature.trim()).filter(|s| s.len() == 64) else { return false };
        let message = fenced_core::grant_message(&self.service, lock, token.get());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.keys
            .iter()
            .filter(|k| k.until_unix.is_none_or(|until| until > now))
            .any(|k| UnparsedPublicKey::new(&ED25519, &k.public).verify(&message, &sig).is_ok())
    }

    /// [`verifies`](Self::verifies) as a refusal: `Error::BadSignature` for a token
    /// without a valid signature (none given counts as none valid).
    pub fn check(&self, lock: &str, token: Token, signature: Option<&str>) -> Result<(), Error> {
        if signature.is_some_and(|s| self.verifies(lock, token, s)) {
            return Ok(());
        }
        Err(Error::BadSignature { token, lock: lock.to_string() })
    }
}

fn public_key(text: &str) -> Result<Vec<u8>, Error> {
    unhex(text)
        .filter(|k| k.len() == 32)
        .ok_or_else(|| Error::BadRequest(format!("'{text}' is not an Ed25519 public key (64 hex digits)")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_core::hex;
    use ring::rand::SystemRandom;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    fn signer() -> Ed25519KeyPair {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap()
    }

    #[test]
    fn a_real_signature_verifies_and_every_change_of_it_does_not() {
        let key = signer();
        let keys = GrantKeys::new("svc", [hex(key.public_key().as_ref()).as_str()]).unwrap();
        let t = Token::new(41).unwrap();
        let sig = hex(key.sign(&fenced_core::grant_message("svc", "acct", 41)).as_ref());
        assert!(keys.verifies("acct", t, &sig));
        assert!(keys.check("acct", t, Some(&sig)).is_ok());
        assert!(!keys.verifies("acct", Token::new(42).unwrap(), &sig), "another token");
        assert!(!keys.verifies("other", t, &sig), "another lock");
        assert!(!keys.verifies("acct", t, "zz"), "not hex");
        let other_service = GrantKeys::new("svc2", [hex(key.public_key().as_ref()).as_str()]).unwrap();
        assert!(!other_service.verifies("acct", t, &sig), "another service");
        assert!(matches!(keys.check("acct", t, None), Err(Error::BadSignature { .. })));
    }

    #[test]
    fn a_retired_key_verifies_until_its_time() {
        let key = signer();
        let public = hex(key.public_key().as_ref());
        let sig = hex(key.sign(&fenced_core::grant_message("s", "l", 3)).as_ref());
        let doc = |until: u64| {
            serde_json::json!({"service": "s", "keys": [
                {"algorithm": "ed25519", "public_key": "00".repeat(32), "valid_until_unix": null},
                {"algorithm": "ed25519", "public_key": public, "valid_until_unix": until},
            ]})
        };
        let t = Token::new(3).unwrap();
        assert!(GrantKeys::from_json(&doc(u64::MAX)).unwrap().verifies("l", t, &sig));
        assert!(!GrantKeys::from_json(&doc(1)).unwrap().verifies("l", t, &sig), "past its time");
        assert!(GrantKeys::from_json(&serde_json::json!({"service": "s", "keys": []})).is_err());
    }
}
