//! Lease calls: create, keepalive, revoke.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use fenced_core::{Answer, Command, LeaseId, LeaseInfo};
use serde::Deserialize;
use serde_json::json;

use super::{json, new_lease_id, parse_lease_id, ApiError, App, AppInner};
use crate::locks::Reply;
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
    let id = new_lease_id()?;
    let info = lease_answer(app.locks.apply(Command::GrantLease { lease: id, ttl_ms }).await)?;
    inc(&app.metrics.leases_created);
    Ok((id, info.ttl_ms))
}

/// Keeps a lease alive (HTTP and the wire protocol): its TTL.
pub async fn keepalive_lease(app: &AppInner, id: LeaseId) -> Result<u64, ApiError> {
    let info = lease_answer(app.locks.apply(Command::Keepalive { lease: id }).await)?;
    inc(&app.metrics.keepalives);
    Ok(info.ttl_ms)
}

/// Revokes a lease and releases its locks (HTTP and the wire protocol).
pub async fn revoke_lease(app: &AppInner, id: LeaseId) -> Result<(), ApiError> {
    match app.locks.apply(Command::Revoke { lease: id }).await {
        Reply::Now(Ok(_)) => Ok(()),
        Reply::Now(Err(e)) => Err(e.into()),
        Reply::Queued { .. } => unreachable!("a revoke does not queue"),
    }
}

fn lease_answer(reply: Reply) -> Result<LeaseInfo, ApiError> {
    match reply {
        Reply::Now(Ok(Answer::Lease(info))) => Ok(info),
        Reply::Now(Err(e)) => Err(e.into()),
        _ => unreachable!("a lease command answers a lease at once"),
    }
}

pub async fn keepalive(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let _: Empty = app.json_body(&headers, body).await?;
    let id = parse_lease_id(&id)?;
    let ttl_ms = keepalive_lease(&app, id).await?;
    Ok(json(StatusCode::OK, &json!({ "lease_id": id.to_hex(), "ttl_ms": ttl_ms })))
}

pub async fn revoke(State(app): State<App>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    revoke_lease(&app, parse_lease_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
