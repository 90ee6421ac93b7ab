//! What the guards of other lock services (etcd, ZooKeeper) share with Fenced's own:
//! the client-side deadline and the lost-lock signal, moved on by a renewal loop.
//!
//! The deadline is the send time of the last renewal the service answered with the lock
//! still alive, plus the TTL, minus a tenth of it; past it the lock is lost, whatever
//! the service says later. Lost is final.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use crate::error::LostReason;

/// A lease as the client sees it.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The client-side deadline.
    valid_until: Mutex<Instant>,
    /// `Some` once lost.
    lost: watch::Sender<Option<LostReason>>,
    ttl: Duration,
}

/// What one renewal came to.
pub(crate) enum Renewal {
    /// The service answered: the lock is still alive.
    Alive,
    /// The service answered: the lease (or session, or lock node) is gone.
    Gone,
    /// No answer that says either (in transit): try again while the deadline allows.
    Failed,
}

impl Lease {
    /// A lease whose TTL started no earlier than `sent`.
    pub(crate) fn new(sent: Instant, ttl: Duration) -> Lease {
        let (lost, _) = watch::channel(None);
        Lease { valid_until: Mutex::new(sent + ttl - ttl / 10), lost, ttl }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().expect("deadline lock")
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
    }

    fn lose(&self, reason: LostReason) {
        self.lost.send_if_modified(|r| r.is_none() && r.replace(reason).is_none());
    }

    /// Resolves when the lock is lost.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.lost.subscribe();
        async move {
            loop {
                if let Some(r) = *rx.borrow_and_update() {
                    return r;
                }
                if rx.changed().await.is_err() {
                    // The guard is gone: nothing will ever be lost now.
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Renews every third of the TTL with `renew`, moving the deadline on from each
    /// answered renewal's send time, until the lock is lost (the service says it is
    /// gone, or the deadline passes without an answer). Runs until aborted or lost.
    pub(crate) async fn keep<F, Fut>(&self, mut renew: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Renewal>,
    {
        loop {
            let deadline = self.valid_until();
            let next = (Instant::now() + self.ttl / 3).min(deadline);
            sleep(next.saturating_duration_since(Instant::now())).await;
            let sent = Instant::now();
            if sent >= deadline {
                return self.lose(LostReason::Expired);
            }
            match timeout(deadline - sent, renew()).await {
                Ok(Renewal::Alive) if Instant::now() >= deadline => return self.lose(LostReason::KeepaliveTooLate),
                Ok(Renewal::Alive) => {
                    *self.valid_until.lock().expect("deadline lock") = sent + self.ttl - self.ttl / 10
                }
                Ok(Renewal::Gone) => return self.lose(LostReason::LeaseNotFound),
                Ok(Renewal::Failed) => {}
                Err(_) => return self.lose(LostReason::Expired),
            }
        }
    }
}
