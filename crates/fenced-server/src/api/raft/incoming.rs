//! A snapshot sent by the leader, received into a file of the data directory
//! (`snapshot.incoming`), not into memory: a snapshot of a full store (the 1 GiB quota)
//! was larger than one peer message (512 MiB) and could never be sent, and one buffered
//! whole held its size in memory twice over while it was read. The leader streams it in
//! chunks ([`fenced_raft::network`]); it is read back once whole, to be decoded and
//! installed. One at a time: a second while one is received is refused `too_busy`.

use std::path::Path;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::api::{ApiError, App};

/// The largest snapshot message taken: far above a full store at its quotas.
pub const SNAPSHOT_MESSAGE_BYTES_MAX: u64 = 8 << 30;

/// A received snapshot: the leader's vote, the snapshot's meta, its bytes.
pub type Received = (fenced_raft::Vote, fenced_raft::SnapshotMeta, Vec<u8>);

/// Receives a framed snapshot message ([`fenced_raft::framing`]) into the data
/// directory, then reads it back.
pub async fn receive(app: &App, headers: &HeaderMap, body: Body) -> Result<Received, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > SNAPSHOT_MESSAGE_BYTES_MAX) {
        return Err(ApiError::too_large("snapshot", SNAPSHOT_MESSAGE_BYTES_MAX as usize));
    }
    let Ok(_one) = app.incoming_snapshot.try_lock() else {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_busy", "a snapshot is being received already")
            .with(fenced_wire::Detail::RetryAfterMs(1000)));
    };
    let path = app.config.data_dir.join(fenced_raft::snapshot_file::INCOMING);
    let result = async {
        write_body(app, body, &path).await?;
        let path = path.clone();
        tokio::task::spawn_blocking(move || read_back(&path)).await.map_err(ApiError::internal)?
    }
    .await;
    let _ = tokio::fs::remove_file(&path).await;
    result
}

/// Writes the body to `path`, each chunk within the body time-out of the one before.
async fn write_body(app: &App, body: Body, path: &Path) -> Result<(), ApiError> {
    let mut file = tokio::fs::File::create(path).await.map_err(ApiError::internal)?;
    let mut chunks = body.into_data_stream();
    let idle = std::time::Duration::from_millis(app.config.body_timeout_ms.max(1_000));
    let mut written = 0u64;
    loop {
        let next = tokio::time::timeout(idle, chunks.next())
            .await
            .map_err(|_| ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", "the snapshot stopped arriving"))?;
        let Some(chunk) = next else { break };
        let chunk = chunk
            .map_err(|e| ApiError::bad_request("invalid_body", format!("the snapshot cannot be read as sent: {e}")))?;
        written += chunk.len() as u64;
        if written > SNAPSHOT_MESSAGE_BYTES_MAX {
            return Err(ApiError::too_large("snapshot", SNAPSHOT_MESSAGE_BYTES_MAX as usize));
        }
        file.write_all(&chunk).await.map_err(ApiError::internal)?;
    }
    file.flush().await.map_err(ApiError::internal)
}

/// Reads a received message back: its frame header (vote and meta), then its bytes.
fn read_back(path: &Path) -> Result<Received, ApiError> {
    let mut file = std::fs::File::open(path).map_err(ApiError::internal)?;
    let size = file.metadata().map_err(ApiError::internal)?.len();
    fenced_raft::framing::read_snapshot(&mut file, size).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => ApiError::bad_request("invalid_frame", format!("a snapshot message: {e}")),
        _ => ApiError::internal(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message read back is what was framed; every cut of one is refused or read
    /// short (the snapshot format's own length and checksum refuse short bytes later),
    /// never a panic.
    #[test]
    fn a_received_message_reads_back_and_a_cut_one_never_panics() {
        let dir = std::env::temp_dir().join(format!("fenced-incoming-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("snapshot.incoming");
        let log_id = serde_json::json!({"leader_id": {"term": 2, "node_id": 1}, "index": 9});
        let meta = fenced_raft::SnapshotMeta {
            last_log_id: Some(serde_json::from_value(log_id).unwrap()),
            last_membership: Default::default(),
        };
        let vote = fenced_raft::Vote::new_committed(2, 1);
        let whole = fenced_raft::framing::encode_snapshot(&vote, &meta, b"the table's bytes");
        std::fs::write(&path, &whole).unwrap();
        let (v, m, data) = read_back(&path).unwrap();
        assert_eq!((v, m.last_log_id, data.as_slice()), (vote, meta.last_log_id, b"the table's bytes".as_slice()));
        for len in 0..whole.len() {
            std::fs::write(&path, &whole[..len]).unwrap();
            if let Ok((_, _, data)) = read_back(&path) {
                assert!(data.len() < 17, "a cut at {len} read whole");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
