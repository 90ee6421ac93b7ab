//! A lock asked for: its options, its attempts under one implicit lease, and the guard it
//! starts once granted.

use super::*;

/// A lock request being configured: `client.lock("orders/42").ttl(..).wait(..).acquire()`.
#[derive(Clone, Debug)]
#[must_use = "nothing is sent until acquire() or try_acquire()"]
pub struct LockRequest {
    /// Whom to ask.
    pub(super) client: Client,
    /// The name as given; checked when the request is sent.
    pub(super) name: String,
    /// The other names of a request for several locks ([`Client::lock_all`]).
    pub(super) also: Vec<String>,
    /// TTL, wait and margin.
    pub(super) options: LockOptions,
    /// The holder's label, shown in lock views and events.
    pub(super) holder: Option<String>,
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
pub(super) fn lock_name(name: &str) -> Result<LockName, Error> {
    LockName::new(name).map_err(|e| Error::BadRequest(e.to_string()))
}

/// A lock's TTL in whole milliseconds, at least 1.
pub(super) fn ttl_ms(ttl: Duration) -> Result<u64, Error> {
    match u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX) {
        0 => Err(Error::BadRequest("the TTL must be at least 1 ms".into())),
        ms => Ok(ms),
    }
}

/// Runs `attempt` until the service answers it, retrying while it refuses for a reason
/// that granted nothing (right after a crash it refuses grants until every lease that
/// could have been held has run out) and the wait lasts: the answer and the send time
/// of the attempt that got it. `lock_held` is `Error::LockHeld` naming `held()`.
pub(super) async fn until_answered<T, F, Fut>(
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
