//! The HTTP API, version 1: routes, shared state and the request helpers every
//! handler uses (body limits, strict JSON, lease ids). Wire types live next to the
//! handlers and convert to core types by hand.

pub mod doc;
mod error;
pub mod forward;
mod leases;
mod locks;
pub mod ops;
mod query;
mod raft;
mod responses;
mod store;

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use fenced_core::LeaseId;
use fenced_wire::Detail;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use error::{details_from_json, error_json, ApiError};
pub use leases::{create_lease, keepalive_lease, revoke_lease};
pub use locks::{acquire_all_grants, acquire_grant, check_token, holder_label, lock_name, release_lock, AcquireReq};
pub use store::{read_value, store_key, write_value};

use crate::config::Config;
use crate::identity::{Identities, Identity, Op};
use crate::locks::Locks;
use crate::metrics::Metrics;

/// Every route, as the OpenAPI document must describe it: (method, path).
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/leases"),
    ("post", "/v1/leases/{lease_id}/keepalive"),
    ("delete", "/v1/leases/{lease_id}"),
    ("post", "/v1/locks/{name}/acquire"),
    ("post", "/v1/locks/acquire"),
    ("post", "/v1/locks/{name}/release"),
    ("post", "/v1/locks/{name}/check"),
    ("post", "/v1/locks/{name}/revoke"),
    ("get", "/v1/locks/{name}"),
    ("get", "/v1/locks"),
    ("get", "/v1/store"),
    ("put", "/v1/store/{key}"),
    ("get", "/v1/store/{key}"),
    ("get", "/v1/events"),
    ("get", "/metrics"),
    ("get", "/livez"),
    ("get", "/readyz"),
    ("get", "/openapi.json"),
    ("get", "/v1/cluster"),
    ("get", "/v1/keys"),
    ("post", "/v1/cluster/members"),
    ("delete", "/v1/cluster/members/{id}"),
    ("get", "/v1/cluster/snapshot"),
    ("post", "/v1/sim/runs"),
    ("post", "/v1/sim/sweeps"),
    ("get", "/"),
    ("get", "/live"),
    ("get", "/assets/{name}"),
];

/// What every handler shares.
pub struct AppInner {
    pub locks: Arc<Locks>,
    pub config: Config,
    pub metrics: Arc<Metrics>,
    /// Who may call, and what each may do; replaced whole on SIGHUP.
    pub identities: std::sync::RwLock<Arc<Identities>>,
    /// Counts the reloads of `identities`: a wire connection looks its caller up again
    /// when it changed.
    pub identities_generation: std::sync::atomic::AtomicU64,
    /// The audit log (a no-op without `audit_log`).
    pub audit: crate::audit::Audit,
    /// Bytes of request bodies being read now (`body_bytes_in_flight_max` permits).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// Bytes of peer messages being read now ([`raft::PEER_BYTES_IN_FLIGHT_MAX`]).
    pub peer_budget: Arc<tokio::sync::Semaphore>,
    /// Held while a snapshot from the leader is received (into the data directory);
    /// what is kept of a cut transfer, to be resumed.
    pub incoming_snapshot: raft::Incoming,
    /// Flips to true when shutdown begins.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The OpenAPI document, generated at start for this configuration's limits.
    pub openapi: String,
    /// The data directory's free space against `min_free_bytes`.
    pub disk: Arc<crate::disk::DiskGuard>,
    /// Signs every grant (`grant_signing_key`); none: grants are not signed.
    pub signer: Option<Arc<crate::signing::GrantSigner>>,
}

pub type App = Arc<AppInner>;

pub use raft::{recovered_incoming, PEER_BYTES_IN_FLIGHT_MAX, PEER_CONNECTIONS_MAX};

pub fn router(app: App) -> Router {
    // The laboratory's simulations run on the server's own cores: an admin's call.
    let lab = if app.config.lab_api {
        fenced_console::api().route_layer(middleware::from_fn(admin_only))
    } else {
        Router::new()
    };
    let v1 = v1_routes(app.clone(), lab);
    // With a peer listener of its own, the client listener serves no peer route: no
    // client credential of any kind reaches one.
    let peers = match app.config.peer_listen {
        None => raft::routes(app.clone())
            .layer(middleware::from_fn(admin_only))
            .layer(middleware::from_fn_with_state(app.clone(), auth)),
        Some(_) => Router::new().route("/raft/{*rest}", axum::routing::any(raft::elsewhere)),
    };
    Router::new()
        .merge(peers)
        .merge(fenced_console::pages())
        .route("/livez", get(ops::livez))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}

/// The `/v1` routes behind [`auth`] (the client listener's, and the leader's side of a
/// forwarded request).
fn v1_routes(app: App, lab: Router<App>) -> Router<App> {
    Router::new()
        .route("/v1/leases", post(leases::create))
        .route("/v1/leases/{id}", axum::routing::delete(leases::revoke))
        .route("/v1/leases/{id}/keepalive", post(leases::keepalive))
        .route("/v1/locks", get(locks::list))
        .route("/v1/locks/{*rest}", get(locks::get_one).post(locks::action))
        .route("/v1/store", get(store::list))
        .route("/v1/store/{*key}", get(store::read).put(store::write))
        .route("/v1/events", get(ops::events))
        .route("/v1/cluster", get(ops::cluster))
        .route("/v1/keys", get(ops::keys))
        .route("/v1/cluster/members", post(ops::add_member))
        .route("/v1/cluster/members/{id}", axum::routing::delete(ops::remove_member))
        .route("/v1/cluster/snapshot", get(ops::snapshot))
        .merge(lab)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app, auth))
}

/// The peer listener's routes: the raft RPCs and nothing else. Its connections are
/// authenticated at the TLS handshake (a certificate of the cluster CA) when the
/// members have certificates; without them (`insecure_peers`), by the client token
/// when one is set.
pub fn peer_router(app: App) -> Router {
    let routes = raft::routes(app.clone());
    let routes = if app.config.peer_tls() {
        routes
    } else {
        routes.layer(middleware::from_fn(admin_only)).layer(middleware::from_fn_with_state(app.clone(), auth))
    };
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route; see /openapi.json")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
}

async fn observe(State(app): State<App>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    // While this lives the connection is busy: the idle timeout does not apply.
    let conn = req.extensions().get::<axum::extract::ConnectInfo<crate::listener::ConnMeta>>().map(|i| i.0.clone());
    let _busy = conn.as_ref().map(crate::listener::InFlight::new);
    let remote = conn.map(|c| c.remote);
    let method = req.method().clone();
    let path = redact(req.uri().path());
    let resp = if req.version() == axum::http::Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        // RFC 9112, 3.2: a server must answer 400 to an HTTP/1.1 request without Host.
        ApiError::bad_request("missing_host", "an HTTP/1.1 request needs a Host header").into_response()
    } else {
        as_json_error(next.run(req).await).await
    };
    let elapsed = started.elapsed();
    app.metrics.observe_request(elapsed);
    tracing::debug!(?remote, %method, %path, status = resp.status().as_u16(), us = elapsed.as_micros() as u64, "request");
    resp
}

/// Every error answer is the documented JSON: an error the framework produced itself
/// (a path that is not UTF-8, a rejected extractor) arrives as plain text naming
/// internal parameters, and is replaced by `{"error":{"code","message"}}`.
async fn as_json_error(resp: Response) -> Response {
    let status = resp.status();
    let is_json =
        resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (code, message) = match status {
        StatusCode::BAD_REQUEST => ("invalid_request", "the request's path, query or headers cannot be read"),
        StatusCode::NOT_FOUND => ("not_found", "no such route; see /openapi.json"),
        StatusCode::METHOD_NOT_ALLOWED => ("method_not_allowed", "this route does not take that method"),
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", "the request is larger than the server takes"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported_media_type", "send the body as application/json"),
        s if s.is_server_error() => ("internal", "the server could not complete the request"),
        _ => ("invalid_request", "the request cannot be served as sent"),
    };
    ApiError::new(status, code, message).into_response()
}

/// A path fit for the logs: lease ids are capabilities, so they are masked.
fn redact(path: &str) -> String {
    path.split('/')
        .map(|seg| if LeaseId::from_hex(seg).is_some() { "{lease_id}" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// Finds the caller by its bearer token (401 `unauthorized` when none matches) and
/// hands it to the handler as a [`Caller`]. The laboratory's simulations need `admin`.
async fn auth(State(app): State<App>, mut req: Request, next: Next) -> Response {
    if let Some(forward::ForwardedCaller(caller)) = req.extensions_mut().remove() {
        req.extensions_mut().insert(caller);
        return next.run(req).await;
    }
    let presented = req.headers().get(header::AUTHORIZATION).and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    let conn = req.extensions().get::<axum::extract::ConnectInfo<crate::listener::ConnMeta>>().map(|i| &i.0);
    let remote = conn.map(|c| c.remote);
    let subject = conn.and_then(|c| c.client_subject.get().cloned());
    let Some(identity) = app.identity(presented, subject.as_deref()) else {
        if app.audit.is_on() {
            let path = redact(req.uri().path());
            app.audit_line("-", remote, "authenticate", Some(&path), None, "unauthorized");
        }
        return unauthorized_with(app.config.client_ca.is_some(), subject.as_deref()).into_response();
    };
    let caller = Caller { identity, remote };
    app.locks.node.await_office().await;
    if forward::wanted(&app, req.method(), req.uri().path()) {
        return forward::to_leader(&app, &caller, req).await;
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Behind [`auth`]: only an identity with `admin` on every name (the laboratory's
/// simulations; the raft routes of members without certificates, whose token is
/// `auth_token_file`'s, every right).
async fn admin_only(req: Request, next: Next) -> Response {
    match req.extensions().get::<Caller>().map(Caller::require_admin) {
        Some(Ok(())) => next.run(req).await,
        Some(Err(e)) => e.into_response(),
        None => unauthorized().into_response(),
    }
}

/// 401 for a call without a known bearer token (HTTP and the wire protocol).
pub fn unauthorized() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "this call needs 'Authorization: Bearer <token>'")
}

/// 401 saying what would have been taken: with `client_ca`, a client certificate too,
/// and the subject presented when it named no identity (the caller's own certificate).
pub fn unauthorized_with(client_ca: bool, subject: Option<&str>) -> ApiError {
    let message = match (client_ca, subject) {
        (false, _) => return unauthorized(),
        (true, None) => "this call needs a client certificate of an identity (cert_subject) or \
                         'Authorization: Bearer <token>'"
            .to_string(),
        (true, Some(s)) => {
            format!("the client certificate's subject '{s}' is no identity's cert_subject, and no bearer token matched")
        }
    };
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// Who makes a request, and from where: what every shared handler is given to decide
/// whether the call is allowed and whose leases it names.
#[derive(Clone, Debug)]
pub struct Caller {
    pub identity: Arc<Identity>,
    pub remote: Option<std::net::SocketAddr>,
}

impl Caller {
    /// 403 `forbidden` unless `op` is allowed on `name`; nothing changes.
    pub fn require(&self, op: Op, name: &str) -> Result<(), ApiError> {
        if self.identity.allows(op, name) {
            return Ok(());
        }
        Err(forbidden(&self.identity, op, Some(name)))
    }

    /// 403 `forbidden` unless `op` is allowed on some name (leases name no lock).
    pub fn require_some(&self, op: Op) -> Result<(), ApiError> {
        if self.identity.allows_some(op) {
            return Ok(());
        }
        Err(forbidden(&self.identity, op, None))
    }

    /// 403 `forbidden` unless `admin` is granted on every name (the prefix "").
    pub fn require_admin(&self) -> Result<(), ApiError> {
        self.require(Op::Admin, "")
    }
}

fn forbidden(identity: &Identity, op: Op, name: Option<&str>) -> ApiError {
    let on = name.map_or_else(|| "any name".to_string(), |n| format!("'{n}'"));
    let e = ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("identity '{}' may not {} on {on}", identity.name, op.as_str()),
    )
    .with(Detail::Operation(op.as_str().into()))
    .with(Detail::Identity(identity.name.clone().into()));
    match name {
        Some(n) => e.with(Detail::Name(n.to_owned().into())),
        None => e,
    }
}

/// A JSON response.
pub fn json(status: StatusCode, v: &Value) -> Response {
    reply(status, v)
}

/// A JSON response from one of the wire types the API document is generated from.
pub fn reply<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    let body = serde_json::to_vec(v).expect("a wire type serializes");
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Reads a whole body, refusing more than `max` bytes with 413. The body must arrive
/// within `body_timeout_ms` (408 `body_timeout`), and it takes its size (declared, or
/// `max` when not) from the budget of bodies in flight first (503 `too_busy` when the
/// budget is spent): a client that stalls its body holds neither memory nor a
/// handler for long. A large body the leader has no room to propose now is refused
/// 503 `too_busy` before it is read: a flood of large writes costs the flooder its
/// sending, not the leader its reading.
pub async fn read_body(
    app: &AppInner,
    headers: &HeaderMap,
    body: Body,
    max: usize,
    what: &str,
) -> Result<Bytes, ApiError> {
    let declared = declared_length(headers);
    if let Some(n) = declared.filter(|n| *n >= fenced_raft::node::LARGE_COMMAND_BYTES && *n <= max as u64) {
        app.locks.node.room_for(n)?;
    }
    read_body_within(app, &app.body_budget, headers, body, max, what).await
}

/// The body's length as its `Content-Length` declares it, if it does.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
}

/// [`read_body`] against another budget (the peer messages have their own).
pub async fn read_body_within(
    app: &AppInner,
    budget: &Arc<tokio::sync::Semaphore>,
    headers: &HeaderMap,
    body: Body,
    max: usize,
    what: &str,
) -> Result<Bytes, ApiError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ApiError::too_large(what, max));
    }
    let reserve = declared.map_or(max, |n| n as usize).max(1) as u32;
    let Ok(_permit) = budget.clone().try_acquire_many_owned(reserve) else {
        crate::metrics::inc(&app.metrics.bodies_refused);
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_busy",
            "the server is reading its limit of request bodies; retry shortly",
        )
        .with(Detail::RetryAfterMs(100)));
    };
    let read = axum::body::to_bytes(body, max);
    let timeout_ms = app.config.body_timeout_ms;
    if timeout_ms == 0 {
        return read.await.map_err(|e| body_error(e, what, max));
    }
    match tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), read).await {
        Ok(r) => r.map_err(|e| body_error(e, what, max)),
        Err(_) => {
            crate::metrics::inc(&app.metrics.body_timeouts);
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!("the {what} did not arrive within body_timeout_ms {timeout_ms}"),
            )
            .with(Detail::BodyTimeoutMs(timeout_ms)))
        }
    }
}

/// Why a body could not be read: over its limit (413 `too_large`), or not a body at
/// all (a bad chunk size, a connection closed mid-body: 400 `invalid_body`).
fn body_error(e: axum::Error, what: &str, max: usize) -> ApiError {
    let e = e.into_inner();
    if e.is::<http_body_util::LengthLimitError>() {
        return ApiError::too_large(what, max);
    }
    ApiError::bad_request("invalid_body", format!("the {what} cannot be read as sent: {e}"))
}

/// Parses a strict JSON body: malformed JSON is `invalid_json`, a wrong type, a
/// missing or an unknown field is `invalid_field`. An empty body parses as `{}`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { &b"{}"[..] } else { bytes };
    // serde would also read a struct from an array; the API takes objects only.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let not_an_object = first.is_some_and(|b| *b == b'[' || b.is_ascii_digit() || *b == b'-' || *b == b'"');
    if not_an_object && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
        return Err(ApiError::bad_request("invalid_field", "the body must be a JSON object"));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        // A number too large for any field (`1e309`) is well-formed JSON that does not fit.
        let out_of_range = e.to_string().starts_with("number out of range");
        match e.classify() {
            Category::Syntax if out_of_range => {
                ApiError::bad_request("invalid_field", format!("the body does not fit this call: {e}"))
            }
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
            }
            Category::Data => ApiError::bad_request("invalid_field", format!("the body does not fit this call: {e}")),
        }
    })
}

impl AppInner {
    /// Writes the decision on `op` (on `name`, with `token`) to the audit log, when one
    /// is kept: `ok`, or the code the caller was answered.
    pub fn audit<T>(&self, caller: &Caller, op: &str, name: Option<&str>, token: Option<u64>, r: &Result<T, ApiError>) {
        if !self.audit.is_on() {
            return;
        }
        let result = match r {
            Ok(_) => "ok",
            Err(e) => e.code,
        };
        self.audit_line(&caller.identity.name, caller.remote, op, name, token, result);
    }

    /// One audit line, stamped now.
    fn audit_line(
        &self,
        identity: &str,
        remote: Option<std::net::SocketAddr>,
        op: &str,
        name: Option<&str>,
        token: Option<u64>,
        result: &str,
    ) {
        let at = crate::audit::now_rfc3339();
        self.audit.write(&crate::audit::Line { at, identity, remote, op, name, token, result });
    }

    /// The identity presenting `bearer` on a connection whose verified client
    /// certificate has `subject`, as the identities are now.
    pub fn identity(&self, bearer: Option<&[u8]>, subject: Option<&str>) -> Option<Arc<Identity>> {
        self.identities.read().unwrap_or_else(|p| p.into_inner()).find(bearer, subject)
    }

    /// Reads and parses a JSON body under the body limit.
    pub async fn json_body<T: DeserializeOwned>(&self, headers: &HeaderMap, body: Body) -> Result<T, ApiError> {
        let bytes = read_body(self, headers, body, self.config.body_bytes_max, "body").await?;
        parse(&bytes)
    }
}

/// 128 bits from the operating system.
pub fn new_lease_id() -> Result<LeaseId, ApiError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(ApiError::internal)?;
    Ok(LeaseId(u128::from_le_bytes(b)))
}

pub fn parse_lease_id(s: &str) -> Result<LeaseId, ApiError> {
    LeaseId::from_hex(s).ok_or_else(|| ApiError::bad_request("invalid_lease_id", "a lease id is 32 hexadecimal digits"))
}
