//! The driver of the core lock table: owns the real monotonic clock, the token
//! ceiling, the queued acquires' reply channels and the one timer task.
//!
//! Every call takes the table mutex, reads the clock *inside* it (so the table never
//! sees time go backwards), runs the core, then `settle`s before anyone else can look:
//! the ceiling is made durable above any new token, then the effects are executed
//! (waiters answered, events published, counters bumped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use fenced_core::table::{Acquire, ReleaseReason, WaitEnd};
use fenced_core::{Effect, Grant, LeaseId, LockTable, Token, WaiterId};
use tokio::sync::{broadcast, oneshot, Notify};

use crate::events::Event;
use crate::metrics::{inc, Metrics};
use fenced_store::{MetaKey, Store};

/// How a queued acquire ends.
#[derive(Debug)]
pub enum WaitOutcome {
    Granted(Grant),
    Ended(WaitEnd),
}

struct Pending {
    tx: oneshot::Sender<WaitOutcome>,
    /// The lease this request created for itself, to revoke if nobody takes the grant.
    implicit: Option<LeaseId>,
}

/// Mutable state behind the mutex.
pub struct Inner {
    pub table: LockTable,
    waiters: HashMap<WaiterId, Pending>,
    /// Every token below this is covered by a durable ceiling.
    ceiling: u64,
    /// How far above the last token a new ceiling goes.
    token_block: u64,
    /// The deadline the timer task sleeps towards.
    armed_ms: Option<u64>,
    /// Set at shutdown: no new waits.
    closed: bool,
}

pub struct Locks {
    inner: Mutex<Inner>,
    start: Instant,
    timer: Notify,
    pub events: broadcast::Sender<Event>,
    pub metrics: Arc<Metrics>,
    store: Store,
}

impl Locks {
    /// `ceiling` must be durable already and above every token `table` has minted or
    /// will mint first; `lib.rs` commits `first_token + token_block` before serving.
    pub fn new(table: LockTable, ceiling: u64, token_block: u64, store: Store, metrics: Arc<Metrics>) -> Locks {
        let (events, _) = broadcast::channel(1024);
        Locks {
            inner: Mutex::new(Inner {
                table,
                waiters: HashMap::new(),
                ceiling,
                token_block,
                armed_ms: None,
                closed: false,
            }),
            start: Instant::now(),
            timer: Notify::new(),
            events,
            metrics,
            store,
        }
    }

    /// Milliseconds on the server's monotonic clock since start.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the table at the current time, then settles.
    pub fn with<R>(&self, f: impl FnOnce(&mut LockTable, u64) -> R) -> R {
        let mut inner = self.lock();
        let now = self.now_ms();
        let r = f(&mut inner.table, now);
        self.settle(&mut inner, now);
        r
    }

    /// Acquire: granted now, refused now, or queued with a receiver for the outcome.
    pub fn acquire(&self, req: Acquire, implicit: Option<LeaseId>) -> Result<Started, fenced_core::AcquireError> {
        let mut inner = self.lock();
        let now = self.now_ms();
        let out = inner.table.acquire(req, now);
        let started = match out {
            Err(e) => Err(e),
            Ok(fenced_core::AcquireOutcome::Granted { grant, .. }) => Ok(Started::Granted(grant)),
            Ok(fenced_core::AcquireOutcome::NotGranted { holder }) => {
                let grace = inner.table.in_grace(now);
                Ok(Started::NotGranted { holder, in_grace: grace })
            }
            Ok(fenced_core::AcquireOutcome::Queued(id)) => {
                if inner.closed {
                    inner.table.cancel_wait(id, now);
                    Ok(Started::Closed)
                } else {
                    let (tx, rx) = oneshot::channel();
                    inner.waiters.insert(id, Pending { tx, implicit });
                    Ok(Started::Queued { id, rx })
                }
            }
        };
        self.settle(&mut inner, now);
        started
    }

    /// The requester of a queued acquire went away (or timed out on its side).
    /// If the grant already arrived, it is released on the requester's behalf.
    pub fn abandon(&self, id: WaiterId, rx: &mut oneshot::Receiver<WaitOutcome>, implicit: Option<LeaseId>) {
        let mut inner = self.lock();
        let now = self.now_ms();
        inner.waiters.remove(&id);
        if let Some(lease) = implicit {
            // Ends the wait and any grant in one go.
            let _ = inner.table.revoke(lease, now);
        } else if !inner.table.cancel_wait(id, now) {
            if let Ok(WaitOutcome::Granted(g)) = rx.try_recv() {
                let _ = inner.table.release(&g.name, g.lease, now);
            }
        }
        self.settle(&mut inner, now);
    }

    /// Makes new tokens durable, executes the effects (which may produce more: a grant
    /// nobody listens for is given back), and wakes the timer task if a call armed an
    /// earlier deadline than the one it sleeps towards.
    fn settle(&self, inner: &mut Inner, now: u64) {
        loop {
            self.cover_tokens(inner);
            let effects: Vec<Effect> = inner.table.drain_effects().collect();
            if effects.is_empty() {
                break;
            }
            let mut orphans = Vec::new();
            let mut delivered = Vec::new();
            for e in effects {
                self.execute(inner, now, e, &mut orphans, &mut delivered);
            }
            for (grant, implicit) in orphans {
                // Nobody is listening for this grant any more: give it back.
                if delivered.contains(&(grant.name.clone(), grant.token)) {
                    continue;
                }
                match implicit {
                    Some(lease) => drop(inner.table.revoke(lease, now)),
                    None => drop(inner.table.release(&grant.name, grant.lease, now)),
                }
            }
        }
        let next = inner.table.poll_timeout();
        if next.is_some() && (inner.armed_ms.is_none() || next < inner.armed_ms) {
            inner.armed_ms = next;
            self.timer.notify_one();
        }
    }

    /// The durability rule for tokens: no token at or above the durable ceiling leaves
    /// this process before a higher ceiling is committed.
    fn cover_tokens(&self, inner: &mut Inner) {
        let Some(last) = inner.table.last_token() else { return };
        if last.get() < inner.ceiling {
            return;
        }
        let ceiling = last.get() + inner.token_block;
        // Rare (once per `token_block` grants): a blocking fsync under the table lock.
        if let Err(e) = self.store.set_meta_blocking(MetaKey::TokenCeiling, Some(ceiling)) {
            // Handing the token out would break monotonicity after a crash; stop instead.
            tracing::error!(error = %e, "cannot make the token ceiling durable; exiting");
            std::process::exit(70);
        }
        inner.ceiling = ceiling;
    }

    fn execute(
        &self,
        inner: &mut Inner,
        now: u64,
        e: Effect,
        orphans: &mut Vec<(Grant, Option<LeaseId>)>,
        delivered: &mut Vec<(fenced_core::LockName, Token)>,
    ) {
        let m = &self.metrics;
        match e {
            Effect::Granted { at_ms, waiter, grant } => {
                inc(&m.grants);
                self.publish(|| Event::Granted {
                    at_ms,
                    name: grant.name.to_string(),
                    token: grant.token.get(),
                    ttl_ms: grant.ttl_ms,
                });
                if let Some(p) = waiter.and_then(|w| inner.waiters.remove(&w)) {
                    if let Some(lease) = p.implicit {
                        // The implicit lease's TTL starts at its grant.
                        let _ = inner.table.keepalive(lease, now);
                    }
                    let key = (grant.name.clone(), grant.token);
                    match p.tx.send(WaitOutcome::Granted(grant)) {
                        Ok(()) => delivered.push(key),
                        Err(WaitOutcome::Granted(g)) => orphans.push((g, p.implicit)),
                        Err(_) => unreachable!("sent a grant"),
                    }
                }
            }
            Effect::Released { at_ms, name, token, reason, .. } => {
                let (counter, kind) = match reason {
                    ReleaseReason::Released => (&m.releases, "released"),
                    ReleaseReason::Revoked => (&m.revoked_releases, "revoked"),
                    ReleaseReason::Expired => (&m.expired_releases, "expired"),
                };
                inc(counter);
                let name = name.to_string();
                let token = token.get();
                if reason == ReleaseReason::Expired {
                    self.publish(|| Event::Expired { at_ms, name, token });
                } else {
                    self.publish(|| Event::Released { at_ms, name, token, reason: kind });
                }
            }
            Effect::LeaseExpired { .. } => inc(&m.lease_expiries),
            Effect::WaitEnded { waiter, reason, .. } => {
                if reason == WaitEnd::TimedOut {
                    inc(&m.wait_timeouts);
                }
                if let Some(p) = inner.waiters.remove(&waiter) {
                    let _ = p.tx.send(WaitOutcome::Ended(reason));
                }
            }
        }
    }

    pub fn publish(&self, event: impl FnOnce() -> Event) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event());
        }
    }

    /// The timer task: sleeps until the table's next deadline (or until a call arms an
    /// earlier one) and runs the due timers. Ends when `shutdown` resolves.
    pub async fn run_timers(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let next = {
                let mut inner = self.lock();
                let now = self.now_ms();
                inner.table.handle_timeout(now);
                self.settle(&mut inner, now);
                inner.armed_ms = inner.table.poll_timeout();
                inner.armed_ms
            };
            let sleep = async {
                match next {
                    Some(at) => {
                        tokio::time::sleep_until((self.start + std::time::Duration::from_millis(at)).into()).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.timer.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// At shutdown: answer every queued acquire (their senders drop) and refuse new
    /// waits. Returns the number of live leases, for the clean-shutdown record.
    pub fn close(&self) -> usize {
        let mut inner = self.lock();
        inner.closed = true;
        let ids: Vec<WaiterId> = inner.waiters.keys().copied().collect();
        let now = self.now_ms();
        for id in ids {
            if let Some(p) = inner.waiters.remove(&id) {
                inner.table.cancel_wait(id, now);
                drop(p);
            }
        }
        self.settle(&mut inner, now);
        inner.table.lease_count()
    }

    pub fn gauges(&self) -> crate::metrics::Gauges {
        let inner = self.lock();
        crate::metrics::Gauges {
            leases: inner.table.lease_count(),
            locks: inner.table.lock_count(),
            waiters: inner.table.waiter_count(),
        }
    }
}

/// How an acquire started.
pub enum Started {
    Granted(Grant),
    NotGranted {
        holder: Option<Token>,
        in_grace: bool,
    },
    Queued {
        id: WaiterId,
        rx: oneshot::Receiver<WaitOutcome>,
    },
    /// The server is shutting down.
    Closed,
}
