//! Operations endpoints: health, metrics, the OpenAPI document, the event stream
//! and the placeholder page at `/`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fenced_wire::Detail;
use futures_util::stream;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ErrorBody;
use super::query::QueryMap;
use super::responses::{InvalidQuery, MembershipChangeFailed, NotLeader};
use super::{reply, ApiError, App};
use crate::events::{Compacted, Indexed, Start};
use crate::watcher::{Item, Watcher};

/// `{"status":"live"}`, or why the server is not ready (`shutting_down`, `no_leader`).
#[derive(Serialize, ToSchema)]
pub struct Status {
    status: &'static str,
}

/// A ready member: whether it leads, the leader it knows, and the grace left after a
/// migration of a single-node data directory.
#[derive(Serialize, ToSchema)]
pub struct Ready {
    status: &'static str,
    leader: bool,
    leader_id: u64,
    recovering: bool,
    grace_left_ms: u64,
}

/// One member of the cluster, as this member sees it.
#[derive(Serialize, ToSchema)]
pub struct MemberView {
    id: u64,
    url: String,
    /// `leader`, `follower` or `learner`.
    role: &'static str,
    #[schema(required = true)]
    last_log_index: Option<u64>,
}

/// The cluster as this member sees it (a single server: a cluster of one).
#[derive(Serialize, ToSchema)]
pub struct ClusterView {
    id: u64,
    state: String,
    #[schema(required = true)]
    leader_id: Option<u64>,
    term: u64,
    #[schema(required = true)]
    commit_index: Option<u64>,
    #[schema(required = true)]
    last_applied_index: Option<u64>,
    #[schema(required = true)]
    last_log_index: Option<u64>,
    #[schema(required = true)]
    snapshot_index: Option<u64>,
    /// The log is purged up to here (a member behind it catches up from a snapshot).
    #[schema(required = true)]
    purged_index: Option<u64>,
    members: Vec<MemberView>,
    /// Whether the lock table decides with limits the cluster agreed on through its
    /// log (the configuration of the leader that set them), the same on every member;
    /// false until every member runs a release that reads them.
    limits_agreed: bool,
    /// With `?digest=true`: the index the hash was taken at.
    #[serde(skip_serializing_if = "Option::is_none")]
    applied_index: Option<u64>,
    /// With `?digest=true`: a hash of this member's replicated state.
    #[serde(skip_serializing_if = "Option::is_none")]
    state_hash: Option<String>,
}

/// The data of an SSE event `lagged`: this reader fell behind what the member holds and
/// missed at least this many positions (some of them may not have been events).
#[derive(Serialize, ToSchema)]
pub struct Lagged {
    pub missed: u64,
}

/// The data of one SSE event of `/v1/events` (its `event:` field is the type).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum EventData {
    Event(Indexed),
    Lagged(Lagged),
}

fn data(d: EventData) -> String {
    serde_json::to_string(&d).expect("an event serializes")
}

#[utoipa::path(get, path = "/livez", tag = "operations", responses((status = 200, description = "live", body = Status)))]
pub async fn livez() -> Response {
    reply(StatusCode::OK, &Status { status: "live" })
}

#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "ready", body = Ready),
        (status = 503, description = "status shutting_down or no_leader", body = Status),
    ))]
pub async fn readyz(State(app): State<App>) -> Response {
    if *app.shutdown.borrow() {
        return reply(StatusCode::SERVICE_UNAVAILABLE, &Status { status: "shutting_down" });
    }
    let left = app.locks.view(|t, now| t.grace_left_ms(now));
    let node = &app.locks.node;
    let leading = node.is_leading();
    let leader = if leading { Some(node.id()) } else { node.not_leader().leader };
    // A leader known but not heard from (a follower cut off from it, a leader cut off
    // from its quorum) serves nothing: not ready, so that clients and balancers move on.
    let Some(leader_id) = leader.filter(|_| node.leader_alive()) else {
        return reply(StatusCode::SERVICE_UNAVAILABLE, &Status { status: "no_leader" });
    };
    let ready = Ready { status: "ready", leader: leading, leader_id, recovering: left > 0, grace_left_ms: left };
    reply(StatusCode::OK, &ready)
}

#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    #[schema(minimum = 1)]
    id: u64,
    /// The member's base URL, `http://` or `https://`.
    #[schema(pattern = "^https?://")]
    url: String,
}

/// `POST /v1/cluster/members` `{"id","url"}`: the new member catches up as a learner,
/// then joins the voters; answered with the cluster's status once it has. Leader only.
#[utoipa::path(post, path = "/v1/cluster/members", tag = "cluster", request_body = AddMember,
    responses(
        (status = 200, description = "the member joined the voters", body = ClusterView),
        (status = 400, description = "invalid_json, invalid_field", body = ErrorBody),
        MembershipChangeFailed,
        NotLeader,
    ))]
pub async fn add_member(
    State(app): State<App>,
    axum::extract::Extension(caller): axum::extract::Extension<super::Caller>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, super::ApiError> {
    let r = add(&app, &caller, headers, body).await;
    app.audit(&caller, "member_add", None, None, &r);
    r
}

async fn add(
    app: &App,
    caller: &super::Caller,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, super::ApiError> {
    caller.require_admin()?;
    let req: AddMember = app.json_body(&headers, body).await?;
    let scheme = if app.config.peer_tls() { "https://" } else { "http://" };
    if req.id == 0 || !req.url.starts_with(scheme) {
        return Err(super::ApiError::bad_request(
            "invalid_field",
            format!(
                "a member needs an id of at least 1 and a {scheme} URL (the members {} certificates)",
                if app.config.peer_tls() { "authenticate each other by" } else { "have no" }
            ),
        ));
    }
    let node = &app.locks.node;
    if !node.is_leading() {
        return Err(fenced_core::Error::from(node.not_leader()).into());
    }
    node.add_member(req.id, req.url.trim_end_matches('/').to_string())
        .await
        .map_err(|e| super::ApiError::new(StatusCode::CONFLICT, "membership_change_failed", e))?;
    Ok(status(app))
}

/// `GET /v1/cluster/snapshot`: a backup of the replicated state, taken after a
/// linearizable read (so it holds every write acknowledged before the call) at one
/// applied index; `fenced snapshot status` reads it, `fenced snapshot restore` makes a
/// new cluster's data from it. An admin's call; the leader answers (a follower says
/// `not_leader`). The table is serialized under the state machine's lock, as a raft
/// snapshot is: applies wait for it.
#[utoipa::path(get, path = "/v1/cluster/snapshot", tag = "cluster",
    responses(
        (status = 200, description = "the snapshot file (docs/operations.md, Backup and restore)", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 403, description = "forbidden: not an admin", body = ErrorBody),
        NotLeader,
    ))]
pub async fn snapshot(
    State(app): State<App>,
    axum::extract::Extension(caller): axum::extract::Extension<super::Caller>,
) -> Result<Response, super::ApiError> {
    let r = save_snapshot(&app, &caller).await;
    app.audit(&caller, "snapshot_save", None, None, &r);
    r
}

async fn save_snapshot(app: &App, caller: &super::Caller) -> Result<Response, super::ApiError> {
    caller.require_admin()?;
    let node = &app.locks.node;
    node.linearize().await.map_err(fenced_core::Error::from)?;
    let (sm, id) = (node.state_machine().clone(), node.id());
    let bytes = tokio::task::spawn_blocking(move || fenced_raft::backup::save(&sm, id))
        .await
        .map_err(|e| super::ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "snapshot_failed", e.to_string()))?
        .map_err(|e| super::ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "snapshot_failed", e.to_string()))?;
    tracing::info!(bytes = bytes.len(), "snapshot saved for a backup");
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `DELETE /v1/cluster/members/{id}`: the member leaves the voters. Leader only.
#[utoipa::path(delete, path = "/v1/cluster/members/{id}", tag = "cluster",
    params(("id" = u64, Path, description = "the member's id")),
    responses(
        (status = 200, description = "the member left the voters", body = ClusterView),
        (status = 400, description = "invalid_request (an id that is not a number)", body = ErrorBody),
        MembershipChangeFailed,
        NotLeader,
    ))]
pub async fn remove_member(
    State(app): State<App>,
    axum::extract::Extension(caller): axum::extract::Extension<super::Caller>,
    axum::extract::Path(id): axum::extract::Path<u64>,
) -> Result<Response, super::ApiError> {
    let r = remove(&app, &caller, id).await;
    app.audit(&caller, "member_remove", Some(&id.to_string()), None, &r);
    r
}

async fn remove(app: &App, caller: &super::Caller, id: u64) -> Result<Response, super::ApiError> {
    caller.require_admin()?;
    let node = &app.locks.node;
    if !node.is_leading() {
        return Err(fenced_core::Error::from(node.not_leader()).into());
    }
    node.remove_member(id)
        .await
        .map_err(|e| super::ApiError::new(StatusCode::CONFLICT, "membership_change_failed", e))?;
    Ok(status(app))
}

fn status(app: &App) -> Response {
    reply(StatusCode::OK, &cluster_view(app))
}

fn cluster_view(app: &App) -> ClusterView {
    let s = app.locks.node.status();
    let members = s
        .members
        .into_iter()
        .map(|m| MemberView { id: m.id, url: m.url, role: m.role, last_log_index: m.last_log_index })
        .collect();
    ClusterView {
        id: s.id,
        state: s.state,
        leader_id: s.leader_id,
        term: s.term,
        commit_index: s.commit_index,
        last_applied_index: s.last_applied_index,
        last_log_index: s.last_log_index,
        snapshot_index: s.snapshot_index,
        purged_index: s.purged_index,
        members,
        limits_agreed: s.limits_agreed,
        applied_index: None,
        state_hash: None,
    }
}

/// One verifying key of `GET /v1/keys`.
#[derive(Serialize, ToSchema)]
pub struct KeyView {
    /// The first 8 bytes of the public key, in hex: a grant's `key_id`.
    key_id: String,
    /// Always `ed25519`.
    algorithm: String,
    /// The 32-byte Ed25519 public key, in hex.
    public_key: String,
    /// `active` (signs grants now) or `retired` (verifies what it signed, until `valid_until_unix`).
    status: String,
    #[schema(required = true)]
    valid_until_unix: Option<u64>,
}

/// `GET /v1/keys`.
#[derive(Serialize, ToSchema)]
pub struct KeysView {
    /// The service's identity, in every signature.
    service: String,
    keys: Vec<KeyView>,
}

/// `GET /v1/keys`: the keys that verify grant signatures (docs/server.md, *Signed
/// grants*); 404 `not_signing` when grants are not signed.
#[utoipa::path(get, path = "/v1/keys", tag = "locks",
    responses(
        (status = 200, description = "the service's identity and its verifying keys", body = KeysView),
        (status = 404, description = "not_signing: this server signs no grants (no grant_signing_key)", body = ErrorBody),
    ))]
pub async fn keys(State(app): State<App>) -> Result<Response, ApiError> {
    let Some(signer) = &app.signer else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_signing",
            "this server signs no grants: start it with grant_signing_key",
        ));
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(reply(StatusCode::OK, &signer.keys_view(now)))
}

/// `GET /v1/cluster`: the members, the leader, the term and the commit index, as this
/// member sees them (a single server answers as a cluster of one). With
/// `?digest=true` also this member's `applied_index` and `state_hash`, taken together:
/// members that applied the same log agree on the hash.
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    params(("digest" = Option<bool>, Query, description = "add this member's applied_index and state_hash")),
    responses(
        (status = 200, description = "the cluster", body = ClusterView),
        InvalidQuery,
    ))]
pub async fn cluster(State(app): State<App>, QueryMap(query): QueryMap) -> Result<Response, ApiError> {
    let digest = match query.get("digest").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad_request("invalid_query", format!("digest is true or false, not '{other}'")))
        }
    };
    if let Some(k) = query.keys().find(|k| *k != "digest") {
        return Err(ApiError::bad_request("invalid_query", format!("unknown parameter '{k}' (only digest)")));
    }
    let mut view = cluster_view(&app);
    if digest {
        let d = app.locks.node.state_machine().digest().map_err(ApiError::internal)?;
        view.applied_index = d.applied_index;
        view.state_hash = Some(d.state_hash);
    }
    Ok(reply(StatusCode::OK, &view))
}

#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text", content_type = "text/plain", body = String)))]
pub async fn metrics(State(app): State<App>) -> Response {
    let node = &app.locks.node;
    let mut text = app.metrics.render(&app.locks.gauges(), &node.figures(), node.log_metrics());
    text.push_str(&app.disk.render());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "this document (OpenAPI 3.1), with this server's limits", body = Object)))]
pub async fn openapi(State(app): State<App>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], app.openapi.clone()).into_response()
}

/// `GET /v1/events`: one SSE event per granted, released, expired, and store
/// accepted/rejected, each with its `index` (also the SSE `id:`). `?prefix=P` keeps the
/// events of names and keys that start with P; `?since=N` (or the `Last-Event-ID`
/// header) starts exactly after index N, from the events this member keeps
/// (`events_retained`), or is answered 410 `compacted` with the oldest index held;
/// `?tail=N` starts with the last N events held. A reader that falls behind what is
/// held gets a `lagged` event with the number of positions it missed, then goes on.
/// The stream ends when the server shuts down.
#[utoipa::path(get, path = "/v1/events", tag = "operations",
    params(
        ("prefix" = Option<String>, Query, description = "only events of lock names and store keys that start with it"),
        ("since" = Option<u64>, Query, description = "start exactly after this index (a resume); the `Last-Event-ID` header does the same"),
        ("tail" = Option<u64>, Query, description = "start with the last this many events held (not with `since`)"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = EventData,
            description = "server-sent events: each event's `id:` is its index, its `event:` its type (granted, released, \
                expired, store_accepted, store_rejected, lagged) and its `data:` one JSON object of this schema"),
        InvalidQuery,
        (status = 410, description = "compacted: `since` is older than every event held (`oldest_index`: a `since` of at least one below it resumes)", body = ErrorBody),
    ))]
pub async fn events(
    State(app): State<App>,
    axum::extract::Extension(caller): axum::extract::Extension<super::Caller>,
    headers: axum::http::HeaderMap,
    query: QueryMap,
) -> Response {
    match open_events(app, caller, &headers, query) {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Where a watcher starts, from its query and headers.
pub fn event_start(
    headers: &axum::http::HeaderMap,
    query: &HashMap<String, String>,
) -> Result<(Start, String), ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    if let Some(k) = query.keys().find(|k| !["prefix", "since", "tail"].contains(&k.as_str())) {
        return Err(bad(format!("unknown parameter '{k}' (prefix, since, tail)")));
    }
    let prefix = query.get("prefix").cloned().unwrap_or_default();
    if prefix.len() > fenced_core::LockName::LEN_MAX.max(1024) {
        return Err(bad("the prefix is longer than any name or key".into()));
    }
    let number = |what: &str, raw: &str| {
        raw.trim().parse::<u64>().map_err(|_| bad(format!("{what} is a whole number, not '{raw}'")))
    };
    let last_id = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("?"));
    let start = match (query.get("since").map(String::as_str).or(last_id), query.get("tail")) {
        (Some(_), Some(_)) => return Err(bad("give since (or Last-Event-ID) or tail, not both".into())),
        (Some(since), None) => Start::After(number("since", since)?),
        (None, Some(tail)) => Start::Tail(number("tail", tail)?.min(usize::MAX as u64) as usize),
        (None, None) => Start::Now,
    };
    Ok((start, prefix))
}

fn open_events(
    app: App,
    caller: super::Caller,
    headers: &axum::http::HeaderMap,
    QueryMap(query): QueryMap,
) -> Result<Response, ApiError> {
    let (start, prefix) = event_start(headers, &query)?;
    let watcher = Watcher::open(&app, caller.identity, start, prefix).map_err(compacted)?;
    let s =
        stream::unfold(watcher, |mut w| async move { w.next().await.map(|item| (Ok::<_, Infallible>(sse(item)), w)) });
    // Comments keep the stream from looking idle to the connection's idle timeout.
    let idle_ms = app.config.idle_timeout_ms;
    let every_ms = if idle_ms == 0 { 15_000 } else { (idle_ms / 3).clamp(10, 15_000) };
    Ok(Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_millis(every_ms))).into_response())
}

/// 410 `compacted`: the watch's start is older than every event held.
pub fn compacted(c: Compacted) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "compacted",
        "events after this index are no longer all held here; resume from oldest_index - 1 or list the locks again",
    )
    .with(Detail::OldestIndex(c.oldest_index))
}

/// One item of a watch as an SSE event: an event's `id:` is its index and its `event:`
/// its type; a position marker is an `id:` with no data (an EventSource keeps it as its
/// last event id, dispatching nothing).
fn sse(item: Item) -> SseEvent {
    match item {
        Item::Event(e) => {
            let ev = SseEvent::default().id(e.index.to_string()).event(e.event.kind());
            ev.data(data(EventData::Event((*e).clone())))
        }
        Item::Mark(at) => SseEvent::default().id(at.to_string()).comment("position"),
        Item::Lagged(missed) => SseEvent::default().event("lagged").data(data(EventData::Lagged(Lagged { missed }))),
    }
}
