//! The JSON bodies of the lock routes, asked and answered.

use super::*;

/// Exactly one of `lease_id` and `ttl_ms`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AcquireRequest)]
pub struct AcquireBody {
    /// A live lease to hold the lock under; with `ttl_ms`, the id the caller chose for
    /// the implicit lease (a retry under the same id gets the first attempt's grant, or
    /// waits beside it in the queue).
    #[schema(pattern = "^[0-9a-fA-F]{32}$")]
    pub(super) lease_id: Option<String>,
    /// An implicit lease for this request alone; bounds: `ttl_ms_min`, `ttl_ms_max`.
    pub(super) ttl_ms: Option<u64>,
    /// How long to queue server-side; 0 (the default) is a try-lock.
    #[serde(default)]
    pub(super) wait_ms: u64,
    /// Lock-delay after the holder's lease expires.
    #[serde(default)]
    pub(super) lock_delay_ms: u64,
    /// Who holds it, as the caller names itself (a host, a process, a job): shown in
    /// lock views and events, never a secret.
    #[schema(min_length = 1, max_length = 256)]
    pub(super) holder: Option<String>,
}

/// Several locks at once, all or nothing (`POST /v1/locks/acquire`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AcquireAllRequest)]
pub struct AcquireAllBody {
    /// 1 to 64 distinct lock names, in any order: granted together, never in part.
    #[schema(min_items = 1, max_items = 64)]
    pub(super) names: Vec<String>,
    /// As for one lock: a live lease, or with `ttl_ms` the implicit lease's own id.
    #[schema(pattern = "^[0-9a-fA-F]{32}$")]
    pub(super) lease_id: Option<String>,
    /// An implicit lease holding every lock of the request.
    pub(super) ttl_ms: Option<u64>,
    /// How long to wait for all of them together; 0 (the default) is a try-lock.
    #[serde(default)]
    pub(super) wait_ms: u64,
    #[serde(default)]
    pub(super) lock_delay_ms: u64,
    #[schema(min_length = 1, max_length = 256)]
    pub(super) holder: Option<String>,
}

/// Every lock of an acquire of several, under one lease: one grant per name, in the
/// names' sorted order, each with its own token.
#[derive(Serialize, ToSchema)]
pub struct GrantAll {
    pub(super) grants: Vec<Grant>,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub(super) lease_id: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ReleaseRequest)]
pub struct ReleaseBody {
    #[schema(pattern = "^[0-9a-fA-F]{32}$")]
    pub(super) lease_id: String,
}

/// An operator's release: empty, or the token it means to take (so that it never takes
/// the lock from a newer holder by mistake).
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
#[schema(as = RevokeRequest)]
pub struct RevokeBody {
    /// Take the lock only while this token holds it.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub(super) token: Option<u64>,
}

/// A lock taken from its holder: the token it held.
#[derive(Serialize, ToSchema)]
pub struct Revoked {
    pub(super) name: String,
    pub(super) token: u64,
    pub(super) revoked: bool,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CheckRequest)]
pub struct CheckBody {
    /// A token is at least 1.
    #[schema(minimum = 1)]
    pub(super) token: u64,
}

/// A grant: the fencing token to send with every write, and the lease holding it.
#[derive(Serialize, ToSchema)]
pub struct Grant {
    pub(super) name: String,
    #[schema(minimum = 1)]
    pub(super) token: u64,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub(super) lease_id: String,
    pub(super) ttl_ms: u64,
    /// With `grant_signing_key`: the Ed25519 signature (hex) over the service, the lock
    /// name and the token (docs/server.md, *Signed grants*).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{128}$")]
    pub(super) signature: Option<String>,
    /// The key that made `signature` (`GET /v1/keys`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{16}$")]
    pub(super) key_id: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Released {
    pub(super) name: String,
    pub(super) token: u64,
    pub(super) released: bool,
}

/// Whether the token is the current grant's, and the holder's token (null: free).
#[derive(Serialize, ToSchema)]
pub struct CheckResult {
    pub(super) name: String,
    pub(super) current: bool,
    #[schema(required = true)]
    pub(super) token: Option<u64>,
}

/// A lock as clients see it (the holder's lease id is never shown). A free lock has
/// `held` false and nulls.
#[derive(Serialize, ToSchema)]
pub struct LockView {
    pub(super) name: String,
    pub(super) held: bool,
    #[schema(required = true)]
    pub(super) token: Option<u64>,
    #[schema(required = true)]
    pub(super) expires_in_ms: Option<u64>,
    pub(super) waiters: usize,
    /// Lock-delay left, when the lock is blocked by one.
    #[schema(required = true)]
    pub(super) blocked_for_ms: Option<u64>,
    /// The holder's label, when held by a caller that gave one.
    #[schema(required = true)]
    pub(super) holder: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct LockList {
    pub(super) locks: Vec<LockView>,
}
