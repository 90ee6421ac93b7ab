//! The lock routes as the OpenAPI document describes them: one path per action, though the
//! router serves them all on `/v1/locks/{*rest}`.

use super::*;

/// The path of a lock's routes, as the OpenAPI document describes it (the handlers
/// take the name as a plain `Path<String>`).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct LockPath {
    /// 1 to lock_name_bytes_max bytes of UTF-8 without control characters; '/' may be sent as %2F or as it is
    #[param(min_length = 1)]
    name: String,
}

// The three actions share one route (`/v1/locks/{*rest}`: a name may hold '/'); the
// document describes each as its own path.
#[utoipa::path(post, path = "/v1/locks/{name}/acquire", tag = "locks", operation_id = "acquire", params(LockPath), request_body = AcquireBody,
    responses(
        (status = 200, description = "granted", body = Grant),
        (status = 400, description = "invalid_json, invalid_field, invalid_name, invalid_holder, invalid_lease_id, ttl_out_of_range, wait_out_of_range, lock_delay_out_of_range", body = ErrorBody),
        (status = 404, description = "lease_not_found (also when the lease expires while waiting)", body = ErrorBody),
        (status = 409, description = "lock_held (with holder_token when held; also during lock-delay); lease_exists (lease_id with ttl_ms names a live lease that neither holds this lock nor waits for it as an implicit lease)", body = ErrorBody),
        TooLarge,
        (status = 429, description = "too_many_locks, too_many_waiters, too_many_leases", body = ErrorBody),
        RecoveringOrNotLeader,
    ))]
#[allow(dead_code)]
pub(super) fn doc_acquire() {}

#[utoipa::path(post, path = "/v1/locks/acquire", tag = "locks", operation_id = "acquire_all", request_body = AcquireAllBody,
    responses(
        (status = 200, description = "every lock granted, under one lease", body = GrantAll),
        (status = 400, description = "invalid_json, invalid_field, invalid_name, invalid_names (none, more than 64), invalid_holder, invalid_lease_id, ttl_out_of_range, wait_out_of_range, lock_delay_out_of_range", body = ErrorBody),
        (status = 403, description = "forbidden: the lock right on every name is needed", body = ErrorBody),
        (status = 404, description = "lease_not_found (also when the lease expires while waiting)", body = ErrorBody),
        (status = 409, description = "lock_held (not all free within the wait; holder_token of one that is held; also when the lease holds some of the names but not all); lease_exists", body = ErrorBody),
        TooLarge,
        (status = 429, description = "too_many_locks, too_many_waiters, too_many_leases", body = ErrorBody),
        RecoveringOrNotLeader,
    ))]
#[allow(dead_code)]
pub(super) fn doc_acquire_all() {}

#[utoipa::path(post, path = "/v1/locks/{name}/release", tag = "locks", operation_id = "release", params(LockPath), request_body = ReleaseBody,
    responses(
        (status = 200, description = "released", body = Released),
        (status = 400, description = "invalid_json, invalid_field, invalid_name, invalid_lease_id", body = ErrorBody),
        (status = 409, description = "not_holder", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
#[allow(dead_code)]
pub(super) fn doc_release() {}

#[utoipa::path(post, path = "/v1/locks/{name}/revoke", tag = "locks", operation_id = "revoke_lock", params(LockPath),
    request_body(content = Option<RevokeBody>, description = "empty, {}, or {\"token\": T} to take the lock only from that holder"),
    responses(
        (status = 200, description = "taken from its holder (the token it held); the next waiter is granted with a higher token", body = Revoked),
        (status = 400, description = "invalid_json, invalid_field, invalid_name, invalid_token", body = ErrorBody),
        (status = 403, description = "forbidden: the admin right on the name is needed", body = ErrorBody),
        (status = 409, description = "not_holder: nobody holds it, or another token does (holder_token)", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
#[allow(dead_code)]
pub(super) fn doc_revoke_lock() {}

#[utoipa::path(post, path = "/v1/locks/{name}/check", tag = "locks", operation_id = "check", params(LockPath), request_body = CheckBody,
    responses(
        (status = 200, description = "whether the token is the current grant's (CheckSequencer)", body = CheckResult),
        (status = 400, description = "invalid_json, invalid_field, invalid_name, invalid_token", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
#[allow(dead_code)]
pub(super) fn doc_check() {}
