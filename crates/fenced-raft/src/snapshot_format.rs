//! The lock table's snapshot as bytes: a versioned, checksummed binary format written
//! and read by hand from the table's [`Image`] (its public counterpart), so that a
//! change to the table's private fields cannot change the format, and a snapshot of a
//! newer version is refused with a message that says so.
//!
//! Version 1:
//!
//! ```text
//! [8: "fenced-s"][1: version = 1][4: CRC-32C of the body, little-endian][body]
//! body    = agreed limits (an option), now, next token, last token (an option), first
//!           token, grace end, effects seq, timers set, then the lists in the image's
//!           canonical order: leases, locks, waiters, granted, granted sets, timers,
//!           store records
//! ```
//!
//! The primitives are `codec`'s (varints, 16-byte lease ids, length-prefixed strings,
//! flag-byte options). Snapshots of releases before this one are the table's serde
//! JSON (first byte `{`): still read, and still written for a member that has not said
//! it reads this format ([`to_legacy_json`], `network`), so a rolling upgrade can
//! send a snapshot either way.

use fenced_core::table::image::{HolderImage, Image, LeaseImage, LockImage, TimerImage, TimerKind, WaiterImage};
use fenced_core::{Limits, LockTable, Record, RequestId};

use crate::codec::{crc, put_bytes, put_flag, put_lease, put_limits, put_name, put_opt, put_u64, Reader};

/// What a snapshot of this format starts with.
pub const MAGIC: &[u8; 8] = b"fenced-s";

/// The version this release writes, and the newest it reads.
pub const VERSION: u8 = 1;

/// The magic, the version and the checksum.
const HEADER: usize = MAGIC.len() + 5;

/// The snapshot of `table`.
pub fn encode(table: &LockTable) -> Vec<u8> {
    let image = table.image();
    // Sized up front: a snapshot of a large store grown by doubling would copy (and
    // remap) hundreds of MiB several times over.
    let items = image.leases.len() + image.locks.len() + image.waiters.len() + image.timers.len();
    let mut out = Vec::with_capacity(HEADER + 96 * items + table.store().usage().1 as usize + 4096);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&[0; 4]);
    put_image(&mut out, &image);
    let sum = crc(&out[HEADER..]);
    out[MAGIC.len() + 1..HEADER].copy_from_slice(&sum.to_le_bytes());
    out
}

/// The table a snapshot describes (of this format or the JSON of earlier releases),
/// deciding with `limits` unless it carries limits the cluster agreed on; refused,
/// saying why, when it is damaged, of a newer version, or breaks the table's
/// invariants.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<LockTable, String> {
    if is_legacy(bytes) {
        return decode_legacy_json(bytes, limits);
    }
    let rest = bytes.strip_prefix(MAGIC).ok_or("not a lock-table snapshot (neither this format nor JSON)")?;
    let (&version, rest) = rest.split_first().ok_or("the snapshot ends after its magic")?;
    if version != VERSION {
        return Err(format!(
            "snapshot format version {version}: this release reads version {VERSION} and the JSON of earlier \
             releases; a newer release of Fenced wrote it (run that one), or it is damaged"
        ));
    }
    let (sum, body) = rest.split_at_checked(4).ok_or("the snapshot ends inside its checksum")?;
    if crc(body) != u32::from_le_bytes(sum.try_into().expect("4 bytes")) {
        return Err("the snapshot's checksum does not match (damaged on disk or on the way, or edited)".into());
    }
    let image = read_image(body)?;
    LockTable::from_image(image, limits.clone()).map_err(|e| format!("the snapshot's table is refused: {e}"))
}

/// Whether `bytes` are the JSON snapshot of a release before this format.
pub fn is_legacy(bytes: &[u8]) -> bool {
    bytes.first() == Some(&b'{')
}

/// The snapshot in the JSON that releases before this format read, for a member that
/// has not said it reads this one (`network`). Also carries the four fields of the
/// retired durability model (the token ceiling and its block, the TTL mark, the
/// lock-delay records), which releases before their removal require in a snapshot:
/// with values that change nothing there. Agreed limits are not in it (no such
/// release reads them, nor the command that sets them).
pub fn to_legacy_json(table: &LockTable) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Body<'t> {
        table: Retired<'t>,
    }
    #[derive(serde::Serialize)]
    struct Retired<'t> {
        #[serde(flatten)]
        table: &'t LockTable,
        ceiling: u64,
        token_block: u64,
        ttl_ms_hwm: u64,
        delay_records: std::collections::BTreeMap<String, u64>,
    }
    let table = Retired { table, ceiling: 0, token_block: 1, ttl_ms_hwm: 0, delay_records: Default::default() };
    serde_json::to_vec(&Body { table }).expect("a lock table serializes")
}

fn decode_legacy_json(bytes: &[u8], limits: &Limits) -> Result<LockTable, String> {
    #[derive(serde::Deserialize)]
    struct Body {
        table: LockTable,
    }
    let body: Body = serde_json::from_slice(bytes).map_err(|e| format!("a JSON lock-table snapshot: {e}"))?;
    // Rebuilt through its image, so the JSON of an earlier release is held to the
    // same invariants as a snapshot of this format.
    LockTable::from_image(body.table.image(), limits.clone())
        .map_err(|e| format!("the JSON snapshot's table is refused: {e}"))
}

fn put_image(out: &mut Vec<u8>, i: &Image) {
    put_opt(out, i.limits.as_ref(), put_limits);
    put_u64(out, i.now_ms);
    put_u64(out, i.next_token.get());
    put_opt(out, i.last_token.map(|t| t.get()), put_u64);
    put_u64(out, i.first_token.get());
    put_u64(out, i.grants_resume_at_ms);
    put_u64(out, i.effects_seq);
    put_u64(out, i.timers_set);
    put_list(out, &i.leases, put_lease_image);
    put_list(out, &i.locks, put_lock_image);
    put_list(out, &i.waiters, put_waiter_image);
    put_list(out, &i.granted, |o, (r, name)| {
        put_u64(o, r.0);
        put_name(o, name);
    });
    put_list(out, &i.granted_all, |o, (r, names)| {
        put_u64(o, r.0);
        put_list(o, names, put_name);
    });
    put_list(out, &i.timers, put_timer);
    put_list(out, &i.records, |o, (key, r)| {
        put_bytes(o, key.as_bytes());
        put_opt(o, r.mark.map(|t| t.get()), put_u64);
        put_opt(o, r.value.as_deref(), put_bytes);
    });
}

fn put_list<T>(out: &mut Vec<u8>, items: &[T], mut put: impl FnMut(&mut Vec<u8>, &T)) {
    put_u64(out, items.len() as u64);
    items.iter().for_each(|item| put(out, item));
}

fn put_requests(out: &mut Vec<u8>, rs: &[RequestId]) {
    put_list(out, rs, |o, r| put_u64(o, r.0));
}

fn put_label(out: &mut Vec<u8>, label: &Option<String>) {
    put_opt(out, label.as_deref(), |o, l| put_bytes(o, l.as_bytes()));
}

fn put_lease_image(out: &mut Vec<u8>, l: &LeaseImage) {
    put_lease(out, l.id);
    put_u64(out, l.ttl_ms);
    put_u64(out, l.expires_at_ms);
    put_opt(out, l.pending_for.map(|r| r.0), put_u64);
    put_flag(out, l.implicit);
    put_list(out, &l.held, put_name);
    put_requests(out, &l.waiting);
}

fn put_lock_image(out: &mut Vec<u8>, l: &LockImage) {
    put_name(out, &l.name);
    put_opt(out, l.holder.as_ref(), |o, h| {
        put_lease(o, h.lease);
        put_u64(o, h.token.get());
        put_u64(o, h.lock_delay_ms);
        put_label(o, &h.label);
        put_u64(o, u64::from(h.told));
        put_requests(o, &h.queued);
    });
    put_requests(out, &l.queue);
    put_u64(out, l.blocked_until_ms);
}

fn put_waiter_image(out: &mut Vec<u8>, w: &WaiterImage) {
    put_u64(out, w.request.0);
    put_name(out, &w.name);
    put_lease(out, w.lease);
    put_u64(out, w.lock_delay_ms);
    put_label(out, &w.label);
    put_list(out, &w.also, put_name);
}

fn put_timer(out: &mut Vec<u8>, t: &TimerImage) {
    put_u64(out, t.at_ms);
    put_u64(out, t.seq);
    match &t.what {
        TimerKind::LeaseExpiry(l) => {
            out.push(0);
            put_lease(out, *l);
        }
        TimerKind::WaitDeadline(r) => {
            out.push(1);
            put_u64(out, r.0);
        }
        TimerKind::LockDelayEnds(n) => {
            out.push(2);
            put_name(out, n);
        }
        TimerKind::GrantsResume => out.push(3),
    }
}

/// The image in `body`, with no checksum check (the tests' negative control).
fn read_image(body: &[u8]) -> Result<Image, String> {
    let mut r = Reader::new(body);
    let image = Image {
        limits: r.opt(Reader::limits)?,
        now_ms: r.u64()?,
        next_token: r.token()?,
        last_token: r.opt(Reader::token)?,
        first_token: r.token()?,
        grants_resume_at_ms: r.u64()?,
        effects_seq: r.u64()?,
        timers_set: r.u64()?,
        leases: r.list(21, Reader::lease_image)?,
        locks: r.list(5, Reader::lock_image)?,
        waiters: r.list(22, Reader::waiter_image)?,
        granted: r.list(2, |r| Ok((RequestId(r.u64()?), r.name()?)))?,
        granted_all: r.list(2, |r| Ok((RequestId(r.u64()?), r.list(1, Reader::name)?)))?,
        timers: r.list(3, Reader::timer)?,
        records: r.list(3, |r| {
            let key = r.string()?;
            let record = Record { mark: r.opt(Reader::token)?, value: r.opt(|r| r.bytes().map(<[u8]>::to_vec))? };
            Ok((key, std::sync::Arc::new(record)))
        })?,
    };
    r.end()?;
    Ok(image)
}

impl Reader<'_> {
    fn requests(&mut self) -> Result<Vec<RequestId>, String> {
        self.list(1, |r| r.u64().map(RequestId))
    }

    fn label(&mut self) -> Result<Option<String>, String> {
        self.opt(Reader::string)
    }

    fn lease_image(&mut self) -> Result<LeaseImage, String> {
        Ok(LeaseImage {
            id: self.lease()?,
            ttl_ms: self.u64()?,
            expires_at_ms: self.u64()?,
            pending_for: self.opt(|r| r.u64().map(RequestId))?,
            implicit: self.flag()?,
            held: self.list(1, Reader::name)?,
            waiting: self.requests()?,
        })
    }

    fn lock_image(&mut self) -> Result<LockImage, String> {
        Ok(LockImage {
            name: self.name()?,
            holder: self.opt(|r| {
                Ok(HolderImage {
                    lease: r.lease()?,
                    token: r.token()?,
                    lock_delay_ms: r.u64()?,
                    label: r.label()?,
                    told: r.u32()?,
                    queued: r.requests()?,
                })
            })?,
            queue: self.requests()?,
            blocked_until_ms: self.u64()?,
        })
    }

    fn waiter_image(&mut self) -> Result<WaiterImage, String> {
        Ok(WaiterImage {
            request: RequestId(self.u64()?),
            name: self.name()?,
            lease: self.lease()?,
            lock_delay_ms: self.u64()?,
            label: self.label()?,
            also: self.list(1, Reader::name)?,
        })
    }

    fn timer(&mut self) -> Result<TimerImage, String> {
        let (at_ms, seq) = (self.u64()?, self.u64()?);
        let what = match self.u8()? {
            0 => TimerKind::LeaseExpiry(self.lease()?),
            1 => TimerKind::WaitDeadline(RequestId(self.u64()?)),
            2 => TimerKind::LockDelayEnds(self.name()?),
            3 => TimerKind::GrantsResume,
            t => return Err(format!("unknown timer tag {t}")),
        };
        Ok(TimerImage { at_ms, seq, what })
    }
}

#[cfg(test)]
mod tests;
