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
mod frame;
pub mod op;
mod request;
mod response;

pub use detail::Detail;
pub use error_frame::{error_code, v2};
pub(crate) use frame::Reader;
pub use frame::{split_frame, FrameError, Split};
pub use request::{decode_request, encode_request, Request};
pub use response::{decode_response, encode_response, Response, SIGNATURE_BYTES};

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

#[cfg(test)]
mod tests;
