//! Lock calls: acquire (try, or wait server-side), release, check, and the views.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use fenced_core::{Acquire, Answer, Command, Error, Grant, LeaseId, LeaseRef, LockInfo, LockName, RequestId, Token};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{json, new_lease_id, parse_lease_id, ApiError, App, AppInner};
use crate::locks::{Locks, Reply};
use crate::metrics::inc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    lease_id: Option<String>,
    /// An implicit lease for this request alone.
    ttl_ms: Option<u64>,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    lease_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    token: u64,
}

/// `POST /v1/locks/{name}/{acquire|release|check}`; the name may hold `/`, encoded
/// as `%2F` or not: the action is the last segment.
pub async fn action(
    State(app): State<App>,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Some((name, action)) = rest.rsplit_once('/') else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "use /v1/locks/{name}/acquire, /release or /check",
        ));
    };
    match action {
        "acquire" => {
            let (name, req) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            acquire(app, name, req).await
        }
        "release" => {
            let (name, req): (_, ReleaseBody) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            let token = release_lock(&app, &name, parse_lease_id(&req.lease_id)?).await?;
            Ok(json(StatusCode::OK, &json!({ "name": name.as_str(), "token": token.get(), "released": true })))
        }
        "check" => {
            let (name, req): (_, CheckBody) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            let (current, holder) = check_token(&app, &name, req.token).await?;
            Ok(json(
                StatusCode::OK,
                &json!({ "name": name.as_str(), "current": current, "token": holder.map(Token::get) }),
            ))
        }
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", "use /v1/locks/{name}/acquire, /release or /check")),
    }
}

pub fn lock_name(app: &AppInner, name: &str) -> Result<LockName, ApiError> {
    LockName::with_len_max(name, app.config.lock_name_bytes_max).map_err(|e| {
        ApiError::bad_request("invalid_name", e.to_string()).with("len_max", app.config.lock_name_bytes_max)
    })
}

async fn acquire(app: App, name: LockName, req: AcquireBody) -> Result<Response, ApiError> {
    let lease = match (&req.lease_id, req.ttl_ms) {
        (Some(id), None) => Some(parse_lease_id(id)?),
        (None, Some(_)) => None,
        _ => return Err(ApiError::bad_request("invalid_field", "give exactly one of lease_id and ttl_ms")),
    };
    let req = AcquireReq { lease, ttl_ms: req.ttl_ms, wait_ms: req.wait_ms, lock_delay_ms: req.lock_delay_ms };
    acquire_grant(app, name, req).await.map(|g| grant_response(&g))
}

/// An acquire as every transport asks for it: exactly one of `lease` and `ttl_ms`.
pub struct AcquireReq {
    /// An existing lease to hold the lock under.
    pub lease: Option<LeaseId>,
    /// An implicit lease for this request alone.
    pub ttl_ms: Option<u64>,
    /// How long to queue server-side; 0 is a try-lock.
    pub wait_ms: u64,
    /// Lock-delay after a holder's lease expires.
    pub lock_delay_ms: u64,
}

/// Acquire (HTTP and the wire protocol): granted, or why not. Dropping the future
/// while it waits withdraws the request (the table ends an implicit lease with it, and
/// gives back a grant that raced the departure unless a twin request was told of it).
pub async fn acquire_grant(app: App, name: LockName, req: AcquireReq) -> Result<Grant, ApiError> {
    let lease = match (req.lease, req.ttl_ms) {
        (Some(id), None) => LeaseRef::Existing(id),
        (None, Some(ttl_ms)) => LeaseRef::Implicit { id: new_lease_id()?, ttl_ms },
        _ => return Err(ApiError::bad_request("invalid_field", "give exactly one of lease_id and ttl_ms")),
    };
    let wait_ms = req.wait_ms;
    let cmd = Command::Acquire(Acquire { name, lease, wait_ms, lock_delay_ms: req.lock_delay_ms });
    let answer = match app.locks.apply(cmd).await {
        Reply::Now(answer) => answer.map(|a| match a {
            Answer::Granted(g) => g,
            other => unreachable!("an acquire answered {other:?}"),
        }),
        Reply::Queued { id, rx } => {
            let mut wait = Wait { locks: &app.locks, id, done: false };
            let outcome = rx.await;
            wait.done = true;
            outcome.unwrap_or(Err(Error::ShuttingDown))
        }
    };
    if let (Ok(_), LeaseRef::Implicit { .. }) = (&answer, lease) {
        inc(&app.metrics.leases_created);
    }
    answer.map_err(|e| match e {
        Error::LockHeld { holder } => lock_held(holder, wait_ms),
        e => e.into(),
    })
}

/// A queued acquire whose handler may be dropped (client gone): on drop, the request
/// is withdrawn.
struct Wait<'a> {
    locks: &'a Locks,
    id: RequestId,
    done: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.locks.withdraw(self.id);
        }
    }
}

fn lock_held(holder: Option<Token>, wait_ms: u64) -> ApiError {
    let e = ApiError::from(Error::LockHeld { holder });
    if wait_ms == 0 {
        return e;
    }
    ApiError { message: format!("the lock was not granted within wait_ms {wait_ms}"), ..e }
}

fn grant_response(g: &Grant) -> Response {
    json(
        StatusCode::OK,
        &json!({ "name": g.name.as_str(), "token": g.token.get(), "lease_id": g.lease.to_hex(), "ttl_ms": g.ttl_ms }),
    )
}

/// Release (HTTP and the wire protocol): the released grant's token.
pub async fn release_lock(app: &AppInner, name: &LockName, lease: LeaseId) -> Result<Token, ApiError> {
    match app.locks.apply(Command::Release { name: name.clone(), lease }).await {
        Reply::Now(Ok(Answer::Released(token))) => Ok(token),
        Reply::Now(Err(e)) => Err(e.into()),
        _ => unreachable!("a release answers at once"),
    }
}

/// CheckSequencer (HTTP and the wire protocol): whether `raw` is the current grant,
/// and the holder's token.
pub async fn check_token(app: &AppInner, name: &LockName, raw: u64) -> Result<(bool, Option<Token>), ApiError> {
    let token = Token::new(raw).ok_or_else(|| ApiError::bad_request("invalid_token", "a token is at least 1"))?;
    Ok(app.locks.read(|t, _| t.check(name, token)).await?)
}

/// `GET /v1/locks/{name}`.
pub async fn get_one(State(app): State<App>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let name = lock_name(&app, &name)?;
    let (info, now) = app.locks.read(|t, now| (t.lock(&name), now)).await?;
    let v = match info {
        Some(info) => lock_view(&info, now),
        None => json!({ "name": name.as_str(), "held": false, "token": null, "waiters": 0 }),
    };
    Ok(json(StatusCode::OK, &v))
}

/// `GET /v1/locks?prefix=P&limit=N`.
pub async fn list(
    State(app): State<App>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (prefix, limit) = list_params(query, app.config.list_locks_max, app.config.lock_name_bytes_max, "lock name")?;
    let (locks, now) = app.locks.read(|t, now| (t.locks_with_prefix(&prefix, limit), now)).await?;
    let views: Vec<Value> = locks.iter().map(|l| lock_view(l, now)).collect();
    Ok(json(StatusCode::OK, &json!({ "locks": views })))
}

/// `prefix` and `limit` of a listing: the limit 1 to `max` (default `max`), the prefix
/// no longer than `prefix_bytes_max` (nothing longer could match).
pub(super) fn list_params(
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
    max: usize,
    prefix_bytes_max: usize,
    what: &str,
) -> Result<(String, usize), ApiError> {
    let Query(mut q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let limit = match q.get("limit") {
        None => max,
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| ApiError::bad_request("invalid_query", format!("limit is between 1 and {max}")))?,
    };
    let prefix = q.remove("prefix").unwrap_or_default();
    if prefix.len() > prefix_bytes_max {
        return Err(ApiError::bad_request("invalid_query", format!("the prefix is longer than any {what}")));
    }
    Ok((prefix, limit))
}

/// A lock as clients see it. The holder's lease id is not shown: it is the
/// capability to release.
fn lock_view(info: &LockInfo, now: u64) -> Value {
    let (token, expires_in_ms) = match &info.holder {
        Some((t, lease)) => (Some(t.get()), Some(lease.expires_at_ms.saturating_sub(now))),
        None => (None, None),
    };
    json!({
        "name": info.name.as_str(),
        "held": info.holder.is_some(),
        "token": token,
        "expires_in_ms": expires_in_ms,
        "waiters": info.waiters,
        "blocked_for_ms": info.blocked_until_ms.map(|b| b.saturating_sub(now)),
    })
}
