//! Lease calls: create, keepalive, revoke.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use fenced_core::{LeaseError, LeaseId};
use serde::Deserialize;
use serde_json::json;

use super::{json, new_lease_id, parse_lease_id, ApiError, App, AppInner};
use crate::metrics::inc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateLease {
    ttl_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

pub async fn create(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let req: CreateLease = app.json_body(&headers, body).await?;
    let (id, ttl_ms) = create_lease(&app, req.ttl_ms).await?;
    Ok(json(StatusCode::CREATED, &json!({ "lease_id": id.to_hex(), "ttl_ms": ttl_ms })))
}

/// Creates a lease (HTTP and the wire protocol): its id and TTL.
pub async fn create_lease(app: &AppInner, ttl_ms: u64) -> Result<(LeaseId, u64), ApiError> {
    app.check_ttl(ttl_ms)?;
    app.ensure_ttl_hwm(ttl_ms).await?;
    let id = new_lease_id()?;
    let info = app.locks.with(|t, now| t.grant_lease(id, ttl_ms, now)).map_err(lease_error)?;
    inc(&app.metrics.leases_created);
    Ok((id, info.ttl_ms))
}

/// Keeps a lease alive (HTTP and the wire protocol): its TTL.
pub fn keepalive_lease(app: &AppInner, id: LeaseId) -> Result<u64, ApiError> {
    let info = app.locks.with(|t, now| t.keepalive(id, now)).map_err(lease_error)?;
    inc(&app.metrics.keepalives);
    Ok(info.ttl_ms)
}

/// Revokes a lease and releases its locks (HTTP and the wire protocol).
pub fn revoke_lease(app: &AppInner, id: LeaseId) -> Result<(), ApiError> {
    app.locks.with(|t, now| t.revoke(id, now)).map_err(lease_error)
}

pub async fn keepalive(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let _: Empty = app.json_body(&headers, body).await?;
    let id = parse_lease_id(&id)?;
    let ttl_ms = keepalive_lease(&app, id)?;
    Ok(json(StatusCode::OK, &json!({ "lease_id": id.to_hex(), "ttl_ms": ttl_ms })))
}

pub async fn revoke(State(app): State<App>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    revoke_lease(&app, parse_lease_id(&id)?)?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn lease_error(e: LeaseError) -> ApiError {
    match e {
        LeaseError::NotFound => ApiError::lease_not_found(),
        LeaseError::TtlOutOfRange { ttl_ms_min, ttl_ms_max } => {
            ApiError::bad_request("ttl_out_of_range", format!("ttl_ms must be between {ttl_ms_min} and {ttl_ms_max}"))
                .with("ttl_ms_min", ttl_ms_min)
                .with("ttl_ms_max", ttl_ms_max)
        }
        LeaseError::TooManyLeases { leases_max } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_leases",
            format!("the server holds its limit of {leases_max} leases"),
        )
        .with("limit", leases_max),
        LeaseError::AlreadyExists => ApiError::internal("a fresh random lease id collided with a live one"),
    }
}
