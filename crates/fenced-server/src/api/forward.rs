//! Followers forward: a `/v1` request that needs the leader, made to a follower, is
//! passed to the leader over the peer channel (`/raft/forward/...`, the members' own
//! credentials) and its answer relayed, so that one address of any member serves the
//! whole API (a load balancer, a Kubernetes Service, `curl`).
//!
//! - The follower authenticates the caller with its own identities and forwards the
//!   identity's name; the leader finds the identity of that name in its identities (all
//!   members are given the same file) and decides the call as if it were its own
//!   client's. A name the leader does not know is refused, 401. Only a member can say
//!   who the caller is: the peer route's guard (mutual TLS, or the members' token) is the
//!   one that protects `/raft/append`, which can do more than any client.
//! - Served here, never forwarded: `GET /v1/cluster` (this member's view), the event
//!   stream (every member publishes the events of the entries it applies) and the
//!   laboratory. Everything else under `/v1` reads or writes what only the leader can
//!   answer for (linearizable reads, proposals).
//! - A follower that knows no live leader, or cannot reach it, answers 503 `not_leader`
//!   with `leader_id` and `leader_url` when it knows them: the clients move on, as
//!   before. A forwarded request is never forwarded again: a leader that lost office
//!   meanwhile answers `not_leader` itself.
//! - The wire protocol forwards its frames by the same rules (`wire::forward`).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use fenced_wire::Detail;

use super::{ApiError, App, Caller};

/// The caller's identity, as the forwarding member authenticated it.
pub const IDENTITY_HEADER: &str = "x-fenced-forwarded-identity";
/// The caller's address, as the forwarding member saw it (for the audit log).
pub const REMOTE_HEADER: &str = "x-fenced-forwarded-remote";
/// Beyond the longest wait a request may ask for: the time a forwarded call is given.
const SLACK: Duration = Duration::from_secs(15);

/// Set on a request the leader took from a member (`/raft/forward`): its caller, found
/// by name. Only the peer route inserts it; no client can.
#[derive(Clone)]
pub struct ForwardedCaller(pub Caller);

/// Headers that belong to one hop, or that only a member may set.
fn hop_only(name: &str) -> bool {
    matches!(
        name,
        "host"
            | "authorization"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-connection"
    ) || name.starts_with("x-fenced-forwarded-")
}

/// Whether this member passes `req` to the leader rather than answer it.
pub fn wanted(app: &App, method: &Method, path: &str) -> bool {
    if !path.starts_with("/v1/") || path == "/v1/events" || path.starts_with("/v1/sim") {
        return false;
    }
    if path == "/v1/cluster" && method == Method::GET {
        return false;
    }
    member_forwards(app)
}

/// Whether this member, serving and not leading, passes its clients' calls on.
pub fn member_forwards(app: &App) -> bool {
    let node = &app.locks.node;
    !node.is_leading() && !node.is_shutting_down() && !*app.shutdown.borrow()
}

/// The headers that tell the leader who the caller is.
pub fn caller_headers(caller: &Caller) -> Vec<(String, Vec<u8>)> {
    let mut headers = vec![(IDENTITY_HEADER.into(), caller.identity.name.as_bytes().to_vec())];
    if let Some(remote) = caller.remote {
        headers.push((REMOTE_HEADER.into(), remote.to_string().into_bytes()));
    }
    headers
}

/// 503 `not_leader` with the leader's id and URL when known.
pub fn not_leader(to: fenced_raft::NotLeader) -> ApiError {
    let mut e = ApiError::from(fenced_core::Error::NotLeader { leader: to.leader });
    if let Some(url) = to.leader_url {
        e = e.with(Detail::LeaderUrl(url.into()));
    }
    e
}

/// Sends `req` to the leader and relays its answer; 503 `not_leader` (with the leader's
/// id and URL) when there is none to send it to.
pub async fn to_leader(app: &App, caller: &Caller, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let max = app.config.body_bytes_max.max(app.config.value_bytes_max);
    let body = match super::read_body(app, &parts.headers, body, max, "body").await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let mut headers: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .filter(|(k, _)| !hop_only(k.as_str()))
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    headers.extend(caller_headers(caller));
    let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let timeout = Duration::from_millis(app.config.wait_ms_max) + SLACK;
    let out = fenced_raft::network::Outgoing { method: parts.method, path_and_query: path, headers, body };
    match app.locks.node.forward_to_leader(out, timeout).await {
        Ok(answer) => relay(answer),
        Err(to) => not_leader(to).into_response(),
    }
}

fn relay(answer: fenced_raft::network::Forwarded) -> Response {
    let mut resp = Response::new(Body::new(answer.body));
    *resp.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (k, v) in answer.headers {
        if hop_only(&k) {
            continue;
        }
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::from_bytes(&v)) {
            resp.headers_mut().append(k, v);
        }
    }
    resp
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The caller of a request a member forwarded: the identity of the name it sent, as
/// this member's identities have it. 401 for a name they lack.
pub fn forwarded_caller(app: &App, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(name) = header(headers, IDENTITY_HEADER) else {
        return Err(ApiError::bad_request("invalid_forward", format!("a forwarded request needs {IDENTITY_HEADER}")));
    };
    let remote = header(headers, REMOTE_HEADER).and_then(|r| r.parse().ok());
    let identity = app.identities.read().unwrap_or_else(|p| p.into_inner()).by_name(&name);
    let Some(identity) = identity else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!(
                "identity '{name}', forwarded by a member, is not among this member's identities: give every \
                 member the same identities_file"
            ),
        ));
    };
    Ok(Caller { identity, remote })
}

/// The leader's side (`/raft/forward/{rest}` on the peer routes): the caller found by
/// the name the member sent, the request handed to the `/v1` routes as `/{rest}`.
pub async fn from_member(app: App, v1: axum::Router, req: Request) -> Response {
    use tower::ServiceExt as _;
    let caller = match forwarded_caller(&app, req.headers()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let uri = {
        let rest = req.uri().path_and_query().map_or("/", |p| p.as_str());
        rest.strip_prefix("/raft/forward").unwrap_or("/").parse::<axum::http::Uri>()
    };
    let Ok(uri) = uri else {
        return ApiError::bad_request("invalid_forward", "a forwarded request's path does not parse").into_response();
    };
    // A new request, not this one re-pointed: this one's extensions hold the outer
    // route's path parameters, which the `/v1` routes' own would be added to.
    let (parts, body) = req.into_parts();
    let mut inner = Request::new(body);
    *inner.method_mut() = parts.method;
    *inner.uri_mut() = uri;
    *inner.version_mut() = parts.version;
    *inner.headers_mut() = parts.headers;
    inner.headers_mut().remove(IDENTITY_HEADER);
    inner.headers_mut().remove(REMOTE_HEADER);
    inner.extensions_mut().insert(ForwardedCaller(caller));
    match v1.oneshot(inner).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}
