//! Server-sent events: what the lock service and the fenced store publish.
//!
//! Lease ids never appear here: a lease id is the capability to release or revoke.

use serde::Serialize;
use utoipa::ToSchema;

/// The `type` field names the event; `at_ms` is the lock table's time.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Granted {
        at_ms: u64,
        name: String,
        token: u64,
        ttl_ms: u64,
        /// The holder's label, when it gave one.
        #[serde(skip_serializing_if = "Option::is_none")]
        holder: Option<String>,
    },
    /// Released explicitly (`reason` "released") or by a lease revoke ("revoked").
    Released {
        at_ms: u64,
        name: String,
        token: u64,
        reason: &'static str,
    },
    /// Released because the holder's lease expired.
    Expired {
        at_ms: u64,
        name: String,
        token: u64,
    },
    StoreAccepted {
        at_ms: u64,
        key: String,
        token: u64,
        op: &'static str,
    },
    StoreRejected {
        at_ms: u64,
        key: String,
        token: u64,
        highest_seen: u64,
        op: &'static str,
    },
}

impl Event {
    /// The lock or store key it is about, and the right an identity needs to see it.
    pub fn subject(&self) -> (crate::identity::Op, &str) {
        use crate::identity::Op;
        match self {
            Event::Granted { name, .. } | Event::Released { name, .. } | Event::Expired { name, .. } => {
                (Op::Lock, name)
            }
            Event::StoreAccepted { key, .. } | Event::StoreRejected { key, .. } => (Op::StoreRead, key),
        }
    }

    /// The SSE `event:` field.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Granted { .. } => "granted",
            Event::Released { .. } => "released",
            Event::Expired { .. } => "expired",
            Event::StoreAccepted { .. } => "store_accepted",
            Event::StoreRejected { .. } => "store_rejected",
        }
    }
}
