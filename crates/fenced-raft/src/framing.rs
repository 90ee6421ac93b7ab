//! Peer messages as frames: the two messages that carry bulk (an append's entries, a
//! snapshot's bytes) travel as a JSON header and a binary payload instead of one JSON
//! body, where entries were JSON objects and a snapshot's bytes an array of numbers
//! (about 3.6 bytes on the wire for each byte).
//!
//! ```text
//! frame  = [4: header length, big-endian][header: JSON][payload]
//! append = header: the request with no entries; payload: each entry's record
//!          (`entry_format`, checksummed) behind its 4-byte big-endian length
//! snapshot = header: [vote, meta]; payload: the snapshot's bytes
//! ```
//!
//! A member says it takes frames with a header on every raft answer
//! ([`ACCEPTS_HEADER`]); a sender frames a message only to a member that said so, so a
//! member of an earlier release, which never says it, keeps getting JSON during a
//! rolling upgrade. A frame's entries are checked as the log checks them at open: a
//! record damaged on the way is refused, never appended.

use openraft::raft::AppendEntriesRequest;

use crate::{entry_format, SnapshotMeta, TypeConfig, Vote};

/// The content type of a frame.
pub const CONTENT_TYPE: &str = "application/x-fenced-raft-frame";

/// On every raft answer of a member that takes frames, its [`LEVEL`].
pub const ACCEPTS_HEADER: &str = "x-fenced-raft-frames";

/// What this release reads from a peer, said in [`ACCEPTS_HEADER`]: 1, frames;
/// 2, also snapshots of `snapshot_format` and `Command::SetLimits` in entries; 3, also
/// a snapshot resumed from an offset ([`SNAPSHOT_ID_HEADER`]); 4, also
/// `Command::Renewed` in entries (written by a cluster of one); 5, also appends
/// pipelined on a stream of their own (`crate::append_stream`). A sender keeps to what
/// the member said: a member at 1 is sent the JSON snapshot, no member proposes agreed
/// limits until every member is at 2, and a member at 2 is sent every snapshot whole;
/// a node below 4 is refused as a new member (the log may hold `Renewed`).
pub const LEVEL: u8 = 5;

/// The level from which a member takes appends on a stream (`crate::append_stream`).
pub const LEVEL_APPEND_STREAM: u8 = 5;

/// The level from which a member reads `Command::Renewed`.
pub const LEVEL_RENEWED: u8 = 4;

/// The level from which a member is sent binary snapshots.
pub const LEVEL_BINARY_SNAPSHOTS: u8 = 2;

/// The level from which a member reads `Command::SetLimits`.
pub const LEVEL_SET_LIMITS: u8 = 2;

/// The level from which a cut snapshot transfer resumes where the member's copy ends.
pub const LEVEL_RESUMABLE_SNAPSHOTS: u8 = 3;

/// On a snapshot message to a member at [`LEVEL_RESUMABLE_SNAPSHOTS`]: the name of the
/// snapshot's bytes (its last log id, length and checksum). The member keeps what it
/// received of a cut transfer under this name.
pub const SNAPSHOT_ID_HEADER: &str = "x-fenced-snapshot-id";

/// On a snapshot message with [`SNAPSHOT_ID_HEADER`]: the offset in the snapshot's
/// bytes where the payload begins (0: from the start). The frame's header (vote and
/// meta) comes first in every message, resumed or not.
pub const SNAPSHOT_OFFSET_HEADER: &str = "x-fenced-snapshot-offset";

/// The level in a member's [`ACCEPTS_HEADER`]: the first release to send it sent "1".
pub fn parse_level(v: &hyper::header::HeaderValue) -> u8 {
    v.to_str().ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1)
}

fn frame(header: &impl serde::Serialize, payload_len: usize) -> Vec<u8> {
    let header = serde_json::to_vec(header).expect("a raft message header serializes");
    let mut out = Vec::with_capacity(4 + header.len() + payload_len);
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out
}

fn split(body: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let (len, rest) = body.split_at_checked(4).ok_or("a frame shorter than its header length")?;
    let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
    rest.split_at_checked(len).ok_or_else(|| format!("a frame header of {len} bytes in {} bytes", rest.len()))
}

/// An append request as a frame.
pub fn encode_append(rpc: &AppendEntriesRequest<TypeConfig>) -> Vec<u8> {
    let header = AppendEntriesRequest::<TypeConfig> {
        vote: rpc.vote,
        prev_log_id: rpc.prev_log_id,
        entries: Vec::new(),
        leader_commit: rpc.leader_commit,
    };
    let mut out = frame(&header, rpc.entries.len() * 64);
    for entry in &rpc.entries {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        entry_format::encode(entry, &mut out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    out
}

/// An append request from its frame; every entry's record checked.
pub fn decode_append(body: &[u8]) -> Result<AppendEntriesRequest<TypeConfig>, String> {
    let (header, mut payload) = split(body)?;
    let mut rpc: AppendEntriesRequest<TypeConfig> =
        serde_json::from_slice(header).map_err(|e| format!("an append's header: {e}"))?;
    if !rpc.entries.is_empty() {
        return Err("an append frame carries its entries in its payload, not its header".into());
    }
    while !payload.is_empty() {
        let (len, rest) = payload.split_at_checked(4).ok_or("an entry's length is cut")?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let (record, rest) = rest.split_at_checked(len).ok_or("an entry is cut")?;
        let n = rpc.entries.len();
        rpc.entries.push(entry_format::decode_record(record).map_err(|why| format!("entry {n} of an append: {why}"))?);
        payload = rest;
    }
    Ok(rpc)
}

/// A snapshot message as a frame.
/// A snapshot message's frame header, which its bytes follow (streamed).
pub fn snapshot_head(vote: &Vote, meta: &SnapshotMeta) -> Vec<u8> {
    frame(&(vote, meta), 0)
}

pub fn encode_snapshot(vote: &Vote, meta: &SnapshotMeta, data: &[u8]) -> Vec<u8> {
    let mut out = frame(&(vote, meta), data.len());
    out.extend_from_slice(data);
    out
}

/// A snapshot message from its frame (the bytes are checked by the caller, as those
/// of a JSON message are).
pub fn decode_snapshot(body: &[u8]) -> Result<(Vote, SnapshotMeta, Vec<u8>), String> {
    read_snapshot(&mut std::io::Cursor::new(body), body.len() as u64).map_err(|e| e.to_string())
}

/// A snapshot message of `size` bytes from `r` (a follower reads back the file it was
/// received into): the frame's header, then the bytes, read into one buffer. An error
/// of kind `InvalidData` is the message's fault, any other the reader's.
pub fn read_snapshot(r: &mut impl std::io::Read, size: u64) -> std::io::Result<(Vote, SnapshotMeta, Vec<u8>)> {
    use std::io::{Error, ErrorKind};
    let bad = |why: String| Error::new(ErrorKind::InvalidData, why);
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|_| bad("a frame shorter than its header length".into()))?;
    let len = u64::from(u32::from_be_bytes(len));
    if 4 + len > size {
        return Err(bad(format!("a frame header of {len} bytes in {} bytes", size - 4)));
    }
    let mut header = vec![0u8; len as usize];
    r.read_exact(&mut header)?;
    let (vote, meta) = serde_json::from_slice(&header).map_err(|e| bad(format!("a snapshot's header: {e}")))?;
    let mut data = Vec::with_capacity((size - 4 - len) as usize);
    r.read_to_end(&mut data)?;
    Ok((vote, meta, data))
}

#[cfg(test)]
mod tests {
    use fenced_core::{Batch, Command, RequestId};
    use openraft::entry::RaftEntry;
    use openraft::vote::RaftLeaderIdExt;
    use openraft::EntryPayload;

    use super::*;
    use crate::{Entry, LogId};

    fn log_id(index: u64) -> LogId {
        LogId::new(openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(3, 2), index)
    }

    fn rpc(entries: Vec<Entry>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(3, 2),
            prev_log_id: Some(log_id(9)),
            entries,
            leader_commit: Some(log_id(8)),
        }
    }

    fn entries() -> Vec<Entry> {
        let batch = Batch::one(RequestId(5), Command::Tick, 77);
        vec![
            Entry { log_id: log_id(10), payload: EntryPayload::Blank },
            Entry { log_id: log_id(11), payload: EntryPayload::Normal(batch) },
        ]
    }

    #[test]
    fn an_append_and_a_snapshot_round_trip() {
        for entries in [vec![], entries()] {
            let sent = rpc(entries);
            let got = decode_append(&encode_append(&sent)).unwrap();
            assert_eq!(format!("{got:?}"), format!("{sent:?}"));
            assert_eq!(
                got.entries.iter().map(|e| e.index()).collect::<Vec<_>>(),
                sent.entries.iter().map(|e| e.index()).collect::<Vec<_>>()
            );
        }
        let meta = SnapshotMeta { last_log_id: Some(log_id(4)), ..Default::default() };
        let data: Vec<u8> = (0..=255).collect();
        let (vote, got_meta, got) =
            decode_snapshot(&encode_snapshot(&Vote::new_committed(3, 2), &meta, &data)).unwrap();
        assert_eq!((vote, got_meta.last_log_id, got), (Vote::new_committed(3, 2), meta.last_log_id, data));
    }

    #[test]
    fn a_frame_damaged_on_the_way_is_refused() {
        let frame = encode_append(&rpc(entries()));
        // A cut inside the header or an entry is refused; one between entries is a
        // shorter append (HTTP's length delivers the body whole or not at all).
        for len in 0..frame.len() {
            if let Ok(got) = decode_append(&frame[..len]) {
                assert!(got.entries.len() < 2, "a cut at {len} kept every entry");
            }
        }
        // A flipped bit in the last entry's record: its checksum refuses it.
        let mut damaged = frame.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 0x10;
        let err = decode_append(&damaged).unwrap_err();
        assert!(err.starts_with("entry 1 of an append: its checksum does not match"), "{err}");
        // Entries smuggled into the header are refused.
        let mut header = serde_json::to_vec(&rpc(entries())).unwrap();
        let mut smuggled = (header.len() as u32).to_be_bytes().to_vec();
        smuggled.append(&mut header);
        assert!(decode_append(&smuggled).unwrap_err().contains("in its payload"));
    }
}
