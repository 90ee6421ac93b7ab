//! An etcd lock whose fencing token is the lock key's `create_revision`, with the same
//! client-side deadline and lost-lock signal as [`crate::LockGuard`], for users whose
//! lock service is etcd (`fenced exec --lock-service etcd://HOST:PORT`).
//!
//! etcd's recipe, as its own `concurrency.Session` and `Mutex` do it: a lease kept alive
//! every third of its TTL from its grant (while `Lock` waits in line too: a queued key
//! whose lease ran out is deleted, and etcd 3.4 still answers that `Lock` with success),
//! `Lock` on it, then the `create_revision` of the key `Lock` answered: that is the token
//! (waiters queue in that order, so each holder of one lock has a higher one than every
//! holder before it), and a key that is gone was never held. The `Lock` answer's header
//! revision is not a token: it is the store's revision when etcd answered.
//!
//! The deadline is the guard's: the send time of the last keepalive etcd answered with
//! a live lease, plus the TTL, minus a tenth of it.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Etcd;
use crate::error::{Error, LostReason};
use crate::foreign::{Lease, Renewal};
use crate::Token;

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
    /// Takes lock `name` under a new lease of `ttl` (whole seconds, at least 1),
    /// waiting in etcd's line at most `wait` (plus the request time-out).
    /// `Error::LockHeld` when not granted in time.
    pub async fn acquire(&self, name: &str, ttl: Duration, wait: Duration) -> Result<EtcdGuard, Error> {
        let ttl = Duration::from_secs(ttl.as_secs().max(1));
        let sent = Instant::now();
        let lease = self.lease_grant(ttl.as_secs() as i64).await?;
        let shared = Arc::new(Lease::new(sent, ttl));
        let keeper = tokio::spawn(keep_alive(self.clone(), lease, shared.clone()));
        let revoke = |e: Error| async {
            keeper.abort();
            let _ = self.lease_revoke(lease).await;
            e
        };
        let key = match self.lock(name.as_bytes(), lease, wait + self.request_timeout).await {
            Ok(Some(locked)) => locked.key,
            Ok(None) => return Err(revoke(Error::LockHeld { name: name.to_owned() }).await),
            Err(e) => return Err(revoke(e).await),
        };
        let revision = match self.create_revision(&key).await {
            Ok(r) => r,
            Err(e) => return Err(revoke(e).await),
        };
        let Some(token) = revision.and_then(|r| u64::try_from(r).ok()).and_then(Token::new) else {
            let gone = Error::LockHeld { name: format!("{name} (granted for a key that is gone: its lease expired)") };
            return Err(revoke(gone).await);
        };
        Ok(EtcdGuard { etcd: self.clone(), name: name.to_owned(), key, lease, token, shared, keeper })
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
        let unlock = self.etcd.unlock(&self.key).await;
        let revoke = self.etcd.lease_revoke(self.lease).await;
        if let Some(reason) = lost {
            return Err(Error::Lost(reason));
        }
        unlock?;
        match revoke {
            Err(Error::NotFound(_)) => Err(Error::Lost(LostReason::LeaseNotFound)),
            other => other,
        }
    }
}

impl Drop for EtcdGuard {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Renews `lease` every third of its TTL (etcd's keepalive answers the TTL left, 0 for
/// a lease it no longer knows), moving the guard's deadline on.
async fn keep_alive(etcd: Etcd, lease: i64, shared: Arc<Lease>) {
    shared
        .keep(|| async {
            match etcd.lease_keep_alive(lease).await {
                Ok(ttl_s) if ttl_s > 0 => Renewal::Alive,
                Ok(_) | Err(Error::NotFound(_)) => Renewal::Gone,
                Err(_) => Renewal::Failed,
            }
        })
        .await
}
