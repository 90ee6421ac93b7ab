//! Lock calls: acquire (try, or wait server-side), release, check, and the views.

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use fenced_core::{
    Acquire, AcquireAll, Answer, Command, Error, LeaseId, LeaseRef, LockInfo, LockName, RequestId, Token,
    HOLDER_BYTES_MAX, LOCK_NAMES_MAX,
};
use fenced_wire::Detail;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::ErrorBody;
use super::query::{ListQuery, QueryMap};
use super::responses::{InvalidQuery, NotLeaderOrShuttingDown, RecoveringOrNotLeader, TooLarge};
use super::{new_lease_id, parse_lease_id, reply, ApiError, App, AppInner, Caller};
use crate::identity::Op;
use crate::locks::{narrow, Locks, Reply};
use crate::metrics::inc;

mod body;
pub(super) mod paths;

pub use body::*;
use paths::LockPath;

/// `POST /v1/locks/{name}/{acquire|release|check}`; the name may hold `/`, encoded
/// as `%2F` or not: the action is the last segment.
pub async fn action(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    if rest == "acquire" {
        let req: AcquireAllBody = app.json_body(&headers, body).await?;
        return acquire_all(app, caller, req).await;
    }
    let Some((name, action)) = rest.rsplit_once('/') else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "use /v1/locks/{name}/acquire, /release, /check or /revoke",
        ));
    };
    match action {
        "acquire" => {
            let (name, req) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            acquire(app, caller, name, req).await
        }
        "release" => {
            let (name, req): (_, ReleaseBody) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            let token = release_lock(&app, &caller, &name, parse_lease_id(&req.lease_id)?).await?;
            Ok(reply(StatusCode::OK, &Released { name: name.as_str().into(), token: token.get(), released: true }))
        }
        "revoke" => {
            let (name, req): (_, RevokeBody) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            let token = revoke_lock(&app, &caller, &name, req.token).await?;
            Ok(reply(StatusCode::OK, &Revoked { name: name.as_str().into(), token: token.get(), revoked: true }))
        }
        "check" => {
            let (name, req): (_, CheckBody) = (lock_name(&app, name)?, app.json_body(&headers, body).await?);
            let (current, holder) = check_token(&app, &caller, &name, req.token).await?;
            let token = holder.map(Token::get);
            Ok(reply(StatusCode::OK, &CheckResult { name: name.as_str().into(), current, token }))
        }
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "use /v1/locks/{name}/acquire, /release, /check or /revoke",
        )),
    }
}

pub fn lock_name(app: &AppInner, name: &str) -> Result<LockName, ApiError> {
    LockName::with_len_max(name, app.config.lock_name_bytes_max).map_err(|e| {
        ApiError::bad_request("invalid_name", e.to_string()).with(Detail::LenMax(app.config.lock_name_bytes_max as u64))
    })
}

async fn acquire(app: App, caller: Caller, name: LockName, req: AcquireBody) -> Result<Response, ApiError> {
    let lease = match (&req.lease_id, req.ttl_ms) {
        (Some(id), _) => Some(parse_lease_id(id)?),
        (None, Some(_)) => None,
        (None, None) => return Err(ApiError::bad_request("invalid_field", "give lease_id, ttl_ms, or both")),
    };
    let holder = holder_label(req.holder)?;
    let req = AcquireReq { lease, ttl_ms: req.ttl_ms, wait_ms: req.wait_ms, lock_delay_ms: req.lock_delay_ms, holder };
    let granted = acquire_grant(app.clone(), &caller, name, req).await;
    granted.map(|g| grant_response(&app, &g))
}

async fn acquire_all(app: App, caller: Caller, req: AcquireAllBody) -> Result<Response, ApiError> {
    let lease = match (&req.lease_id, req.ttl_ms) {
        (Some(id), _) => Some(parse_lease_id(id)?),
        (None, Some(_)) => None,
        (None, None) => return Err(ApiError::bad_request("invalid_field", "give lease_id, ttl_ms, or both")),
    };
    if req.names.is_empty() || req.names.len() > LOCK_NAMES_MAX {
        return Err(ApiError::from(Error::InvalidNames { names_max: LOCK_NAMES_MAX }));
    }
    let names = req.names.iter().map(|n| lock_name(&app, n)).collect::<Result<Vec<_>, _>>()?;
    let holder = holder_label(req.holder)?;
    let req = AcquireReq { lease, ttl_ms: req.ttl_ms, wait_ms: req.wait_ms, lock_delay_ms: req.lock_delay_ms, holder };
    let grants = acquire_all_grants(app.clone(), &caller, names, req).await?;
    let lease_id = grants.first().map(|g| g.lease.to_hex()).unwrap_or_default();
    let grants = grants.iter().map(|g| grant_view(&app, g)).collect();
    Ok(reply(StatusCode::OK, &GrantAll { grants, lease_id }))
}

/// An acquire as every transport asks for it: `lease` (an existing lease), `ttl_ms` (an
/// implicit lease the server names), or both (an implicit lease the caller named).
pub struct AcquireReq {
    /// An existing lease to hold the lock under; with `ttl_ms`, the implicit lease's id.
    pub lease: Option<LeaseId>,
    /// An implicit lease for this request alone.
    pub ttl_ms: Option<u64>,
    /// How long to queue server-side; 0 is a try-lock.
    pub wait_ms: u64,
    /// Lock-delay after a holder's lease expires.
    pub lock_delay_ms: u64,
    /// The holder's label, checked ([`holder_label`]).
    pub holder: Option<String>,
}

/// Acquire (HTTP and the wire protocol): granted, or why not. Dropping the future
/// while it waits withdraws the request (the table ends an implicit lease with it, and
/// gives back a grant that raced the departure unless a twin request was told of it).
pub async fn acquire_grant(
    app: App,
    caller: &Caller,
    name: LockName,
    req: AcquireReq,
) -> Result<fenced_core::Grant, ApiError> {
    let audit_name = app.audit.is_on().then(|| name.clone());
    let r = acquire_unaudited(app.clone(), caller, name, req).await;
    if let Some(name) = audit_name {
        app.audit(caller, "acquire", Some(name.as_str()), r.as_ref().ok().map(|g| g.token.get()), &r);
    }
    r
}

async fn acquire_unaudited(
    app: App,
    caller: &Caller,
    name: LockName,
    req: AcquireReq,
) -> Result<fenced_core::Grant, ApiError> {
    caller.require(Op::Lock, name.as_str())?;
    let (wait_ms, lock_delay_ms) = (req.wait_ms, req.lock_delay_ms);
    let make = |lease, holder| Command::Acquire(Acquire { name, lease, wait_ms, lock_delay_ms, holder });
    Ok(narrow(Ok(acquire_answer(app, caller, req, make).await?))?)
}

/// Several locks together (HTTP and the wire protocol): one grant per name, in the
/// names' sorted order, or why not. Dropping the future while it waits withdraws the
/// request, as for one lock.
pub async fn acquire_all_grants(
    app: App,
    caller: &Caller,
    names: Vec<LockName>,
    req: AcquireReq,
) -> Result<Vec<fenced_core::Grant>, ApiError> {
    let audit_names = app.audit.is_on().then(|| names.iter().map(LockName::as_str).collect::<Vec<_>>().join(","));
    let r = async {
        for name in &names {
            caller.require(Op::Lock, name.as_str())?;
        }
        let (wait_ms, lock_delay_ms) = (req.wait_ms, req.lock_delay_ms);
        let make = |lease, holder| Command::AcquireAll(AcquireAll { names, lease, wait_ms, lock_delay_ms, holder });
        Ok(narrow::<Vec<fenced_core::Grant>>(Ok(acquire_answer(app.clone(), caller, req, make).await?))?)
    }
    .await;
    if let Some(names) = audit_names {
        app.audit(
            caller,
            "acquire_all",
            Some(&names),
            r.as_ref().ok().and_then(|g| g.first()).map(|g| g.token.get()),
            &r,
        );
    }
    r
}

/// The lease of an acquire resolved, the command made with it, applied, and waited
/// for: the answer, its grants under the caller's name for the lease.
async fn acquire_answer(
    app: App,
    caller: &Caller,
    req: AcquireReq,
    make: impl FnOnce(LeaseRef, Option<String>) -> Command,
) -> Result<Answer, ApiError> {
    let lease = match (req.lease, req.ttl_ms) {
        (Some(id), None) => LeaseRef::Existing(id),
        (None, Some(ttl_ms)) => LeaseRef::Implicit { id: new_lease_id()?, ttl_ms },
        (Some(id), Some(ttl_ms)) if id.looks_random() => LeaseRef::Implicit { id, ttl_ms },
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "invalid_lease_id",
                "an implicit lease's id is its capability: draw its 128 bits at random (this one has fewer than \
                 six distinct hex digits)",
            ))
        }
        (None, None) => return Err(ApiError::bad_request("invalid_field", "give lease_id, ttl_ms, or both")),
    };
    // The caller's name for the lease, and the table's (an identity's leases are its own).
    let external = lease.id();
    let lease = match lease {
        LeaseRef::Existing(id) => LeaseRef::Existing(caller.identity.lease(id)),
        LeaseRef::Implicit { id, ttl_ms } => LeaseRef::Implicit { id: caller.identity.lease(id), ttl_ms },
    };
    let wait_ms = req.wait_ms;
    let answer = match app.locks.apply(make(lease, req.holder)).await {
        Reply::Now(answer) => answer,
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
    let external = |g: fenced_core::Grant| fenced_core::Grant { lease: external, ..g };
    answer
        .map(|a| match a {
            Answer::Granted(g) => Answer::Granted(external(g)),
            Answer::GrantedAll(gs) => Answer::GrantedAll(gs.into_iter().map(external).collect()),
            other => other,
        })
        .map_err(|e| match e {
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

fn grant_view(app: &AppInner, g: &fenced_core::Grant) -> Grant {
    let signed = app.signer.as_ref().map(|s| s.sign(g.name.as_str(), g.token.get()));
    let (signature, key_id) = signed.map(|s| (s.signature, s.key_id)).unzip();
    let (name, token, lease_id, ttl_ms) = (g.name.as_str().into(), g.token.get(), g.lease.to_hex(), g.ttl_ms);
    Grant { name, token, lease_id, ttl_ms, signature, key_id }
}

fn grant_response(app: &AppInner, g: &fenced_core::Grant) -> Response {
    reply(StatusCode::OK, &grant_view(app, g))
}

/// Release (HTTP and the wire protocol): the released grant's token.
pub async fn release_lock(app: &AppInner, caller: &Caller, name: &LockName, lease: LeaseId) -> Result<Token, ApiError> {
    let r = async {
        caller.require(Op::Lock, name.as_str())?;
        let lease = caller.identity.lease(lease);
        Ok(app.locks.answered::<Token>(Command::Release { name: name.clone(), lease }).await?)
    }
    .await;
    app.audit(caller, "release", Some(name.as_str()), r.as_ref().ok().map(|t| t.get()), &r);
    r
}

/// An operator's release by name: the `admin` right on the name, not the holder's lease.
/// The next waiter is granted with a higher token; the holder hears at its next
/// keepalive (an implicit lease ends with its lock) or check.
pub async fn revoke_lock(
    app: &AppInner,
    caller: &Caller,
    name: &LockName,
    token: Option<u64>,
) -> Result<Token, ApiError> {
    let r = async {
        caller.require(Op::Admin, name.as_str())?;
        let token = match token {
            None => None,
            Some(raw) => {
                Some(Token::new(raw).ok_or_else(|| ApiError::bad_request("invalid_token", "a token is at least 1"))?)
            }
        };
        Ok(app.locks.answered::<Token>(Command::RevokeLock { name: name.clone(), token }).await?)
    }
    .await;
    app.audit(caller, "revoke_lock", Some(name.as_str()), r.as_ref().ok().map(|t| t.get()), &r);
    r
}

/// CheckSequencer (HTTP and the wire protocol): whether `raw` is the current grant,
/// and the holder's token.
pub async fn check_token(
    app: &AppInner,
    caller: &Caller,
    name: &LockName,
    raw: u64,
) -> Result<(bool, Option<Token>), ApiError> {
    let r = async {
        caller.require(Op::Lock, name.as_str())?;
        let token = Token::new(raw).ok_or_else(|| ApiError::bad_request("invalid_token", "a token is at least 1"))?;
        Ok(app.locks.read(|t, _| t.check(name, token)).await?)
    }
    .await;
    if app.audit.all || r.is_err() {
        app.audit(caller, "check", Some(name.as_str()), Some(raw), &r);
    }
    r
}

/// `GET /v1/locks/{name}`.
#[utoipa::path(get, path = "/v1/locks/{name}", tag = "locks", operation_id = "get_lock", params(LockPath),
    responses(
        (status = 200, description = "the lock (a free one: held false)", body = LockView),
        (status = 400, description = "invalid_name", body = ErrorBody),
        NotLeaderOrShuttingDown,
    ))]
pub async fn get_one(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let name = lock_name(&app, &name)?;
    let allowed = caller.require(Op::Lock, name.as_str());
    if allowed.is_err() {
        app.audit(&caller, "view", Some(name.as_str()), None, &allowed);
    }
    allowed?;
    let (info, now) = app.locks.read(|t, now| (t.lock(&name), now)).await?;
    let v = match info {
        Some(info) => lock_view(&info, now),
        None => LockView {
            name: name.as_str().into(),
            held: false,
            token: None,
            expires_in_ms: None,
            waiters: 0,
            blocked_for_ms: None,
            holder: None,
        },
    };
    Ok(reply(StatusCode::OK, &v))
}

/// `GET /v1/locks?prefix=P&limit=N`.
#[utoipa::path(get, path = "/v1/locks", tag = "locks", operation_id = "list_locks",
    params(ListQuery),
    responses(
        (status = 200, description = "locks in name order", body = LockList),
        InvalidQuery,
        NotLeaderOrShuttingDown,
    ))]
pub async fn list(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    query: QueryMap,
) -> Result<Response, ApiError> {
    let (prefix, limit) = query.listing(app.config.list_locks_max, app.config.lock_name_bytes_max, "lock name")?;
    let (locks, now) = app.locks.read(|t, now| (t.locks_with_prefix(&prefix, limit), now)).await?;
    // An identity sees the locks it may lock, and no other (the page may come out short).
    let id = &caller.identity;
    let locks = locks.iter().filter(|l| id.allows(Op::Lock, l.name.as_str())).map(|l| lock_view(l, now)).collect();
    Ok(reply(StatusCode::OK, &LockList { locks }))
}

/// A lock as clients see it. The holder's lease id is not shown: it is the
/// capability to release.
fn lock_view(info: &LockInfo, now: u64) -> LockView {
    let (token, expires_in_ms) = match &info.holder {
        Some((t, lease)) => (Some(t.get()), Some(lease.expires_at_ms.saturating_sub(now))),
        None => (None, None),
    };
    LockView {
        name: info.name.as_str().into(),
        held: info.holder.is_some(),
        token,
        expires_in_ms,
        waiters: info.waiters,
        blocked_for_ms: info.blocked_until_ms.map(|b| b.saturating_sub(now)),
        holder: info.label.clone(),
    }
}

/// A holder label as given: 1 to [`HOLDER_BYTES_MAX`] bytes of UTF-8 without control
/// characters (it is shown in views, events and logs).
pub fn holder_label(holder: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(h) = holder else { return Ok(None) };
    if h.is_empty() || h.len() > HOLDER_BYTES_MAX || h.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "invalid_holder",
            format!("a holder label is 1 to {HOLDER_BYTES_MAX} bytes of UTF-8 without control characters"),
        )
        .with(Detail::LenMax(HOLDER_BYTES_MAX as u64)));
    }
    Ok(Some(h))
}
