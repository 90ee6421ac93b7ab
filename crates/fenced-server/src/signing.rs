//! Signed grants: every grant carries an Ed25519 signature over the service's identity,
//! the lock name and the token ([`fenced_core::grant_message`]), with the id of the key
//! that made it, so a resource other than Fenced's own store can tell a token this
//! service issued for that lock from a forged or borrowed one, offline. Every member is
//! given the same key (`grant_signing_key`), so a failover changes nothing; a retired
//! key (`grant_retired_key`) stays published for verification until its stated time.
//!
//! A signature proves the service issued that token for that lock. It does not prove
//! the holder still holds it: the resource's mark does that.

use std::path::Path;

use fenced_core::{hex, unhex};
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde_json::{json, Value};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer;

use crate::config::Config;

/// The key id: the first 8 bytes of the public key, in hex.
pub fn key_id(public_key: &[u8]) -> String {
    hex(&public_key[..8.min(public_key.len())])
}

/// A verifying key that no longer signs, published until `until_unix`.
#[derive(Debug)]
struct Retired {
    public_hex: String,
    public: Vec<u8>,
    until_unix: u64,
}

/// The service's signing key, loaded once at start.
#[derive(Debug)]
pub struct GrantSigner {
    service: String,
    key: Ed25519KeyPair,
    key_id: String,
    public_hex: String,
    retired: Option<Retired>,
}

/// A grant's signature and the key that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub key_id: String,
    pub signature: String,
}

impl GrantSigner {
    /// The signer `config` names, or none without `grant_signing_key`. The key is an
    /// Ed25519 private key in PKCS#8 (PEM, as `openssl genpkey -algorithm ed25519` writes it).
    pub fn load(config: &Config) -> Result<Option<GrantSigner>, String> {
        let Some(path) = &config.grant_signing_key else { return Ok(None) };
        let key = read_key(path)?;
        let public = key.public_key().as_ref().to_vec();
        let retired = match &config.grant_retired_key {
            None => None,
            Some(h) => {
                let ok = h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit());
                if !ok {
                    return Err("grant_retired_key must be an Ed25519 public key: 64 hex digits".into());
                }
                let public_hex = h.to_ascii_lowercase();
                let public = unhex(&public_hex).ok_or("grant_retired_key: not hex")?;
                Some(Retired { public_hex, public, until_unix: config.grant_retired_key_until })
            }
        };
        let (key_id, public_hex) = (key_id(&public), hex(&public));
        Ok(Some(GrantSigner { service: config.grant_service.clone(), key, key_id, public_hex, retired }))
    }

    /// The signature of `token` for lock `name`.
    pub fn sign(&self, name: &str, token: u64) -> Signature {
        Signature { key_id: self.key_id.clone(), signature: hex(&self.sign_bytes(name, token)) }
    }

    /// The signature's 64 bytes, as the wire protocol's grant frames carry it.
    pub fn sign_bytes(&self, name: &str, token: u64) -> Vec<u8> {
        self.key.sign(&fenced_core::grant_message(&self.service, name, token)).as_ref().to_vec()
    }

    /// Whether `signature` (hex) is this service's for `token` of lock `name`, by the
    /// active key or by the retired one while it is still published.
    pub fn verifies(&self, name: &str, token: u64, signature: &str, now_unix: u64) -> bool {
        let Some(sig) = unhex(signature).filter(|s| s.len() == 64) else { return false };
        let message = fenced_core::grant_message(&self.service, name, token);
        let check = |public: &[u8]| UnparsedPublicKey::new(&ED25519, public).verify(&message, &sig).is_ok();
        check(self.key.public_key().as_ref())
            || self.retired.as_ref().is_some_and(|r| r.until_unix > now_unix && check(&r.public))
    }

    /// `GET /v1/keys`: the service's identity and every key a verifier should accept.
    pub fn keys_view(&self, now_unix: u64) -> Value {
        let mut keys = vec![json!({
            "key_id": self.key_id, "algorithm": "ed25519", "public_key": self.public_hex,
            "status": "active", "valid_until_unix": null,
        })];
        if let Some(r) = self.retired.as_ref().filter(|r| r.until_unix > now_unix) {
            keys.push(json!({
                "key_id": r.public_hex[..16], "algorithm": "ed25519", "public_key": r.public_hex,
                "status": "retired", "valid_until_unix": r.until_unix,
            }));
        }
        json!({ "service": self.service, "keys": keys })
    }
}

fn read_key(path: &Path) -> Result<Ed25519KeyPair, String> {
    let what = |e: &dyn std::fmt::Display| format!("grant_signing_key {}: {e}", path.display());
    let der = PrivatePkcs8KeyDer::from_pem_file(path).map_err(|e| what(&e))?;
    // openssl writes PKCS#8 v1 (no public key inside); ring's checked parse wants v2.
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).map_err(|e| what(&e))
}
