//! The JSON of the HTTP API, version 1, as the client reads and writes it: the client's
//! text edge, where lease ids and tokens are parsed into their core types once (the
//! wire protocol carries them typed already). Converted by hand at the edge.

use fenced_core::{LeaseId, Token};
use serde::Deserialize;

use crate::conn::Granted;
use crate::error::{bad_answer, Error};

/// `POST /v1/locks/{name}/acquire` → 200.
#[derive(Deserialize, Debug)]
pub(crate) struct GrantBody {
    pub name: String,
    pub token: u64,
    pub lease_id: String,
    pub ttl_ms: u64,
    /// The service's signature (hex), when it signs grants.
    #[serde(default)]
    pub signature: Option<String>,
}

impl GrantBody {
    /// The grant, its token and lease typed.
    pub fn typed(self) -> Result<Granted, Error> {
        let (token, lease) = (token(self.token)?, lease_id(&self.lease_id)?);
        Ok(Granted { name: self.name, token, lease, ttl_ms: self.ttl_ms, signature: self.signature })
    }
}

/// `POST /v1/locks/acquire` → 200: every lock of the set, under one lease.
#[derive(Deserialize, Debug)]
pub(crate) struct GrantAllBody {
    pub grants: Vec<GrantBody>,
}

/// `POST /v1/leases/{id}/keepalive` → 200, `POST /v1/leases` → 201.
#[derive(Deserialize, Debug)]
pub(crate) struct LeaseBody {
    pub lease_id: String,
    pub ttl_ms: u64,
}

impl LeaseBody {
    /// The lease's id, typed, and its TTL.
    pub fn typed(self) -> Result<(LeaseId, u64), Error> {
        Ok((lease_id(&self.lease_id)?, self.ttl_ms))
    }
}

/// `PUT /v1/store/{key}` → 200.
#[derive(Deserialize, Debug)]
pub(crate) struct StoreBody {
    #[allow(dead_code)] // echoes the key
    pub key: String,
    pub token: u64,
    pub highest_seen: u64,
}

/// `POST /v1/locks/{name}/check` → 200.
#[derive(Deserialize, Debug)]
pub(crate) struct CheckBody {
    pub current: bool,
    #[serde(default)]
    pub token: Option<u64>,
}

impl CheckBody {
    /// Whether the token is current, and the holder's token (none: 0 or absent).
    pub fn typed(self) -> (bool, Option<Token>) {
        (self.current, self.token.and_then(Token::new))
    }
}

pub(crate) fn token(raw: u64) -> Result<Token, Error> {
    Token::new(raw).ok_or_else(|| bad_answer("the server sent token 0, which is never issued"))
}

fn lease_id(hex: &str) -> Result<LeaseId, Error> {
    LeaseId::from_hex(hex).ok_or_else(|| bad_answer(&format!("the server sent lease id '{hex}', not 32 hex digits")))
}
