//! Fenced resources: stores that keep the highest token they have seen and refuse
//! operations that carry a lower one.
//!
//! The rule is the design's fence gate: an operation carrying token `t` is accepted iff
//! `t >= highest_seen`, and then `highest_seen := t`, in the same transaction as the
//! data it guards. Reads that carry a token advance the mark too (a fenced read). A
//! refusal is a value ([`Fenced::Rejected`]), not an error.

use std::future::Future;

use fenced_core::Token;

use crate::error::Error;
use crate::guard::SignedToken;
use crate::signing::GrantKeys;

#[cfg(any(feature = "s3", feature = "dynamodb"))]
mod aws_http;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod store;

pub use store::{Store, StoreRead};

/// The answer of a fenced operation.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Fenced<T> {
    /// Done; the resource's mark is now the operation's token.
    Accepted(T),
    /// Refused and nothing changed: the resource had already seen a newer token.
    Rejected {
        /// The token the operation carried.
        token: Token,
        /// The resource's mark, higher than `token`.
        highest_seen: Token,
    },
}

impl<T> Fenced<T> {
    pub fn is_accepted(&self) -> bool {
        matches!(self, Fenced::Accepted(_))
    }

    /// `Error::StaleToken` for a refusal, for callers that treat it as a failure.
    pub fn into_result(self) -> Result<T, Error> {
        match self {
            Fenced::Accepted(v) => Ok(v),
            Fenced::Rejected { token, highest_seen } => Err(Error::StaleToken { token, highest_seen }),
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Accepted(v) => Fenced::Accepted(f(v)),
            Fenced::Rejected { token, highest_seen } => Fenced::Rejected { token, highest_seen },
        }
    }
}

/// A key-value resource behind a fence gate. Every operation carries the token of the
/// lock its caller holds.
pub trait FencedResource {
    /// Writes `value` under `key` iff `token` is at least the key's mark, and advances
    /// the mark to `token` in the same transaction.
    fn write(&self, key: &str, token: Token, value: &[u8]) -> impl Future<Output = Result<Fenced<()>, Error>> + Send;

    /// Reads `key` iff `token` is at least the key's mark, and advances the mark, so an
    /// older holder is shut out from this moment. `None` when the key holds no value.
    fn read(&self, key: &str, token: Token) -> impl Future<Output = Result<Fenced<Option<Vec<u8>>>, Error>> + Send;
}

/// Builds a rejection from the mark read back after a conditional statement changed
/// nothing. The mark only moves up, so a mark read after a refusal is above the refused
/// token; `None` when it is not (no row: nothing to refuse).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn rejected<T>(token: Token, mark: Option<i64>) -> Option<Fenced<T>> {
    let highest_seen = Token::new(u64::try_from(mark?).ok()?).filter(|m| *m > token)?;
    Some(Fenced::Rejected { token, highest_seen })
}

/// A token as a signed 64-bit integer, the type SQL databases store.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn sql_token(token: Token) -> Result<i64, Error> {
    i64::try_from(token.get()).map_err(|_| Error::BadRequest(format!("token {token} does not fit a SQL bigint")))
}

/// Checks a table or column name before it is spliced into SQL: identifiers cannot be
/// bound as parameters, so only plain ones are allowed.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn ident(name: &str) -> Result<&str, Error> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(name)
    } else {
        Err(Error::BadRequest(format!("'{name}' is not a plain SQL identifier (letters, digits, _)")))
    }
}

/// A gate that also asks for the service's signature: given the verifying keys
/// ([`GrantKeys`]) and the rule naming the lock that guards each key, it refuses a
/// token without a valid signature for that lock (`Error::BadSignature`, and nothing
/// is sent to the resource) before the inner gate applies its mark. So a forged number
/// (a client that sends 2^63−1 to shut a row for good) and a real token of another
/// lock (higher, since every lock draws from one counter) are both refused.
pub struct Verified<R> {
    inner: R,
    keys: GrantKeys,
    lock_of: Box<dyn Fn(&str) -> String + Send + Sync>,
}

impl<R: FencedResource + Sync> Verified<R> {
    /// `inner` behind the signature check; `lock_of` names the lock that guards a key.
    pub fn new(inner: R, keys: GrantKeys, lock_of: impl Fn(&str) -> String + Send + Sync + 'static) -> Verified<R> {
        Verified { inner, keys, lock_of: Box::new(lock_of) }
    }

    /// Every key guarded by the lock of the same name.
    pub fn same_name(inner: R, keys: GrantKeys) -> Verified<R> {
        Verified::new(inner, keys, str::to_string)
    }

    /// Every key guarded by one lock.
    pub fn one_lock(inner: R, keys: GrantKeys, lock: &str) -> Verified<R> {
        let lock = lock.to_string();
        Verified::new(inner, keys, move |_| lock.clone())
    }

    /// The inner gate's write, if `token` is signed for the key's lock.
    pub async fn write(&self, key: &str, token: &SignedToken, value: &[u8]) -> Result<Fenced<()>, Error> {
        self.keys.check(&(self.lock_of)(key), token.token, Some(&token.signature))?;
        self.inner.write(key, token.token, value).await
    }

    /// The inner gate's fenced read (it moves the mark too), if `token` is signed for
    /// the key's lock.
    pub async fn read(&self, key: &str, token: &SignedToken) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        self.keys.check(&(self.lock_of)(key), token.token, Some(&token.signature))?;
        self.inner.read(key, token.token).await
    }

    /// The gate without the check.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}
