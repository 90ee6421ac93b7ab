//! The peer routes: openraft's RPCs from the other members (`POST /raft/...`), each
//! answering openraft's `Result<Response, RaftError>` as JSON. Behind the same bearer
//! token as `/v1` when one is configured.

use std::io::Cursor;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{ApiError, App};

/// The largest peer message taken: a snapshot of a large table travels whole.
pub const PEER_BODY_BYTES_MAX: usize = 512 << 20;

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request("invalid_json", format!("a peer message: {e}")))
}

fn answer<T: Serialize>(r: &T) -> Response {
    match serde_json::to_vec(r) {
        Ok(body) => (StatusCode::OK, [("content-type", "application/json")], body).into_response(),
        Err(_) => ApiError::internal("a raft answer did not serialize").into_response(),
    }
}

pub async fn append(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    Ok(answer(&app.locks.node.raft.append_entries(decode(&body)?).await))
}

pub async fn vote(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    Ok(answer(&app.locks.node.raft.vote(decode(&body)?).await))
}

pub async fn pre_vote(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    Ok(answer(&app.locks.node.raft.pre_vote(decode(&body)?).await))
}

pub async fn snapshot(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    let (vote, meta, data): (fenced_raft::Vote, fenced_raft::SnapshotMeta, Vec<u8>) = decode(&body)?;
    let snapshot = fenced_raft::Snapshot { meta, snapshot: Cursor::new(data) };
    let r = app.locks.node.raft.install_full_snapshot(vote, snapshot).await;
    Ok(answer(&r.map_err(openraft_fatal)))
}

pub async fn transfer_leader(State(app): State<App>, body: Bytes) -> Result<Response, ApiError> {
    let r = app.locks.node.raft.handle_transfer_leader(decode(&body)?).await;
    Ok(answer(&r.map_err(openraft_fatal)))
}

fn openraft_fatal(
    e: fenced_raft::openraft::errors::Fatal<fenced_raft::TypeConfig>,
) -> fenced_raft::openraft::errors::RaftError<fenced_raft::TypeConfig> {
    fenced_raft::openraft::errors::RaftError::Fatal(e)
}
