//! etcd through its JSON gateway: the workspace's one etcd client. The handful of v3
//! calls etcd's lock recipes make (lease grant, keepalive and revoke; `Lock`, `Unlock`;
//! `Put`, `Range`), as JSON POSTs to `/v3/...` on etcd's client port, and the lock
//! guard built on them ([`guard`]: `fenced exec --lock-service etcd://`). The
//! laboratory's torture and bench recipes call the same methods.
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

pub mod guard;

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
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::error::Error;
pub use guard::EtcdGuard;

/// One etcd endpoint, over pooled HTTP/1 connections; cheap to clone (the clones share
/// the pool).
#[derive(Clone, Debug)]
pub struct Etcd {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    /// `http://host:port`, no trailing slash.
    base: String,
    /// The bound on every call but `Lock`, whose wait the caller bounds.
    request_timeout: Duration,
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

/// What a member says of itself (`Status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// This member's id.
    pub member_id: u64,
    /// The id of the member it takes for the leader; 0 for none.
    pub leader: u64,
    pub raft_term: u64,
}

impl Etcd {
    /// A client of the etcd at `endpoint` (`http://host:port`; `etcd://host:port` is
    /// taken as the same). Connects on first use, each connection within
    /// `connect_timeout`; every call but `Lock` is bounded by `request_timeout`.
    pub fn new(endpoint: &str, connect_timeout: Duration, request_timeout: Duration) -> Result<Etcd, Error> {
        let rest = endpoint.strip_prefix("etcd://").or_else(|| endpoint.strip_prefix("http://")).unwrap_or("");
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') {
            return Err(Error::BadRequest(format!("etcd endpoint '{endpoint}' must be etcd://HOST:PORT")));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Etcd { http, base: format!("http://{rest}"), request_timeout })
    }

    /// `http://host:port`.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// Grants a lease of `ttl_s` seconds; its id.
    pub async fn lease_grant(&self, ttl_s: i64) -> Result<i64, Error> {
        #[derive(Deserialize)]
        struct Granted {
            #[serde(rename = "ID", deserialize_with = "int")]
            id: i64,
        }
        let r: Granted = self.call("/v3/lease/grant", json!({ "TTL": ttl_s.to_string() })).await?;
        Ok(r.id)
    }

    /// Renews lease `id` once: the TTL it has again, in seconds; 0 when etcd no longer
    /// knows the lease (expired or revoked).
    ///
    /// The gateway maps the keepalive stream onto one POST: the body's one request gets
    /// one streamed `{"result": ...}` line back, then the stream ends. One POST per
    /// renewal is all a keepalive at a third of the TTL needs.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, Error> {
        #[derive(Deserialize)]
        struct Streamed {
            result: Option<KeptAlive>,
            error: Option<Value>,
        }
        #[derive(Deserialize)]
        struct KeptAlive {
            // Left out of the JSON when 0, as every zero value is.
            #[serde(rename = "TTL", default, deserialize_with = "int")]
            ttl: i64,
        }
        let r: Streamed = self.call("/v3/lease/keepalive", json!({ "ID": id.to_string() })).await?;
        match (r.result, r.error) {
            (Some(kept), _) => Ok(kept.ttl),
            (None, Some(e)) => Err(refusal(None, e["message"].as_str().unwrap_or_default().to_owned())),
            (None, None) => Err(Error::unavailable("etcd's lease keepalive: an empty answer")),
        }
    }

    /// Revokes lease `id`: its keys go with it (a lock it held, a queued lock key).
    /// `Error::NotFound` when etcd no longer knows the lease.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        self.call::<Value>("/v3/lease/revoke", json!({ "ID": id.to_string() })).await?;
        Ok(())
    }

    /// etcd's `Lock` on `name`, owned by lease `lease`: queues behind every older key
    /// under the name and answers when it holds the lock; `None` when `wait` ran out
    /// first (the queued key is then taken back out, see the module's notes).
    pub async fn lock(&self, name: &[u8], lease: i64, wait: Duration) -> Result<Option<Locked>, Error> {
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
    pub async fn unlock(&self, key: &[u8]) -> Result<(), Error> {
        self.call::<Value>("/v3/lock/unlock", json!({ "key": BASE64.encode(key) })).await?;
        Ok(())
    }

    /// The `create_revision` of `key`: the revision of the transaction that created it;
    /// `None` when the key does not exist. For a lock key this is the grant's fencing
    /// token, as etcd advises: waiters queue in `create_revision` order, so each holder
    /// of one lock has a higher one than every holder before it, across restarts too.
    pub async fn create_revision(&self, key: &[u8]) -> Result<Option<i64>, Error> {
        #[derive(Deserialize)]
        struct Kv {
            #[serde(deserialize_with = "int")]
            create_revision: i64,
        }
        let body = json!({ "key": BASE64.encode(key), "keys_only": true });
        let r: Range<Kv> = self.call("/v3/kv/range", body).await?;
        Ok(r.kvs.into_iter().next().map(|kv| kv.create_revision))
    }

    /// A plain `Put`: no lease, no revision check.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let body = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value) });
        self.call::<Value>("/v3/kv/put", body).await?;
        Ok(())
    }

    /// A `Range` of one key: its value, `None` when it does not exist.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        #[derive(Deserialize)]
        struct Kv {
            // Left out when empty.
            #[serde(default, deserialize_with = "base64_bytes")]
            value: Vec<u8>,
        }
        let r: Range<Kv> = self.call("/v3/kv/range", json!({ "key": BASE64.encode(key) })).await?;
        Ok(r.kvs.into_iter().next().map(|kv| kv.value))
    }

    /// The member's `Status`: who it is, who it says leads, in which term.
    pub async fn status(&self) -> Result<Status, Error> {
        #[derive(Deserialize)]
        struct Answered {
            header: MemberHeader,
            #[serde(default, deserialize_with = "int")]
            leader: u64,
            #[serde(rename = "raftTerm", default, deserialize_with = "int")]
            raft_term: u64,
        }
        #[derive(Deserialize)]
        struct MemberHeader {
            #[serde(default, deserialize_with = "int")]
            member_id: u64,
        }
        let r: Answered = self.call("/v3/maintenance/status", json!({})).await?;
        Ok(Status { member_id: r.header.member_id, leader: r.leader, raft_term: r.raft_term })
    }

    /// POSTs `body` to `path` and parses the answer, within the request time-out.
    async fn call<T: DeserializeOwned>(&self, path: &str, body: Value) -> Result<T, Error> {
        let bound = self.request_timeout;
        self.call_within(path, body, bound)
            .await?
            .ok_or_else(|| Error::unavailable(format!("{}{path}: no answer within {bound:?}", self.base)))
    }

    /// POSTs `body` to `path` and parses the answer; `None` when none came within
    /// `bound` (the request is then dropped, which cancels it in etcd). A non-2xx
    /// answer is an error carrying etcd's message (`etcdserver: requested lease not
    /// found` is `Error::NotFound`).
    async fn call_within<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Value,
        bound: Duration,
    ) -> Result<Option<T>, Error> {
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
            let body = resp.into_body().collect().await.map_err(|e| Error::unavailable(format!("{uri}: {e}")))?;
            Ok::<_, Error>((status, body.to_bytes()))
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
            return Err(refusal(Some(status.as_u16()), why));
        }
        serde_json::from_slice(&body).map(Some).map_err(|e| {
            Error::unavailable(format!("{uri}: unexpected answer {:?}: {e}", String::from_utf8_lossy(&body)))
        })
    }
}

/// etcd's refusal: `NotFound` for a lease it no longer knows, else the message as a
/// server error.
fn refusal(status: Option<u16>, message: String) -> Error {
    if message.contains("lease not found") {
        Error::NotFound(message)
    } else {
        Error::Server { status, code: "etcd_error".into(), message }
    }
}

/// The task keeping an etcd lease alive; stopped when dropped.
pub struct Keeper(JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps lease `lease` alive every third of `ttl` until dropped, or until a renewal
/// fails or finds the lease gone (or until the process is frozen). The laboratory's
/// recipes use it; the guard keeps its lease with a deadline instead ([`guard`]).
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

/// The answer to a `Range`: the keys that matched, each as the caller asks for it.
#[derive(Deserialize)]
struct Range<Kv> {
    // Left out when nothing matched.
    #[serde(default = "Vec::new")]
    kvs: Vec<Kv>,
}

/// A response header: the one field the recipes read.
#[derive(Deserialize)]
struct Header {
    #[serde(default, deserialize_with = "int")]
    revision: i64,
}

/// An int64 or uint64 field: a JSON string from the gateway (numbers are taken too).
fn int<'de, D, N>(d: D) -> Result<N, D::Error>
where
    D: Deserializer<'de>,
    N: std::str::FromStr + Deserialize<'de>,
    N::Err: std::fmt::Display,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int<N> {
        Text(String),
        Number(N),
    }
    match Int::<N>::deserialize(d)? {
        Int::Text(s) => s.parse().map_err(serde::de::Error::custom),
        Int::Number(n) => Ok(n),
    }
}

/// A bytes field: base64 text.
fn base64_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    BASE64.decode(text).map_err(serde::de::Error::custom)
}
