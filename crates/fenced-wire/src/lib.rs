//! Fenced's binary wire protocol: the frames, their encoding and decoding, no IO.
//!
//! The server (`--wire-listen`) and the client (`fenced://host:port`) share this one
//! codec so the two cannot drift. Semantics, limits and error codes are the HTTP API's:
//! the server runs every request through the same handlers, and an error answer
//! carries the domain code (`lock_held`, `stale_token`, ...; no HTTP status: that is
//! the HTTP edge's mapping), the message and the error's fields, typed ([`Detail`]:
//! the same fields the HTTP API's JSON error object holds, in binary).
//!
//! A connection opens with the client's 8-byte preamble ([`PREAMBLE`]); then both
//! directions are a stream of frames:
//!
//! ```text
//! len: u32   bytes after this field (big-endian, like every integer here)
//! id:  u32   chosen by the client; the answer carries the same id
//! op:  u8    request: the operation; answer: the request's op on success, 0 on error
//! ...        the payload, below
//! ```
//!
//! Requests on one connection are read in order; those that finish at once (all but a
//! waiting acquire and the fenced store's durable calls) are answered in order, the
//! others when they finish, so many can be in flight on one connection.
//!
//! **Versions.** The preamble's last byte is the version the client speaks; only the
//! error answer differs between versions 2 and 3 (see [`error_frame`]). A server
//! answers each connection in the version its preamble names ([`Version`]): an earlier
//! client keeps working while it is upgraded. A client speaks [`Version::CURRENT`]
//! only; a server that does not know it answers `bad_preamble` and closes, and since an
//! error answer begins with its code in every version ([`error_code`]), the client can
//! say so plainly even when the rest of that answer is in an older shape.

pub mod detail;
pub mod error_frame;

pub use detail::Detail;
pub use error_frame::{error_code, v2};
use fenced_core::{LeaseId, Token};

/// A version of the protocol this crate speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// An error answer carries its code and the HTTP API's JSON error body ([`v2`]);
    /// written by servers for clients of earlier releases, never by this client.
    V2 = 2,
    /// An error answer carries its code, its message and typed fields ([`Detail`]).
    V3 = 3,
}

impl Version {
    /// The version this release's client speaks.
    pub const CURRENT: Version = Version::V3;

    /// The version's number, as the preamble and the forwarding header carry it.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The version numbered `n`, if this release speaks it.
    pub fn from_number(n: u8) -> Option<Version> {
        match n {
            2 => Some(Version::V2),
            3 => Some(Version::V3),
            _ => None,
        }
    }

    /// The 8 bytes a connection in this version opens with.
    pub fn preamble(self) -> [u8; 8] {
        let mut p = *b"FENCED\x00\x00";
        p[7] = self.number();
        p
    }
}

/// What a client sends first: "FENCED", a zero byte, and the protocol version (3: an
/// error answer carries typed fields instead of a JSON body).
pub const PREAMBLE: [u8; 8] = *b"FENCED\x00\x03";

/// Why a connection's first 8 bytes are no preamble this release speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreambleError {
    /// "FENCED\0" and a version this release does not speak.
    Version(u8),
    /// Not "FENCED\0" at all (an HTTP request on the wire port, say).
    NotFenced,
}

/// The version a connection's first 8 bytes name.
pub fn read_preamble(first: &[u8; 8]) -> Result<Version, PreambleError> {
    if first[..7] != PREAMBLE[..7] {
        return Err(PreambleError::NotFenced);
    }
    Version::from_number(first[7]).ok_or(PreambleError::Version(first[7]))
}

/// Bytes of a frame before its payload: length, id, op.
pub const HEADER_BYTES: usize = 9;

/// A frame's payload beyond the request's body (names, keys, fixed fields); the server
/// allows `body_bytes_max` plus this.
pub const FRAME_OVERHEAD_BYTES: usize = 1024;

/// Request operation codes (also the answer's kind on success).
pub mod op {
    /// Payload: the bearer token. Answer: empty.
    pub const AUTH: u8 = 1;
    /// Payload: `ttl_ms u64`. Answer: `lease u128, ttl_ms u64`.
    pub const CREATE_LEASE: u8 = 2;
    /// Payload: `lease u128`. Answer: `lease u128, ttl_ms u64`.
    pub const KEEPALIVE: u8 = 3;
    /// Payload: `lease u128`. Answer: empty; the lease's locks are released.
    pub const REVOKE: u8 = 4;
    /// Payload: `flags u8` (1: lease given, 2: ttl given; exactly one), `lease u128`,
    /// `ttl_ms u64`, `wait_ms u64`, `lock_delay_ms u64`, then the name (the rest).
    /// Answer: `token u64, lease u128, ttl_ms u64`, then, when the service signs its
    /// grants, the 64-byte Ed25519 signature (what HTTP's `signature` holds, in binary).
    pub const ACQUIRE: u8 = 5;
    /// Payload: `lease u128`, then the name. Answer: `token u64`.
    pub const RELEASE: u8 = 6;
    /// Payload: `token u64`, then the name. Answer: `current u8, token u64` (0: none).
    pub const CHECK: u8 = 7;
    /// Payload: `token u64` (0: none), `key_len u16`, key, then the value (the rest).
    /// Answer: `token u64, highest_seen u64`.
    pub const PUT: u8 = 8;
    /// Payload: `token u64` (0: a plain read), then the key. Answer: `highest_seen u64`
    /// (0: none), then the value (the rest).
    pub const GET: u8 = 9;
    /// Payload: `target u32`, the id of a request in flight (a waiting acquire) to
    /// withdraw. No answer of its own: the target is answered `cancelled` unless it
    /// was answered already.
    pub const CANCEL: u8 = 10;
    /// Several locks at once, all or none. Payload: ACQUIRE's fixed fields and holder,
    /// then `count u8` (1 to 64) and `count` names, each `len u16` and its bytes.
    /// Answer: `lease u128, ttl_ms u64, count u8`, then per lock (in the names' sorted
    /// order) `token u64, len u16` and its name; then, when the service signs its
    /// grants, one 64-byte signature per lock in the same order.
    pub const ACQUIRE_ALL: u8 = 11;
    /// A watch of the events of lock names and store keys that start with a prefix, as
    /// `GET /v1/events`. Payload: `flags u8` (1: `since` given, 2: `tail` given; not
    /// both), `since u64`, `tail u32`, then the prefix (the rest, UTF-8). Answered by a
    /// stream of frames with the watch's id: events (this kind: `index u64`, then the
    /// event's JSON object, as the HTTP stream's `data:`), [`WATCH_MARK`] and
    /// [`WATCH_LAGGED`], until an error frame ends it (`compacted` with `oldest_index`
    /// at the start, `cancelled` after a CANCEL of the watch, `shutting_down`).
    pub const WATCH: u8 = 12;
    /// A watch's position marker: `index u64`, every position up to it was read.
    pub const WATCH_MARK: u8 = 13;
    /// A watch fell behind what the member holds: `missed u64` positions at least.
    /// The stream goes on after the gap; a client that must miss nothing resumes from
    /// its last position elsewhere, or reads the state again.
    pub const WATCH_LAGGED: u8 = 14;
    /// The answer kind of an error: `code_len u8`, the code (snake_case ASCII),
    /// `message_len u16`, the message, `count u8` and that many typed fields
    /// ([`crate::error_frame`]; version 2: the code, then the HTTP API's JSON error body).
    pub const ERROR: u8 = 0;
}

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

/// A frame that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The declared length is above the limit: the stream cannot be trusted further.
    TooLarge { id: Option<u32>, len: u64, max: usize },
    /// The declared length is below the header's: the stream cannot be trusted further.
    TooShort { len: u32 },
    /// The op is not one this version knows; the frame was skipped.
    UnknownOp { id: u32, op: u8 },
    /// The payload does not fit the op; the frame was skipped.
    Malformed { id: u32, what: &'static str },
}

/// A complete frame at the start of a buffer: `(id, op, payload, bytes used)`.
pub type Split<'a> = (u32, u8, &'a [u8], usize);

/// One complete frame at the start of `buf`, or `None` when more bytes are needed.
/// `max` bounds the declared length.
pub fn split_frame(buf: &[u8], max: usize) -> Result<Option<Split<'_>>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes"));
    let id = (buf.len() >= 8).then(|| u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes")));
    if len as u64 > max as u64 {
        return Err(FrameError::TooLarge { id, len: len as u64, max });
    }
    if (len as usize) < HEADER_BYTES - 4 {
        return Err(FrameError::TooShort { len });
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some((id.expect("8 bytes present"), buf[8], &buf[HEADER_BYTES..total], total)))
}

/// Reads fixed fields off the front of a payload.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes(b.try_into().expect("2")))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_be_bytes(b.try_into().expect("4")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_be_bytes(b.try_into().expect("8")))
    }
    fn u128(&mut self) -> Option<u128> {
        self.take(16).map(|b| u128::from_be_bytes(b.try_into().expect("16")))
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.rest()).ok()
    }
    /// `len u16` and that many bytes of UTF-8.
    fn short_text(&mut self) -> Option<&'a str> {
        let len = self.u16()?;
        std::str::from_utf8(self.take(len as usize)?).ok()
    }
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

/// `len u16` and the bytes (cut at u16::MAX: longer cannot be valid, and the server
/// refuses what it gets).
fn put_short(out: &mut Vec<u8>, text: &str) {
    let b = &text.as_bytes()[..text.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_be_bytes());
    out.extend_from_slice(b);
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

/// Starts a frame in `out`; `finish` fills in its length.
pub(crate) fn begin(out: &mut Vec<u8>, id: u32, op: u8) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&id.to_be_bytes());
    out.push(op);
    at
}

pub(crate) fn finish(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip_request(req: Request<'_>) {
        let mut out = Vec::new();
        encode_request(&mut out, 42, &req);
        let (id, op, payload, used) = split_frame(&out, 1 << 20).unwrap().unwrap();
        assert_eq!((id, used), (42, out.len()));
        assert_eq!(decode_request(id, op, payload).unwrap(), req);
    }

    fn round_trip_response(resp: Response<'_>) {
        let mut out = Vec::new();
        encode_response(&mut out, 7, &resp);
        let (id, kind, payload, _) = split_frame(&out, 1 << 20).unwrap().unwrap();
        assert_eq!(decode_response(id, kind, payload).unwrap(), resp);
    }

    #[test]
    fn every_request_round_trips() {
        let lease = LeaseId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let t = Token::new(9);
        round_trip_request(Request::Auth { token: b"secret" });
        round_trip_request(Request::CreateLease { ttl_ms: 5000 });
        round_trip_request(Request::Keepalive { lease });
        round_trip_request(Request::Revoke { lease });
        round_trip_request(Request::AcquireAll {
            names: vec!["a", "é/b", ""],
            lease: None,
            ttl_ms: Some(100),
            wait_ms: 3,
            lock_delay_ms: 0,
            holder: Some("job"),
        });
        // A name cut short, or bytes after the last: malformed, not misread.
        let mut out = Vec::new();
        let req = Request::AcquireAll {
            names: vec!["ab"],
            lease: Some(lease),
            ttl_ms: None,
            wait_ms: 0,
            lock_delay_ms: 0,
            holder: None,
        };
        encode_request(&mut out, 1, &req);
        let (id, op, payload, _) = split_frame(&out, 1 << 20).unwrap().unwrap();
        assert!(decode_request(id, op, &payload[..payload.len() - 1]).is_err());
        let mut longer = payload.to_vec();
        longer.push(b'x');
        assert!(decode_request(id, op, &longer).is_err());
        round_trip_request(Request::Acquire {
            name: "a/b",
            lease: Some(lease),
            ttl_ms: None,
            wait_ms: 3,
            lock_delay_ms: 4,
            holder: None,
        });
        round_trip_request(Request::Acquire {
            name: "a/b",
            lease: None,
            ttl_ms: Some(100),
            wait_ms: 0,
            lock_delay_ms: 0,
            holder: Some("worker-7 on host-é"),
        });
        round_trip_request(Request::Acquire {
            name: "é",
            lease: None,
            ttl_ms: Some(100),
            wait_ms: 0,
            lock_delay_ms: 0,
            holder: None,
        });
        round_trip_request(Request::Release { name: "x", lease });
        round_trip_request(Request::Check { name: "x", token: 3 });
        round_trip_request(Request::Put { key: "k", token: t, value: b"\x00\x01v" });
        round_trip_request(Request::Put { key: "k", token: None, value: b"" });
        round_trip_request(Request::Get { key: "k", token: t });
        round_trip_request(Request::Cancel { target: 99 });
        round_trip_request(Request::Watch { prefix: "jobs/", since: Some(7), tail: None });
        round_trip_request(Request::Watch { prefix: "", since: None, tail: Some(100) });
        round_trip_request(Request::Watch { prefix: "é", since: None, tail: None });
    }

    #[test]
    fn every_response_round_trips() {
        let lease = LeaseId(u128::MAX);
        let t = Token::new(5).unwrap();
        round_trip_response(Response::Done { op: op::REVOKE });
        round_trip_response(Response::Lease { op: op::KEEPALIVE, lease, ttl_ms: 9 });
        round_trip_response(Response::Granted { token: t, lease, ttl_ms: 100, signature: None });
        round_trip_response(Response::Granted { token: t, lease, ttl_ms: 100, signature: Some(&[7; 64]) });
        round_trip_response(Response::Released { token: t });
        let grants = vec![("a", t), ("é/b", Token::new(9).unwrap())];
        round_trip_response(Response::GrantedAll { lease, ttl_ms: 100, grants: grants.clone(), signatures: vec![] });
        let signatures = vec![&[1u8; 64][..], &[2u8; 64][..]];
        round_trip_response(Response::GrantedAll { lease, ttl_ms: 100, grants, signatures });
        // Signatures that do not add up to one per grant are refused, not half read.
        let mut out = Vec::new();
        encode_response(&mut out, 7, &Response::Granted { token: t, lease, ttl_ms: 1, signature: Some(&[3; 10]) });
        let (id, kind, payload, _) = split_frame(&out, 1 << 20).unwrap().unwrap();
        assert!(matches!(decode_response(id, kind, payload), Err(FrameError::Malformed { .. })));
        round_trip_response(Response::Checked { current: false, token: None });
        round_trip_response(Response::Written { token: t, highest_seen: t });
        round_trip_response(Response::Read { highest_seen: Some(t), value: b"v" });
        let details = [Detail::HolderToken(t)];
        round_trip_response(Response::Error { code: "lock_held", message: "held", details: details.to_vec() });
        round_trip_response(Response::Event { index: 41, data: br#"{"type":"granted"}"# });
        round_trip_response(Response::Mark { index: 40 });
        round_trip_response(Response::Lagged { missed: 9 });
    }

    #[test]
    fn a_preamble_names_its_version() {
        assert_eq!(read_preamble(&PREAMBLE), Ok(Version::CURRENT));
        assert_eq!(Version::CURRENT.preamble(), PREAMBLE);
        assert_eq!(read_preamble(b"FENCED\x00\x02"), Ok(Version::V2));
        assert_eq!(read_preamble(b"FENCED\x00\x01"), Err(PreambleError::Version(1)));
        assert_eq!(read_preamble(b"FENCED\x00\x04"), Err(PreambleError::Version(4)));
        assert_eq!(read_preamble(b"GET / HT"), Err(PreambleError::NotFenced));
        for v in [Version::V2, Version::V3] {
            assert_eq!(Version::from_number(v.number()), Some(v));
            assert_eq!(read_preamble(&v.preamble()), Ok(v));
        }
    }

    #[test]
    fn bad_frames_are_named() {
        assert_eq!(split_frame(&[0, 0], 100), Ok(None));
        assert_eq!(split_frame(&[0, 0, 0, 1], 100), Err(FrameError::TooShort { len: 1 }));
        assert!(matches!(split_frame(b"GET / HTTP/1.1", 100), Err(FrameError::TooLarge { .. })));
        let mut out = Vec::new();
        encode_request(&mut out, 1, &Request::CreateLease { ttl_ms: 1 });
        assert_eq!(split_frame(&out[..out.len() - 1], 100), Ok(None));
        assert_eq!(decode_request(1, 77, b""), Err(FrameError::UnknownOp { id: 1, op: 77 }));
        assert!(matches!(decode_request(1, op::KEEPALIVE, b"short"), Err(FrameError::Malformed { .. })));
        assert!(matches!(
            decode_request(1, op::PUT, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 9, b'k']),
            Err(FrameError::Malformed { .. })
        ));
    }
}
