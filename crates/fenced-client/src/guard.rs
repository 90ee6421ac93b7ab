//! The lock guard: the grant, a background keepalive, and an honest lost-lock signal.
//!
//! The guard trusts its own monotonic clock, not the server: it is valid until the send
//! time of its last successful acquire or keepalive plus the TTL minus a margin. A
//! keepalive that the server refuses, or that cannot come back before that deadline,
//! moves the guard to lost at once; a timer moves it to lost at the deadline if no
//! keepalive succeeded. Lost is final.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fenced_core::{LeaseId, LockName, Token};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::conn::Conn;
use crate::error::{Error, LostReason};
use crate::validity;

/// A held lock. Dropping it stops the keepalive and releases the lock in the
/// background (best effort); call [`LockGuard::release`] to know that it happened.
#[derive(Debug)]
pub struct LockGuard {
    /// State shared with the keepalive task.
    shared: Arc<Shared>,
    /// The lock service, for release.
    conn: Conn,
    /// Stops the keepalive task on release or drop.
    stop: CancellationToken,
    /// The keepalive task, awaited on release.
    task: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    /// The lock's name.
    name: LockName,
    /// The grant's fencing token.
    token: Token,
    /// The other locks of a set acquired together, with their tokens.
    also: Vec<(LockName, Token)>,
    /// The service's signatures (hex), in the order of `tokens()`; empty when it does not sign.
    signatures: Vec<String>,
    /// The lease the lock is held under; only this guard uses it.
    lease_id: LeaseId,
    /// The lease's TTL as the server granted it.
    ttl: Duration,
    /// Kept below the TTL in the client-side deadline.
    margin: Duration,
    /// The client-side deadline; only moves forward.
    valid_until: Mutex<Instant>,
    /// Cancelled once, when the lock is lost.
    lost: CancellationToken,
    /// Why it was lost; set before `lost` is cancelled.
    reason: OnceLock<LostReason>,
    /// Test hook: while set, the keepalive task skips its keepalives.
    keepalive_paused: AtomicBool,
}

impl Shared {
    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().expect("valid_until lock")
    }

    fn extend(&self, sent_at: Instant, ttl: Duration) {
        let mut v = self.valid_until.lock().expect("valid_until lock");
        let next = validity::valid_until(sent_at, ttl.min(self.ttl), self.margin);
        if next > *v {
            *v = next;
        }
    }

    fn mark_lost(&self, reason: LostReason) {
        let _ = self.reason.set(reason);
        self.lost.cancel();
    }
}

/// A fencing token with the service's signature for the lock it was granted for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedToken {
    /// The lock the token was granted for.
    pub lock: LockName,
    pub token: Token,
    /// The Ed25519 signature over the service's identity, the lock and the token (hex).
    pub signature: String,
}

/// What the lock request produced, before the guard starts its keepalive.
pub(crate) struct Grant {
    /// The lock granted.
    pub name: LockName,
    /// Its fencing token.
    pub token: Token,
    /// The other locks of a set acquired together, with their tokens.
    pub also: Vec<(LockName, Token)>,
    /// The service's signatures (hex), the lock's first, then `also`'s; none when it
    /// does not sign grants.
    pub signatures: Vec<String>,
    /// The implicit lease created for this grant alone.
    pub lease_id: LeaseId,
    /// The lease's TTL as granted.
    pub ttl: Duration,
    /// Kept below the TTL in the client-side deadline.
    pub margin: Duration,
    /// When the acquire that produced the grant was sent.
    pub sent_at: Instant,
}

impl LockGuard {
    pub(crate) fn start(grant: Grant, conn: Conn) -> LockGuard {
        let shared = Arc::new(Shared {
            name: grant.name,
            token: grant.token,
            also: grant.also,
            signatures: grant.signatures,
            lease_id: grant.lease_id,
            ttl: grant.ttl,
            margin: grant.margin,
            valid_until: Mutex::new(validity::valid_until(grant.sent_at, grant.ttl, grant.margin)),
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            keepalive_paused: AtomicBool::new(false),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(keepalive_loop(shared.clone(), conn.clone(), stop.clone(), grant.sent_at));
        LockGuard { shared, conn, stop, task: Some(task) }
    }

    /// Every lock this guard holds with its token: one for a lock, one per name, in
    /// sorted order, for a set acquired together (each resource gets its own lock's).
    pub fn tokens(&self) -> Vec<(LockName, Token)> {
        std::iter::once((self.shared.name.clone(), self.shared.token)).chain(self.shared.also.iter().cloned()).collect()
    }

    /// The token with the service's signature for its lock, when the service signs
    /// grants (`grant_signing_key`): what a gate given the verifying keys asks for
    /// (a key under the server's `signed_key_prefix`, a [`Verified`](crate::resource::Verified) gate).
    pub fn signed(&self) -> Option<SignedToken> {
        self.signed_tokens().into_iter().next()
    }

    /// Every lock this guard holds with its token and signature, in the order of
    /// [`tokens`](Self::tokens); empty when the service does not sign grants.
    pub fn signed_tokens(&self) -> Vec<SignedToken> {
        let tokens = self.tokens().into_iter();
        tokens
            .zip(&self.shared.signatures)
            .map(|((lock, token), signature)| SignedToken { lock, token, signature: signature.clone() })
            .collect()
    }

    /// The fencing token of this grant: pass it with every operation on the resource.
    pub fn token(&self) -> Token {
        self.shared.token
    }

    /// The lease the lock is held under.
    pub fn lease_id(&self) -> LeaseId {
        self.shared.lease_id
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// The lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The client-side deadline: past it the guard is lost whatever the server says.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// Whether the lock can still be trusted right now: not lost, and before `valid_until`.
    /// Checks the clock itself, so it is exact even before the timer task has run.
    pub fn is_valid(&self) -> bool {
        self.lost_reason().is_none() && Instant::now() < self.valid_until()
    }

    /// The token if the lock can still be trusted, `Error::Lost` otherwise.
    pub fn check(&self) -> Result<Token, Error> {
        if let Some(reason) = self.lost_reason() {
            return Err(Error::Lost(reason));
        }
        if Instant::now() >= self.valid_until() {
            return Err(Error::Lost(LostReason::Expired));
        }
        Ok(self.token())
    }

    /// Why the lock was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.reason.get().copied()
    }

    /// Resolves when the lock is lost or can no longer be trusted. Does not borrow the
    /// guard, so it can be awaited beside work that uses it.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let shared = self.shared.clone();
        async move {
            shared.lost.cancelled().await;
            shared.reason.get().copied().expect("reason is set before the signal")
        }
    }

    /// A token cancelled when the lock is lost, for work to select on. Cancelling it
    /// yourself does not touch the lock.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Test hook: stops (or resumes) sending keepalives, as a long pause of this
    /// process would. The deadline timer keeps running, which is the point.
    #[doc(hidden)]
    pub fn pause_keepalive(&self, paused: bool) {
        self.shared.keepalive_paused.store(paused, Ordering::SeqCst);
    }

    /// Releases the lock and ends its lease. Returns `Error::Lost` if the lock had been
    /// lost before (the work done under it may not have been exclusive).
    pub async fn release(mut self) -> Result<(), Error> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let result = release_on_server(&self.conn, &self.shared).await;
        match self.lost_reason() {
            Some(reason) => Err(Error::Lost(reason)),
            None => result,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        self.stop.cancel();
        task.abort();
        // Best effort: without a runtime (or while it shuts down) the lease simply expires.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (conn, shared) = (self.conn.clone(), self.shared.clone());
            handle.spawn(async move {
                let _ = release_on_server(&conn, &shared).await;
            });
        }
    }
}

/// Gives the lock (or set) back by ending its implicit lease, which only this guard
/// used: one command, which releases every lock of the lease (reported as released).
/// A lease the server no longer knows is already released.
async fn release_on_server(conn: &Conn, shared: &Shared) -> Result<(), Error> {
    match conn.revoke(shared.lease_id).await? {
        Err(e) if !e.lease_gone() => Err(e.into_error()),
        _ => Ok(()),
    }
}

/// Keeps the lease alive at a third of the TTL and fires the lost signal at the
/// client-side deadline when no keepalive got through. Retries a keepalive that failed
/// in transit (keepalive is idempotent) for as long as the deadline allows.
async fn keepalive_loop(shared: Arc<Shared>, conn: Conn, stop: CancellationToken, sent_at: Instant) {
    let lease = shared.lease_id;
    let retry_step = (shared.ttl / 10).max(Duration::from_millis(10));
    let mut next = validity::next_keepalive(sent_at, shared.ttl);
    loop {
        let deadline = shared.valid_until();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep_until(deadline) => return shared.mark_lost(LostReason::Expired),
            _ = sleep_until(next) => {}
        }
        if shared.keepalive_paused.load(Ordering::SeqCst) {
            next = Instant::now() + retry_step;
            continue;
        }
        let sent_at = Instant::now();
        let attempt = tokio::select! {
            _ = stop.cancelled() => return,
            r = timeout_at(deadline, conn.keepalive(lease, conn.request_timeout())) => r,
        };
        let response = match attempt {
            // The answer could not arrive before the deadline: the lease may be gone.
            Err(_elapsed) => return shared.mark_lost(LostReason::Expired),
            Ok(Err(_transient)) => {
                next = Instant::now() + retry_step;
                continue;
            }
            Ok(Ok(r)) => r,
        };
        if Instant::now() >= deadline {
            return shared.mark_lost(LostReason::KeepaliveTooLate);
        }
        match response {
            Ok(ttl_ms) => {
                shared.extend(sent_at, Duration::from_millis(ttl_ms));
                next = validity::next_keepalive(sent_at, shared.ttl);
            }
            Err(e) if e.lease_gone() => return shared.mark_lost(LostReason::LeaseNotFound),
            Err(e) if e.unauthorised() => return shared.mark_lost(LostReason::Unauthorised),
            Err(_) => next = Instant::now() + retry_step,
        }
    }
}
