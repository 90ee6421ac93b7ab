//! The payload of an error answer ([`op::ERROR`](crate::op::ERROR)): in version 3 a
//! code, a message and typed fields; in version 2 ([`v2`]) a code and the HTTP API's
//! JSON error body. The code comes first in both, so [`error_code`] reads it whatever
//! the version.
//!
//! ```text
//! code_len u8, code (snake_case ASCII)
//! message_len u16, message (UTF-8, for a person)
//! count u8, then count fields, each:
//!   tag u8; below 128 a u64 value, from 128 on len u16 and that many bytes of UTF-8
//! ```
//!
//! Nothing may follow the last field. A tag this release does not know is skipped
//! (its size follows from the tag), so fields may be added without a new version.

use std::borrow::Cow;

use crate::detail::{Detail, Value, TEXT_TAGS_FROM};
use crate::{FrameError, Reader, Response};

/// Appends an error payload: `code` (cut at 255 bytes), `message` (cut at 65,535
/// bytes, on a character boundary) and at most 255 of `details`.
pub(crate) fn write(out: &mut Vec<u8>, code: &str, message: &str, details: &[Detail<'_>]) {
    let code = &code.as_bytes()[..code.len().min(u8::MAX as usize)];
    out.push(code.len() as u8);
    out.extend_from_slice(code);
    put_text(out, message);
    let details = &details[..details.len().min(u8::MAX as usize)];
    out.push(details.len() as u8);
    for d in details {
        out.push(d.tag());
        match d.value() {
            Value::Number(n) => out.extend_from_slice(&n.to_be_bytes()),
            Value::Text(s) => put_text(out, &s),
        }
    }
}

/// Reads an error payload; `bad` names what does not fit.
pub(crate) fn read<'a>(
    r: &mut Reader<'a>,
    bad: impl Fn(&'static str) -> FrameError,
) -> Result<Response<'a>, FrameError> {
    let code = read_code(r).ok_or(bad("code_len u8, then the code (UTF-8)"))?;
    let message = r.short_text().ok_or(bad("message_len u16, then the message (UTF-8)"))?;
    let count = r.u8().ok_or(bad("count u8, then the fields"))?;
    let mut details = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let tag = r.u8().ok_or(bad("a field's tag u8"))?;
        let value = if tag < TEXT_TAGS_FROM {
            Value::Number(r.u64().ok_or(bad("a number field's u64"))?)
        } else {
            Value::Text(Cow::Borrowed(r.short_text().ok_or(bad("a text field (len u16, UTF-8)"))?))
        };
        match Detail::from_tag(tag, value) {
            Some(Some(d)) => details.push(d),
            Some(None) => return Err(bad("a token field is 0")),
            None => {} // a later release's field
        }
    }
    if !r.0.is_empty() {
        return Err(bad("bytes after the last field"));
    }
    Ok(Response::Error { code, message, details })
}

fn read_code<'a>(r: &mut Reader<'a>) -> Option<&'a str> {
    let len = r.u8()?;
    std::str::from_utf8(r.take(len as usize)?).ok()
}

/// The code of an error answer's payload, in any version of the protocol: for a peer
/// that must say what it was refused even when the rest does not read (an older
/// server's `bad_preamble`, say).
pub fn error_code(payload: &[u8]) -> Option<&str> {
    read_code(&mut Reader(payload))
}

/// `len u16` and the text, cut on a character boundary at 65,535 bytes (the reader
/// refuses a cut character).
fn put_text(out: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(u16::MAX as usize);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

/// Version 2's error answer, which a server still writes to a peer that opened with
/// version 2's preamble: `code_len u8`, the code, then the HTTP API's JSON error body
/// (the bytes are the caller's: this crate knows no JSON).
pub mod v2 {
    use super::read_code;
    use crate::frame::{begin, finish};
    use crate::{op, Reader};

    /// Appends a version-2 error frame to `out`.
    pub fn encode_error(out: &mut Vec<u8>, id: u32, code: &str, json_body: &[u8]) {
        let at = begin(out, id, op::ERROR);
        let code = &code.as_bytes()[..code.len().min(u8::MAX as usize)];
        out.push(code.len() as u8);
        out.extend_from_slice(code);
        out.extend_from_slice(json_body);
        finish(out, at);
    }

    /// A version-2 error payload's code and JSON body; `None` when the code is cut
    /// short or not UTF-8.
    pub fn decode_error(payload: &[u8]) -> Option<(&str, &[u8])> {
        let mut r = Reader(payload);
        let code = read_code(&mut r)?;
        Some((code, r.rest()))
    }
}

#[cfg(test)]
mod tests;
