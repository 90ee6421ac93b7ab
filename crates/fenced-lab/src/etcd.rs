//! etcd through its JSON gateway: the handful of v3 calls the torture and bench recipes
//! make (lease grant, keepalive and revoke; `Lock`, `Unlock`; `Put`, `Range`), as
//! JSON POSTs to `/v3/...` on etcd's client port.
//!
//! Why not etcd's gRPC client: `etcd-client` generates its protobuf code at build time
//! with `protoc`, and building Fenced must need nothing but cargo. etcd serves the same
//! RPCs through grpc-gateway on the same port, so the recipes keep etcd's own lock and
//! lease semantics; only the encoding differs: byte fields travel as base64, and int64
//! fields come back as JSON strings (sent as strings too, which the gateway takes).
//!
//! The gateway forwards to etcd's own gRPC server in the same process, and it cancels
//! the forwarded call when the HTTP request goes away: a `Lock` whose wait is abandoned
//! (the future dropped) takes its queued key back out, as with the gRPC client.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// One etcd endpoint, over pooled HTTP/1 connections; cheap to clone (the clones share
/// the pool).
#[derive(Clone, Debug)]
pub struct Etcd {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    /// `http://host:port`, no trailing slash.
    base: String,
    /// The bound on every call but `Lock`, whose wait the caller bounds.
    op_timeout: Duration,
}

/// A lock etcd granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    /// The lock's key (the lock's name, `/`, the lease in hex): what `Unlock` takes.
    pub key: Vec<u8>,
    /// The store's revision in the response's header, as the gRPC client reports it:
    /// the revision when etcd answered, tied to nothing about this grant. Not a fencing
    /// token; [`Etcd::create_revision`] of `key` is.
    pub revision: i64,
}

impl Etcd {
    /// A client of the etcd at `endpoint` (`http://host:port`). Connects on first use.
    pub fn new(endpoint: &str, connect_timeout: Duration, op_timeout: Duration) -> Result<Etcd> {
        let base = endpoint.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            bail!("etcd endpoint '{endpoint}' must be http://HOST:PORT");
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Etcd { http, base, op_timeout })
    }

    /// Grants a lease of `ttl_s` seconds; its id.
    pub async fn lease_grant(&self, ttl_s: i64) -> Result<i64> {
        #[derive(Deserialize)]
        struct Granted {
            #[serde(rename = "ID", deserialize_with = "int64")]
            id: i64,
        }
        let r: Granted = self.call("/v3/lease/grant", json!({ "TTL": ttl_s.to_string() }), self.op_timeout).await?;
        Ok(r.id)
    }

    /// Renews lease `id` once: the TTL it has again, in seconds; 0 when etcd no longer
    /// knows the lease (expired or revoked).
    ///
    /// The gateway maps the keepalive stream onto one POST: the body's one request gets
    /// one streamed `{"result": ...}` line back, then the stream ends. One POST per
    /// renewal is all a keepalive at a third of the TTL needs.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64> {
        #[derive(Deserialize)]
        struct Streamed {
            result: Option<KeptAlive>,
            error: Option<Value>,
        }
        #[derive(Deserialize)]
        struct KeptAlive {
            // Left out of the JSON when 0, as every zero value is.
            #[serde(rename = "TTL", default, deserialize_with = "int64")]
            ttl: i64,
        }
        let r: Streamed = self.call("/v3/lease/keepalive", json!({ "ID": id.to_string() }), self.op_timeout).await?;
        match (r.result, r.error) {
            (Some(kept), _) => Ok(kept.ttl),
            (None, Some(e)) => bail!("lease keepalive: {e}"),
            (None, None) => bail!("lease keepalive: an empty answer"),
        }
    }

    /// Revokes lease `id`: its keys go with it (a lock it held, a queued lock key).
    pub async fn lease_revoke(&self, id: i64) -> Result<()> {
        self.call::<Value>("/v3/lease/revoke", json!({ "ID": id.to_string() }), self.op_timeout).await?;
        Ok(())
    }

    /// etcd's `Lock` on `name`, owned by lease `lease`: queues behind every older key
    /// under the name and answers when it holds the lock; `None` when `wait` ran out
    /// first (the queued key is then taken back out, see the module's notes).
    pub async fn lock(&self, name: &[u8], lease: i64, wait: Duration) -> Result<Option<Locked>> {
        #[derive(Deserialize)]
        struct Granted {
            header: Header,
            #[serde(deserialize_with = "base64_bytes")]
            key: Vec<u8>,
        }
        let body = json!({ "name": BASE64.encode(name), "lease": lease.to_string() });
        let r: Option<Granted> = self.call_within("/v3/lock/lock", body, wait).await?;
        Ok(r.map(|r| Locked { key: r.key, revision: r.header.revision }))
    }

    /// etcd's `Unlock`: deletes the lock's key (whoever holds it now).
    pub async fn unlock(&self, key: &[u8]) -> Result<()> {
        self.call::<Value>("/v3/lock/unlock", json!({ "key": BASE64.encode(key) }), self.op_timeout).await?;
        Ok(())
    }

    /// The `create_revision` of `key`: the revision of the transaction that created it;
    /// `None` when the key does not exist. For a lock key this is the grant's fencing
    /// token, as etcd advises: waiters queue in `create_revision` order, so each holder
    /// of one lock has a higher one than every holder before it, across restarts too.
    pub async fn create_revision(&self, key: &[u8]) -> Result<Option<i64>> {
        #[derive(Deserialize)]
        struct Kv {
            #[serde(deserialize_with = "int64")]
            create_revision: i64,
        }
        let body = json!({ "key": BASE64.encode(key), "keys_only": true });
        let r: Range<Kv> = self.call("/v3/kv/range", body, self.op_timeout).await?;
        Ok(r.kvs.into_iter().next().map(|kv| kv.create_revision))
    }

    /// A plain `Put`: no lease, no revision check.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let body = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value) });
        self.call::<Value>("/v3/kv/put", body, self.op_timeout).await?;
        Ok(())
    }

    /// A `Range` of one key: its value, `None` when it does not exist.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        #[derive(Deserialize)]
        struct Kv {
            // Left out when empty.
            #[serde(default, deserialize_with = "base64_bytes")]
            value: Vec<u8>,
        }
        let r: Range<Kv> = self.call("/v3/kv/range", json!({ "key": BASE64.encode(key) }), self.op_timeout).await?;
        Ok(r.kvs.into_iter().next().map(|kv| kv.value))
    }

    /// POSTs `body` to `path` and parses the answer, within `bound`.
    async fn call<T: DeserializeOwned>(&self, path: &str, body: Value, bound: Duration) -> Result<T> {
        self.call_within(path, body, bound)
            .await?
            .ok_or_else(|| anyhow!("{}{path}: no answer within {bound:?}", self.base))
    }

    /// POSTs `body` to `path` and parses the answer; `None` when none came within
    /// `bound` (the request is then dropped, which cancels it in etcd). A non-2xx
    /// answer is an error carrying etcd's message (`etcdserver: requested lease not
    /// found`).
    async fn call_within<T: DeserializeOwned>(&self, path: &str, body: Value, bound: Duration) -> Result<Option<T>> {
        let uri = format!("{}{path}", self.base);
        let req = Request::builder()
            .method(Method::POST)
            .uri(&uri)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .with_context(|| format!("build a request for {uri}"))?;
        let exchange = async {
            let resp = self.http.request(req).await.with_context(|| format!("POST {uri}"))?;
            let status = resp.status();
            let body = resp.into_body().collect().await.with_context(|| format!("read the answer of {uri}"))?;
            anyhow::Ok((status, body.to_bytes()))
        };
        let Ok(answer) = timeout(bound, exchange).await else { return Ok(None) };
        let (status, body) = answer?;
        if !status.is_success() {
            #[derive(Deserialize)]
            struct Failed {
                message: String,
            }
            let why = serde_json::from_slice::<Failed>(&body)
                .map(|f| f.message)
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).trim().to_owned());
            bail!("{uri}: {status}: {why}");
        }
        serde_json::from_slice(&body)
            .map(Some)
            .with_context(|| format!("{uri}: unexpected answer {:?}", String::from_utf8_lossy(&body)))
    }
}

/// The task keeping an etcd lease alive; stopped when dropped.
pub struct Keeper(JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The answer to a `Range`: the keys that matched, each as the caller asks for it.
#[derive(Deserialize)]
struct Range<Kv> {
    // Left out when nothing matched.
    #[serde(default = "Vec::new")]
    kvs: Vec<Kv>,
}

/// Keeps lease `lease` alive every third of `ttl` until dropped, or until a renewal
/// fails or finds the lease gone (or until the process is frozen, which is the point).
pub fn spawn_keepalive(etcd: Etcd, lease: i64, ttl: Duration) -> Keeper {
    Keeper(tokio::spawn(async move {
        loop {
            tokio::time::sleep(ttl / 3).await;
            match etcd.lease_keep_alive(lease).await {
                Ok(ttl_s) if ttl_s > 0 => {}
                _ => return,
            }
        }
    }))
}

/// A response header: the one field the recipes read.
#[derive(Deserialize)]
struct Header {
    #[serde(default, deserialize_with = "int64")]
    revision: i64,
}

/// An int64 field: a JSON string from the gateway (numbers are taken too).
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int64 {
        Text(String),
        Number(i64),
    }
    match Int64::deserialize(d)? {
        Int64::Text(s) => s.parse().map_err(serde::de::Error::custom),
        Int64::Number(n) => Ok(n),
    }
}

/// A bytes field: base64 text.
fn base64_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    BASE64.decode(text).map_err(serde::de::Error::custom)
}
