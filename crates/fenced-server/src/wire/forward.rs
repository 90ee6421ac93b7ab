//! Followers forward over the wire protocol too: a request made to a follower is sent
//! to the leader as its frame, `POST /raft/forward/wire` on the peer channel with the
//! caller's identity (as `/raft/forward/v1/...` carries an HTTP request), and the
//! leader's answer, one frame, is written back as it came.
//!
//! - One request per forward: the client's connection stays with this member, its
//!   requests in flight are each their own call to the leader, and CANCEL of a waiting
//!   acquire drops that call (the leader withdraws the waiter whose caller went away).
//! - AUTH and CANCEL are the connection's own and are never forwarded.
//! - When there is no live leader to send it to, or the leader's answer is not one
//!   frame for this request, the request is answered `not_leader` with the leader's id
//!   and URL, as an HTTP request is: the client moves on through its endpoints.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use fenced_wire as w;

use super::conn::{dispatch, encode_answer, Answer, Call};
use crate::api::forward::{caller_headers, forwarded_caller, member_forwards, not_leader};
use crate::api::{ApiError, App, Caller};

/// The leader's route for forwarded frames (beside `/raft/forward/{*rest}`).
pub const ROUTE: &str = "/raft/forward/wire";
/// Beyond the longest wait a request may ask for: the time a forwarded call is given.
const SLACK: Duration = Duration::from_secs(15);

/// Whether this member passes its wire requests to the leader.
pub(super) fn wanted(app: &App) -> bool {
    member_forwards(app)
}

/// Sends request `id` (encoded in `frame`) to the leader and answers with the leader's
/// answer frame.
pub(super) async fn to_leader(app: &App, caller: &Caller, id: u32, frame: Vec<u8>) -> Answer {
    let mut headers = caller_headers(caller);
    headers.push(("content-type".into(), b"application/octet-stream".to_vec()));
    let out = fenced_raft::network::Outgoing {
        method: Method::POST,
        path_and_query: "/wire".into(),
        headers,
        body: frame.into(),
    };
    let timeout = Duration::from_millis(app.config.wait_ms_max) + SLACK;
    let node = &app.locks.node;
    let answer = match node.forward_to_leader(out, timeout).await {
        Ok(answer) => answer,
        Err(to) => return Answer::Error(not_leader(to)),
    };
    // An answer frame holds at most a value, as a request frame does.
    let max = app.config.body_bytes_max.max(app.config.value_bytes_max) + w::FRAME_OVERHEAD_BYTES;
    let status = answer.status;
    match axum::body::to_bytes(Body::new(answer.body), max).await {
        Ok(body) if status == 200 && is_answer_to(&body, id) => Answer::Frame(body.to_vec()),
        _ => {
            tracing::warn!(status, "the leader's answer to a forwarded wire request is not one frame");
            Answer::Error(not_leader(node.not_leader()))
        }
    }
}

/// Whether `body` is exactly one well-formed answer frame to request `id`.
fn is_answer_to(body: &[u8], id: u32) -> bool {
    match w::split_frame(body, usize::MAX) {
        Ok(Some((got, kind, payload, used))) => {
            got == id && used == body.len() && w::decode_response(id, kind, payload).is_ok()
        }
        _ => false,
    }
}

/// The leader's side: the frame decoded, run for the caller the member named, and
/// answered as one frame (errors included: an error is an answer like any other).
pub async fn from_member(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let max = app.config.body_bytes_max + w::FRAME_OVERHEAD_BYTES;
    let bytes = match crate::api::read_body(&app, &headers, body, max, "frame").await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Ok(Some((id, op, payload, used))) = w::split_frame(&bytes, max) else {
        return ApiError::bad_request("invalid_forward", "a forwarded wire request is one whole frame").into_response();
    };
    if used != bytes.len() {
        return ApiError::bad_request("invalid_forward", "a forwarded wire request is one frame, no more")
            .into_response();
    }
    let answer = match (forwarded_caller(&app, &headers), w::decode_request(id, op, payload)) {
        (Err(e), _) => Answer::Error(e),
        (_, Err(e)) => Answer::Error(ApiError::bad_request("invalid_frame", format!("a forwarded frame: {e:?}"))),
        (Ok(caller), Ok(req)) => match dispatch(&app, caller, req) {
            Call::Now(answer) => answer,
            Call::Later { call, .. } => call.await,
        },
    };
    let mut out = Vec::new();
    encode_answer(&mut out, id, &answer);
    (StatusCode::OK, [("content-type", "application/octet-stream")], out).into_response()
}
