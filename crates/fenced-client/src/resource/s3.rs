//! S3, and the object stores that speak its protocol, as a fenced resource: every write
//! is ONE conditional put on the ETag of the version whose mark was checked, so the
//! check and the change are a single step at the store.
//!
//! **Where the mark lives: in the object's own bytes**, a first line
//! `fenced-token:N\n` before the value (copied into the `x-amz-meta-fenced-token`
//! header too, for people looking with other tools; the gate never trusts the copy).
//! Neither the metadata alone nor a sidecar object works:
//! - the ETag of an S3 object written in one part is the MD5 of its bytes; metadata does
//!   not enter it. With the mark in metadata only, a fenced read (same bytes, a higher
//!   mark) leaves the ETag as it was, and a stale writer's `If-Match` prepared against
//!   the older version still matches: its write goes through. With the mark in the
//!   bytes, one ETag means one mark. (Tested: `s3_metadata_alone_cannot_hold_the_mark`.)
//! - a sidecar object cannot be changed in the same step as the object it guards.
//!
//! The price: a reader that does not go through the gate sees the first line, and must
//! skip it. Objects the gate did not write have no mark line; the gate refuses to
//! guess (an error, never "no mark"), so write them once through the gate first.
//!
//! The first write is a put with `If-None-Match: *`; every later one a put with
//! `If-Match: <ETag>`. A precondition failure means another writer came in between:
//! the gate reads again and decides again (refused if that writer's token is newer),
//! up to [`S3Gate::retries_max`] times.
//!
//! The client is the `object_store` crate's Amazon S3 store (its `aws-base` and `ring`
//! features: SigV4 signing, the conditional puts, no `reqwest` and no `aws-lc-rs`),
//! on this crate's own hyper connection pool through [`HyperConnector`].

use fenced_core::Token;
use object_store::aws::S3ConditionalPut;
pub use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{Attribute, Attributes, GetOptions, ObjectStore, PutMode, PutOptions, UpdateVersion};

use crate::error::Error;
pub use crate::resource::aws_http::HyperConnector;
use crate::resource::{Fenced, FencedResource};

/// The object's first line starts with this, then the mark in decimal.
const MARK_PREFIX: &[u8] = b"fenced-token:";
/// Said after the mark when the key has a mark and no value (a fenced read of a key
/// never written leaves its mark behind all the same).
const NO_VALUE: &[u8] = b" none";
/// The metadata key of the mark's copy (`x-amz-meta-fenced-token`).
const MARK_METADATA: &str = "fenced-token";
/// Conditional puts lost to other writers before the gate gives up on one operation.
pub const RETRIES_MAX_DEFAULT: u32 = 64;

/// A bucket behind the gate: keys are object names.
#[derive(Debug)]
pub struct S3Gate {
    /// The bucket's client.
    store: AmazonS3,
    /// Conditional puts lost to other writers before one operation gives up.
    retries_max: u32,
}

impl S3Gate {
    /// The gate on the bucket `builder` describes (`AmazonS3Builder::from_env()` and
    /// `.with_bucket_name(..)`, `.with_endpoint(..)`, ...): this crate's connection
    /// pool, and conditional puts on the ETag.
    pub fn new(builder: AmazonS3Builder) -> Result<S3Gate, Error> {
        let store =
            builder.with_http_connector(HyperConnector).with_conditional_put(S3ConditionalPut::ETagMatch).build()?;
        Ok(S3Gate { store, retries_max: RETRIES_MAX_DEFAULT })
    }

    /// How many conditional puts lost to other writers one operation tolerates.
    pub fn retries_max(mut self, n: u32) -> S3Gate {
        self.retries_max = n.max(1);
        self
    }

    /// The store underneath, for what the gate does not cover (listing, deleting).
    pub fn store(&self) -> &AmazonS3 {
        &self.store
    }

    /// The value under `key` as it stands, read without a token (nothing moves): for a
    /// report or a check after the work, not for a holder deciding what to write.
    /// `None` when there is no object or it holds no value.
    pub async fn value(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = Path::parse(key).map_err(|e| Error::BadRequest(format!("'{key}' is not an object name: {e}")))?;
        match self.store.get_opts(&path, GetOptions::default()).await {
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
            Ok(got) => Ok(decode(&got.bytes().await?).ok_or_else(|| corrupt(key))?.1),
        }
    }

    /// Reads `key`, checks `token` against its mark, and when accepted puts the new
    /// object (`value`, or the value it holds for a read) under `token`, conditional on
    /// the ETag read. A read whose token equals the mark writes nothing.
    async fn fenced(&self, key: &str, token: Token, value: Option<&[u8]>) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        let path = Path::parse(key).map_err(|e| Error::BadRequest(format!("'{key}' is not an object name: {e}")))?;
        for _ in 0..self.retries_max {
            let (mode, held) = match self.store.get_opts(&path, GetOptions::default()).await {
                Err(object_store::Error::NotFound { .. }) => (PutMode::Create, None),
                Err(e) => return Err(e.into()),
                Ok(got) => {
                    let version = UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
                    let bytes = got.bytes().await?;
                    let (mark, held) = decode(&bytes).ok_or_else(|| corrupt(key))?;
                    if token < mark {
                        return Ok(Fenced::Rejected { token, highest_seen: mark });
                    }
                    if value.is_none() && token == mark {
                        return Ok(Fenced::Accepted(held));
                    }
                    (PutMode::Update(version), held)
                }
            };
            let body = encode(token, value.or(held.as_deref()));
            let mut attributes = Attributes::new();
            attributes.insert(Attribute::Metadata(MARK_METADATA.into()), token.get().to_string().into());
            let opts = PutOptions { mode, attributes, ..PutOptions::default() };
            match self.store.put_opts(&path, body.into(), opts).await {
                Ok(_) => return Ok(Fenced::Accepted(if value.is_some() { None } else { held })),
                // Another writer came in between: read again, decide again.
                Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::unavailable(format!("{key}: {} conditional puts in a row lost to other writers", self.retries_max)))
    }
}

impl FencedResource for S3Gate {
    async fn write(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<()>, Error> {
        Ok(self.fenced(key, token, Some(value)).await?.map(|_| ()))
    }

    async fn read(&self, key: &str, token: Token) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        self.fenced(key, token, None).await
    }
}

/// The object's bytes: the mark line, then the value.
fn encode(token: Token, value: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + value.map_or(0, <[u8]>::len));
    out.extend_from_slice(MARK_PREFIX);
    out.extend_from_slice(token.get().to_string().as_bytes());
    if value.is_none() {
        out.extend_from_slice(NO_VALUE);
    }
    out.push(b'\n');
    out.extend_from_slice(value.unwrap_or_default());
    out
}

/// The mark and the value of an object the gate wrote; `None` when the bytes do not
/// start with an intact mark line.
fn decode(bytes: &[u8]) -> Option<(Token, Option<Vec<u8>>)> {
    let end = bytes.iter().take(64).position(|b| *b == b'\n')?;
    let line = bytes[..end].strip_prefix(MARK_PREFIX)?;
    let (digits, has_value) = match line.strip_suffix(NO_VALUE) {
        Some(d) => (d, false),
        None => (line, true),
    };
    let mark = std::str::from_utf8(digits).ok()?.parse().ok().and_then(Token::new)?;
    Some((mark, has_value.then(|| bytes[end + 1..].to_vec())))
}

fn corrupt(key: &str) -> Error {
    Error::Server {
        status: None,
        code: "corrupt_record".into(),
        message: format!("object '{key}' has no intact fenced-token line: the gate refuses to guess its mark"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Token {
        Token::new(n).expect("non-zero")
    }

    #[test]
    fn the_mark_line_round_trips_and_a_damaged_one_is_no_mark() {
        assert_eq!(decode(&encode(t(7), Some(b"v\nw"))), Some((t(7), Some(b"v\nw".to_vec()))));
        assert_eq!(decode(&encode(t(7), Some(b""))), Some((t(7), Some(Vec::new()))));
        assert_eq!(decode(&encode(t(u64::MAX), None)), Some((t(u64::MAX), None)));
        for bad in
            [&b"plain value"[..], b"fenced-token:\n", b"fenced-token:0\nv", b"fenced-token:x\n", b"fenced-token:7"]
        {
            assert_eq!(decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
