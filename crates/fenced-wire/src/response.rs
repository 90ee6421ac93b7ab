//! The answers: their shape, and their payloads both ways.

use fenced_core::{LeaseId, Token};

use crate::frame::{begin, finish, put_short, FrameError, Reader};
use crate::{error_frame, op, Detail};

/// An answer, borrowing from the frame it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// AUTH or REVOKE done.
    Done {
        op: u8,
    },
    /// CREATE_LEASE or KEEPALIVE.
    Lease {
        op: u8,
        lease: LeaseId,
        ttl_ms: u64,
    },
    /// `signature`: the grant's, 64 bytes, when the service signs grants.
    Granted {
        token: Token,
        lease: LeaseId,
        ttl_ms: u64,
        signature: Option<&'a [u8]>,
    },
    /// Every lock of an ACQUIRE_ALL, each with its token; `signatures`: none, or one
    /// per grant in the same order.
    GrantedAll {
        lease: LeaseId,
        ttl_ms: u64,
        grants: Vec<(&'a str, Token)>,
        signatures: Vec<&'a [u8]>,
    },
    Released {
        token: Token,
    },
    Checked {
        current: bool,
        token: Option<Token>,
    },
    Written {
        token: Token,
        highest_seen: Token,
    },
    Read {
        highest_seen: Option<Token>,
        value: &'a [u8],
    },
    /// A refusal: its code, a sentence for a person, and the fields a caller acts on.
    Error {
        code: &'a str,
        message: &'a str,
        details: Vec<Detail<'a>>,
    },
    /// One event of a watch: its index and its JSON object.
    Event {
        index: u64,
        data: &'a [u8],
    },
    /// A watch's position marker.
    Mark {
        index: u64,
    },
    /// A watch fell behind by at least `missed` positions.
    Lagged {
        missed: u64,
    },
}

/// Appends an answer frame to `out`.
pub fn encode_response(out: &mut Vec<u8>, id: u32, resp: &Response<'_>) {
    let kind = match resp {
        Response::Done { op } | Response::Lease { op, .. } => *op,
        Response::Granted { .. } => op::ACQUIRE,
        Response::GrantedAll { .. } => op::ACQUIRE_ALL,
        Response::Released { .. } => op::RELEASE,
        Response::Checked { .. } => op::CHECK,
        Response::Written { .. } => op::PUT,
        Response::Read { .. } => op::GET,
        Response::Error { .. } => op::ERROR,
        Response::Event { .. } => op::WATCH,
        Response::Mark { .. } => op::WATCH_MARK,
        Response::Lagged { .. } => op::WATCH_LAGGED,
    };
    let at = begin(out, id, kind);
    match resp {
        Response::Done { .. } => {}
        Response::Lease { lease, ttl_ms, .. } => {
            out.extend_from_slice(&lease.0.to_be_bytes());
            out.extend_from_slice(&ttl_ms.to_be_bytes());
        }
        Response::Granted { token, lease, ttl_ms, signature } => {
            out.extend_from_slice(&token.get().to_be_bytes());
            out.extend_from_slice(&lease.0.to_be_bytes());
            out.extend_from_slice(&ttl_ms.to_be_bytes());
            out.extend_from_slice(signature.unwrap_or_default());
        }
        Response::GrantedAll { lease, ttl_ms, grants, signatures } => {
            out.extend_from_slice(&lease.0.to_be_bytes());
            out.extend_from_slice(&ttl_ms.to_be_bytes());
            out.push(grants.len().min(u8::MAX as usize) as u8);
            for (name, token) in grants.iter().take(u8::MAX as usize) {
                out.extend_from_slice(&token.get().to_be_bytes());
                put_short(out, name);
            }
            for signature in signatures.iter().take(grants.len().min(u8::MAX as usize)) {
                out.extend_from_slice(signature);
            }
        }
        Response::Released { token } => out.extend_from_slice(&token.get().to_be_bytes()),
        Response::Checked { current, token } => {
            out.push(u8::from(*current));
            out.extend_from_slice(&token.map_or(0, Token::get).to_be_bytes());
        }
        Response::Written { token, highest_seen } => {
            out.extend_from_slice(&token.get().to_be_bytes());
            out.extend_from_slice(&highest_seen.get().to_be_bytes());
        }
        Response::Read { highest_seen, value } => {
            out.extend_from_slice(&highest_seen.map_or(0, Token::get).to_be_bytes());
            out.extend_from_slice(value);
        }
        Response::Error { code, message, details } => error_frame::write(out, code, message, details),
        Response::Event { index, data } => {
            out.extend_from_slice(&index.to_be_bytes());
            out.extend_from_slice(data);
        }
        Response::Mark { index } => out.extend_from_slice(&index.to_be_bytes()),
        Response::Lagged { missed } => out.extend_from_slice(&missed.to_be_bytes()),
    }
    finish(out, at);
}

/// The signatures after a grant's fields: none, or exactly `count` of 64 bytes.
fn signatures(rest: &[u8], count: usize) -> Option<Vec<&[u8]>> {
    match rest.len() {
        0 => Some(Vec::new()),
        n if n == count * SIGNATURE_BYTES => Some(rest.chunks(SIGNATURE_BYTES).collect()),
        _ => None,
    }
}

/// An Ed25519 signature's length.
pub const SIGNATURE_BYTES: usize = 64;

/// Decodes an answer's payload; `kind` is the frame's op byte.
pub fn decode_response(id: u32, kind: u8, payload: &[u8]) -> Result<Response<'_>, FrameError> {
    let mut r = Reader(payload);
    let bad = |what| FrameError::Malformed { id, what };
    let token = |raw: Option<u64>| raw.and_then(Token::new).ok_or(bad("a token is at least 1"));
    let resp = match kind {
        op::ERROR => error_frame::read(&mut r, bad)?,
        op::AUTH | op::REVOKE => Response::Done { op: kind },
        op::CREATE_LEASE | op::KEEPALIVE => Response::Lease {
            op: kind,
            lease: LeaseId(r.u128().ok_or(bad("lease u128"))?),
            ttl_ms: r.u64().ok_or(bad("ttl_ms u64"))?,
        },
        op::ACQUIRE => Response::Granted {
            token: token(r.u64())?,
            lease: LeaseId(r.u128().ok_or(bad("lease u128"))?),
            ttl_ms: r.u64().ok_or(bad("ttl_ms u64"))?,
            signature: signatures(r.rest(), 1).ok_or(bad("a signature is 64 bytes"))?.pop(),
        },
        op::ACQUIRE_ALL => {
            let lease = LeaseId(r.u128().ok_or(bad("lease u128"))?);
            let ttl_ms = r.u64().ok_or(bad("ttl_ms u64"))?;
            let count = r.u8().ok_or(bad("count u8"))?;
            let mut grants = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let t = token(r.u64())?;
                grants.push((r.short_text().ok_or(bad("a name (len u16, UTF-8) is cut short or not UTF-8"))?, t));
            }
            let signatures = signatures(r.rest(), grants.len()).ok_or(bad("one 64-byte signature per grant"))?;
            Response::GrantedAll { lease, ttl_ms, grants, signatures }
        }
        op::RELEASE => Response::Released { token: token(r.u64())? },
        op::CHECK => Response::Checked {
            current: r.u8().ok_or(bad("current u8"))? != 0,
            token: Token::new(r.u64().ok_or(bad("token u64"))?),
        },
        op::PUT => Response::Written { token: token(r.u64())?, highest_seen: token(r.u64())? },
        op::GET => {
            Response::Read { highest_seen: Token::new(r.u64().ok_or(bad("highest_seen u64"))?), value: r.rest() }
        }
        op::WATCH => Response::Event { index: r.u64().ok_or(bad("index u64, event"))?, data: r.rest() },
        op::WATCH_MARK => Response::Mark { index: r.u64().ok_or(bad("index u64"))? },
        op::WATCH_LAGGED => Response::Lagged { missed: r.u64().ok_or(bad("missed u64"))? },
        _ => return Err(FrameError::UnknownOp { id, op: kind }),
    };
    Ok(resp)
}
