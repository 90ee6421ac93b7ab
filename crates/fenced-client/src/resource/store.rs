//! The server's built-in fenced key-value store (`/v1/store`), the reference resource.

use std::sync::Arc;

use bytes::Bytes;
use fenced_core::Token;
use hyper::Method;

use crate::error::Error;
use crate::http::{segment, Transport};
use crate::resource::{Fenced, FencedResource};
use crate::wire::{self, StoreBody};

/// The header carrying the operation's token.
const FENCING_TOKEN: &str = "fencing-token";
/// The header carrying the key's mark on a read.
const FENCING_HIGHEST_SEEN: &str = "fencing-highest-seen";

/// The built-in store of one lock service. Get it from `Client::store`.
#[derive(Clone, Debug)]
pub struct Store {
    /// The HTTP side, shared with the client.
    transport: Arc<Transport>,
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
    pub(crate) fn new(transport: Arc<Transport>) -> Store {
        Store { transport }
    }

    /// `PUT /v1/store/{key}`: accepted with the new mark, or rejected.
    pub async fn put(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<Token>, Error> {
        let path = format!("/v1/store/{}", segment(key));
        let headers = [(FENCING_TOKEN, token.get().to_string())];
        let r = self
            .transport
            .send(Method::PUT, &path, &headers, Some(Bytes::copy_from_slice(value)), self.transport.request_timeout)
            .await?;
        match r.status {
            200 | 201 | 204 if r.body.is_empty() => Ok(Fenced::Accepted(token)),
            200 | 201 => {
                let b: StoreBody = r.json()?;
                if b.token != token.get() {
                    return Err(wire::bad_answer("the store echoed another token"));
                }
                Ok(Fenced::Accepted(wire::token(b.highest_seen)?))
            }
            _ => stale_or_error(&r, token),
        }
    }

    /// `PUT /v1/store/{key}` without a token, for a key under the server's
    /// `unfenced_prefix` (last writer wins; the server answers 428 `token_required`, here
    /// `Error::Server`, for any other key). Nothing guards such a write: this exists to
    /// show what fencing prevents, as `fenced demo --fencing off` does.
    pub async fn put_unfenced(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        let path = format!("/v1/store/{}", segment(key));
        let r = self
            .transport
            .send(Method::PUT, &path, &[], Some(Bytes::copy_from_slice(value)), self.transport.request_timeout)
            .await?;
        match r.status {
            200 | 201 | 204 => Ok(()),
            _ => Err(r.api_error().into_error()),
        }
    }

    /// `GET /v1/store/{key}`, fenced when `token` is given.
    pub async fn get(&self, key: &str, token: Option<Token>) -> Result<Fenced<StoreRead>, Error> {
        let path = format!("/v1/store/{}", segment(key));
        let headers: Vec<_> = token.map(|t| (FENCING_TOKEN, t.get().to_string())).into_iter().collect();
        let r = self.transport.send(Method::GET, &path, &headers, None, self.transport.request_timeout).await?;
        let highest_seen = r
            .headers
            .get(FENCING_HIGHEST_SEEN)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .and_then(Token::new);
        match r.status {
            200 => Ok(Fenced::Accepted(StoreRead { value: Some(r.body.to_vec()), highest_seen })),
            404 => {
                let api = r.api_error();
                let mark = highest_seen.or_else(|| api.detail_u64("highest_seen").and_then(Token::new));
                Ok(Fenced::Accepted(StoreRead { value: None, highest_seen: mark }))
            }
            _ => match token {
                Some(t) => stale_or_error(&r, t),
                None => Err(r.api_error().into_error()),
            },
        }
    }
}

fn stale_or_error<T>(r: &crate::http::Response, token: Token) -> Result<Fenced<T>, Error> {
    match r.api_error().into_error() {
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
