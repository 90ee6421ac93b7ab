//! A record of the segment log, written and read: the header, the kinds, the payloads
//! and the state at a segment's start (layout: [`super`]).

use super::{Change, State};
use crate::codec::crc;

/// The bytes before a record's body.
pub(super) const HEADER: usize = 4 + 4 + 8 + 8;

/// Marks the last record of a write.
pub(super) const END: u8 = 0x80;
/// Every record's last byte: never zero, so a record cut short (zeros where the rest of
/// it should be) is told from one edited (see `recover::torn_by_zeros`).
pub(super) const TRAILER: u8 = 0xa5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// The vote, the commit mark and the purge mark, at the start of a segment.
    State = 1,
    /// A log entry: its index, then its record (`entry_format`).
    Entry = 2,
    Vote = 3,
    Commit = 4,
    /// Removes the entries from an index on.
    Truncate = 5,
    /// Removes the entries up to an index, and records the purge mark.
    Purge = 6,
}

impl Kind {
    pub(super) fn of(byte: u8) -> Option<Kind> {
        Some(match byte & !END {
            1 => Kind::State,
            2 => Kind::Entry,
            3 => Kind::Vote,
            4 => Kind::Commit,
            5 => Kind::Truncate,
            6 => Kind::Purge,
            _ => return None,
        })
    }
}

/// The first record of the first segment that a purge reads as keeping.
pub(super) fn purge_keeps_from(payload: &[u8]) -> Result<u64, String> {
    u64_at(payload, 8)
}

/// One record read back.
pub(super) struct Read<'a> {
    pub(super) seq: u64,
    pub(super) group: u64,
    pub(super) kind: Kind,
    pub(super) end: bool,
    pub(super) payload: &'a [u8],
    pub(super) len: usize,
}

/// The record at `at` in `bytes`, if one that checks is there.
pub(super) fn record_at(bytes: &[u8], at: usize) -> Option<Read<'_>> {
    let head = bytes.get(at..at + HEADER + 1)?;
    let len = u32::from_le_bytes(head[0..4].try_into().ok()?) as usize;
    let sum = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let body = bytes.get(at + HEADER..at + HEADER + len)?;
    if len < 2 || crc(&bytes[at + 8..at + HEADER + len]) != sum {
        return None;
    }
    Some(Read {
        seq: u64::from_le_bytes(head[8..16].try_into().ok()?),
        group: u64::from_le_bytes(head[16..24].try_into().ok()?),
        kind: Kind::of(body[0])?,
        end: body[0] & END != 0,
        payload: &body[1..len - 1],
        len: HEADER + len,
    })
}

pub(super) fn kind_of(change: &Change) -> Kind {
    match change {
        Change::Entry { .. } => Kind::Entry,
        Change::Vote(_) => Kind::Vote,
        Change::Commit(_) => Kind::Commit,
        Change::Truncate { .. } => Kind::Truncate,
        Change::Purge { .. } => Kind::Purge,
    }
}

pub(super) fn payload_len(change: &Change) -> usize {
    match change {
        Change::Entry { bytes, .. } => 8 + bytes.len(),
        Change::Vote(b) | Change::Commit(b) => b.len(),
        Change::Truncate { .. } => 8,
        Change::Purge { mark, .. } => 16 + mark.len(),
    }
}

/// A change's payload; a purge's carries `keep_from` ([`State::kept_from`]).
pub(super) fn put_payload(out: &mut Vec<u8>, change: &Change, keep_from: u64) {
    match change {
        Change::Entry { index, bytes } => {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(bytes);
        }
        Change::Vote(b) | Change::Commit(b) => out.extend_from_slice(b),
        Change::Truncate { from } => out.extend_from_slice(&from.to_le_bytes()),
        Change::Purge { upto, mark } => {
            out.extend_from_slice(&upto.to_le_bytes());
            out.extend_from_slice(&keep_from.to_le_bytes());
            out.extend_from_slice(mark);
        }
    }
}

pub(super) fn state_len(state: &State) -> usize {
    let field = |b: &Option<Vec<u8>>| 1 + 4 + b.as_ref().map_or(0, Vec::len);
    field(&state.vote) + field(&state.committed) + 8 + field(&state.purged.as_ref().map(|(_, m)| m.clone())) + 8
}

pub(super) fn put_state(out: &mut Vec<u8>, state: &State) {
    let put = |out: &mut Vec<u8>, b: Option<&Vec<u8>>| {
        out.push(b.is_some() as u8);
        let b = b.map_or(&[][..], Vec::as_slice);
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    put(out, state.vote.as_ref());
    put(out, state.committed.as_ref());
    out.extend_from_slice(&state.purged.as_ref().map_or(0, |(upto, _)| *upto).to_le_bytes());
    put(out, state.purged.as_ref().map(|(_, mark)| mark));
    out.extend_from_slice(&state.kept_from.to_le_bytes());
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> Result<u64, String> {
    bytes
        .get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| "a record is cut short".into())
}

/// The change a record holds (`None` for the state at a segment's start).
pub(super) fn decode<'a>(r: &Read<'a>) -> Result<Option<Change<'a>>, String> {
    let p = r.payload;
    Ok(Some(match r.kind {
        Kind::State => return Ok(None),
        Kind::Entry => Change::Entry { index: u64_at(p, 0)?, bytes: &p[8..] },
        Kind::Vote => Change::Vote(p),
        Kind::Commit => Change::Commit(p),
        Kind::Truncate => Change::Truncate { from: u64_at(p, 0)? },
        Kind::Purge => Change::Purge { upto: u64_at(p, 0)?, mark: p.get(16..).ok_or("a purge record is cut short")? },
    }))
}

pub(super) fn decode_state(p: &[u8]) -> Result<State, String> {
    let mut at = 0;
    let field = |at: &mut usize| -> Result<Option<Vec<u8>>, String> {
        let present = *p.get(*at).ok_or("the state record is cut short")? == 1;
        let len = p.get(*at + 1..*at + 5).ok_or("the state record is cut short")?;
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let bytes = p.get(*at + 5..*at + 5 + len).ok_or("the state record is cut short")?;
        *at += 5 + len;
        Ok(present.then(|| bytes.to_vec()))
    };
    let vote = field(&mut at)?;
    let committed = field(&mut at)?;
    let upto = u64_at(p, at)?;
    at += 8;
    let purged = field(&mut at)?.map(|mark| (upto, mark));
    let kept_from = u64_at(p, at)?;
    Ok(State { vote, committed, purged, kept_from })
}
