//! The JSON of the HTTP API, version 1, as the client reads and writes it. Converted to
//! core types by hand at the edge.

use fenced_core::{LeaseId, Token};
use serde::Deserialize;

use crate::error::Error;

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

pub(crate) fn token(raw: u64) -> Result<Token, Error> {
    Token::new(raw).ok_or_else(|| bad_answer("the server sent token 0, which is never issued"))
}

pub(crate) fn lease_id(hex: &str) -> Result<LeaseId, Error> {
    LeaseId::from_hex(hex).ok_or_else(|| bad_answer(&format!("the server sent lease id '{hex}', not 32 hex digits")))
}

pub(crate) fn bad_answer(message: &str) -> Error {
    Error::Server { status: None, code: "bad_response".into(), message: message.into() }
}
