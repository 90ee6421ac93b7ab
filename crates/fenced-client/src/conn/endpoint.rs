//! One member, reached over HTTP or the wire protocol: each call of the lock service and
//! the store on it, its answer typed.

use super::*;

/// The header carrying the operation's token.
const FENCING_TOKEN: &str = "fencing-token";
const FENCING_SIGNATURE: &str = "fencing-signature";

/// A signed store call on a fenced:// endpoint: its frames have no room for the signature.
fn unsigned_on_wire() -> Error {
    Error::BadRequest(
        "the wire protocol's PUT and GET frames carry no signature: use an http(s):// endpoint for keys \
         under the server's signed_key_prefix"
            .into(),
    )
}

/// The header carrying the key's mark on a read.
const FENCING_HIGHEST_SEEN: &str = "fencing-highest-seen";

/// One attempt of an acquire under an implicit lease, on one member: the same on every
/// member of one call but for the wait left and the attempt's time-out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Implicit<'a> {
    /// The implicit lease every attempt of the call names.
    pub lease: LeaseId,
    pub ttl_ms: u64,
    /// What is left of the call's wait.
    pub wait_ms: u64,
    pub holder: Option<&'a str>,
    pub timeout: Duration,
}

impl Implicit<'_> {
    /// The HTTP body: `{"lease_id", "ttl_ms", "wait_ms"}`, and `"holder"` when given.
    fn body(&self) -> serde_json::Value {
        let mut req =
            serde_json::json!({ "lease_id": self.lease.to_hex(), "ttl_ms": self.ttl_ms, "wait_ms": self.wait_ms });
        if let Some(h) = self.holder {
            req["holder"] = h.into();
        }
        req
    }
}

/// One endpoint of the lock service, over one transport. Cloning shares the connections.
#[derive(Clone, Debug)]
pub(crate) enum Endpoint {
    /// `http://` or `https://`: pooled HTTP/1.1 connections.
    Http(Arc<Transport>),
    /// `fenced://`: one multiplexed wire-protocol connection.
    Wire(Arc<Mux>),
}

/// An open watch: the HTTP event stream (SSE), or a WATCH's frames.
pub(crate) enum EventSource {
    Http(hyper::body::Incoming),
    Wire(crate::mux::Stream),
}

impl Endpoint {
    /// A watch of `prefix` after `since` on this member. Over the wire protocol the
    /// first frame tells whether it opened (its start marker) or was refused.
    pub(super) async fn open_watch(
        &self,
        prefix: &str,
        since: Option<u64>,
        timeout: Duration,
    ) -> Result<Answer<EventSource>, Error> {
        match self {
            Endpoint::Http(t) => {
                let mut path = format!("/v1/events?prefix={}", segment(prefix));
                if let Some(p) = since {
                    path.push_str(&format!("&since={p}"));
                }
                match t.open_stream(&path, timeout).await? {
                    crate::http::StreamAnswer::Open(body) => Ok(Ok(EventSource::Http(body))),
                    crate::http::StreamAnswer::Refused(e) => Ok(Err(e)),
                }
            }
            Endpoint::Wire(m) => {
                let mut stream = m.stream(Request::Watch { prefix, since, tail: None }).await?;
                match tokio::time::timeout(timeout, stream.peek()).await {
                    Ok(Some(Reply::Error(e))) => Ok(Err(e.clone())),
                    Ok(Some(_)) => Ok(Ok(EventSource::Wire(stream))),
                    Ok(None) => Err(Error::unavailable(format!("{}: the watch closed before it opened", m.endpoint))),
                    Err(_) => Err(Error::unavailable(format!("{}: no answer to the watch in time", m.endpoint))),
                }
            }
        }
    }

    pub fn new(endpoint: &str, dial: crate::http::Dial<'_>) -> Result<Endpoint, Error> {
        if endpoint.starts_with("fenced://") || endpoint.starts_with("fenceds://") {
            return Ok(Endpoint::Wire(Arc::new(Mux::new(endpoint, dial)?)));
        }
        Ok(Endpoint::Http(Transport::new(endpoint, dial)?))
    }

    pub fn endpoint(&self) -> &str {
        match self {
            Endpoint::Http(t) => &t.base,
            Endpoint::Wire(m) => &m.endpoint,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        match self {
            Endpoint::Http(t) => t.request_timeout,
            Endpoint::Wire(m) => m.request_timeout,
        }
    }

    /// Whether this member shows, within `within`, that it is alive: `GET /readyz`
    /// answering `leader: true` over HTTP (a member that answers it no longer leads
    /// would answer the request `not_leader` too); over the wire, which has no such
    /// call, an `AUTH` with the connection's own token, which the member answers itself
    /// (no quorum round: a freshly elected leader under load must not look silent)
    /// and which leaves the connection's state as it was.
    pub async fn probe(&self, within: Duration) -> bool {
        let asked = async {
            match self {
                Endpoint::Http(t) => match t.send(Method::GET, "/readyz", &[], None, within).await {
                    Ok(r) if r.is_success() => r.json::<serde_json::Value>().is_ok_and(|v| v["leader"] == true),
                    _ => false,
                },
                Endpoint::Wire(m) => m.probe(within).await,
            }
        };
        tokio::time::timeout(within, asked).await.unwrap_or(false)
    }

    /// The HTTP transport, for the calls only the HTTP API has (the views).
    pub fn http(&self, what: &str) -> Result<&Transport, Error> {
        match self {
            Endpoint::Http(t) => Ok(t),
            Endpoint::Wire(_) => {
                Err(Error::BadRequest(format!("{what} is served over HTTP only; use an http:// endpoint for it")))
            }
        }
    }

    /// Acquire under the implicit lease `lease` of `ttl_ms` (the caller drew its id),
    /// queueing up to `wait_ms`.
    pub async fn acquire(&self, name: &LockName, a: Implicit<'_>) -> Result<Answer<Granted>, Error> {
        match self {
            Endpoint::Http(t) => {
                let path = format!("/v1/locks/{}/acquire", segment(name.as_str()));
                let r = t.json(Method::POST, &path, &a.body(), a.timeout).await?;
                r.answer(|r| r.json::<GrantBody>()?.typed())
            }
            Endpoint::Wire(m) => {
                let (lease, ttl_ms, wait_ms, holder) = (Some(a.lease), Some(a.ttl_ms), a.wait_ms, a.holder);
                let req = Request::Acquire { name: name.as_str(), lease, ttl_ms, wait_ms, lock_delay_ms: 0, holder };
                match m.call(req, true, a.timeout).await? {
                    Reply::Granted { token, lease, ttl_ms, signature } => {
                        Ok(Ok(Granted { name: name.to_string(), token, lease, ttl_ms, signature }))
                    }
                    other => unexpected(other),
                }
            }
        }
    }

    /// Acquires every one of `names` together under the implicit lease `lease`
    /// (`POST /v1/locks/acquire`, or the wire protocol's ACQUIRE_ALL).
    pub async fn acquire_all(&self, names: &[LockName], a: Implicit<'_>) -> Result<Answer<Vec<Granted>>, Error> {
        let names: Vec<&str> = names.iter().map(LockName::as_str).collect();
        match self {
            Endpoint::Http(t) => {
                let mut req = a.body();
                req["names"] = names.into();
                let r = t.json(Method::POST, "/v1/locks/acquire", &req, a.timeout).await?;
                r.answer(|r| r.json::<GrantAllBody>()?.grants.into_iter().map(GrantBody::typed).collect())
            }
            Endpoint::Wire(m) => {
                let (lease, ttl_ms, wait_ms, holder) = (Some(a.lease), Some(a.ttl_ms), a.wait_ms, a.holder);
                let req = Request::AcquireAll { names, lease, ttl_ms, wait_ms, lock_delay_ms: 0, holder };
                match m.call(req, true, a.timeout).await? {
                    Reply::GrantedAll { lease, ttl_ms, grants } => Ok(Ok(grants
                        .into_iter()
                        .map(|(name, token, signature)| Granted { name, token, lease, ttl_ms, signature })
                        .collect())),
                    other => unexpected(other),
                }
            }
        }
    }

    /// A new lease of `ttl_ms`: its id and TTL.
    pub async fn create_lease(&self, ttl_ms: u64) -> Result<Answer<(LeaseId, u64)>, Error> {
        match self {
            Endpoint::Http(t) => {
                let req = serde_json::json!({ "ttl_ms": ttl_ms });
                let r = t.json(Method::POST, "/v1/leases", &req, t.request_timeout).await?;
                r.answer(|r| r.json::<LeaseBody>()?.typed())
            }
            Endpoint::Wire(m) => match m.call(Request::CreateLease { ttl_ms }, false, m.request_timeout).await? {
                Reply::Lease { lease, ttl_ms } => Ok(Ok((lease, ttl_ms))),
                other => unexpected(other),
            },
        }
    }

    /// Keeps `lease` alive once: its TTL.
    pub async fn keepalive(&self, lease: LeaseId, timeout: Duration) -> Result<Answer<u64>, Error> {
        match self {
            Endpoint::Http(t) => {
                let path = format!("/v1/leases/{}/keepalive", lease.to_hex());
                let r = t.send(Method::POST, &path, &[], None, timeout).await?;
                r.answer(|r| Ok(r.json::<LeaseBody>()?.ttl_ms))
            }
            Endpoint::Wire(m) => match m.call(Request::Keepalive { lease }, false, timeout).await? {
                Reply::Lease { ttl_ms, .. } => Ok(Ok(ttl_ms)),
                other => unexpected(other),
            },
        }
    }

    pub async fn revoke(&self, lease: LeaseId) -> Result<Answer<()>, Error> {
        match self {
            Endpoint::Http(t) => {
                let path = format!("/v1/leases/{}", lease.to_hex());
                let r = t.send(Method::DELETE, &path, &[], None, t.request_timeout).await?;
                r.answer(|_| Ok(()))
            }
            Endpoint::Wire(m) => match m.call(Request::Revoke { lease }, false, m.request_timeout).await? {
                Reply::Done => Ok(Ok(())),
                other => unexpected(other),
            },
        }
    }

    /// Whether `token` is `name`'s current grant, and the holder's token.
    pub async fn check(&self, name: &str, token: Token) -> Result<Answer<(bool, Option<Token>)>, Error> {
        match self {
            Endpoint::Http(t) => {
                let path = format!("/v1/locks/{}/check", segment(name));
                let body = serde_json::json!({ "token": token.get() });
                let r = t.json(Method::POST, &path, &body, t.request_timeout).await?;
                r.answer(|r| Ok(r.json::<CheckBody>()?.typed()))
            }
            Endpoint::Wire(m) => {
                match m.call(Request::Check { name, token: token.get() }, false, m.request_timeout).await? {
                    Reply::Checked { current, token } => Ok(Ok((current, token))),
                    other => unexpected(other),
                }
            }
        }
    }

    /// A fenced write: the key's new mark. `signature`: the grant's, for a key under
    /// the server's `signed_key_prefix` (HTTP only: the wire protocol's PUT has none).
    pub async fn put(
        &self,
        key: &str,
        token: Token,
        value: &[u8],
        signature: Option<&str>,
    ) -> Result<Answer<Token>, Error> {
        match self {
            Endpoint::Http(t) => {
                let path = format!("/v1/store/{}", segment(key));
                let mut headers = vec![(FENCING_TOKEN, token.get().to_string())];
                headers.extend(signature.map(|s| (FENCING_SIGNATURE, s.to_string())));
                let r = t
                    .send(Method::PUT, &path, &headers, Some(Bytes::copy_from_slice(value)), t.request_timeout)
                    .await?;
                match r.status {
                    200 | 201 | 204 if r.body.is_empty() => Ok(Ok(token)),
                    200 | 201 => {
                        let b: StoreBody = r.json()?;
                        if b.token != token.get() {
                            return Err(bad_answer("the store echoed another token"));
                        }
                        Ok(Ok(json::token(b.highest_seen)?))
                    }
                    _ => Ok(Err(r.api_error())),
                }
            }
            Endpoint::Wire(_) if signature.is_some() => Err(unsigned_on_wire()),
            Endpoint::Wire(m) => {
                let req = Request::Put { key, token: Some(token), value };
                match m.call(req, false, m.request_timeout).await? {
                    Reply::Written { highest_seen } => Ok(Ok(highest_seen)),
                    other => unexpected(other),
                }
            }
        }
    }

    /// A read, fenced when `token` is given; an absent key reads as no value.
    pub async fn get(
        &self,
        key: &str,
        token: Option<Token>,
        signature: Option<&str>,
    ) -> Result<Answer<StoreRead>, Error> {
        match self {
            Endpoint::Http(t) => {
                let path = format!("/v1/store/{}", segment(key));
                let mut headers: Vec<_> = token.map(|t| (FENCING_TOKEN, t.get().to_string())).into_iter().collect();
                headers.extend(signature.map(|s| (FENCING_SIGNATURE, s.to_string())));
                let r = t.send(Method::GET, &path, &headers, None, t.request_timeout).await?;
                let highest_seen = r
                    .headers
                    .get(FENCING_HIGHEST_SEEN)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .and_then(Token::new);
                match r.status {
                    200 => Ok(Ok(StoreRead { value: Some(r.body.to_vec()), highest_seen })),
                    404 => {
                        let api = r.api_error();
                        let mark = highest_seen.or_else(|| api.detail_u64("highest_seen").and_then(Token::new));
                        Ok(Ok(StoreRead { value: None, highest_seen: mark }))
                    }
                    _ => Ok(Err(r.api_error())),
                }
            }
            Endpoint::Wire(_) if signature.is_some() => Err(unsigned_on_wire()),
            Endpoint::Wire(m) => match m.call(Request::Get { key, token }, false, m.request_timeout).await? {
                Reply::Read { highest_seen, value } => Ok(Ok(StoreRead { value: Some(value), highest_seen })),
                Reply::Error(api) if api.code == "not_found" => {
                    let mark = api.detail_u64("highest_seen").and_then(Token::new);
                    Ok(Ok(StoreRead { value: None, highest_seen: mark }))
                }
                other => unexpected(other),
            },
        }
    }
}

/// An error answer passes through; any other answer to the wrong request is a bug.
fn unexpected<T>(reply: Reply) -> Result<Answer<T>, Error> {
    match reply {
        Reply::Error(e) => Ok(Err(e)),
        other => Err(bad_answer(&format!("the server answered a different call: {other:?}"))),
    }
}
