//! A snapshot sent by the leader, received into a file of the data directory
//! (`snapshot.incoming`), not into memory: a snapshot of a full store (the 1 GiB quota)
//! was larger than one peer message (512 MiB) and could never be sent, and one buffered
//! whole held its size in memory twice over while it was read. The leader streams it in
//! chunks ([`fenced_raft::network`]); the frame's header (vote and meta) is read from
//! the stream, and the file is written in the kept snapshot's layout (its head, the
//! bytes as they come, flushed every 8 MiB, then their length and checksum): read back
//! once whole to be decoded, then renamed over the kept snapshot at install, never
//! written a second time. One at a time, from the first byte to the install: a second
//! while one is received or installed is refused `too_busy`.
//!
//! **Resumed transfers.** A leader at peer level 3 names the snapshot's bytes
//! ([`fenced_raft::framing::SNAPSHOT_ID_HEADER`]) and first asks how much of them this
//! member holds ([`offset`]). When a named transfer is cut (the leader stalled, the
//! link failed, a chunk came late), what arrived stays in the file under that name,
//! and the next message may begin at its end
//! ([`fenced_raft::framing::SNAPSHOT_OFFSET_HEADER`]). Bytes of another name, or an
//! offset other than the end of what is held, start again from nothing. The name is
//! kept beside the file (`snapshot.incoming.id`), so a member that restarts mid-transfer
//! resumes it as well ([`recovered`]); the snapshot's own checksum refuses bytes that
//! do not make it whole (a crash of the machine may leave the unflushed end damaged).

use std::path::Path;
use std::sync::atomic::AtomicU64;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::api::{ApiError, App};

/// The largest snapshot message taken: far above a full store at its quotas.
pub const SNAPSHOT_MESSAGE_BYTES_MAX: u64 = 8 << 30;

/// The largest frame header (a vote and a snapshot's meta: a membership of many
/// members is a few KiB).
const HEAD_BYTES_MAX: usize = 1 << 20;

/// A received snapshot: the leader's vote, the snapshot's meta, its bytes.
pub type Received = (fenced_raft::Vote, fenced_raft::SnapshotMeta, Vec<u8>);

/// What `snapshot.incoming` holds of a cut transfer: the name of the bytes and how
/// many of them, from their start; or (`installed`) the name and length of the last
/// snapshot received whole and installed by this process, so that a leader that gave up
/// on a message this member went on to take whole (a member frozen mid-transfer, its
/// socket holding the rest) is not sent the same bytes again ([`installed_already`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    pub id: String,
    pub len: u64,
    pub installed: bool,
}

/// The receiver's state, held while a snapshot is received and installed
/// (`AppInner::incoming_snapshot`).
pub type Incoming = std::sync::Arc<tokio::sync::Mutex<Option<Partial>>>;

/// How a message says where its bytes begin.
#[derive(Debug, PartialEq, Eq)]
struct Resume {
    /// The name of the bytes; none from a leader before level 3 (never resumed).
    id: Option<String>,
    offset: u64,
}

impl Resume {
    fn of(headers: &HeaderMap) -> Result<Resume, ApiError> {
        let text = |name: &str| headers.get(name).map(|v| v.to_str().map(str::to_owned));
        let bad = |why: String| ApiError::bad_request("invalid_header", why);
        let id = text(fenced_raft::framing::SNAPSHOT_ID_HEADER)
            .transpose()
            .map_err(|_| bad("the snapshot's name is not text".into()))?;
        let offset = match text(fenced_raft::framing::SNAPSHOT_OFFSET_HEADER).transpose() {
            Ok(None) => 0,
            Ok(Some(v)) => v.parse().map_err(|_| bad(format!("a snapshot offset of {v:?}")))?,
            Err(_) => return Err(bad("the snapshot offset is not text".into())),
        };
        if offset > 0 && id.is_none() {
            return Err(bad("a snapshot offset without the snapshot's name".into()));
        }
        Ok(Resume { id, offset })
    }
}

/// What a data directory holds of a transfer cut by a restart: the name beside
/// `snapshot.incoming` and the bytes after its head. A file without a name that reads
/// (or a name without a file) is removed.
pub fn recovered(dir: &Path) -> Incoming {
    std::sync::Arc::new(tokio::sync::Mutex::new(recovered_partial(dir)))
}

fn recovered_partial(dir: &Path) -> Option<Partial> {
    let (path, named) = (dir.join(fenced_raft::snapshot_file::INCOMING), id_path(dir));
    let id = std::fs::read_to_string(&named).ok().filter(|id| !id.is_empty());
    match (id, fenced_raft::snapshot_file::incoming_held(&path)) {
        (Some(id), Some(len)) => Some(Partial { id, len, installed: false }),
        _ => {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&named);
            None
        }
    }
}

fn id_path(dir: &Path) -> std::path::PathBuf {
    dir.join(fenced_raft::snapshot_file::INCOMING_ID)
}

/// How many bytes of the snapshot named `id` this member holds from a cut transfer
/// (0: none). Asked while one is received, the answer is `too_busy`.
pub fn offset(incoming: &Incoming, id: &str) -> Result<u64, ApiError> {
    let Ok(held) = incoming.try_lock() else { return Err(busy()) };
    Ok(held.as_ref().filter(|p| p.id == id).map_or(0, |p| p.len))
}

/// Whether the message of `headers` resumes, at its end, the snapshot this process
/// installed last: it brings no byte, and the snapshot is in place already.
pub fn installed_already(held: &Held, headers: &HeaderMap) -> Result<bool, ApiError> {
    let resume = Resume::of(headers)?;
    Ok(held.as_ref().is_some_and(|p| p.installed && Some(&p.id) == resume.id.as_ref() && p.len == resume.offset))
}

/// After the install of a named message's `len` bytes: remembered, for
/// [`installed_already`] (in memory only: after a restart the leader sends them again).
pub fn installed(held: &mut Held, headers: &HeaderMap, len: u64) {
    if let Ok(Resume { id: Some(id), .. }) = Resume::of(headers) {
        **held = Some(Partial { id, len, installed: true });
    }
}

fn busy() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_busy", "a snapshot is being received already")
        .with(fenced_wire::Detail::RetryAfterMs(1000))
}

/// The receiver, held from the first byte of a message to the end of the install of
/// what it brought ([`receive`]), owned so that the install's task keeps it when the
/// call that brought the message is dropped.
pub type Held = tokio::sync::OwnedMutexGuard<Option<Partial>>;

/// Takes the receiver, or `too_busy` while another message is received or installed.
pub fn take(incoming: &Incoming) -> Result<Held, ApiError> {
    incoming.clone().try_lock_owned().map_err(|_| busy())
}

/// Receives a framed snapshot message ([`fenced_raft::framing`]) into the data
/// directory, then reads its bytes back; the file, whole in the kept layout, stays at
/// [`incoming_path`] to be installed (or removed: [`done`]).
pub async fn receive(app: &App, held: &mut Held, headers: &HeaderMap, body: Body) -> Result<Received, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > SNAPSHOT_MESSAGE_BYTES_MAX) {
        return Err(ApiError::too_large("snapshot", SNAPSHOT_MESSAGE_BYTES_MAX as usize));
    }
    let resume = Resume::of(headers)?;
    if let Some(rest) = declared {
        // The rest of the file, which becomes the kept snapshot.
        room(app, rest)?;
    }
    let path = incoming_path(app);
    let idle = std::time::Duration::from_millis(app.config.body_timeout_ms.max(1_000));
    let resumed = resume.offset > 0;
    let received = &app.metrics.snapshot_bytes_received;
    let (result, kept) = receive_into(&path, held, resume, body, idle, received).await;
    if resumed && !result.as_ref().is_err_and(|e| e.code == "snapshot_not_resumable") {
        crate::metrics::inc(&app.metrics.snapshot_transfers_resumed);
    }
    **held = kept;
    result
}

/// Where a snapshot is received.
pub fn incoming_path(app: &App) -> std::path::PathBuf {
    app.config.data_dir.join(fenced_raft::snapshot_file::INCOMING)
}

/// After the install of what [`receive`] brought (or its refusal): the file, if it was
/// not renamed over the kept snapshot, is removed, with its name.
pub async fn done(app: &App) {
    let _ = tokio::fs::remove_file(incoming_path(app)).await;
    let _ = tokio::fs::remove_file(id_path(&app.config.data_dir)).await;
}

/// Receives into `path` what follows what `held` says it holds, counting the bytes
/// written in `received`: the result, and what the file holds afterwards (kept only of
/// a named transfer cut while its bytes came).
async fn receive_into(
    path: &Path,
    held: &mut Option<Partial>,
    resume: Resume,
    body: Body,
    idle: std::time::Duration,
    received: &AtomicU64,
) -> (Result<Received, ApiError>, Option<Partial>) {
    let named = path.with_file_name(fenced_raft::snapshot_file::INCOMING_ID);
    let start = match resume.offset {
        0 => {
            // From the start: whatever was held (of these bytes or others) goes first,
            // so a cut before the first byte keeps nothing under the new name.
            let _ = tokio::fs::remove_file(path).await;
            let _ = tokio::fs::remove_file(&named).await;
            None
        }
        n => match held.take() {
            Some(p) if !p.installed && Some(&p.id) == resume.id.as_ref() && p.len == n => Some(p.len),
            other => {
                let holds = other.filter(|p| Some(&p.id) == resume.id.as_ref()).map_or(0, |p| p.len);
                let why = format!("a snapshot resumed at byte {n}, where this member holds {holds} of those bytes");
                let _ = tokio::fs::remove_file(path).await;
                let _ = tokio::fs::remove_file(&named).await;
                return (Err(ApiError::new(StatusCode::CONFLICT, "snapshot_not_resumable", why)), None);
            }
        },
    };
    let mut chunks = body.into_data_stream();
    let got = async {
        let (vote, meta, rest) = read_head(&mut chunks, idle).await?;
        let mut file = open(path, start, &meta, resume.id.as_deref()).await.map_err(Stage::Local)?;
        let written = write_rest(&mut file, rest, &mut chunks, idle, received).await;
        file.flush().await.map_err(Stage::Local)?;
        written?;
        Ok((vote, meta))
    }
    .await;
    let drop_all = || async {
        let _ = tokio::fs::remove_file(path).await;
        let _ = tokio::fs::remove_file(&named).await;
    };
    match got {
        Ok((vote, meta)) => {
            let sealed = {
                let path = path.to_path_buf();
                tokio::task::spawn_blocking(move || fenced_raft::snapshot_file::seal_incoming(&path)).await
            };
            let _ = tokio::fs::remove_file(&named).await;
            match sealed.map_err(ApiError::internal).and_then(|r| r.map_err(ApiError::internal)) {
                Ok(data) => (Ok((vote, meta, data)), None),
                Err(e) => {
                    drop_all().await;
                    (Err(e), None)
                }
            }
        }
        Err(Stage::Cut(e)) if resume.id.is_some() => {
            let len = fenced_raft::snapshot_file::incoming_held(path).unwrap_or(0);
            (Err(e), resume.id.map(|id| Partial { id, len, installed: false }))
        }
        Err(Stage::Cut(e) | Stage::Refused(e)) => {
            drop_all().await;
            (Err(e), None)
        }
        Err(Stage::Local(e)) => {
            drop_all().await;
            (Err(ApiError::internal(e)), None)
        }
    }
}

/// Why a message was not received whole.
enum Stage {
    /// The bytes stopped coming (cut, or late): what arrived may be resumed.
    Cut(ApiError),
    /// The message is wrong (its header, its length).
    Refused(ApiError),
    /// This member's file failed.
    Local(std::io::Error),
}

type Chunks = axum::body::BodyDataStream;

/// The next chunk, within `idle` of the one before; `None` at the body's end.
async fn next(chunks: &mut Chunks, idle: std::time::Duration) -> Result<Option<Bytes>, Stage> {
    let late = || ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", "the snapshot stopped arriving");
    match tokio::time::timeout(idle, chunks.next()).await {
        Err(_) => Err(Stage::Cut(late())),
        Ok(None) => Ok(None),
        Ok(Some(Ok(chunk))) => Ok(Some(chunk)),
        Ok(Some(Err(e))) => {
            Err(Stage::Cut(ApiError::bad_request("invalid_body", format!("the snapshot cannot be read as sent: {e}"))))
        }
    }
}

/// The frame's header (the vote and the snapshot's meta), and the bytes after it in the
/// chunk that ended it.
async fn read_head(
    chunks: &mut Chunks,
    idle: std::time::Duration,
) -> Result<(fenced_raft::Vote, fenced_raft::SnapshotMeta, Bytes), Stage> {
    let refused =
        |why: String| Stage::Refused(ApiError::bad_request("invalid_frame", format!("a snapshot message: {why}")));
    let mut head = Vec::new();
    loop {
        if head.len() >= 4 {
            let len = u32::from_be_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            if len > HEAD_BYTES_MAX {
                return Err(refused(format!("a frame header of {len} bytes (at most {HEAD_BYTES_MAX})")));
            }
            if head.len() >= 4 + len {
                let (vote, meta) = serde_json::from_slice(&head[4..4 + len])
                    .map_err(|e| refused(format!("a snapshot's header: {e}")))?;
                return Ok((vote, meta, Bytes::copy_from_slice(&head[4 + len..])));
            }
        }
        match next(chunks, idle).await? {
            Some(chunk) => head.extend_from_slice(&chunk),
            None => return Err(refused("a frame shorter than its header".into())),
        }
    }
}

/// The file the bytes go to: new (the kept layout's head of `meta` written, and the
/// bytes' name beside it when they have one), or the one holding `start` bytes already.
async fn open(
    path: &Path,
    start: Option<u64>,
    meta: &fenced_raft::SnapshotMeta,
    id: Option<&str>,
) -> std::io::Result<tokio::fs::File> {
    let Some(start) = start else {
        let mut file = tokio::fs::File::create(path).await?;
        file.write_all(&fenced_raft::snapshot_file::incoming_head(meta)?).await?;
        if let Some(id) = id {
            tokio::fs::write(path.with_file_name(fenced_raft::snapshot_file::INCOMING_ID), id).await?;
        }
        return Ok(file);
    };
    let held = fenced_raft::snapshot_file::incoming_held(path);
    if held != Some(start) {
        return Err(std::io::Error::other(format!("{} holds {held:?} bytes, not {start}", path.display())));
    }
    tokio::fs::OpenOptions::new().append(true).open(path).await
}

/// The received bytes are flushed to the disk every this many: one `fdatasync` of
/// hundreds of MiB at the end held the disk for seconds, and the log's own fsyncs
/// waited behind it (as for the kept snapshot, `fenced_raft::snapshot_file`).
const FLUSH_EVERY: u64 = 8 << 20;

/// Writes `first` and the chunks after it, up to [`SNAPSHOT_MESSAGE_BYTES_MAX`].
async fn write_rest(
    file: &mut tokio::fs::File,
    first: Bytes,
    chunks: &mut Chunks,
    idle: std::time::Duration,
    received: &AtomicU64,
) -> Result<(), Stage> {
    let (mut written, mut flushed) = (0u64, 0u64);
    let mut chunk = Some(first);
    while let Some(bytes) = chunk {
        written += bytes.len() as u64;
        if written > SNAPSHOT_MESSAGE_BYTES_MAX {
            return Err(Stage::Refused(ApiError::too_large("snapshot", SNAPSHOT_MESSAGE_BYTES_MAX as usize)));
        }
        file.write_all(&bytes).await.map_err(Stage::Local)?;
        #[cfg(feature = "fault-injection")]
        if let Some(fault) = fenced_raft::fault::receiving(written) {
            // What arrived reaches the file first, as it would before a kill -9.
            let _ = file.flush().await;
            match fault {
                fenced_raft::fault::Receiving::Dies => std::process::abort(),
                fenced_raft::fault::Receiving::Freezes => {
                    // SAFETY: raise only sends this process a signal.
                    let _ = unsafe { libc::raise(libc::SIGSTOP) };
                }
            }
        }
        if written - flushed >= FLUSH_EVERY {
            file.flush().await.map_err(Stage::Local)?;
            file.sync_data().await.map_err(Stage::Local)?;
            flushed = written;
        }
        received.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        chunk = next(chunks, idle).await?;
    }
    Ok(())
}

/// Refuses a snapshot that would leave the disk under its reserve (`min_free_bytes`):
/// the room left is for the log, which the member needs to go on once it caught up.
fn room(app: &App, bytes: u64) -> Result<(), ApiError> {
    let Err(free) = app.disk.room_for(bytes) else { return Ok(()) };
    let min = app.disk.min_free_bytes;
    let why = format!(
        "a snapshot needing {bytes} bytes, with {free} bytes free and min_free_bytes {min} kept for the log: \
         refused until there is room"
    );
    Err(ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage", why)
        .with(fenced_wire::Detail::FreeBytes(free))
        .with(fenced_wire::Detail::MinFreeBytes(min)))
}

#[cfg(test)]
mod tests;
