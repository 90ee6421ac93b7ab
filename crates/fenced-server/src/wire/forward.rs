//! Followers forward wire requests too: a frame that needs the leader, sent to a
//! follower, goes to the leader over the peer channel as it arrived (its id, op and
//! payload, `POST /raft/forward/wire`), the leader runs it through the same dispatch as
//! its own connections' frames, and the frame it answers is written back to the client
//! unchanged. So one wire address of any member serves the whole protocol, as one HTTP
//! address does (`api::forward`, whose rules this follows: the caller authenticated
//! here and named to the leader, never forwarded twice, `not_leader` with the leader's
//! id and URL when there is no leader to reach).
//!
//! AUTH and CANCEL stay with the connection: a CANCEL drops the forwarded call, and the
//! leader withdraws a queued acquire whose caller went away, as for HTTP.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use fenced_wire::{self as w, Request};
use http_body_util::BodyExt as _;

use super::conn::{dispatch, encode_answer, Answer, Call};
use crate::api::{self, forward, ApiError, App, Caller};

/// The peer route a forwarded frame goes to, under `/raft/forward`.
pub const PATH: &str = "/wire";
/// Beyond the longest wait a request may ask for: the time a forwarded frame is given.
const SLACK: Duration = Duration::from_secs(15);

/// The follower's side: frame `id` (`op`, `payload`) sent to the leader for `caller`,
/// and the leader's answer frame. A member elected but not yet in office waits for
/// office first ([`fenced_raft::Node::await_office`]) and then runs the frame itself,
/// as the HTTP listener does.
pub(super) async fn to_leader(app: App, caller: Caller, id: u32, op: u8, payload: Vec<u8>) -> Answer {
    app.locks.node.await_office().await;
    if !forward::member_forwards(&app) {
        let call = match w::decode_request(id, op, &payload) {
            Ok(req) => dispatch(&app, caller, req),
            Err(e) => return Answer::Error(ApiError::bad_request("invalid_frame", format!("{e:?}"))),
        };
        return match call {
            Call::Now(answer) => answer,
            Call::Later { call, .. } => call.await,
        };
    }
    let mut body = Vec::with_capacity(5 + payload.len());
    body.extend_from_slice(&id.to_be_bytes());
    body.push(op);
    body.extend_from_slice(&payload);
    let mut headers = forward::caller_headers(&caller);
    headers.push(("content-type".into(), b"application/octet-stream".to_vec()));
    let out = fenced_raft::network::Outgoing {
        method: Method::POST,
        path_and_query: PATH.into(),
        headers,
        body: Bytes::from(body),
    };
    let timeout = Duration::from_millis(app.config.wait_ms_max) + SLACK;
    let answer = match app.locks.node.forward_to_leader(out, timeout).await {
        Ok(a) => a,
        Err(to) => return Answer::Error(forward::not_leader(to)),
    };
    // The longest answer is a read of the largest value.
    let max = app.config.value_bytes_max + w::FRAME_OVERHEAD_BYTES;
    let bytes = match http_body_util::Limited::new(answer.body, max).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Answer::Error(unreachable_leader(format!("the leader's answer did not arrive: {e}"))),
    };
    if answer.status != 200 {
        return Answer::Error(relayed_error(answer.status, &bytes));
    }
    match w::split_frame(&bytes, max) {
        Ok(Some((got, _, _, used))) if got == id && used == bytes.len() => Answer::Frame(bytes.to_vec()),
        _ => Answer::Error(unreachable_leader("the leader answered a forwarded frame with another frame".into())),
    }
}

/// The leader's side (`POST /raft/forward/wire`): the caller found by the name the member
/// sent, the frame run as one of this member's own connections would run it, answered
/// with the encoded answer frame.
pub async fn from_member(app: App, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    match answer_frame(&app, &parts.headers, body).await {
        Ok(frame) => (StatusCode::OK, [("content-type", "application/octet-stream")], frame).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn answer_frame(app: &App, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let caller = forward::forwarded_caller(app, headers)?;
    let max = app.config.body_bytes_max + w::FRAME_OVERHEAD_BYTES;
    // The clients' budget, as for the frame had it come here: forwarded writes must not
    // take the room of the members' own messages (appends, votes).
    let bytes = api::read_body_within(app, &app.body_budget, headers, body, max, "forwarded frame").await?;
    let (Some(id), Some(&op)) = (bytes.get(..4), bytes.get(4)) else {
        return Err(ApiError::bad_request("invalid_forward", "a forwarded frame is at least an id and an op"));
    };
    let id = u32::from_be_bytes(id.try_into().expect("4 bytes"));
    let req = w::decode_request(id, op, &bytes[5..])
        .map_err(|e| ApiError::bad_request("invalid_forward", format!("a forwarded frame does not decode: {e:?}")))?;
    if matches!(req, Request::Auth { .. } | Request::Cancel { .. }) {
        return Err(ApiError::bad_request("invalid_forward", "AUTH and CANCEL are never forwarded"));
    }
    let answer = match dispatch(app, caller, req) {
        Call::Now(answer) => answer,
        Call::Later { call, .. } => call.await,
    };
    let mut out = Vec::new();
    encode_answer(&mut out, id, &answer);
    Ok(out)
}

/// An error the leader's peer route answered (not a frame): its code and message, as
/// the client would have had them from the leader.
fn relayed_error(status: u16, body: &[u8]) -> ApiError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let message = v["error"]["message"].as_str().unwrap_or("the leader refused a forwarded frame").to_string();
    let code = match v["error"]["code"].as_str() {
        Some("unauthorized") => "unauthorized",
        Some("too_large") => "too_large",
        Some("too_busy") => "too_busy",
        Some("not_leader") => "not_leader",
        _ => "invalid_forward",
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let e = ApiError::new(status, code, message);
    match v["error"].as_object() {
        Some(error) => e.with_json_details(error),
        None => e,
    }
}

/// 503 `not_leader` for a leader that could not be heard to the end: the client moves
/// on, as for a leader it cannot reach.
fn unreachable_leader(why: String) -> ApiError {
    tracing::debug!(%why, "a wire frame could not be forwarded");
    ApiError::from(fenced_core::Error::NotLeader { leader: None })
}
