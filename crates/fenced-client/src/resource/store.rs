//! The server's built-in fenced key-value store (`/v1/store`), the reference resource.

use bytes::Bytes;
use fenced_core::Token;
use hyper::Method;

use crate::conn::Conn;
use crate::error::{ApiError, Error};
use crate::guard::SignedToken;
use crate::http::segment;
use crate::resource::{Fenced, FencedResource};

/// The built-in store of one lock service. Get it from `Client::store`.
#[derive(Clone, Debug)]
pub struct Store {
    /// The lock service, shared with the client.
    conn: Conn,
}

/// A value read from the store.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StoreRead {
    /// The value, `None` when the key holds none.
    pub value: Option<Vec<u8>>,
    /// The key's mark after the read.
    pub highest_seen: Option<Token>,
}

impl Store {
    pub(crate) fn new(conn: Conn) -> Store {
        Store { conn }
    }

    /// `PUT /v1/store/{key}`: accepted with the new mark, or rejected.
    pub async fn put(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<Token>, Error> {
        self.put_with(key, token, value, None).await
    }

    /// `PUT /v1/store/{key}` with the grant's signature, for a key under the server's
    /// `signed_key_prefix` (`Error::BadSignature` when it does not verify for the
    /// key's lock). HTTP endpoints only.
    pub async fn put_signed(&self, key: &str, token: &SignedToken, value: &[u8]) -> Result<Fenced<Token>, Error> {
        self.put_with(key, token.token, value, Some(&token.signature)).await
    }

    async fn put_with(&self, key: &str, token: Token, value: &[u8], sig: Option<&str>) -> Result<Fenced<Token>, Error> {
        match self.conn.put(key, token, value, sig).await? {
            Ok(mark) => Ok(Fenced::Accepted(mark)),
            Err(e) => stale_or_error(e, token),
        }
    }

    /// `PUT /v1/store/{key}` without a token, for a key under the server's
    /// `unfenced_prefix` (last writer wins; the server answers 428 `token_required`, here
    /// `Error::Server`, for any other key). Nothing guards such a write: this exists to
    /// show what fencing prevents, as `fenced demo --fencing off` does. HTTP endpoints
    /// only: the wire protocol has no unfenced write.
    pub async fn put_unfenced(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        let t = self.conn.http("an unfenced write")?;
        let path = format!("/v1/store/{}", segment(key));
        let r = t.send(Method::PUT, &path, &[], Some(Bytes::copy_from_slice(value)), t.request_timeout).await?;
        match r.status {
            200 | 201 | 204 => Ok(()),
            _ => Err(r.api_error().into_error()),
        }
    }

    /// `GET /v1/store/{key}`, fenced when `token` is given.
    pub async fn get(&self, key: &str, token: Option<Token>) -> Result<Fenced<StoreRead>, Error> {
        self.get_with(key, token, None).await
    }

    /// A fenced read with the grant's signature (see [`put_signed`](Self::put_signed)).
    pub async fn get_signed(&self, key: &str, token: &SignedToken) -> Result<Fenced<StoreRead>, Error> {
        self.get_with(key, Some(token.token), Some(&token.signature)).await
    }

    async fn get_with(&self, key: &str, token: Option<Token>, sig: Option<&str>) -> Result<Fenced<StoreRead>, Error> {
        match (self.conn.get(key, token, sig).await?, token) {
            (Ok(read), _) => Ok(Fenced::Accepted(read)),
            (Err(e), Some(t)) => stale_or_error(e, t),
            (Err(e), None) => Err(e.into_error()),
        }
    }
}

fn stale_or_error<T>(e: ApiError, token: Token) -> Result<Fenced<T>, Error> {
    match e.into_error() {
        Error::StaleToken { highest_seen, .. } => Ok(Fenced::Rejected { token, highest_seen }),
        e => Err(e),
    }
}

impl FencedResource for Store {
    async fn write(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<()>, Error> {
        Ok(self.put(key, token, value).await?.map(|_| ()))
    }

    async fn read(&self, key: &str, token: Token) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        Ok(self.get(key, Some(token)).await?.map(|r| r.value))
    }
}
