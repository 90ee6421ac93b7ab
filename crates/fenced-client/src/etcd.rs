//! An etcd lock whose fencing token is the lock key's `create_revision`, with the same
//! client-side deadline and lost-lock signal as [`crate::LockGuard`], for users whose
//! lock service is etcd (`fenced exec --lock-service etcd://HOST:PORT`).
//!
//! etcd's recipe, as its own `concurrency.Session` and `Mutex` do it, through etcd's
//! JSON gateway on its client port (no gRPC stack): a lease kept alive every third of
//! its TTL from its grant (while `Lock` waits in line too: a queued key whose lease ran
//! out is deleted, and etcd 3.4 still answers that `Lock` with success), `Lock` on it,
//! then a `Range` of the key `Lock` answered: its `create_revision` is the token (waiters
//! queue in that order, so each holder of one lock has a higher one than every holder
//! before it), and a key that is gone was never held. The `Lock` answer's header
//! revision is not a token: it is the store's revision when etcd answered.
//!
//! The deadline is the guard's: the send time of the last keepalive etcd answered with
//! a live lease, plus the TTL, minus a tenth of it.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use crate::error::{Error, LostReason};
use crate::foreign::{Lease, Renewal};
use crate::Token;

/// One etcd endpoint (`http://host:port`), over pooled HTTP/1 connections.
#[derive(Clone, Debug)]
pub struct Etcd {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    base: String,
    request_timeout: Duration,
}

/// A held etcd lock: its token, its deadline, its lost-lock signal.
#[derive(Debug)]
pub struct EtcdGuard {
    etcd: Etcd,
    name: String,
    /// The lock's key: the name, `/`, the lease in hex.
    key: Vec<u8>,
    lease: i64,
    token: Token,
    shared: Arc<Lease>,
    keeper: JoinHandle<()>,
}

impl Etcd {
    /// A client of the etcd at `endpoint` (`http://host:port`; `etcd://host:port` is
    /// taken as the same).
    pub fn new(endpoint: &str, request_timeout: Duration) -> Result<Etcd, Error> {
        let rest = endpoint.strip_prefix("etcd://").or_else(|| endpoint.strip_prefix("http://")).unwrap_or("");
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') {
            return Err(Error::BadRequest(format!("etcd endpoint '{endpoint}' must be etcd://HOST:PORT")));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Etcd { http, base: format!("http://{rest}"), request_timeout })
    }

    /// `http://host:port`.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// Takes lock `name` under a new lease of `ttl` (whole seconds, at least 1),
    /// waiting in etcd's line at most `wait`. `Error::LockHeld` when not granted in
    /// time.
    pub async fn lock(&self, name: &str, ttl: Duration, wait: Duration) -> Result<EtcdGuard, Error> {
        let ttl = Duration::from_secs(ttl.as_secs().max(1));
        let sent = Instant::now();
        let granted = self.call("/v3/lease/grant", json!({ "TTL": ttl.as_secs().to_string() }), None).await?;
        let lease = int64(&granted["ID"]).ok_or_else(|| Error::unavailable("etcd granted a lease without an ID"))?;
        let shared = Arc::new(Lease::new(sent, ttl));
        let keeper = tokio::spawn(keep_alive(self.clone(), lease, shared.clone()));
        let revoke = |e: Error| async {
            keeper.abort();
            let _ = self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() }), None).await;
            e
        };
        let body = json!({ "name": BASE64.encode(name), "lease": lease.to_string() });
        let key = match self.call("/v3/lock/lock", body, Some(wait)).await {
            Err(Error::LockHeld { .. }) => return Err(revoke(Error::LockHeld { name: name.to_owned() }).await),
            Ok(answer) => match answer["key"].as_str().and_then(|k| BASE64.decode(k).ok()) {
                Some(key) => key,
                None => return Err(revoke(Error::unavailable("etcd's Lock answered without a key")).await),
            },
            Err(e) => return Err(revoke(e).await),
        };
        let range = self.call("/v3/kv/range", json!({ "key": BASE64.encode(&key), "keys_only": true }), None).await;
        let revision = match range {
            Ok(r) => r["kvs"].get(0).and_then(|kv| int64(&kv["create_revision"])),
            Err(e) => return Err(revoke(e).await),
        };
        let Some(token) = revision.and_then(|r| u64::try_from(r).ok()).and_then(Token::new) else {
            let gone = Error::LockHeld { name: format!("{name} (granted for a key that is gone: its lease expired)") };
            return Err(revoke(gone).await);
        };
        Ok(EtcdGuard { etcd: self.clone(), name: name.to_owned(), key, lease, token, shared, keeper })
    }

    /// POSTs `body` to `path`; within `wait` plus the request time-out when given (a
    /// `Lock` waits in line), else the request time-out. A `Lock` that did not answer
    /// in time is `LockHeld` (dropping the request takes the queued key back out).
    async fn call(&self, path: &str, body: Value, wait: Option<Duration>) -> Result<Value, Error> {
        let uri = format!("{}{path}", self.base);
        let req = Request::builder()
            .method(Method::POST)
            .uri(&uri)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| Error::BadRequest(format!("a request to {uri}: {e}")))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| Error::unavailable(format!("POST {uri}: {e}")))?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map_err(|e| Error::unavailable(format!("{uri}: {e}")))?;
            Ok::<_, Error>((status, bytes.to_bytes()))
        };
        let bound = wait.map_or(self.request_timeout, |w| w + self.request_timeout);
        let Ok(answer) = timeout(bound, exchange).await else {
            return Err(match wait {
                Some(_) => Error::LockHeld { name: "(etcd lock)".into() },
                None => Error::unavailable(format!("{uri}: no answer within {bound:?}")),
            });
        };
        let (status, bytes) = answer?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let message = value["message"].as_str().unwrap_or_default().to_owned();
        Err(if message.contains("lease not found") {
            Error::NotFound(message)
        } else {
            Error::Server { status: Some(status.as_u16()), code: "etcd_error".into(), message }
        })
    }
}

impl EtcdGuard {
    /// The fencing token: the lock key's `create_revision`.
    pub fn token(&self) -> Token {
        self.token
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The etcd lease, in hex as etcd's tools print it.
    pub fn lease_hex(&self) -> String {
        format!("{:x}", self.lease)
    }

    /// The client-side deadline: the last answered keepalive's send time + TTL − a tenth.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// Why the lock was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// Resolves when the lock is lost.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.shared.lost()
    }

    /// Deletes the lock's key and revokes its lease; `Error::Lost` when the lock had been
    /// lost before.
    pub async fn release(self) -> Result<(), Error> {
        self.keeper.abort();
        let lost = self.lost_reason();
        let unlock = self.etcd.call("/v3/lock/unlock", json!({ "key": BASE64.encode(&self.key) }), None).await;
        let revoke = self.etcd.call("/v3/lease/revoke", json!({ "ID": self.lease.to_string() }), None).await;
        if let Some(reason) = lost {
            return Err(Error::Lost(reason));
        }
        unlock?;
        match revoke {
            Err(Error::NotFound(_)) => Err(Error::Lost(LostReason::LeaseNotFound)),
            other => other.map(|_| ()),
        }
    }
}

impl Drop for EtcdGuard {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Renews `lease` every third of its TTL (etcd's keepalive answers the TTL left, 0 for
/// a lease it no longer knows).
async fn keep_alive(etcd: Etcd, lease: i64, shared: Arc<Lease>) {
    shared
        .keep(|| async {
            match etcd.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }), None).await {
                Ok(answer) if int64(&answer["result"]["TTL"]).unwrap_or(0) > 0 => Renewal::Alive,
                Ok(_) | Err(Error::NotFound(_)) => Renewal::Gone,
                Err(_) => Renewal::Failed,
            }
        })
        .await
}

/// An int64 field of the gateway's JSON: a string (numbers are taken too).
fn int64(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64())
}
