//! The calls the client makes, over either transport: HTTP/JSON (`http://`,
//! `https://`) or the binary wire protocol (`fenced://`). Each answers
//! `Ok(Ok(value))`, `Ok(Err(api_error))` (the server's error, the same code and
//! details on both transports) or `Err(error)` (it could not be asked).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fenced_core::{LeaseId, LockName, Token};
use fenced_wire::Request;
use hyper::Method;
use tokio::time::Instant;

use crate::error::{bad_answer, ApiError, Error};
use crate::failover::Members;
use crate::http::{segment, Transport};
use crate::json::{self, CheckBody, GrantAllBody, GrantBody, LeaseBody, StoreBody};
use crate::mux::{Mux, Reply};
use crate::resource::StoreRead;

mod endpoint;

pub(crate) use endpoint::{Endpoint, EventSource, Implicit};

/// The server's answer: a value or its error.
pub(crate) type Answer<T> = Result<T, ApiError>;

/// One lock granted, as either transport answered it: typed from here on (the HTTP
/// edge parses its JSON into it, the wire's frame carries it typed).
#[derive(Debug)]
pub(crate) struct Granted {
    /// The lock's name, as the server granted it.
    pub name: String,
    pub token: Token,
    /// The lease it is held under.
    pub lease: LeaseId,
    pub ttl_ms: u64,
    /// The service's signature (hex), when it signs grants.
    pub signature: Option<String>,
}

/// The lock service: one endpoint, or the members of a cluster, between which a call
/// moves as `failover` describes. Cloning shares the connections and what was learnt
/// of the members.
#[derive(Clone, Debug)]
pub(crate) struct Conn {
    members: Arc<Members>,
}

/// A refusal that sends the call to the next member: nothing was done.
fn refused_as_follower(e: &ApiError) -> bool {
    e.code == "not_leader" || e.code == "shutting_down"
}

fn moves_on<T>(r: &Result<Answer<T>, Error>) -> bool {
    match r {
        Err(Error::Unavailable { .. }) => true,
        Ok(Err(e)) => refused_as_follower(e),
        _ => false,
    }
}

impl Conn {
    /// `endpoints` is one URL or several separated by commas.
    pub fn new(
        endpoints: &str,
        auth: Option<&str>,
        connect_timeout: Duration,
        request_timeout: Duration,
        attempt_timeout: Duration,
        tls: crate::http::TlsFiles<'_>,
    ) -> Result<Conn, Error> {
        let given: Vec<&str> = endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
        // With several members, a refused connection sends the call to the next member
        // at once (the rounds come back to it), rather than after backing off on it.
        let connect_attempts = if given.len() > 1 { 1 } else { crate::http::CONNECT_ATTEMPTS_MAX };
        let dial = crate::http::Dial { auth, connect_timeout, request_timeout, tls, connect_attempts };
        let list: Vec<Endpoint> = given.into_iter().map(|e| Endpoint::new(e, dial)).collect::<Result<_, _>>()?;
        if list.is_empty() {
            return Err(Error::BadRequest("no endpoint given".into()));
        }
        if attempt_timeout < crate::failover::ATTEMPT_TIMEOUT_MIN {
            return Err(Error::BadRequest(format!(
                "the attempt time-out must be at least {} ms",
                crate::failover::ATTEMPT_TIMEOUT_MIN.as_millis()
            )));
        }
        Ok(Conn { members: Arc::new(Members::new(list, attempt_timeout)) })
    }

    fn current(&self) -> &Endpoint {
        self.members.current()
    }

    pub fn endpoint(&self) -> &str {
        self.current().endpoint()
    }

    /// Every endpoint, comma-separated, the one that answered last first.
    pub fn endpoints(&self) -> String {
        self.members.current_first().map(Endpoint::endpoint).collect::<Vec<_>>().join(",")
    }

    pub fn request_timeout(&self) -> Duration {
        self.current().request_timeout()
    }

    pub fn http(&self, what: &str) -> Result<&Transport, Error> {
        self.current().http(what)
    }

    /// Runs `call` on the current member, and on the next ones while it moves on, for
    /// up to the request time-out.
    async fn each<'a, T, F, Fut>(&'a self, call: F) -> Result<Answer<T>, Error>
    where
        F: Fn(&'a Endpoint) -> Fut,
        Fut: Future<Output = Result<Answer<T>, Error>> + 'a,
    {
        let deadline = Instant::now() + self.request_timeout();
        self.members.each_by(deadline, call, moves_on).await.result
    }

    /// `GET path` as JSON over HTTP (the views), on whichever endpoint answers.
    pub async fn view(&self, what: &str, path: &str) -> Result<Answer<serde_json::Value>, Error> {
        self.call_json(what, Method::GET, path, None).await
    }

    /// A JSON call over HTTP (views and administration), on whichever endpoint takes it.
    /// An empty answer (204) is `null`.
    pub async fn call_json(
        &self,
        what: &str,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer<serde_json::Value>, Error> {
        // Membership changes wait for a new member to catch up: a longer bound.
        let timeout = self.request_timeout() * 6;
        let call = |e| {
            let method = method.clone();
            async move {
                let t = Endpoint::http(e, what)?;
                let r = match body {
                    Some(b) => t.json(method, path, b, timeout).await?,
                    None => t.send(method, path, &[], None, timeout).await?,
                };
                r.answer(|r| if r.status == 204 { Ok(serde_json::Value::Null) } else { r.json() })
            }
        };
        self.members.each_by(Instant::now() + timeout, call, moves_on).await.result
    }

    /// Opens a watch of `prefix` after `since` on whichever member answers: the event
    /// stream over HTTP, a WATCH over the wire protocol.
    pub async fn open_watch(&self, prefix: &str, since: Option<u64>) -> Result<Answer<EventSource>, Error> {
        let timeout = self.request_timeout();
        let call = |e| async move { Endpoint::open_watch(e, prefix, since, timeout).await };
        let first = self.members.each_by(Instant::now() + timeout, call, moves_on).await.result?;
        match first {
            Err(e) if e.code == "compacted" => Ok(self.open_watch_elsewhere(prefix, since, e).await),
            answer => Ok(answer),
        }
    }

    /// After the member that answered said `compacted` (a member that restarted holds
    /// its events only from its last snapshot on): each other member once, in turn, for
    /// one that still holds the events after the position. Indexes are the same on
    /// every member, so the stream resumes exactly where it was. `compacted` only when
    /// none does, or none could be asked.
    async fn open_watch_elsewhere(&self, prefix: &str, since: Option<u64>, compacted: ApiError) -> Answer<EventSource> {
        let timeout = self.request_timeout();
        for member in self.members.current_first().skip(1) {
            if let Ok(Ok(source)) = member.open_watch(prefix, since, timeout).await {
                return Ok(source);
            }
        }
        Err(compacted)
    }

    /// `GET path` answered with bytes (a backup), on whichever endpoint serves it,
    /// within `timeout`.
    pub async fn get_bytes(&self, what: &str, path: &str, timeout: Duration) -> Result<Answer<Bytes>, Error> {
        let call = |e| async move {
            let r = Endpoint::http(e, what)?.send(Method::GET, path, &[], None, timeout).await?;
            r.answer(|r| Ok(r.body))
        };
        self.members.each_by(Instant::now() + timeout, call, moves_on).await.result
    }

    /// Acquires under an implicit lease, waiting in the queue until `give_up_at`; a
    /// retry on another member waits only what is left.
    ///
    /// Every attempt names the same implicit lease, whose id is drawn here: an attempt
    /// whose answer was lost (its member died or fell silent after granting) and its
    /// retry get one grant, not two (docs/client.md). When the call ends without an
    /// answer from the service, or is dropped, that lease is revoked in the background
    /// (best effort): a grant made for a caller who left is given back at once.
    pub async fn acquire(
        &self,
        name: &LockName,
        ttl_ms: u64,
        holder: Option<&str>,
        give_up_at: Instant,
    ) -> Result<Answer<Granted>, Error> {
        self.implicit(give_up_at, ttl_ms, holder, |e, a| e.acquire(name, a)).await
    }

    /// [`acquire`](Self::acquire) for several names, all or none, under one implicit lease.
    pub async fn acquire_all(
        &self,
        names: &[LockName],
        ttl_ms: u64,
        holder: Option<&str>,
        give_up_at: Instant,
    ) -> Result<Answer<Vec<Granted>>, Error> {
        self.implicit(give_up_at, ttl_ms, holder, |e, a| e.acquire_all(names, a)).await
    }

    /// One acquire under a fresh implicit lease on the members in turn (see
    /// [`acquire`](Self::acquire)): `attempt` gets the endpoint and what to ask it (the
    /// lease, the TTL, the wait left, the holder and the attempt's time-out).
    async fn implicit<'a, T, F, Fut>(
        &'a self,
        give_up_at: Instant,
        ttl_ms: u64,
        holder: Option<&'a str>,
        attempt: F,
    ) -> Result<Answer<T>, Error>
    where
        F: Fn(&'a Endpoint, Implicit<'a>) -> Fut,
        Fut: Future<Output = Result<Answer<T>, Error>> + 'a,
    {
        let lease = random_lease_id()?;
        let mut pending = Pending { conn: self, lease, answered: false };
        let deadline = give_up_at.max(Instant::now()) + self.request_timeout();
        let each = |e: &'a Endpoint| {
            let wait_left = give_up_at.saturating_duration_since(Instant::now());
            let wait_ms = u64::try_from(wait_left.as_millis()).unwrap_or(u64::MAX);
            attempt(e, Implicit { lease, ttl_ms, wait_ms, holder, timeout: e.request_timeout() + wait_left })
        };
        let result = self.members.each_by(deadline, each, moves_on).await.result;
        // The leader's answer (a grant, or a refusal that left nothing behind): nothing
        // to undo. A transport error or a follower's refusal leaves earlier attempts
        // unknown.
        pending.answered = !moves_on(&result);
        result
    }

    pub async fn create_lease(&self, ttl_ms: u64) -> Result<Answer<(LeaseId, u64)>, Error> {
        self.each(|e| e.create_lease(ttl_ms)).await
    }

    pub async fn keepalive(&self, lease: LeaseId, timeout: Duration) -> Result<Answer<u64>, Error> {
        let deadline = Instant::now() + timeout;
        self.members.each_by(deadline, |e| e.keepalive(lease, timeout), moves_on).await.result
    }

    pub async fn revoke(&self, lease: LeaseId) -> Result<Answer<()>, Error> {
        self.each(|e| e.revoke(lease)).await
    }

    pub async fn check(&self, name: &str, token: Token) -> Result<Answer<(bool, Option<Token>)>, Error> {
        self.each(|e| e.check(name, token)).await
    }

    /// A fenced write. Retried on another member after one fell silent, the write may
    /// have been applied twice under the same token: harmless, the gate admits a token
    /// equal to the mark and nothing else can have written in between (any other
    /// writer's token is above ours and would have refused the retry). But a retry
    /// refused as stale leaves the first attempt's fate unknown (it may have landed
    /// before the newer writer), so that refusal is reported as `Unavailable`, never as
    /// a clean rejection.
    pub async fn put(
        &self,
        key: &str,
        token: Token,
        value: &[u8],
        signature: Option<&str>,
    ) -> Result<Answer<Token>, Error> {
        let deadline = Instant::now() + self.request_timeout();
        let tried = self.members.each_by(deadline, |e| e.put(key, token, value, signature), moves_on).await;
        match tried.result {
            Ok(Err(e)) if tried.uncertain && matches!(e.refusal, Some(fenced_core::Error::StaleToken { .. })) => {
                Err(Error::unavailable(format!(
                    "the write under token {token} was retried after a member fell silent and the retry was \
                     refused ({}): the first attempt may have been applied",
                    e.message
                )))
            }
            r => r,
        }
    }

    pub async fn get(
        &self,
        key: &str,
        token: Option<Token>,
        signature: Option<&str>,
    ) -> Result<Answer<StoreRead>, Error> {
        self.each(|e| e.get(key, token, signature)).await
    }
}

/// 128 bits from the OS: the id of an implicit acquire's lease.
fn random_lease_id() -> Result<LeaseId, Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| Error::unavailable(format!("no random bytes for a lease id: {e}")))?;
    Ok(LeaseId(u128::from_le_bytes(b)))
}

/// An implicit acquire the service has not answered yet. Dropped unanswered (the call
/// gave up, or its future was dropped), it revokes the lease in the background: an
/// attempt granted after its caller left would otherwise hold the lock for a TTL.
struct Pending<'a> {
    conn: &'a Conn,
    lease: LeaseId,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let (conn, lease) = (self.conn.clone(), self.lease);
        rt.spawn(async move {
            // Not found: the attempts left nothing behind.
            let _ = conn.revoke(lease).await;
        });
    }
}
