//! Lease calls: create, keepalive, revoke.

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use fenced_core::{Command, LeaseId, LeaseInfo};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::ErrorBody;
use super::responses::NotLeaderOrShuttingDown;
use super::{new_lease_id, parse_lease_id, reply, ApiError, App, AppInner, Caller};
use crate::identity::Op;
use crate::metrics::inc;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LeaseRequest)]
pub struct CreateLease {
    /// The lease's TTL; bounds: `ttl_ms_min`, `ttl_ms_max`.
    ttl_ms: u64,
}

/// A keepalive's body: empty, or `{}`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The path of a lease's routes, as the OpenAPI document describes it (the handlers
/// take the id as a plain `Path<String>` and parse it themselves).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct LeasePath {
    /// 32 hexadecimal digits
    #[param(pattern = "^[0-9a-fA-F]{32}$")]
    lease_id: String,
}

/// A lease: its id (the capability to keep alive, release and revoke) and TTL.
#[derive(Serialize, ToSchema)]
pub struct Lease {
    #[schema(pattern = "^[0-9a-f]{32}$")]
    lease_id: String,
    ttl_ms: u64,
}

#[utoipa::path(post, path = "/v1/leases", tag = "leases", operation_id = "create_lease", request_body = CreateLease,
    responses(
        (status = 201, description = "created", body = Lease),
        (status = 400, description = "invalid_json, invalid_field, ttl_out_of_range", body = ErrorBody),
        (status = 429, description = "too_many_leases", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
pub async fn create(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req: CreateLease = app.json_body(&headers, body).await?;
    let (id, ttl_ms) = create_lease(&app, &caller, req.ttl_ms).await?;
    Ok(reply(StatusCode::CREATED, &Lease { lease_id: id.to_hex(), ttl_ms }))
}

/// Creates a lease (HTTP and the wire protocol): its id, as the caller names it, and
/// its TTL. Any right to lock some name is the right to hold a lease.
pub async fn create_lease(app: &AppInner, caller: &Caller, ttl_ms: u64) -> Result<(LeaseId, u64), ApiError> {
    let r = async {
        caller.require_some(Op::Lock)?;
        let id = new_lease_id()?;
        let lease = caller.identity.lease(id);
        let info = app.locks.answered::<LeaseInfo>(Command::GrantLease { lease, ttl_ms }).await?;
        inc(&app.metrics.leases_created);
        Ok((id, info.ttl_ms))
    }
    .await;
    app.audit(caller, "lease_create", None, None, &r);
    r
}

/// Keeps a lease alive (HTTP and the wire protocol): its TTL.
pub async fn keepalive_lease(app: &AppInner, caller: &Caller, id: LeaseId) -> Result<u64, ApiError> {
    let r = async {
        caller.require_some(Op::Lock)?;
        let lease = caller.identity.lease(id);
        // The leader answers from memory (`Node::keepalive_here`: at once on a cluster
        // of one, after a quorum round on a larger one); for a lease past its time, or
        // on a member that is not leading, the log decides.
        let info = match app.locks.node.keepalive_here(lease).await {
            Some(answered) => {
                let info = answered.map_err(fenced_core::Error::from)?;
                inc(&app.metrics.keepalives_from_memory);
                info
            }
            None => app.locks.answered::<LeaseInfo>(Command::Keepalive { lease }).await?,
        };
        inc(&app.metrics.keepalives);
        Ok(info.ttl_ms)
    }
    .await;
    if app.audit.all || r.is_err() {
        app.audit(caller, "keepalive", None, None, &r);
    }
    r
}

/// Revokes a lease and releases its locks (HTTP and the wire protocol).
pub async fn revoke_lease(app: &AppInner, caller: &Caller, id: LeaseId) -> Result<(), ApiError> {
    let r = async {
        caller.require_some(Op::Lock)?;
        Ok(app.locks.answered(Command::Revoke { lease: caller.identity.lease(id) }).await?)
    }
    .await;
    app.audit(caller, "revoke", None, None, &r);
    r
}

#[utoipa::path(post, path = "/v1/leases/{lease_id}/keepalive", tag = "leases", operation_id = "keepalive", params(LeasePath),
    request_body(content = Option<Empty>, description = "empty, or {}"),
    responses(
        (status = 200, description = "kept alive: its TTL restarts", body = Lease),
        (status = 400, description = "invalid_lease_id, invalid_json, invalid_field", body = ErrorBody),
        (status = 404, description = "lease_not_found", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
pub async fn keepalive(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let _: Empty = app.json_body(&headers, body).await?;
    let id = parse_lease_id(&id)?;
    let ttl_ms = keepalive_lease(&app, &caller, id).await?;
    Ok(reply(StatusCode::OK, &Lease { lease_id: id.to_hex(), ttl_ms }))
}

#[utoipa::path(delete, path = "/v1/leases/{lease_id}", tag = "leases", operation_id = "revoke_lease", params(LeasePath),
    responses(
        (status = 204, description = "revoked: its locks are released, its waits end"),
        (status = 400, description = "invalid_lease_id", body = ErrorBody),
        (status = 404, description = "lease_not_found", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
pub async fn revoke(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    revoke_lease(&app, &caller, parse_lease_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
