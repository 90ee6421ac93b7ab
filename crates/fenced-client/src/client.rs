//! The client handle, its builder, and lock requests.

use std::future::Future;
use std::time::Duration;

use fenced_core::{LeaseId, LockName, Token};
use tokio::time::Instant;

use crate::conn::Conn;
use tokio_util::sync::CancellationToken;

use crate::error::{bad_answer, Error};
use crate::guard::{Grant, LockGuard};
use crate::http::segment;
use crate::resource::Store;
use crate::validity;

/// The endpoint used when neither the builder nor `FENCED_ENDPOINT` names one.
pub const ENDPOINT_DEFAULT: &str = "http://127.0.0.1:7400";

/// How long a watch keeps reopening a broken stream before [`crate::Watch::next`]
/// answers `Unavailable` (calling it again goes on from the same position).
const WATCH_RETRY_FOR: Duration = Duration::from_secs(30);

/// A handle on one lock service. Cheap to clone; clones share one connection pool
/// (`http://`, `https://`) or one multiplexed connection (`fenced://`).
#[derive(Clone, Debug)]
pub struct Client {
    /// The transport the endpoint's scheme chose.
    conn: Conn,
}

/// Configures a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    /// `http://host:port`, `https://host:port` or `fenced://host:port` (the binary
    /// wire protocol), or several separated by commas (the members of a cluster: a call
    /// moves on to the next when one is unreachable or not the leader);
    /// `FENCED_ENDPOINT`, else [`ENDPOINT_DEFAULT`].
    endpoint: Option<String>,
    /// Sent as `Authorization: Bearer ..`; `FENCED_AUTH_TOKEN` by default.
    auth_token: Option<String>,
    /// Bound on opening a connection.
    connect_timeout: Duration,
    /// Bound on one request's round trip (a blocking acquire adds its wait), failovers
    /// included.
    request_timeout: Duration,
    /// With several endpoints: how long a member may answer neither a request nor a
    /// probe before the call moves on to the next (see [`ClientBuilder::attempt_timeout`]);
    /// `FENCED_ATTEMPT_TIMEOUT`, else [`crate::ATTEMPT_TIMEOUT_DEFAULT`].
    attempt_timeout: Option<Duration>,
    /// PEM certificates a `https://` server must chain to; `FENCED_CA_FILE` by default,
    /// else the public web roots.
    tls_ca_pem: Option<Vec<u8>>,
    /// This client's certificate chain and key (PEM) for a server with `client_ca`;
    /// `FENCED_CLIENT_CERT` and `FENCED_CLIENT_KEY` by default.
    tls_client_pem: Option<ClientPem>,
}

/// A client certificate chain and its private key, PEM.
type ClientPem = (Vec<u8>, Vec<u8>);

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            endpoint: None,
            auth_token: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            attempt_timeout: None,
            tls_ca_pem: None,
            tls_client_pem: None,
        }
    }
}

impl ClientBuilder {
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// With several endpoints (a cluster's members): how long a member may leave a
    /// request unanswered *and* not answer a probe of its liveness before the call
    /// moves on to the next member; the request time-out still bounds the whole call.
    /// A request a live leader keeps on purpose (an acquire parked in the queue) is
    /// not cut: the leader answers the probe. Default `FENCED_ATTEMPT_TIMEOUT` (written
    /// like `750ms` or `2s`), else [`crate::ATTEMPT_TIMEOUT_DEFAULT`] (750 ms); at least
    /// [`crate::ATTEMPT_TIMEOUT_MIN`] (20 ms), or `build` refuses it. Unused with one
    /// endpoint.
    pub fn attempt_timeout(mut self, d: Duration) -> Self {
        self.attempt_timeout = Some(d);
        self
    }

    /// Trusts only these PEM certificates for a `https://` endpoint.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// Presents this certificate chain, with its private key (both PEM), to a server
    /// that takes client certificates (its `client_ca`): the identity of its subject.
    pub fn tls_client_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.tls_client_pem = Some((cert.into(), key.into()));
        self
    }

    /// Builds the client; reads `FENCED_ENDPOINT`, `FENCED_AUTH_TOKEN`,
    /// `FENCED_ATTEMPT_TIMEOUT`, `FENCED_CA_FILE`, `FENCED_CLIENT_CERT` and
    /// `FENCED_CLIENT_KEY` for what was not given, and does no network IO (the first
    /// request connects).
    pub fn build(self) -> Result<Client, Error> {
        let endpoint = self
            .endpoint
            .or_else(|| std::env::var("FENCED_ENDPOINT").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| ENDPOINT_DEFAULT.to_owned());
        let auth = self.auth_token.or_else(|| std::env::var("FENCED_AUTH_TOKEN").ok().filter(|s| !s.is_empty()));
        let ca = match (self.tls_ca_pem, std::env::var_os("FENCED_CA_FILE").filter(|s| !s.is_empty())) {
            (Some(pem), _) => Some(pem),
            (None, Some(path)) => Some(std::fs::read(&path).map_err(|e| {
                Error::BadRequest(format!("FENCED_CA_FILE {}: {e}", std::path::Path::new(&path).display()))
            })?),
            (None, None) => None,
        };
        let client_pem = match self.tls_client_pem {
            Some(pair) => Some(pair),
            None => client_pem_from_env()?,
        };
        let attempt_timeout = attempt_timeout(self.attempt_timeout, std::env::var("FENCED_ATTEMPT_TIMEOUT").ok())?;
        let conn = Conn::new(
            &endpoint,
            auth.as_deref(),
            self.connect_timeout,
            self.request_timeout,
            attempt_timeout,
            crate::http::TlsFiles {
                ca_pem: ca.as_deref(),
                client_pem: client_pem.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
            },
        )?;
        Ok(Client { conn })
    }
}

/// `FENCED_CLIENT_CERT` and `FENCED_CLIENT_KEY` (files, PEM), read; both or neither.
fn client_pem_from_env() -> Result<Option<ClientPem>, Error> {
    let var = |name: &str| std::env::var_os(name).filter(|s| !s.is_empty());
    let read = |name: &str, path: std::ffi::OsString| {
        std::fs::read(&path)
            .map_err(|e| Error::BadRequest(format!("{name} {}: {e}", std::path::Path::new(&path).display())))
    };
    match (var("FENCED_CLIENT_CERT"), var("FENCED_CLIENT_KEY")) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some((read("FENCED_CLIENT_CERT", cert)?, read("FENCED_CLIENT_KEY", key)?))),
        _ => Err(Error::BadRequest("FENCED_CLIENT_CERT and FENCED_CLIENT_KEY go together".into())),
    }
}

/// The attempt time-out: the builder's, else `FENCED_ATTEMPT_TIMEOUT` (`env`), else the
/// default. (The minimum is checked where the members are made.)
fn attempt_timeout(given: Option<Duration>, env: Option<String>) -> Result<Duration, Error> {
    match (given, env) {
        (Some(d), _) => Ok(d),
        (None, Some(s)) if !s.trim().is_empty() => fenced_core::duration_ms(&s)
            .map(Duration::from_millis)
            .map_err(|e| Error::BadRequest(format!("FENCED_ATTEMPT_TIMEOUT: {e}"))),
        (None, _) => Ok(crate::ATTEMPT_TIMEOUT_DEFAULT),
    }
}

/// How a lock is asked for.
#[derive(Clone, Copy, Debug)]
pub struct LockOptions {
    /// The lease's TTL: how long the lock outlives a silent holder.
    pub ttl: Duration,
    /// How long to wait in the queue; zero is a try-lock.
    pub wait: Duration,
    /// Kept below the TTL in the client-side deadline; `None` is a tenth of the TTL.
    pub margin: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions { ttl: Duration::from_secs(10), wait: Duration::from_secs(30), margin: None }
    }
}

impl Client {
    /// A client for `endpoint`, with the auth token from `FENCED_AUTH_TOKEN` if set.
    pub fn connect(endpoint: &str) -> Result<Client, Error> {
        ClientBuilder::default().endpoint(endpoint).build()
    }

    /// A client configured from `FENCED_ENDPOINT` and `FENCED_AUTH_TOKEN`.
    pub fn from_env() -> Result<Client, Error> {
        ClientBuilder::default().build()
    }

    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The endpoint, `http://host:port` (or `https://`, `fenced://`).
    pub fn endpoint(&self) -> &str {
        self.conn.endpoint()
    }

    /// Every endpoint this client was given, comma-separated, the one that answered last
    /// first: what a child process needs to fail over as this client does.
    pub fn endpoints(&self) -> String {
        self.conn.endpoints()
    }

    /// Starts a lock request; nothing is sent until `acquire` or `try_acquire`.
    pub fn lock(&self, name: impl Into<String>) -> LockRequest {
        LockRequest {
            client: self.clone(),
            name: name.into(),
            also: vec![],
            options: LockOptions::default(),
            holder: None,
        }
    }

    /// Starts a request for several locks at once (`POST /v1/locks/acquire`): granted
    /// all together under one lease, or none, within the wait; no deadlock whatever
    /// order callers name them in, and a waiter for several is not overtaken by later
    /// waiters for one of them. The guard holds every lock: [`LockGuard::tokens`] has
    /// a token per name, in the names' sorted order (its `name` and `token` are the
    /// first's); its lost signal is the lease's, and `release()` ends the lease, which
    /// releases every one. Over HTTP and the wire protocol alike.
    pub fn lock_all<I, S>(&self, names: I) -> LockRequest
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut names = names.into_iter().map(Into::into);
        let name = names.next().unwrap_or_default();
        LockRequest { client: self.clone(), name, also: names.collect(), options: LockOptions::default(), holder: None }
    }

    /// Acquires `name`, runs `work` with the token and a cancellation token, and
    /// releases. When the lock is lost first, `work` is dropped (cancelled at its next
    /// await point) and the answer is `Error::Lost`; the cancellation token fires at the
    /// same moment, for tasks that `work` handed it to.
    pub async fn with_lock<F, Fut, T>(&self, name: &str, options: LockOptions, work: F) -> Result<T, Error>
    where
        F: FnOnce(Token, CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(name).options(options).acquire().await?;
        let lost = guard.lost();
        let outcome = tokio::select! {
            out = work(guard.token(), guard.cancellation()) => Ok(out),
            reason = lost => Err(Error::Lost(reason)),
        };
        let released = guard.release().await;
        match (outcome, released) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(e @ Error::Lost(_))) => Err(e),
            // The work finished under a valid lock; a failed release only delays the
            // next holder until the lease expires.
            (Ok(out), _) => Ok(out),
        }
    }

    /// The locks whose names start with `prefix`, as the server describes them.
    pub async fn locks(&self, prefix: Option<&str>) -> Result<serde_json::Value, Error> {
        let path = match prefix {
            Some(p) => format!("/v1/locks?prefix={}", segment(p)),
            None => "/v1/locks".to_owned(),
        };
        self.conn.view("listing locks", &path).await?.map_err(|e| e.into_error())
    }

    /// The cluster as the member that answers sees it (`GET /v1/cluster`).
    pub async fn cluster(&self) -> Result<serde_json::Value, Error> {
        self.conn.view("the cluster's status", "/v1/cluster").await?.map_err(|e| e.into_error())
    }

    /// Adds a member (`id`, reachable at `url`) to the cluster: it catches up as a
    /// learner, then becomes a voter. Returns the cluster's status after.
    pub async fn add_member(&self, id: u64, url: &str) -> Result<serde_json::Value, Error> {
        let body = serde_json::json!({ "id": id, "url": url });
        let method = hyper::Method::POST;
        self.conn
            .call_json("adding a member", method, "/v1/cluster/members", Some(&body))
            .await?
            .map_err(|e| e.into_error())
    }

    /// A backup of the replicated state: the bytes of a snapshot file (`fenced
    /// snapshot status` reads one), from the leader, holding every write acknowledged
    /// before the call. Needs the admin permission where identities exist.
    pub async fn snapshot(&self, timeout: std::time::Duration) -> Result<bytes::Bytes, Error> {
        self.conn.get_bytes("saving a snapshot", "/v1/cluster/snapshot", timeout).await?.map_err(|e| e.into_error())
    }

    /// Removes a member from the cluster's voters.
    pub async fn remove_member(&self, id: u64) -> Result<serde_json::Value, Error> {
        let path = format!("/v1/cluster/members/{id}");
        let method = hyper::Method::DELETE;
        self.conn.call_json("removing a member", method, &path, None).await?.map_err(|e| e.into_error())
    }

    /// One lock as the server describes it.
    pub async fn lock_info(&self, name: &str) -> Result<serde_json::Value, Error> {
        let path = format!("/v1/locks/{}", segment(name));
        self.conn.view("describing a lock", &path).await?.map_err(|e| e.into_error())
    }

    /// Asks whether `token` is still the current grant of `name` (Chubby's
    /// CheckSequencer). Returns whether it is, and the current holder's token.
    pub async fn check(&self, name: &str, token: Token) -> Result<(bool, Option<Token>), Error> {
        self.conn.check(name, token).await?.map_err(|e| e.into_error())
    }

    /// Creates a lease of `ttl` (for callers that manage leases themselves; a lock
    /// guard makes its own): its id. Keep it alive with [`Client::keepalive`].
    pub async fn create_lease(&self, ttl: Duration) -> Result<LeaseId, Error> {
        let ttl_ms = ttl.as_millis().min(u64::MAX as u128) as u64;
        let (lease, _) = self.conn.create_lease(ttl_ms).await?.map_err(|e| e.into_error())?;
        Ok(lease)
    }

    /// Keeps a lease alive once; answers its TTL. `Error::NotFound` once it is gone.
    pub async fn keepalive(&self, lease: LeaseId) -> Result<Duration, Error> {
        let ttl_ms = self.conn.keepalive(lease, self.conn.request_timeout()).await?.map_err(|e| e.into_error())?;
        Ok(Duration::from_millis(ttl_ms))
    }

    /// Revokes a lease: every lock held under it is released. Idempotent.
    pub async fn revoke_lease(&self, lease: LeaseId) -> Result<(), Error> {
        match self.conn.revoke(lease).await? {
            Ok(()) => Ok(()),
            Err(e) if e.lease_gone() => Ok(()),
            Err(e) => Err(e.into_error()),
        }
    }

    /// Watches the events of lock names and store keys that start with `prefix` (""
    /// for all), from now (`since` None) or exactly after index `since` (a position a
    /// previous watch reached: [`crate::Watch::position`]). A broken stream is reopened
    /// from the last position on any member, so nothing is missed or repeated; see
    /// [`crate::Watch::next`]. Served over HTTP only.
    pub fn watch(&self, prefix: &str, since: Option<u64>) -> crate::Watch {
        crate::Watch::new(self.conn.clone(), prefix, since, WATCH_RETRY_FOR)
    }

    /// The leader of election `name` (the holder of lock `name`), if there is one.
    pub async fn leader(&self, name: &str) -> Result<Option<crate::Leader>, Error> {
        let v = self.lock_info(name).await?;
        Ok(crate::watch::leader_of(&v))
    }

    /// Follows election `name`: each change of its leader, from now (or exactly after
    /// index `since`), with [`crate::Watch`]'s rules (nothing missed across reconnects,
    /// `Error::Missed` rather than a gap).
    pub fn observe(&self, name: &str, since: Option<u64>) -> crate::Observe {
        crate::Observe::new(self.watch(name, since), name)
    }

    /// An operator's release: takes lock `name` from whoever holds it (with `token`,
    /// only while that token holds it), needing the `admin` right on the name. The
    /// next waiter is granted with a higher token; the old holder's guard hears at its
    /// next keepalive (its implicit lease ended with the lock) or check. Answers the
    /// token taken; `Refused(NotHolder)` when nobody, or another token, holds it.
    ///
    /// Without `token`, the current holder's is read first and named: a call retried on
    /// another member (its first answer lost) can then never take the lock from the
    /// holder granted after the revoke.
    pub async fn revoke_lock(&self, name: &str, token: Option<Token>) -> Result<Token, Error> {
        let name = lock_name(name)?;
        let token = match token {
            Some(t) => t,
            None => {
                let view = self.lock_info(name.as_str()).await?;
                let held = view["token"].as_u64().and_then(Token::new);
                held.ok_or(Error::Refused(fenced_core::Error::NotHolder { holder: None }))?
            }
        };
        let path = format!("/v1/locks/{}/revoke", segment(name.as_str()));
        let body = serde_json::json!({ "token": token.get() });
        let method = hyper::Method::POST;
        let v =
            self.conn.call_json("revoking a lock", method, &path, Some(&body)).await?.map_err(|e| e.into_error())?;
        v["token"].as_u64().and_then(Token::new).ok_or_else(|| Error::Server {
            status: None,
            code: "bad_response".into(),
            message: format!("a revoke answered without a token: {v}"),
        })
    }

    /// `GET /v1/keys`: the keys that verify this service's grant signatures, for a
    /// [`Verified`](crate::Verified) gate (fetch them once, or configure them). The
    /// server answers 404 `not_signing` (here `Error::NotFound`) when it does not sign.
    pub async fn grant_keys(&self) -> Result<crate::GrantKeys, Error> {
        let timeout = self.conn.request_timeout();
        let body =
            self.conn.get_bytes("reading the grant keys", "/v1/keys", timeout).await?.map_err(|e| e.into_error())?;
        let doc: serde_json::Value = serde_json::from_slice(&body).map_err(|e| bad_answer(&e.to_string()))?;
        crate::GrantKeys::from_json(&doc)
    }

    /// The server's built-in fenced key-value store.
    pub fn store(&self) -> Store {
        Store::new(self.conn.clone())
    }
}

/// A lock request being configured: `client.lock("orders/42").ttl(..).wait(..).acquire()`.
#[derive(Clone, Debug)]
#[must_use = "nothing is sent until acquire() or try_acquire()"]
pub struct LockRequest {
    /// Whom to ask.
    client: Client,
    /// The name as given; checked when the request is sent.
    name: String,
    /// The other names of a request for several locks ([`Client::lock_all`]).
    also: Vec<String>,
    /// TTL, wait and margin.
    options: LockOptions,
    /// The holder's label, shown in lock views and events.
    holder: Option<String>,
}

impl LockRequest {
    /// Names the holder (a host, a process, a job) in the lock's views and events: 1 to
    /// 256 bytes of UTF-8 without control characters, never a secret.
    pub fn holder(mut self, label: impl Into<String>) -> Self {
        self.holder = Some(label.into());
        self
    }

    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = ttl;
        self
    }

    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = wait;
        self
    }

    pub fn margin(mut self, margin: Duration) -> Self {
        self.options.margin = Some(margin);
        self
    }

    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Campaigns for leadership: waits in the lock's queue for as long as it takes (one
    /// wait of the configured length after another, keeping its place between them
    /// only as any new waiter would), until elected; the guard is the leadership, with
    /// its token and its lost signal, and `release()` resigns. A waiting campaign
    /// holds no lease that could expire (its implicit lease lives only from the grant),
    /// so it cannot go on campaigning under a lease that is gone; dropping the future
    /// withdraws it. Errors other than "not yet" end it.
    pub async fn campaign(self) -> Result<LockGuard, Error> {
        if self.options.wait.is_zero() {
            return Err(Error::BadRequest("a campaign needs a wait per round above 0".into()));
        }
        loop {
            let round = Instant::now();
            match self.clone().acquire().await {
                // Refused before the wait was up (a lock-delay refuses at once): pause
                // rather than spin.
                Err(Error::LockHeld { .. }) if round.elapsed() < self.options.wait / 2 => {
                    tokio::time::sleep(self.options.wait.min(Duration::from_millis(200))).await;
                }
                Err(Error::LockHeld { .. }) => {}
                other => return other,
            }
        }
    }

    /// Acquires without waiting: `Error::LockHeld` when someone holds it.
    pub async fn try_acquire(self) -> Result<LockGuard, Error> {
        self.wait(Duration::ZERO).acquire().await
    }

    /// Acquires, waiting up to the configured wait in the server's FIFO queue.
    /// Dropping this future withdraws the waiter: its connection closes and the server
    /// takes it out of the queue.
    pub async fn acquire(self) -> Result<LockGuard, Error> {
        if !self.also.is_empty() {
            return self.acquire_all().await;
        }
        let name = lock_name(&self.name)?;
        let a = self.attempt()?;
        let conn = &self.client.conn;
        let attempt = || conn.acquire(&name, a.ttl_ms, a.holder, a.give_up_at);
        let (granted, sent_at) = until_answered(a.give_up_at, || name.to_string(), attempt).await?;
        if granted.name != name.as_str() {
            return Err(bad_answer(&format!("asked for lock '{}', granted '{}'", name, granted.name)));
        }
        let (ttl, margin) = self.validity(granted.ttl_ms, a.ttl_ms);
        let grant = Grant {
            name,
            token: granted.token,
            also: vec![],
            signatures: granted.signature.into_iter().collect(),
            lease_id: granted.lease,
            ttl,
            margin,
            sent_at,
        };
        self.start_guard(grant, a.started).await
    }

    /// Every name of [`Client::lock_all`] at once, as [`acquire`](Self::acquire) does one.
    async fn acquire_all(self) -> Result<LockGuard, Error> {
        let mut names =
            std::iter::once(&self.name).chain(&self.also).map(|n| lock_name(n)).collect::<Result<Vec<_>, _>>()?;
        names.sort_unstable();
        names.dedup();
        let a = self.attempt()?;
        let conn = &self.client.conn;
        let attempt = || conn.acquire_all(&names, a.ttl_ms, a.holder, a.give_up_at);
        let held = || names.iter().map(LockName::as_str).collect::<Vec<_>>().join(",");
        let (grants, sent_at) = until_answered(a.give_up_at, held, attempt).await?;
        let granted: Vec<&str> = grants.iter().map(|g| g.name.as_str()).collect();
        let asked: Vec<&str> = names.iter().map(LockName::as_str).collect();
        if granted != asked {
            return Err(bad_answer(&format!("asked for locks {asked:?}, granted {granted:?}")));
        }
        let first = &grants[0];
        let lease_id = first.lease;
        if grants.iter().any(|g| g.lease != lease_id) {
            return Err(bad_answer("the locks of one request were granted under different leases"));
        }
        let (ttl, margin) = self.validity(first.ttl_ms, a.ttl_ms);
        // Signed, every grant carries one; a set signed only in part is no signed set.
        let signatures: Vec<String> = grants.iter().map_while(|g| g.signature.clone()).collect();
        let signatures = if signatures.len() == grants.len() { signatures } else { vec![] };
        let mut tokens = names.into_iter().zip(&grants).map(|(n, g)| (n, g.token));
        let (name, token) = tokens.next().expect("one name or more");
        let also = tokens.collect();
        let grant = Grant { name, token, also, signatures, lease_id, ttl, margin, sent_at };
        self.start_guard(grant, a.started).await
    }

    /// Where both acquires start: the TTL checked, the deadline counted from now.
    fn attempt(&self) -> Result<Attempt<'_>, Error> {
        let ttl_ms = ttl_ms(self.options.ttl)?;
        let give_up_at = Instant::now() + self.options.wait;
        Ok(Attempt { ttl_ms, give_up_at, started: Instant::now(), holder: self.holder.as_deref() })
    }

    /// The TTL granted (never above the one asked for) and the margin kept below it.
    fn validity(&self, granted_ttl_ms: u64, ttl_ms: u64) -> (Duration, Duration) {
        let ttl = Duration::from_millis(granted_ttl_ms.min(ttl_ms));
        (ttl, self.options.margin.unwrap_or_else(|| validity::default_margin(ttl)))
    }

    /// The guard of a grant. One that came after a long wait in the queue may leave
    /// little of the deadline counted from the send: renewed once first, so the guard
    /// starts fresh.
    async fn start_guard(&self, mut grant: Grant, grant_started: Instant) -> Result<LockGuard, Error> {
        let (granted_ttl, conn) = (grant.ttl, &self.client.conn);
        if Instant::now().duration_since(grant_started) > granted_ttl / 3 {
            let renewed_at = Instant::now();
            match self.client.keepalive(grant.lease_id).await {
                Ok(_) => grant.sent_at = renewed_at,
                Err(Error::NotFound(_)) => {
                    return Err(Error::Lost(crate::LostReason::LeaseNotFound));
                }
                Err(_) => {} // the guard's own keepalive retries until the deadline
            }
        }
        Ok(LockGuard::start(grant, conn.clone()))
    }
}

/// An acquire under way: what it asked for and until when it may wait.
struct Attempt<'a> {
    ttl_ms: u64,
    /// When the queue's wait is over.
    give_up_at: Instant,
    /// When it began: a grant that took long is renewed before its guard starts.
    started: Instant,
    holder: Option<&'a str>,
}

/// A lock's name, checked; a bad one is the caller's error.
fn lock_name(name: &str) -> Result<LockName, Error> {
    LockName::new(name).map_err(|e| Error::BadRequest(e.to_string()))
}

/// A lock's TTL in whole milliseconds, at least 1.
fn ttl_ms(ttl: Duration) -> Result<u64, Error> {
    match u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX) {
        0 => Err(Error::BadRequest("the TTL must be at least 1 ms".into())),
        ms => Ok(ms),
    }
}

/// Runs `attempt` until the service answers it, retrying while it refuses for a reason
/// that granted nothing (right after a crash it refuses grants until every lease that
/// could have been held has run out) and the wait lasts: the answer and the send time
/// of the attempt that got it. `lock_held` is `Error::LockHeld` naming `held()`.
async fn until_answered<T, F, Fut>(
    give_up_at: Instant,
    held: impl Fn() -> String,
    mut attempt: F,
) -> Result<(T, Instant), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<T, crate::error::ApiError>, Error>>,
{
    loop {
        let sent_at = Instant::now();
        let api = match attempt().await? {
            Ok(answer) => return Ok((answer, sent_at)),
            Err(api) => api,
        };
        match api.refusal {
            Some(fenced_core::Error::LockHeld { .. }) => return Err(Error::LockHeld { name: held() }),
            _ if api.retryable() && Instant::now() < give_up_at => {
                let pause = api.retry_after().unwrap_or(Duration::from_millis(200));
                tokio::time::sleep_until((Instant::now() + pause).min(give_up_at)).await;
            }
            _ => return Err(api.into_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempt_timeout_is_the_builders_else_the_environments_else_the_default() {
        let ms = Duration::from_millis;
        assert_eq!(attempt_timeout(Some(ms(40)), Some("2s".into())).unwrap(), ms(40));
        assert_eq!(attempt_timeout(None, Some("2s".into())).unwrap(), ms(2_000));
        assert_eq!(attempt_timeout(None, Some(" ".into())).unwrap(), crate::ATTEMPT_TIMEOUT_DEFAULT);
        assert_eq!(attempt_timeout(None, None).unwrap(), crate::ATTEMPT_TIMEOUT_DEFAULT);
        let bad = attempt_timeout(None, Some("soon".into())).unwrap_err();
        assert!(matches!(&bad, Error::BadRequest(m) if m.starts_with("FENCED_ATTEMPT_TIMEOUT")), "{bad:?}");
        // Below the minimum: refused where the members are made.
        let low = Client::builder().endpoint("http://127.0.0.1:1,http://127.0.0.1:2").attempt_timeout(ms(5)).build();
        assert!(matches!(low, Err(Error::BadRequest(_))));
    }
}
