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

mod builder;
mod lock_request;

pub use builder::ClientBuilder;
use lock_request::lock_name;
pub use lock_request::LockRequest;

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
