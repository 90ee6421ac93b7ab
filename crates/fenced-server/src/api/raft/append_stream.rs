//! A member's side of a leader's append stream (`fenced_raft::append_stream`): the
//! upgrade, then each append read as it comes and handed to openraft's streaming
//! append, and each answer written back in order.
//!
//! The bounds are those of append messages: a frame is at most
//! [`super::PEER_BODY_BYTES_MAX`] and holds its length of the peer budget from before
//! it is read until it is answered (at most `IN_FLIGHT_MAX` wait), and one that does
//! not decode (a damaged record) ends the stream, never reaching the log.
//! A stream with no append for [`fenced_raft::append_stream::IDLE`] is closed: a
//! leader cut off or frozen does not keep this member's connections.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fenced_raft::append_stream::{self as stream, Answer};
use fenced_raft::openraft::errors::RaftError;
use fenced_raft::openraft::raft::AppendEntriesRequest;
use fenced_raft::TypeConfig;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{ApiError, App, PEER_BODY_BYTES_MAX};

/// `POST /raft/append-stream` with `Upgrade: fenced-raft-append`: 101, and the stream
/// runs in a task of its own on the upgraded connection.
pub async fn open(axum::extract::State(app): axum::extract::State<App>, mut req: axum::extract::Request) -> Response {
    let asks = req.headers().get(hyper::header::UPGRADE).is_some_and(|v| v == stream::PROTOCOL);
    let Some(upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>().filter(|_| asks) else {
        let m = format!(
            "an append stream is asked with `Upgrade: {}` on a connection that can be upgraded",
            stream::PROTOCOL
        );
        return ApiError::bad_request("invalid_upgrade", m).into_response();
    };
    // The stream is a request in flight for as long as it runs: the connection's idle
    // and head deadlines (`listener.rs`), meant for HTTP between requests, do not
    // apply to its frames; its own idle bound does.
    let conn = req.extensions().get::<axum::extract::ConnectInfo<crate::listener::ConnMeta>>().map(|i| i.0.clone());
    let busy = conn.as_ref().map(crate::listener::InFlight::new);
    tokio::spawn(async move {
        let _busy = busy;
        match upgrade.await {
            Ok(io) => serve(app, TokioIo::new(io)).await,
            Err(e) => tracing::debug!(error = %e, "an append stream was not upgraded"),
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (hyper::header::CONNECTION.as_str(), "upgrade"),
            (hyper::header::UPGRADE.as_str(), stream::PROTOCOL),
            (fenced_raft::framing::ACCEPTS_HEADER, super::LEVEL),
        ],
    )
        .into_response()
}

/// Reads appends and writes answers until the leader closes the stream, an answer
/// ends it (a refusal, a conflict), or it idles past [`stream::IDLE`].
async fn serve<IO: AsyncRead + AsyncWrite + Send + 'static>(app: App, io: IO) {
    let (mut r, mut w) = tokio::io::split(io);
    let (tx, rx) = tokio::sync::mpsc::channel(stream::IN_FLIGHT_MAX);
    // Each append's share of the peer budget, held until it is answered (in order):
    // the appends a leader keeps in flight weigh on this member's memory together.
    let held = std::sync::Mutex::new(std::collections::VecDeque::new());
    let answers = app.locks.node.raft.stream_append(tokio_stream_of(rx));
    let read = async {
        loop {
            match next_append(&app, &mut r).await {
                Ok(Some((req, permit))) => {
                    held.lock().unwrap_or_else(|p| p.into_inner()).push_back(permit);
                    if tx.send(req).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(why) => {
                    tracing::warn!(%why, "an append stream from the leader ended");
                    break;
                }
            }
        }
        drop(tx);
        // The answers still due are written; the write side ends the stream.
        std::future::pending::<()>().await
    };
    let write = async {
        let mut answers = std::pin::pin!(answers);
        while let Some(answer) = answers.next().await {
            let answer: Answer = answer.map_err(RaftError::Fatal);
            let last = !matches!(answer, Ok(Ok(_)));
            let Ok(bytes) = serde_json::to_vec(&answer) else { return };
            if stream::write_frame(&mut w, &bytes).await.is_err() || last {
                return;
            }
            drop(held.lock().unwrap_or_else(|p| p.into_inner()).pop_front());
        }
    };
    tokio::select! {
        () = read => {}
        () = write => {}
    }
}

/// The next append and its share of the peer budget, `None` when the leader closed
/// the stream between two. An error says why the stream cannot go on.
async fn next_append<R: AsyncRead + Unpin>(
    app: &App,
    r: &mut R,
) -> Result<Option<(AppendEntriesRequest<TypeConfig>, tokio::sync::OwnedSemaphorePermit)>, String> {
    let len = match tokio::time::timeout(stream::IDLE, stream::read_len(r, PEER_BODY_BYTES_MAX)).await {
        Err(_) => return Err(format!("no append in {} s", stream::IDLE.as_secs())),
        Ok(r) => r.map_err(|e| e.to_string())?,
    };
    let Some(len) = len else { return Ok(None) };
    // Waits for room (the appends ahead of it answered, a snapshot received), within
    // the body deadline.
    let body = std::time::Duration::from_millis(app.config.body_timeout_ms.max(1000));
    let budget = app.peer_budget.clone().acquire_many_owned(len.max(1) as u32);
    let permit = match tokio::time::timeout(body, budget).await {
        Ok(Ok(permit)) => permit,
        _ => return Err(format!("no room in the peer budget for an append of {len} bytes")),
    };
    let bytes = match tokio::time::timeout(body, stream::read_body(r, len)).await {
        Err(_) => return Err(format!("an append of {len} bytes did not arrive within {} ms", body.as_millis())),
        Ok(r) => r.map_err(|e| e.to_string())?,
    };
    let req =
        fenced_raft::framing::decode_append(&bytes).map_err(|e| format!("an append that does not decode: {e}"))?;
    Ok(Some((req, permit)))
}

/// The receiver as a stream (openraft's streaming append takes one).
fn tokio_stream_of<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}
