//! A log entry as the log keeps it (a segment's entry record, `segment_log`; `raft.redb`
//! before data directory format 5): a versioned, checksummed, binary record,
//! written and read by hand rather than derived from the core's types, so that
//! renaming a field of `Command` cannot change the format on disk, and a record edited
//! or damaged on disk is refused rather than applied.
//!
//! Version 1:
//!
//! ```text
//! [1: version = 1][4: CRC-32C of the body, little-endian][body]
//! body    = term, leader node id, index (varints), then one payload
//! payload = 0 (blank) | 1 batch | 2 membership (its JSON, length-prefixed)
//! batch   = now_ms, count, then count × (request id, command)
//! ```
//!
//! Integers are LEB128 varints, lease ids 16 bytes little-endian, strings and byte
//! strings a varint length and the bytes. Each command is a one-byte tag and its fields
//! in a fixed order ([`put_command`]); the match there is exhaustive, so a new command
//! does not compile until it has a tag here.
//!
//! Releases before this one wrote each entry as serde JSON (its first byte is `{`):
//! such rows are still read, never written. A record of a version above
//! [`VERSION`] is refused with a message saying a newer release wrote it.

use std::io;

use fenced_core::{Acquire, AcquireAll, Batch, Command, LeaseRef, Record, RequestId, StoreCommand, Token};
use openraft::alias::LeaderIdOf;
use openraft::entry::RaftEntry;
use openraft::vote::RaftLeaderIdExt;
use openraft::EntryPayload;

use crate::codec::{crc, put_bytes, put_flag, put_lease, put_limits, put_name, put_opt, put_quotas, put_u64, Reader};
use crate::{Entry, LogId, TypeConfig};

/// The version this release writes, and the newest it reads.
pub const VERSION: u8 = 1;

/// The first byte of a record written by a release before [`VERSION`] 1 (serde JSON).
const LEGACY_JSON: u8 = b'{';

/// The bytes before the body: the version and the checksum.
const HEADER: usize = 5;

/// Appends `entry`'s record to `out`.
pub fn encode(entry: &Entry, out: &mut Vec<u8>) {
    let start = out.len();
    out.push(VERSION);
    out.extend_from_slice(&[0; 4]);
    let log_id = entry.log_id();
    put_u64(out, log_id.leader_id.term);
    put_u64(out, log_id.leader_id.node_id);
    put_u64(out, log_id.index);
    match &entry.payload {
        EntryPayload::Blank => out.push(0),
        EntryPayload::Normal(batch) => {
            out.push(1);
            put_batch(out, batch);
        }
        EntryPayload::Membership(m) => {
            out.push(2);
            // A membership entry is rare and openraft's own type: its serde form is
            // kept, inside the checksummed record.
            put_bytes(out, &serde_json::to_vec(m).expect("a membership serializes"));
        }
    }
    let sum = crc(&out[start + HEADER..]);
    out[start + 1..start + HEADER].copy_from_slice(&sum.to_le_bytes());
}

/// The record of `entry`, on its own.
pub fn to_vec(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode(entry, &mut out);
    out
}

/// Reads the record kept under `index`: refused (`InvalidData`, naming the index)
/// when its checksum does not match, its version is newer than this release's, its
/// fields do not decode, bytes follow them, or it names another index.
pub fn decode(bytes: &[u8], index: u64) -> io::Result<Entry> {
    let entry = decode_record(bytes).map_err(|why| invalid(index, &why))?;
    if entry.index() != index {
        return Err(invalid(index, &format!("the record names index {}", entry.index())));
    }
    Ok(entry)
}

/// Reads a record on its own (one that travelled in a peer message): refused, saying
/// why, as [`decode`] refuses one, but with no index to hold it to.
pub fn decode_record(bytes: &[u8]) -> Result<Entry, String> {
    match bytes.first() {
        Some(&LEGACY_JSON) => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
        Some(&VERSION) => decode_v1(bytes),
        Some(&v) => Err(format!(
            "format version {v}: this release writes version {VERSION} and reads it and the JSON of earlier \
             releases; a newer release of Fenced wrote it (run that one), or the file is damaged"
        )),
        None => Err("empty record".into()),
    }
}

fn invalid(index: u64, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("the raft log: log entry {index} is refused: {why}"))
}

fn decode_v1(bytes: &[u8]) -> Result<Entry, String> {
    let (head, body) = bytes.split_at_checked(HEADER).ok_or("record shorter than its header")?;
    let stored = u32::from_le_bytes(head[1..HEADER].try_into().expect("four bytes"));
    if crc(body) != stored {
        return Err("its checksum does not match (damaged on disk or on the way, or edited)".into());
    }
    decode_body(body)
}

/// The body's fields, with no checksum check (the tests' negative control shows what
/// an edit would decode to without it).
fn decode_body(body: &[u8]) -> Result<Entry, String> {
    let mut r = Reader::new(body);
    let (term, node_id, index) = (r.u64()?, r.u64()?, r.u64()?);
    let log_id = LogId::new(LeaderIdOf::<TypeConfig>::new_committed(term, node_id), index);
    let payload = match r.u8()? {
        0 => EntryPayload::Blank,
        1 => EntryPayload::Normal(r.batch()?),
        2 => EntryPayload::Membership(serde_json::from_slice(r.bytes()?).map_err(|e| format!("membership: {e}"))?),
        t => return Err(format!("unknown payload tag {t}")),
    };
    r.end()?;
    Ok(Entry { log_id, payload })
}

fn put_batch(out: &mut Vec<u8>, batch: &Batch) {
    put_u64(out, batch.now_ms);
    put_u64(out, batch.items.len() as u64);
    for (request, cmd) in &batch.items {
        put_u64(out, request.0);
        put_command(out, cmd);
    }
}

fn put_lease_ref(out: &mut Vec<u8>, lease: LeaseRef) {
    match lease {
        LeaseRef::Existing(id) => {
            out.push(0);
            put_lease(out, id);
        }
        LeaseRef::Implicit { id, ttl_ms } => {
            out.push(1);
            put_lease(out, id);
            put_u64(out, ttl_ms);
        }
    }
}

fn put_wait(out: &mut Vec<u8>, lease: LeaseRef, wait_ms: u64, lock_delay_ms: u64, holder: Option<&String>) {
    put_lease_ref(out, lease);
    put_u64(out, wait_ms);
    put_u64(out, lock_delay_ms);
    put_opt(out, holder, |o, h| put_bytes(o, h.as_bytes()));
}

fn put_command(out: &mut Vec<u8>, cmd: &Command) {
    match cmd {
        Command::GrantLease { lease, ttl_ms } => {
            out.push(0);
            put_lease(out, *lease);
            put_u64(out, *ttl_ms);
        }
        Command::Keepalive { lease } => {
            out.push(1);
            put_lease(out, *lease);
        }
        Command::Acquire(a) => {
            out.push(2);
            put_name(out, &a.name);
            put_wait(out, a.lease, a.wait_ms, a.lock_delay_ms, a.holder.as_ref());
        }
        Command::AcquireAll(a) => {
            out.push(3);
            put_u64(out, a.names.len() as u64);
            a.names.iter().for_each(|n| put_name(out, n));
            put_wait(out, a.lease, a.wait_ms, a.lock_delay_ms, a.holder.as_ref());
        }
        Command::Release { name, lease } => {
            out.push(4);
            put_name(out, name);
            put_lease(out, *lease);
        }
        Command::Revoke { lease } => {
            out.push(5);
            put_lease(out, *lease);
        }
        Command::RevokeLock { name, token } => {
            out.push(6);
            put_name(out, name);
            put_opt(out, token.map(Token::get), put_u64);
        }
        Command::Cancel { request } => {
            out.push(7);
            put_u64(out, request.0);
        }
        Command::Renewed { leases } => {
            out.push(13);
            put_u64(out, leases.len() as u64);
            for (lease, at_ms) in leases {
                put_lease(out, *lease);
                put_u64(out, *at_ms);
            }
        }
        Command::Tick => out.push(8),
        Command::Promote => out.push(9),
        Command::RaiseTokens { floor } => {
            out.push(10);
            put_u64(out, floor.get());
        }
        Command::Store(s) => {
            out.push(11);
            put_store(out, s);
        }
        Command::SetLimits(l) => {
            out.push(12);
            put_limits(out, l);
        }
    }
}

fn put_store(out: &mut Vec<u8>, cmd: &StoreCommand) {
    match cmd {
        StoreCommand::Write { key, token, value, foreign, quotas } => {
            out.push(0);
            put_bytes(out, key.as_bytes());
            put_u64(out, token.get());
            put_bytes(out, value);
            put_flag(out, *foreign);
            put_quotas(out, *quotas);
        }
        StoreCommand::FencedRead { key, token, foreign, quotas } => {
            out.push(1);
            put_bytes(out, key.as_bytes());
            put_u64(out, token.get());
            put_flag(out, *foreign);
            put_quotas(out, *quotas);
        }
        StoreCommand::WriteUnfenced { key, value, quotas } => {
            out.push(2);
            put_bytes(out, key.as_bytes());
            put_bytes(out, value);
            put_quotas(out, *quotas);
        }
        StoreCommand::Import { records } => {
            out.push(3);
            put_u64(out, records.len() as u64);
            for (key, record) in records {
                put_bytes(out, key.as_bytes());
                put_opt(out, record.mark.map(Token::get), put_u64);
                put_opt(out, record.value.as_deref(), put_bytes);
            }
        }
    }
}

impl Reader<'_> {
    fn lease_ref(&mut self) -> Result<LeaseRef, String> {
        match self.u8()? {
            0 => Ok(LeaseRef::Existing(self.lease()?)),
            1 => Ok(LeaseRef::Implicit { id: self.lease()?, ttl_ms: self.u64()? }),
            t => Err(format!("unknown lease tag {t}")),
        }
    }

    fn batch(&mut self) -> Result<Batch, String> {
        let now_ms = self.u64()?;
        let n = self.count(2)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push((RequestId(self.u64()?), self.command()?));
        }
        Ok(Batch { items, now_ms })
    }

    fn command(&mut self) -> Result<Command, String> {
        Ok(match self.u8()? {
            0 => Command::GrantLease { lease: self.lease()?, ttl_ms: self.u64()? },
            1 => Command::Keepalive { lease: self.lease()? },
            2 => {
                let name = self.name()?;
                let (lease, wait_ms, lock_delay_ms, holder) = self.wait()?;
                Command::Acquire(Acquire { name, lease, wait_ms, lock_delay_ms, holder })
            }
            3 => {
                let n = self.count(1)?;
                let names = (0..n).map(|_| self.name()).collect::<Result<_, _>>()?;
                let (lease, wait_ms, lock_delay_ms, holder) = self.wait()?;
                Command::AcquireAll(AcquireAll { names, lease, wait_ms, lock_delay_ms, holder })
            }
            4 => Command::Release { name: self.name()?, lease: self.lease()? },
            5 => Command::Revoke { lease: self.lease()? },
            6 => Command::RevokeLock { name: self.name()?, token: self.opt(Self::token)? },
            7 => Command::Cancel { request: RequestId(self.u64()?) },
            8 => Command::Tick,
            9 => Command::Promote,
            10 => Command::RaiseTokens { floor: self.token()? },
            11 => Command::Store(self.store()?),
            12 => Command::SetLimits(self.limits()?),
            13 => {
                let n = self.count(17)?;
                let leases = (0..n).map(|_| Ok((self.lease()?, self.u64()?))).collect::<Result<_, String>>()?;
                Command::Renewed { leases }
            }
            t => return Err(format!("unknown command tag {t}")),
        })
    }

    #[allow(clippy::type_complexity)]
    fn wait(&mut self) -> Result<(LeaseRef, u64, u64, Option<String>), String> {
        Ok((self.lease_ref()?, self.u64()?, self.u64()?, self.opt(Self::string)?))
    }

    fn store(&mut self) -> Result<StoreCommand, String> {
        Ok(match self.u8()? {
            0 => StoreCommand::Write {
                key: self.string()?,
                token: self.token()?,
                value: self.bytes()?.to_vec(),
                foreign: self.flag()?,
                quotas: self.quotas()?,
            },
            1 => StoreCommand::FencedRead {
                key: self.string()?,
                token: self.token()?,
                foreign: self.flag()?,
                quotas: self.quotas()?,
            },
            2 => StoreCommand::WriteUnfenced {
                key: self.string()?,
                value: self.bytes()?.to_vec(),
                quotas: self.quotas()?,
            },
            3 => {
                let n = self.count(3)?;
                let mut records = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = self.string()?;
                    let mark = self.opt(Self::token)?;
                    let value = self.opt(|r| r.bytes().map(<[u8]>::to_vec))?;
                    records.push((key, Record { mark, value }));
                }
                StoreCommand::Import { records }
            }
            t => return Err(format!("unknown store command tag {t}")),
        })
    }
}

#[cfg(test)]
mod tests;
