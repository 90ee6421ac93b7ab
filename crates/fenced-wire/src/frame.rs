//! A frame on the stream: its header, the split of a buffer into frames, and the reading
//! and writing of the fixed fields of a payload.

use crate::HEADER_BYTES;

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
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes(b.try_into().expect("2")))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_be_bytes(b.try_into().expect("4")))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_be_bytes(b.try_into().expect("8")))
    }
    pub(crate) fn u128(&mut self) -> Option<u128> {
        self.take(16).map(|b| u128::from_be_bytes(b.try_into().expect("16")))
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    pub(crate) fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.rest()).ok()
    }
    /// `len u16` and that many bytes of UTF-8.
    pub(crate) fn short_text(&mut self) -> Option<&'a str> {
        let len = self.u16()?;
        std::str::from_utf8(self.take(len as usize)?).ok()
    }
}

/// `len u16` and the bytes (cut at u16::MAX: longer cannot be valid, and the server
/// refuses what it gets).
pub(crate) fn put_short(out: &mut Vec<u8>, text: &str) {
    let b = &text.as_bytes()[..text.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_be_bytes());
    out.extend_from_slice(b);
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
