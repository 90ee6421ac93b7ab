//! Operations endpoints: health, metrics, the OpenAPI document, the event stream
//! and the placeholder page at `/`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::{json, ApiError, App};

pub const OPENAPI_DOC: &str = include_str!("../../assets/openapi.json");

pub async fn livez() -> Response {
    json(StatusCode::OK, &json!({ "status": "live" }))
}

pub async fn readyz(State(app): State<App>) -> Response {
    if *app.shutdown.borrow() {
        return json(StatusCode::SERVICE_UNAVAILABLE, &json!({ "status": "shutting_down" }));
    }
    let left = app.locks.view(|t, now| t.grace_left_ms(now));
    let node = &app.locks.node;
    let leading = node.is_leading();
    let leader = if leading { Some(node.id()) } else { node.not_leader().leader };
    if leader.is_none() {
        return json(StatusCode::SERVICE_UNAVAILABLE, &json!({ "status": "no_leader" }));
    }
    json(
        StatusCode::OK,
        &json!({ "status": "ready", "leader": leading, "leader_id": leader, "recovering": left > 0, "grace_left_ms": left }),
    )
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    id: u64,
    url: String,
}

/// `POST /v1/cluster/members` `{"id","url"}`: the new member catches up as a learner,
/// then joins the voters; answered with the cluster's status once it has. Leader only.
pub async fn add_member(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, super::ApiError> {
    let req: AddMember = app.json_body(&headers, body).await?;
    if req.id == 0 || !(req.url.starts_with("http://") || req.url.starts_with("https://")) {
        return Err(super::ApiError::bad_request(
            "invalid_field",
            "a member needs an id of at least 1 and an http(s) URL",
        ));
    }
    let node = &app.locks.node;
    if !node.is_leading() {
        return Err(fenced_core::Error::from(node.not_leader()).into());
    }
    node.add_member(req.id, req.url.trim_end_matches('/').to_string())
        .await
        .map_err(|e| super::ApiError::new(StatusCode::CONFLICT, "membership_change_failed", e))?;
    Ok(status(&app))
}

/// `DELETE /v1/cluster/members/{id}`: the member leaves the voters. Leader only.
pub async fn remove_member(
    State(app): State<App>,
    axum::extract::Path(id): axum::extract::Path<u64>,
) -> Result<Response, super::ApiError> {
    let node = &app.locks.node;
    if !node.is_leading() {
        return Err(fenced_core::Error::from(node.not_leader()).into());
    }
    node.remove_member(id)
        .await
        .map_err(|e| super::ApiError::new(StatusCode::CONFLICT, "membership_change_failed", e))?;
    Ok(status(&app))
}

fn status(app: &App) -> Response {
    json(StatusCode::OK, &serde_json::to_value(app.locks.node.status()).unwrap_or_default())
}

/// `GET /v1/cluster`: the members, the leader, the term and the commit index, as this
/// member sees them (a single server answers as a cluster of one). With
/// `?digest=true` also this member's `applied_index` and `state_hash`, taken together:
/// members that applied the same log agree on the hash.
pub async fn cluster(
    State(app): State<App>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
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
    let mut body = serde_json::to_value(app.locks.node.status()).unwrap_or_default();
    if digest {
        let d = app.locks.node.state_machine().digest().map_err(ApiError::internal)?;
        body["applied_index"] = json!(d.applied_index);
        body["state_hash"] = json!(d.state_hash);
    }
    Ok(json(StatusCode::OK, &body))
}

pub async fn metrics(State(app): State<App>) -> Response {
    let text = app.metrics.render(&app.locks.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_DOC).into_response()
}

/// `GET /v1/events`: one SSE event per granted, released, expired, and store
/// accepted/rejected. A slow reader that falls behind gets a `lagged` event with the
/// number it missed. The stream ends when the server shuts down.
pub async fn events(State(app): State<App>) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let rx = app.locks.events.subscribe();
    let shutdown = app.shutdown.clone();
    let s = stream::unfold((rx, shutdown), |(mut rx, mut shutdown)| async move {
        if *shutdown.borrow() {
            return None;
        }
        let got = tokio::select! {
            r = rx.recv() => r,
            _ = shutdown.changed() => return None,
        };
        let ev = match got {
            Ok(e) => SseEvent::default().event(e.kind()).data(serde_json::to_string(&e).expect("serializes")),
            Err(RecvError::Lagged(n)) => SseEvent::default().event("lagged").data(json!({ "missed": n }).to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok(ev), (rx, shutdown)))
    });
    // Comments keep the stream from looking idle to the connection's idle timeout.
    let idle_ms = app.config.idle_timeout_ms;
    let every_ms = if idle_ms == 0 { 15_000 } else { (idle_ms / 3).clamp(10, 15_000) };
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_millis(every_ms)))
}
