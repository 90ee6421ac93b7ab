//! Appends pipelined to a follower: openraft's replication stream on a connection of
//! its own, each append sent as soon as its entries are in the leader's log, without
//! waiting for the answer to the one before (openraft's streaming append).
//!
//! The leader asks `POST {member URL}/raft/append-stream` with `Upgrade:
//! fenced-raft-append` (and the peer credentials of every raft call); the member
//! answers `101 Switching Protocols`, and the connection (TLS where the members speak
//! it) then carries frames both ways until either side closes it:
//!
//! ```text
//! frame    = [4: length, big-endian][bytes]
//! leader   → member: each append as `framing::encode_append` makes it
//! member   → leader: the answer to each append, in order, JSON of
//!                    Result<StreamAppendResult, RaftError>
//! ```
//!
//! The member hands the appends to `Raft::stream_append`, which passes each to its
//! log before the one before is flushed. At most [`IN_FLIGHT_MAX`] appends go
//! unanswered; an answer later than the call's time-out (counted from the append's
//! send or the last answer, whichever is later) ends the stream with an error, and
//! openraft starts another. A heartbeat (a stream of one append) keeps to the pooled
//! connections, as does every append to a member below
//! [`crate::framing::LEVEL_APPEND_STREAM`].

use std::io;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use openraft::errors::{RPCError, RaftError};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::{LogId, NodeId, TypeConfig};

/// The path a leader asks for a stream on.
pub const PATH: &str = "/raft/append-stream";

/// The protocol named in `Upgrade`.
pub const PROTOCOL: &str = "fenced-raft-append";

/// Appends sent and not yet answered, at most, on one stream.
pub const IN_FLIGHT_MAX: usize = 32;

/// The longest answer frame a leader reads (an answer is a few hundred bytes).
pub const ANSWER_BYTES_MAX: usize = 1 << 20;

/// How long a member keeps a stream on which no append came: the leader's stream
/// waits for entries without sending, and a leader gone without closing (cut off,
/// frozen) must not hold the member's connections.
pub const IDLE: Duration = Duration::from_secs(30);

/// A member's answer to one append, as it travels.
pub type Answer = Result<StreamAppendResult<TypeConfig>, RaftError<TypeConfig>>;

/// Writes `bytes` as one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| io::Error::other("a frame over 4 GiB"))?;
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(bytes).await?;
    w.flush().await
}

/// The length of the next frame: `None` when the stream ended between frames.
pub async fn read_len<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> io::Result<Option<usize>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes, over {max}")));
    }
    Ok(Some(len))
}

/// The next frame's `len` bytes.
pub async fn read_body<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes).await?;
    Ok(bytes)
}

/// What the leader keeps of an append it sent: what a full answer acknowledges, when
/// it went, and its size (a large one is given longer).
struct Sent {
    last: Option<LogId>,
    at: Instant,
    len: usize,
}

/// The log id an append's answer acknowledges when it took all of it.
fn last_of(req: &AppendEntriesRequest<TypeConfig>) -> Option<LogId> {
    req.entries.last().map(|e| e.log_id).or(req.prev_log_id)
}

/// Sends each append of `input` on `w` as it comes, at most [`IN_FLIGHT_MAX`]
/// unanswered (`sent` is that bound); closes the write side once `input` ends, and the
/// member closes the stream once it answered the rest.
async fn send_all<W, S>(mut w: W, mut input: S, sent: mpsc::Sender<Sent>)
where
    W: AsyncWrite + Unpin,
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    while let Some(req) = input.next().await {
        let frame = crate::framing::encode_append(&req);
        let Ok(slot) = sent.reserve().await else { return };
        slot.send(Sent { last: last_of(&req), at: Instant::now(), len: frame.len() });
        // A failed write leaves its append unanswered: the reader reports it.
        if write_frame(&mut w, &frame).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// Aborts the sending task when the answers' stream is dropped (openraft ended the
/// session): the connection closes with it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The reading side of a stream.
struct Answers<R> {
    r: R,
    sent: mpsc::Receiver<Sent>,
    _sender: AbortOnDrop,
    /// When the last answer came (or the stream began).
    progress: Instant,
    ttl: Duration,
    target: NodeId,
    ended: bool,
}

fn net(e: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Network(openraft::errors::NetworkError::from_string(e.to_string()))
}

impl<R: AsyncRead + Unpin> Answers<R> {
    /// The answer to the oldest append unanswered; `None` once every append is.
    async fn next(&mut self) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
        if self.ended {
            return None;
        }
        let sent = match self.wait_sent().await {
            Ok(Some(sent)) => sent,
            Ok(None) => return None,
            Err(e) => {
                self.ended = true;
                return Some(Err(e));
            }
        };
        let deadline = sent.at.max(self.progress) + crate::network::rpc_ttl(self.ttl, sent.len);
        let read = async {
            let len = read_len(&mut self.r, ANSWER_BYTES_MAX).await?.ok_or(io::ErrorKind::UnexpectedEof)?;
            read_body(&mut self.r, len).await
        };
        let answer = match tokio::time::timeout_at(deadline.into(), read).await {
            Err(_) => Err(net(format!("member {} did not answer a streamed append in time", self.target))),
            Ok(Err(e)) => Err(net(format!("member {}: the append stream: {e}", self.target))),
            Ok(Ok(bytes)) => match serde_json::from_slice::<Answer>(&bytes) {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(net(e)),
                Err(e) => Err(net(format!("member {}: an append answer that does not decode: {e}", self.target))),
            },
        };
        self.progress = Instant::now();
        // The stream ends at an error, a refusal, or an append taken only in part (as
        // openraft's sequential stream ends): the appends behind it are void.
        self.ended = !matches!(&answer, Ok(Ok(acked)) if *acked == sent.last);
        Some(answer)
    }

    /// The oldest append unanswered, once one is sent; `None` when the sender is done
    /// and everything is answered. While none is unanswered, a member that closes the
    /// stream ends it at once, as an error: openraft starts another.
    async fn wait_sent(&mut self) -> Result<Option<Sent>, RPCError<TypeConfig>> {
        if let Ok(sent) = self.sent.try_recv() {
            return Ok(Some(sent));
        }
        let mut probe = [0u8; 1];
        let closed = || Err(net(format!("member {} closed the append stream", self.target)));
        // Biased: an append's `Sent` is queued before its frame is written, so when its
        // answer can be read the `Sent` is here, and is taken first (the probe below
        // must never eat a byte of an answer).
        tokio::select! {
            biased;
            sent = self.sent.recv() => Ok(sent),
            // Nothing was asked: whatever comes (the end of the stream, an error, a byte
            // out of turn) ends it; cleanly only if the sender is done too (the member
            // answered everything and closed once the leader's side was shut).
            _ = self.r.read(&mut probe) => match tokio::time::timeout(self.ttl, self.sent.recv()).await {
                Ok(None) => Ok(None),
                _ => closed(),
            },
        }
    }
}

/// The answers to `input`'s appends, sent on `io` (an upgraded connection to member
/// `target`), each due within `ttl` of its send or of the answer before it.
pub fn pipelined<IO, S>(
    io: IO,
    input: S,
    ttl: Duration,
    target: NodeId,
) -> impl Stream<Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> + Send + 'static
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let (r, w) = tokio::io::split(io);
    // One more waits in the reader for its answer: IN_FLIGHT_MAX in all.
    let (tx, rx) = mpsc::channel(IN_FLIGHT_MAX - 1);
    let sender = tokio::spawn(send_all(w, input, tx));
    let answers = Answers {
        r,
        sent: rx,
        _sender: AbortOnDrop(sender.abort_handle()),
        progress: Instant::now(),
        ttl,
        target,
        ended: false,
    };
    futures_util::stream::unfold(answers, |mut a| async move { a.next().await.map(|item| (item, a)) })
}

/// The request that asks member `url` for a stream: `Upgrade: fenced-raft-append`,
/// with the members' bearer token when they share one.
pub(crate) fn upgrade_request(
    url: &str,
    auth: Option<&str>,
) -> Result<hyper::Request<crate::network::PeerBody>, hyper::http::Error> {
    let mut request =
        hyper::Request::post(url).header(hyper::header::CONNECTION, "upgrade").header(hyper::header::UPGRADE, PROTOCOL);
    if let Some(auth) = auth {
        request = request.header(hyper::header::AUTHORIZATION, auth);
    }
    request.body(crate::network::full(bytes::Bytes::new()))
}

#[cfg(test)]
mod tests;
