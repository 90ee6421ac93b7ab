//! The requests: their shape, and their payloads both ways.

use fenced_core::{LeaseId, Token};

use crate::frame::{begin, finish, put_short, FrameError, Reader};
use crate::op;

/// A request, borrowing from the frame it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Auth {
        token: &'a [u8],
    },
    CreateLease {
        ttl_ms: u64,
    },
    Keepalive {
        lease: LeaseId,
    },
    Revoke {
        lease: LeaseId,
    },
    /// `holder`: the holder's label (flag bit 2, then its length as u16 and its bytes
    /// before the name); absent in frames of clients that do not send one.
    Acquire {
        name: &'a str,
        lease: Option<LeaseId>,
        ttl_ms: Option<u64>,
        wait_ms: u64,
        lock_delay_ms: u64,
        holder: Option<&'a str>,
    },
    /// Several locks at once ([`op::ACQUIRE_ALL`]).
    AcquireAll {
        names: Vec<&'a str>,
        lease: Option<LeaseId>,
        ttl_ms: Option<u64>,
        wait_ms: u64,
        lock_delay_ms: u64,
        holder: Option<&'a str>,
    },
    Release {
        name: &'a str,
        lease: LeaseId,
    },
    Check {
        name: &'a str,
        token: u64,
    },
    Put {
        key: &'a str,
        token: Option<Token>,
        value: &'a [u8],
    },
    Get {
        key: &'a str,
        token: Option<Token>,
    },
    Cancel {
        target: u32,
    },
    /// A watch ([`op::WATCH`]): after `since`, or the last `tail` events held, or from now.
    Watch {
        prefix: &'a str,
        since: Option<u64>,
        tail: Option<u32>,
    },
}

/// The fields ACQUIRE and ACQUIRE_ALL share: `flags u8, lease u128, ttl_ms u64,
/// wait_ms u64, lock_delay_ms u64`, then the holder label when flag 4 is set.
struct AcquireFields<'a> {
    lease: Option<LeaseId>,
    ttl_ms: Option<u64>,
    wait_ms: u64,
    lock_delay_ms: u64,
    holder: Option<&'a str>,
}

impl<'a> AcquireFields<'a> {
    fn read(r: &mut Reader<'a>, bad: impl Fn(&'static str) -> FrameError) -> Result<Self, FrameError> {
        let fields = "flags u8, lease u128, ttl_ms u64, wait_ms u64, lock_delay_ms u64, [holder], name";
        let flags = r.u8().ok_or(bad(fields))?;
        let lease = r.u128().ok_or(bad(fields))?;
        let ttl_ms = r.u64().ok_or(bad(fields))?;
        let wait_ms = r.u64().ok_or(bad(fields))?;
        let lock_delay_ms = r.u64().ok_or(bad(fields))?;
        let holder = if flags & 4 != 0 {
            let len = r.u16().ok_or(bad("holder_len u16"))?;
            let bytes = r.take(len as usize).ok_or(bad("the holder label is cut short"))?;
            Some(std::str::from_utf8(bytes).map_err(|_| bad("the holder label is not UTF-8"))?)
        } else {
            None
        };
        let lease = (flags & 1 != 0).then_some(LeaseId(lease));
        Ok(AcquireFields { lease, ttl_ms: (flags & 2 != 0).then_some(ttl_ms), wait_ms, lock_delay_ms, holder })
    }

    fn write(&self, out: &mut Vec<u8>) {
        let (lease, ttl_ms, holder) = (self.lease, self.ttl_ms, self.holder);
        let flags = u8::from(lease.is_some()) | (u8::from(ttl_ms.is_some()) << 1) | (u8::from(holder.is_some()) << 2);
        out.push(flags);
        out.extend_from_slice(&lease.map_or(0, |l| l.0).to_be_bytes());
        out.extend_from_slice(&ttl_ms.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&self.wait_ms.to_be_bytes());
        out.extend_from_slice(&self.lock_delay_ms.to_be_bytes());
        if let Some(h) = holder {
            // Labels longer than u16 cannot be valid; send a length the server refuses.
            put_short(out, h);
        }
    }
}

/// Decodes a request's payload.
pub fn decode_request(id: u32, op: u8, payload: &[u8]) -> Result<Request<'_>, FrameError> {
    let mut r = Reader(payload);
    let bad = |what| FrameError::Malformed { id, what };
    let req = match op {
        op::AUTH => Request::Auth { token: r.rest() },
        op::CREATE_LEASE => Request::CreateLease { ttl_ms: r.u64().ok_or(bad("ttl_ms u64"))? },
        op::KEEPALIVE => Request::Keepalive { lease: LeaseId(r.u128().ok_or(bad("lease u128"))?) },
        op::REVOKE => Request::Revoke { lease: LeaseId(r.u128().ok_or(bad("lease u128"))?) },
        op::ACQUIRE => {
            let f = AcquireFields::read(&mut r, bad)?;
            let name = r.text().ok_or(bad("the name is not UTF-8"))?;
            let (lease, ttl_ms, wait_ms, lock_delay_ms, holder) =
                (f.lease, f.ttl_ms, f.wait_ms, f.lock_delay_ms, f.holder);
            Request::Acquire { name, lease, ttl_ms, wait_ms, lock_delay_ms, holder }
        }
        op::ACQUIRE_ALL => {
            let f = AcquireFields::read(&mut r, bad)?;
            let count = r.u8().ok_or(bad("count u8"))?;
            let mut names = Vec::with_capacity(count as usize);
            for _ in 0..count {
                names.push(r.short_text().ok_or(bad("a name (len u16, UTF-8) is cut short or not UTF-8"))?);
            }
            if !r.0.is_empty() {
                return Err(bad("bytes after the last name"));
            }
            let (lease, ttl_ms, wait_ms, lock_delay_ms, holder) =
                (f.lease, f.ttl_ms, f.wait_ms, f.lock_delay_ms, f.holder);
            Request::AcquireAll { names, lease, ttl_ms, wait_ms, lock_delay_ms, holder }
        }
        op::RELEASE => {
            let lease = LeaseId(r.u128().ok_or(bad("lease u128, name"))?);
            Request::Release { lease, name: r.text().ok_or(bad("the name is not UTF-8"))? }
        }
        op::CHECK => {
            let token = r.u64().ok_or(bad("token u64, name"))?;
            Request::Check { token, name: r.text().ok_or(bad("the name is not UTF-8"))? }
        }
        op::PUT => {
            let token = Token::new(r.u64().ok_or(bad("token u64, key_len u16, key, value"))?);
            let key_len = r.u16().ok_or(bad("token u64, key_len u16, key, value"))?;
            let key = r.take(key_len as usize).ok_or(bad("key_len is past the frame's end"))?;
            let key = std::str::from_utf8(key).map_err(|_| bad("the key is not UTF-8"))?;
            Request::Put { key, token, value: r.rest() }
        }
        op::GET => {
            let token = Token::new(r.u64().ok_or(bad("token u64, key"))?);
            Request::Get { token, key: r.text().ok_or(bad("the key is not UTF-8"))? }
        }
        op::CANCEL => Request::Cancel { target: r.u32().ok_or(bad("target u32"))? },
        op::WATCH => {
            let fields = "flags u8, since u64, tail u32, prefix";
            let flags = r.u8().ok_or(bad(fields))?;
            let (since, tail) = (r.u64().ok_or(bad(fields))?, r.u32().ok_or(bad(fields))?);
            if flags & 3 == 3 || flags & !3 != 0 {
                return Err(bad("flags: 1 (since) or 2 (tail), not both"));
            }
            let prefix = r.text().ok_or(bad("the prefix is not UTF-8"))?;
            Request::Watch { prefix, since: (flags & 1 != 0).then_some(since), tail: (flags & 2 != 0).then_some(tail) }
        }
        _ => return Err(FrameError::UnknownOp { id, op }),
    };
    Ok(req)
}

/// Appends a request frame to `out`.
pub fn encode_request(out: &mut Vec<u8>, id: u32, req: &Request<'_>) {
    let op = match req {
        Request::Auth { .. } => op::AUTH,
        Request::CreateLease { .. } => op::CREATE_LEASE,
        Request::Keepalive { .. } => op::KEEPALIVE,
        Request::Revoke { .. } => op::REVOKE,
        Request::Acquire { .. } => op::ACQUIRE,
        Request::AcquireAll { .. } => op::ACQUIRE_ALL,
        Request::Release { .. } => op::RELEASE,
        Request::Check { .. } => op::CHECK,
        Request::Put { .. } => op::PUT,
        Request::Get { .. } => op::GET,
        Request::Cancel { .. } => op::CANCEL,
        Request::Watch { .. } => op::WATCH,
    };
    let at = begin(out, id, op);
    match req {
        Request::Auth { token } => out.extend_from_slice(token),
        Request::CreateLease { ttl_ms } => out.extend_from_slice(&ttl_ms.to_be_bytes()),
        Request::Keepalive { lease } | Request::Revoke { lease } => out.extend_from_slice(&lease.0.to_be_bytes()),
        Request::Acquire { name, lease, ttl_ms, wait_ms, lock_delay_ms, holder } => {
            let (lease, ttl_ms, wait_ms, lock_delay_ms, holder) = (*lease, *ttl_ms, *wait_ms, *lock_delay_ms, *holder);
            AcquireFields { lease, ttl_ms, wait_ms, lock_delay_ms, holder }.write(out);
            out.extend_from_slice(name.as_bytes());
        }
        Request::AcquireAll { names, lease, ttl_ms, wait_ms, lock_delay_ms, holder } => {
            let (lease, ttl_ms, wait_ms, lock_delay_ms, holder) = (*lease, *ttl_ms, *wait_ms, *lock_delay_ms, *holder);
            AcquireFields { lease, ttl_ms, wait_ms, lock_delay_ms, holder }.write(out);
            // More than 255 cannot be valid; the count says so and the server refuses it.
            out.push(names.len().min(u8::MAX as usize) as u8);
            for name in names.iter().take(u8::MAX as usize) {
                put_short(out, name);
            }
        }
        Request::Release { name, lease } => {
            out.extend_from_slice(&lease.0.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        Request::Check { name, token } => {
            out.extend_from_slice(&token.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        Request::Put { key, token, value } => {
            out.extend_from_slice(&token.map_or(0, Token::get).to_be_bytes());
            // Keys longer than u16 cannot be valid; send a length the server refuses.
            let key = &key.as_bytes()[..key.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(key.len() as u16).to_be_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(value);
        }
        Request::Get { key, token } => {
            out.extend_from_slice(&token.map_or(0, Token::get).to_be_bytes());
            out.extend_from_slice(key.as_bytes());
        }
        Request::Cancel { target } => out.extend_from_slice(&target.to_be_bytes()),
        Request::Watch { prefix, since, tail } => {
            out.push(u8::from(since.is_some()) | (u8::from(tail.is_some()) << 1));
            out.extend_from_slice(&since.unwrap_or(0).to_be_bytes());
            out.extend_from_slice(&tail.unwrap_or(0).to_be_bytes());
            out.extend_from_slice(prefix.as_bytes());
        }
    }
    finish(out, at);
}
