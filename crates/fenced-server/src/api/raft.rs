//! The peer routes: openraft's RPCs from the other members (`POST /raft/...`, JSON,
//! or for an append and a snapshot a binary frame, `fenced_raft::framing`), each
//! answering openraft's `Result<Response, RaftError>` as JSON, and the handshake
//! (`GET /raft/hello`) a leader makes before it adds a member.
//!
//! Who may call them is decided before a handler runs: on a peer listener with
//! certificates, only a member of the cluster CA completes the TLS handshake; without
//! certificates (`insecure_peers`), the client token when one is set. Here, every
//! message is held to the peer budget and the body deadline like a client's body, a
//! snapshot that does not decode is refused before openraft sees it (it would stop the
//! log), and a server that is a cluster of one takes no raft message at all: no member
//! exists who could send one.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{ApiError, App};

mod append_stream;
mod incoming;

pub use incoming::{recovered as recovered_incoming, Incoming};

/// The largest peer message taken whole in memory: appends, votes, and the JSON
/// snapshot of a release before frames. A framed snapshot is received into a file
/// (`incoming::SNAPSHOT_MESSAGE_BYTES_MAX`).
pub const PEER_BODY_BYTES_MAX: usize = 512 << 20;
/// Bytes of peer messages read at once: one snapshot and the appends beside it.
pub const PEER_BYTES_IN_FLIGHT_MAX: usize = PEER_BODY_BYTES_MAX + (64 << 20);
/// Connections the peer listener takes at once (the members need a few each).
pub const PEER_CONNECTIONS_MAX: usize = 64;

/// The raft routes, without the guard that decides who may call them.
pub fn routes(app: App) -> Router<App> {
    // The leader's side of a follower's forwarded request: the `/v1` routes, without
    // the laboratory (never forwarded).
    let v1 = super::v1_routes(app.clone(), Router::new()).with_state(app.clone());
    let forwarded = move |State(app): State<App>, req: axum::extract::Request| {
        let v1 = v1.clone();
        async move {
            let wire = format!("/raft/forward{}", crate::wire::forward::PATH);
            if req.uri().path() == wire && req.method() == axum::http::Method::POST {
                return crate::wire::forward::from_member(app, req).await;
            }
            super::forward::from_member(app, v1, req).await
        }
    };
    Router::new()
        .route("/raft/forward/{*rest}", axum::routing::any(forwarded))
        .route("/raft/append", post(append))
        .route(fenced_raft::append_stream::PATH, post(append_stream::open))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/snapshot-offset", post(snapshot_offset))
        .route("/raft/transfer-leader", post(transfer_leader))
        .layer(axum::middleware::from_fn_with_state(app, only_in_a_cluster))
        .route("/raft/hello", get(hello))
        .layer(axum::extract::DefaultBodyLimit::disable())
}

/// A peer route asked on the client listener while the peer routes have their own.
pub async fn elsewhere() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "the peer routes are served on this member's peer listener only, to members of the cluster",
    )
}

async fn only_in_a_cluster(
    State(app): State<App>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if app.locks.node.is_alone() {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "not_a_cluster",
            "this server is a cluster of one: it takes no message from a peer",
        )
        .into_response();
    }
    next.run(req).await
}

async fn read<T: DeserializeOwned>(app: &App, headers: &HeaderMap, body: Body) -> Result<T, ApiError> {
    let bytes =
        super::read_body_within(app, &app.peer_budget, headers, body, PEER_BODY_BYTES_MAX, "peer message").await?;
    decode(&bytes)
}

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request("invalid_json", format!("a peer message: {e}")))
}

/// Whether a message says it is a frame ([`fenced_raft::framing`]), not JSON.
fn is_framed(headers: &HeaderMap) -> bool {
    headers.get("content-type").is_some_and(|v| v == fenced_raft::framing::CONTENT_TYPE)
}

/// A message's body: a frame when it says so, JSON otherwise.
async fn read_framed<T: DeserializeOwned>(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    unframe: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, ApiError> {
    let bytes =
        super::read_body_within(app, &app.peer_budget, headers, body, PEER_BODY_BYTES_MAX, "peer message").await?;
    if is_framed(headers) {
        return unframe(&bytes).map_err(|why| ApiError::bad_request("invalid_frame", format!("a peer message: {why}")));
    }
    decode(&bytes)
}

/// [`fenced_raft::framing::LEVEL`], as the header says it.
const LEVEL: &str = "5";

/// Every raft answer says that this member takes frames ([`fenced_raft::framing`]).
fn answer<T: Serialize>(r: &T) -> Response {
    match serde_json::to_vec(r) {
        Ok(body) => (
            StatusCode::OK,
            [("content-type", "application/json"), (fenced_raft::framing::ACCEPTS_HEADER, LEVEL)],
            body,
        )
            .into_response(),
        Err(_) => ApiError::internal("a raft answer did not serialize").into_response(),
    }
}

async fn hello(State(app): State<App>) -> Response {
    answer(&app.locks.node.hello().await)
}

/// An append that takes this long to be answered is logged: the leader counts a
/// heartbeat unanswered within about a second as lost.
const SLOW_APPEND: std::time::Duration = std::time::Duration::from_millis(500);

async fn append(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let req = read_framed(&app, &headers, body, fenced_raft::framing::decode_append).await?;
    let (read, entries) = (started.elapsed(), req.entries.len());
    let r = app.locks.node.append_entries(req).await;
    if started.elapsed() >= SLOW_APPEND {
        let (read_ms, raft_ms) = (read.as_millis() as u64, (started.elapsed() - read).as_millis() as u64);
        tracing::warn!(read_ms, raft_ms, entries, "a slow append from the leader: heartbeats wait behind it");
    }
    Ok(answer(&r))
}

async fn vote(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let req = read(&app, &headers, body).await?;
    Ok(answer(&app.locks.node.raft.vote(req).await))
}

async fn pre_vote(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let req = read(&app, &headers, body).await?;
    Ok(answer(&app.locks.node.raft.pre_vote(req).await))
}

async fn snapshot(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    // A framed snapshot (every release since frames) is received into a file, however
    // large; the JSON of releases before frames is read whole, as it always was.
    // The receiver is held to the install: a second message must not replace the file
    // that the install renames over the kept snapshot.
    let mut held = incoming::take(&app.incoming_snapshot)?;
    let framed = is_framed(&headers);
    if framed && incoming::installed_already(&held, &headers)? {
        // Taken whole and installed after the leader gave up on the message: the
        // leader learns it is in place (and this member's vote), and sends no byte.
        let vote = app.locks.node.vote();
        let r = Ok::<_, fenced_raft::openraft::errors::RaftError<fenced_raft::TypeConfig>>(
            fenced_raft::openraft::raft::SnapshotResponse::<fenced_raft::TypeConfig> { vote },
        );
        return Ok(answer(&r));
    }
    let (vote, meta, data): incoming::Received = if framed {
        incoming::receive(&app, &mut held, &headers, body).await?
    } else {
        read(&app, &headers, body).await?
    };
    let file = framed.then(|| incoming::incoming_path(&app));
    // The install runs to its end in a task of its own, holding the receiver, even if
    // this call is dropped (the leader's time-out): no next message may replace the file
    // the install renames, and the file is removed only once the install is over.
    let len = data.len() as u64;
    let task = tokio::spawn(async move {
        let installed = install(&app, vote, meta, data, file).await;
        if framed {
            // Whatever the install's outcome: a file left here would hold the disk's room.
            incoming::done(&app).await;
            if installed.as_ref().is_ok_and(|(_, installed)| *installed) {
                incoming::installed(&mut held, &headers, len);
            }
        }
        drop(held);
        installed.map(|(answered, _)| answered)
    });
    task.await.map_err(ApiError::internal)?
}

/// Checks a received snapshot and hands it to openraft to install: the answer, and
/// whether it is in place (this member applied through the snapshot's last entry:
/// openraft answers a message of a lower vote without installing it).
async fn install(
    app: &App,
    vote: fenced_raft::Vote,
    meta: fenced_raft::SnapshotMeta,
    data: Vec<u8>,
    file: Option<std::path::PathBuf>,
) -> Result<(Response, bool), ApiError> {
    let checked = match app.locks.node.check_snapshot(data, file).await {
        Ok(checked) => checked,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(ApiError::bad_request("invalid_snapshot", e.to_string()))
        }
        Err(e) => return Err(ApiError::internal(e)),
    };
    let covers = meta.last_log_id;
    let snapshot = fenced_raft::Snapshot { meta, snapshot: checked };
    let r = app.locks.node.raft.install_full_snapshot(vote, snapshot).await;
    let installed = r.is_ok() && covers.is_some() && app.locks.node.applied_through(covers);
    Ok((answer(&r.map_err(openraft_fatal)), installed))
}

/// How much of a snapshot's bytes this member holds from a cut transfer, by their name
/// (`fenced_raft::framing::SNAPSHOT_ID_HEADER`): where the leader resumes.
async fn snapshot_offset(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let id: String = read(&app, &headers, body).await?;
    let held = incoming::offset(&app.incoming_snapshot, &id)?;
    Ok(answer(&Ok::<u64, fenced_raft::openraft::errors::RaftError<fenced_raft::TypeConfig>>(held)))
}

async fn transfer_leader(State(app): State<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let req = read(&app, &headers, body).await?;
    let r = app.locks.node.raft.handle_transfer_leader(req).await;
    Ok(answer(&r.map_err(openraft_fatal)))
}

fn openraft_fatal(
    e: fenced_raft::openraft::errors::Fatal<fenced_raft::TypeConfig>,
) -> fenced_raft::openraft::errors::RaftError<fenced_raft::TypeConfig> {
    fenced_raft::openraft::errors::RaftError::Fatal(e)
}

#[cfg(test)]
mod tests {
    /// The header says the level this release reads, as the peers parse it.
    #[test]
    fn the_level_said_is_the_level_read() {
        let said = axum::http::HeaderValue::from_static(super::LEVEL);
        assert_eq!(fenced_raft::framing::parse_level(&said), fenced_raft::framing::LEVEL);
    }
}
