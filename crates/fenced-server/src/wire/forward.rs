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
//!
//! Error answers differ between protocol versions, so the follower names the version
//! its client speaks ([`VERSION_HEADER`]) and the leader answers in it, saying so in the
//! same header. Through a rolling upgrade either may be of the release before, which
//! knows no such header and speaks version 2: a leader asked nothing answers version 2,
//! and a follower whose leader said nothing translates an error answer into the
//! version its client speaks ([`in_version`]).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use fenced_wire::{self as w, op, Request, Response, Version};
use http_body_util::BodyExt as _;

use super::conn::{dispatch, encode_answer, json_bytes, Answer, Call};
use crate::api::{self, details_from_json, error_json, forward, ApiError, App, Caller};

/// The peer route a forwarded frame goes to, under `/raft/forward`.
pub const PATH: &str = "/wire";
/// On a forwarded frame, the protocol version the client speaks; on the leader's
/// answer, the version it answered in. Absent: version 2 (a member of the release
/// before).
pub const VERSION_HEADER: &str = "x-fenced-wire-version";
/// Beyond the longest wait a request may ask for: the time a forwarded frame is given.
const SLACK: Duration = Duration::from_secs(15);

/// The follower's side: frame `id` (`op`, `payload`) sent to the leader for `caller`,
/// and the leader's answer frame. A member elected but not yet in office waits for
/// office first ([`fenced_raft::Node::await_office`]) and then runs the frame itself,
/// as the HTTP listener does.
pub(super) async fn to_leader(app: App, caller: Caller, id: u32, op: u8, payload: Vec<u8>, version: Version) -> Answer {
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
    headers.push((VERSION_HEADER.into(), version.number().to_string().into_bytes()));
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
    let answered = answer.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(VERSION_HEADER)).map(|(_, v)| v);
    let answered = answered.map_or(Some(Version::V2), |v| header_version(v));
    match w::split_frame(&bytes, max) {
        Ok(Some((got, _, _, used))) if got == id && used == bytes.len() => {
            match answered.and_then(|from| in_version(&bytes, from, version)) {
                Some(frame) => Answer::Frame(frame),
                None => Answer::Error(unreachable_leader("the leader's answer is in no version we speak".into())),
            }
        }
        _ => Answer::Error(unreachable_leader("the leader answered a forwarded frame with another frame".into())),
    }
}

/// The version a [`VERSION_HEADER`] names, if this release speaks it.
fn header_version(v: &[u8]) -> Option<Version> {
    std::str::from_utf8(v).ok()?.trim().parse().ok().and_then(Version::from_number)
}

/// `frame`, answered in version `from`, as version `to` writes it: unchanged but for an
/// error answer between versions (version 2's JSON body and version 3's typed fields
/// carry the same code, message and details). `None` when the error does not read.
pub(super) fn in_version(frame: &[u8], from: Version, to: Version) -> Option<Vec<u8>> {
    let (id, kind, payload, _) = w::split_frame(frame, usize::MAX).ok()??;
    if kind != op::ERROR || from == to {
        return Some(frame.to_vec());
    }
    // The versions differ: `to` is the other one.
    let mut out = Vec::new();
    match from {
        Version::V2 => {
            let (code, body) = w::v2::decode_error(payload)?;
            let json: serde_json::Value = serde_json::from_slice(body).ok()?;
            let error = json["error"].as_object()?;
            let message = error.get("message").and_then(serde_json::Value::as_str).unwrap_or_default();
            let details = details_from_json(code, error);
            w::encode_response(&mut out, id, &Response::Error { code, message, details });
        }
        Version::V3 => {
            let Ok(Response::Error { code, message, details }) = w::decode_response(id, kind, payload) else {
                return None;
            };
            w::v2::encode_error(&mut out, id, code, &json_bytes(&error_json(code, message, &details)));
        }
    }
    Some(out)
}

/// The leader's side (`POST /raft/forward/wire`): the caller found by the name the member
/// sent, the frame run as one of this member's own connections would run it, answered
/// with the encoded answer frame.
pub async fn from_member(app: App, req: axum::extract::Request) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let version = match parts.headers.get(VERSION_HEADER) {
        // A member of the release before, which speaks version 2 only.
        None => Version::V2,
        Some(v) => match header_version(v.as_bytes()) {
            Some(v) => v,
            None => {
                let m = format!("{VERSION_HEADER} names a wire protocol version this member does not speak");
                return ApiError::bad_request("invalid_forward", m).into_response();
            }
        },
    };
    match answer_frame(&app, &parts.headers, body, version).await {
        Ok(frame) => {
            let headers = [
                ("content-type", "application/octet-stream".to_string()),
                (VERSION_HEADER, version.number().to_string()),
            ];
            (StatusCode::OK, headers, frame).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn answer_frame(app: &App, headers: &HeaderMap, body: Body, version: Version) -> Result<Vec<u8>, ApiError> {
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
    encode_answer(&mut out, id, &answer, version);
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

#[cfg(test)]
mod tests {
    use fenced_core::Token;
    use fenced_wire::Detail;

    use super::*;
    use crate::wire::conn::encode_error;

    #[test]
    fn an_error_answer_is_the_same_error_in_either_version() {
        let holder = Token::new(4);
        let e = ApiError::from(fenced_core::Error::LockHeld { holder }).with(Detail::LeaderUrl("https://m2".into()));
        let (mut v2, mut v3) = (Vec::new(), Vec::new());
        encode_error(&mut v2, 9, &e, Version::V2);
        encode_error(&mut v3, 9, &e, Version::V3);
        assert_ne!(v2, v3);
        assert_eq!(in_version(&v2, Version::V2, Version::V3), Some(v3.clone()), "an earlier leader's answer");
        assert_eq!(in_version(&v3, Version::V3, Version::V2), Some(v2.clone()));
        assert_eq!(in_version(&v3, Version::V3, Version::V3), Some(v3.clone()));
        // Every other answer is the same frame in both versions.
        let mut ok = Vec::new();
        w::encode_response(&mut ok, 9, &Response::Released { token: Token::new(4).unwrap() });
        assert_eq!(in_version(&ok, Version::V2, Version::V3), Some(ok.clone()));
        // An error answer that does not read is no answer to relay.
        let mut bad = Vec::new();
        w::v2::encode_error(&mut bad, 9, "lock_held", b"not JSON");
        assert_eq!(in_version(&bad, Version::V2, Version::V3), None);
        assert_eq!(in_version(&v2, Version::V3, Version::V2), None, "version 2's body is no version-3 error");
    }

    #[test]
    fn a_version_header_names_a_version_spoken_here() {
        assert_eq!(header_version(b"3"), Some(Version::V3));
        assert_eq!(header_version(b" 2 "), Some(Version::V2));
        assert_eq!(header_version(b"4"), None);
        assert_eq!(header_version(b"\xff"), None);
    }
}
