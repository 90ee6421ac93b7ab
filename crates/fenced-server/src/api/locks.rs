//! Lock calls: acquire (try, or wait server-side), release, check, and the views.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use fenced_core::table::{Acquire, WaitEnd};
use fenced_core::{AcquireError, Grant, LeaseId, LockInfo, LockName, ReleaseError, Token, WaiterId};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{json, new_lease_id, parse_lease_id, ApiError, App, AppInner};
use crate::locks::{Locks, Started, WaitOutcome};
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
            let token = release_lock(&app, &name, parse_lease_id(&req.lease_id)?)?;
            Ok(json(StatusCode::OK, &json!({ "name": name.as_str(), "token": token.get(), "released": true })))
        }
        "check" => {
            let (name, req): (_, CheckBody) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            let (current, holder) = check_token(&app, &name, req.token)?;
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
/// while it waits withdraws the waiter (and revokes an implicit lease).
pub async fn acquire_grant(app: App, name: LockName, req: AcquireReq) -> Result<Grant, ApiError> {
    let (lease, implicit) = match (req.lease, req.ttl_ms) {
        (Some(id), None) => (id, None),
        (None, Some(ttl_ms)) => {
            app.check_ttl(ttl_ms)?;
            check_wait(&app, req.wait_ms, req.lock_delay_ms)?;
            app.ensure_ttl_hwm(ttl_ms).await?;
            let id = new_lease_id()?;
            app.locks.with(|t, now| t.grant_lease(id, ttl_ms, now)).map_err(super::leases::lease_error)?;
            inc(&app.metrics.leases_created);
            (id, Some(id))
        }
        _ => return Err(ApiError::bad_request("invalid_field", "give exactly one of lease_id and ttl_ms")),
    };
    let result = acquire_with(&app, name, lease, implicit, &req).await;
    if result.is_err() {
        if let Some(id) = implicit {
            // The implicit lease exists only for a grant; no grant, no lease.
            let _ = app.locks.with(|t, now| t.revoke(id, now));
        }
    }
    result
}

fn check_wait(app: &AppInner, wait_ms: u64, lock_delay_ms: u64) -> Result<(), ApiError> {
    let c = &app.config;
    if wait_ms > c.wait_ms_max {
        return Err(ApiError::bad_request("wait_out_of_range", format!("wait_ms is at most {}", c.wait_ms_max))
            .with("wait_ms_max", c.wait_ms_max));
    }
    if lock_delay_ms > c.lock_delay_ms_max {
        return Err(ApiError::bad_request(
            "lock_delay_out_of_range",
            format!("lock_delay_ms is at most {}", c.lock_delay_ms_max),
        )
        .with("lock_delay_ms_max", c.lock_delay_ms_max));
    }
    Ok(())
}

async fn acquire_with(
    app: &AppInner,
    name: LockName,
    lease: LeaseId,
    implicit: Option<LeaseId>,
    req: &AcquireReq,
) -> Result<Grant, ApiError> {
    check_wait(app, req.wait_ms, req.lock_delay_ms)?;
    let wait_ms = req.wait_ms;
    let cmd = Acquire { name: name.clone(), lease, wait_ms, lock_delay_ms: req.lock_delay_ms };
    match app.locks.acquire(cmd, implicit).map_err(acquire_error)? {
        Started::Granted(g) => Ok(g),
        Started::NotGranted { in_grace: true, .. } => {
            let left = app.grace_until_ms.saturating_sub(app.locks.now_ms());
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "recovering",
                "the server restarted and grants nothing until every lease of before the restart has expired",
            )
            .with("retry_after_ms", left))
        }
        Started::NotGranted { holder, .. } => Err(lock_held(holder, wait_ms)),
        Started::Closed => Err(ApiError::shutting_down()),
        Started::Queued { id, rx, .. } => {
            let mut wait = Wait { locks: &app.locks, id, rx, implicit, done: false };
            let outcome = match implicit {
                None => (&mut wait.rx).await,
                // An implicit lease lives as long as its request waits: the open
                // request is the proof of life. Its TTL restarts at the grant.
                Some(lease) => {
                    let ttl_ms = app.locks.with(|t, now| t.lease(lease, now).map_or(0, |l| l.ttl_ms));
                    let period = std::time::Duration::from_millis((ttl_ms / 3).max(1));
                    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    loop {
                        tokio::select! {
                            r = &mut wait.rx => break r,
                            _ = tick.tick() => drop(app.locks.with(|t, now| t.keepalive(lease, now))),
                        }
                    }
                }
            };
            wait.done = true;
            match outcome {
                Ok(WaitOutcome::Granted(g)) => Ok(g),
                Ok(WaitOutcome::Ended(WaitEnd::LeaseGone)) => Err(ApiError::lease_not_found()),
                Ok(WaitOutcome::Ended(_)) => {
                    let holder = app.locks.with(|t, now| t.check(&name, Token::FIRST, now).1);
                    Err(lock_held(holder, wait_ms))
                }
                Err(_) => Err(ApiError::shutting_down()),
            }
        }
    }
}

/// A queued acquire whose handler may be dropped (client gone): on drop, it leaves
/// the queue, and a grant that raced in is given back.
struct Wait<'a> {
    locks: &'a Locks,
    id: WaiterId,
    rx: oneshot::Receiver<WaitOutcome>,
    implicit: Option<LeaseId>,
    done: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.locks.abandon(self.id, &mut self.rx, self.implicit);
        }
    }
}

fn lock_held(holder: Option<Token>, wait_ms: u64) -> ApiError {
    let message = match holder {
        Some(_) if wait_ms == 0 => "the lock is held".to_string(),
        Some(_) => format!("the lock was not granted within wait_ms {wait_ms}"),
        None if wait_ms == 0 => "the lock is free but in lock-delay after its holder's lease expired".to_string(),
        None => format!("the lock was not granted within wait_ms {wait_ms}"),
    };
    let e = ApiError::new(StatusCode::CONFLICT, "lock_held", message);
    match holder {
        Some(t) => e.with("holder_token", t.get()),
        None => e,
    }
}

fn acquire_error(e: AcquireError) -> ApiError {
    match e {
        AcquireError::LeaseNotFound => ApiError::lease_not_found(),
        AcquireError::TooManyLocks { locks_max } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_locks",
            format!("the server holds its limit of {locks_max} locks"),
        )
        .with("limit", locks_max),
        AcquireError::TooManyWaiters { waiters_max } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_waiters",
            format!("the waiter limit of {waiters_max} is reached"),
        )
        .with("limit", waiters_max),
        AcquireError::WaitOutOfRange { wait_ms_max } => {
            ApiError::bad_request("wait_out_of_range", format!("wait_ms is at most {wait_ms_max}"))
                .with("wait_ms_max", wait_ms_max)
        }
        AcquireError::LockDelayOutOfRange { lock_delay_ms_max } => {
            ApiError::bad_request("lock_delay_out_of_range", format!("lock_delay_ms is at most {lock_delay_ms_max}"))
                .with("lock_delay_ms_max", lock_delay_ms_max)
        }
    }
}

fn grant_response(g: &Grant) -> Response {
    json(
        StatusCode::OK,
        &json!({ "name": g.name.as_str(), "token": g.token.get(), "lease_id": g.lease.to_hex(), "ttl_ms": g.ttl_ms }),
    )
}

/// Release (HTTP and the wire protocol): the released grant's token.
pub fn release_lock(app: &AppInner, name: &LockName, lease: LeaseId) -> Result<Token, ApiError> {
    match app.locks.with(|t, now| t.release(name, lease, now)) {
        Ok(token) => Ok(token),
        Err(ReleaseError::NotHolder { .. }) => {
            Err(ApiError::new(StatusCode::CONFLICT, "not_holder", "this lease does not hold the lock"))
        }
    }
}

/// CheckSequencer (HTTP and the wire protocol): whether `raw` is the current grant,
/// and the holder's token.
pub fn check_token(app: &AppInner, name: &LockName, raw: u64) -> Result<(bool, Option<Token>), ApiError> {
    let token = Token::new(raw).ok_or_else(|| ApiError::bad_request("invalid_token", "a token is at least 1"))?;
    Ok(app.locks.with(|t, now| t.check(name, token, now)))
}

/// `GET /v1/locks/{name}`.
pub async fn get_one(State(app): State<App>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let name = lock_name(&app, &name)?;
    let (info, now) = app.locks.with(|t, now| (t.lock(&name, now), now));
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
    let (locks, now) = app.locks.with(|t, now| (t.locks_with_prefix(&prefix, limit, now), now));
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
