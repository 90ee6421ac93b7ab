//! The driver of the core lock table: the runtime around the engine. It owns the
//! monotonic clock (with stalls of the process taken out), makes durable what the table
//! asks to keep before anything leaves, delivers answers to the callers of queued
//! acquires, and runs the one timer task.
//!
//! Every change is one `Command` applied under the table mutex at a clock read inside
//! it, so the table never sees time go backwards; `settle` then executes the output in
//! its one safe order: durable writes, then effects (events, counters), then answers.
//! The rules (implicit leases, twins, lock-delay, the grace, the token ceiling) are the
//! table's: the driver only carries out what it says.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fenced_core::{
    Answer, Command, Effect, Error, Grant, LockTable, Output, Persist, ReleaseReason, RequestId, WaitEnd,
};
use tokio::sync::{broadcast, oneshot, Notify};

use crate::events::Event;
use crate::metrics::{inc, Metrics};
use fenced_store::Store;

/// The timer task reads the clock at least this often, so that a longer gap between
/// two reads means the process did not run.
const HEARTBEAT_MS: u64 = 100;
/// A gap between two clock reads longer than this is a stall of the whole process
/// (SIGSTOP, a VM frozen, a machine suspended): the lock table's time stands still
/// through it, so no lease expires and no waiter times out because the *server* was
/// not running. Leases are extended by the stall, never shortened: clients judge their
/// leases on their own clocks, so this costs liveness after a stall, never safety.
const STALL_MS: u64 = 1_000;

/// How a command's request was answered.
pub enum Reply {
    /// At once.
    Now(Result<Answer, Error>),
    /// Queued: the answer comes on `rx`. Dropping the request must withdraw it
    /// ([`Locks::withdraw`]).
    Queued { id: RequestId, rx: oneshot::Receiver<Result<Grant, Error>> },
}

/// Mutable state behind the mutex.
struct Inner {
    table: LockTable,
    /// Callers of queued acquires.
    pending: HashMap<RequestId, oneshot::Sender<Result<Grant, Error>>>,
    next_request: u64,
    /// The clock: the last raw reading, and the stalls taken out of it.
    last_raw_ms: u64,
    stalled_ms: u64,
    /// The deadline the timer task sleeps towards.
    armed_ms: Option<u64>,
    /// Set at shutdown: no new waits.
    closed: bool,
    /// Reused output buffer.
    out: Output,
}

impl Inner {
    /// The table's clock: milliseconds since start, less the stalls.
    fn now(&mut self, start: Instant) -> u64 {
        let raw = start.elapsed().as_millis() as u64;
        let gap = raw.saturating_sub(self.last_raw_ms);
        if gap > STALL_MS {
            self.stalled_ms += gap - HEARTBEAT_MS;
            tracing::warn!(stall_ms = gap, "the process did not run for {gap} ms: lock time stood still");
        }
        self.last_raw_ms = self.last_raw_ms.max(raw);
        self.last_raw_ms - self.stalled_ms
    }

    fn next_id(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }
}

pub struct Locks {
    inner: Mutex<Inner>,
    start: Instant,
    /// `Inner::stalled_ms`, for clock reads outside the mutex (event times).
    stalled_ms: AtomicU64,
    timer: Notify,
    pub events: broadcast::Sender<Event>,
    pub metrics: Arc<Metrics>,
    store: Store,
    /// Set when a durable write failed: nothing is answered any more.
    failed: AtomicBool,
    /// Woken when `failed` is set, so the server stops.
    pub fatal: Notify,
}

impl Locks {
    /// `table` comes from `LockTable::recover`, whose first writes are durable already.
    pub fn new(table: LockTable, store: Store, metrics: Arc<Metrics>) -> Locks {
        let (events, _) = broadcast::channel(1024);
        Locks {
            inner: Mutex::new(Inner {
                table,
                pending: HashMap::new(),
                next_request: 0,
                last_raw_ms: 0,
                stalled_ms: 0,
                armed_ms: None,
                closed: false,
                out: Output::default(),
            }),
            start: Instant::now(),
            stalled_ms: AtomicU64::new(0),
            timer: Notify::new(),
            events,
            metrics,
            store,
            failed: AtomicBool::new(false),
            fatal: Notify::new(),
        }
    }

    /// The lock table's clock, read outside the mutex (for event times).
    pub fn now_ms(&self) -> u64 {
        (self.start.elapsed().as_millis() as u64).saturating_sub(self.stalled_ms.load(Ordering::Relaxed))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn clock(&self, inner: &mut Inner) -> u64 {
        let now = inner.now(self.start);
        self.stalled_ms.store(inner.stalled_ms, Ordering::Relaxed);
        now
    }

    /// Applies one command now and settles its output.
    pub fn apply(&self, cmd: Command) -> Reply {
        if self.failed.load(Ordering::Acquire) {
            return Reply::Now(Err(Error::ShuttingDown));
        }
        let mut inner = self.lock();
        let now = self.clock(&mut inner);
        let id = inner.next_id();
        let mut out = std::mem::take(&mut inner.out);
        inner.table.apply_into(id, cmd, now, &mut out);
        let reply = match out.take_answer(id) {
            Some(a) => Reply::Now(a),
            None if inner.closed => {
                let cancel = inner.next_id();
                inner.table.apply_into(cancel, Command::Cancel { request: id }, now, &mut out);
                out.take_answer(cancel);
                Reply::Now(Err(Error::ShuttingDown))
            }
            None => {
                let (tx, rx) = oneshot::channel();
                inner.pending.insert(id, tx);
                Reply::Queued { id, rx }
            }
        };
        if !self.settle(&mut inner, now, out) {
            return Reply::Now(Err(Error::ShuttingDown));
        }
        reply
    }

    /// Reads the table as of now: a tick runs first when one is due, so a view never
    /// shows a lease past its expiry. The view itself changes nothing.
    pub fn view<R>(&self, f: impl FnOnce(&LockTable, u64) -> R) -> R {
        let mut inner = self.lock();
        let now = self.clock(&mut inner);
        self.tick_if_due(&mut inner, now);
        f(&inner.table, now)
    }

    /// Applies a `Tick` when a timer of the table is due at `now`.
    fn tick_if_due(&self, inner: &mut Inner, now: u64) {
        if inner.table.is_due(now) && !self.failed.load(Ordering::Acquire) {
            let id = inner.next_id();
            let mut out = std::mem::take(&mut inner.out);
            inner.table.apply_into(id, Command::Tick, now, &mut out);
            self.settle(inner, now, out);
        }
    }

    /// The caller of a queued acquire went away. The table decides what that means:
    /// the request leaves its queue, or a grant it was answered with is given back
    /// unless another request of the same lease was told of it.
    pub fn withdraw(&self, id: RequestId) {
        let _ = self.apply(Command::Cancel { request: id });
    }

    /// Executes an output: durable writes first (urgent ones before anything leaves),
    /// then effects, then answers. An answer nobody takes any more is withdrawn, which
    /// may produce more output. False when a durable write failed: then nothing of
    /// this output left, and the server stops.
    fn settle(&self, inner: &mut Inner, now: u64, mut out: Output) -> bool {
        loop {
            let urgent = out.needs_sync();
            if !out.persist.is_empty() && !self.make_durable(std::mem::take(&mut out.persist), urgent) {
                // Answers are dropped unsent: waiters hear "shutting down".
                out.clear();
                inner.out = out;
                inner.pending.clear();
                inner.closed = true;
                return false;
            }
            for e in out.effects.drain(..) {
                self.execute(e);
            }
            let mut gone = Vec::new();
            for (request, answer) in out.answers.drain(..) {
                let Some(tx) = inner.pending.remove(&request) else { continue };
                let answer = answer.map(|a| match a {
                    Answer::Granted(g) => g,
                    other => unreachable!("a queued acquire answered {other:?}"),
                });
                if tx.send(answer).is_err() {
                    gone.push(request);
                }
            }
            if gone.is_empty() {
                break;
            }
            for request in gone {
                let id = inner.next_id();
                inner.table.apply_into(id, Command::Cancel { request }, now, &mut out);
                out.take_answer(id);
            }
        }
        inner.out = out;
        let next = inner.table.poll_timeout();
        if next.is_some() && (inner.armed_ms.is_none() || next < inner.armed_ms) {
            inner.armed_ms = next;
            self.timer.notify_one();
        }
        true
    }

    /// Writes what the table asked to keep: blocking when answers must wait for it
    /// (rare: a token ceiling once per `token_block` grants, a higher TTL mark, a
    /// lock's first lock-delay), lazily otherwise.
    fn make_durable(&self, items: Vec<Persist>, urgent: bool) -> bool {
        if !urgent {
            self.store.persist_lazily(items);
            return true;
        }
        match self.store.persist_blocking(items) {
            Ok(()) => true,
            Err(e) => {
                // Answering would break a promise after the next crash (a token reused,
                // a lock-delay forgotten): stop serving instead.
                tracing::error!(error = %e, "cannot make the lock table's state durable; stopping");
                self.failed.store(true, Ordering::Release);
                self.fatal.notify_waiters();
                false
            }
        }
    }

    fn execute(&self, e: Effect) {
        let m = &self.metrics;
        match e {
            Effect::Granted { at_ms, grant, .. } => {
                inc(&m.grants);
                self.publish(|| Event::Granted {
                    at_ms,
                    name: grant.name.to_string(),
                    token: grant.token.get(),
                    ttl_ms: grant.ttl_ms,
                });
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
            Effect::WaitEnded { reason, .. } => {
                if reason == WaitEnd::TimedOut {
                    inc(&m.wait_timeouts);
                }
            }
        }
    }

    pub fn publish(&self, event: impl FnOnce() -> Event) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event());
        }
    }

    /// The timer task: ticks at the table's next deadline (or when a call arms an
    /// earlier one), and at least every `HEARTBEAT_MS` so that stalls are seen. Ends
    /// when `shutdown` resolves.
    pub async fn run_timers(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let raw_deadline_ms = {
                let mut inner = self.lock();
                let now = self.clock(&mut inner);
                self.tick_if_due(&mut inner, now);
                inner.armed_ms = inner.table.poll_timeout();
                let heartbeat = inner.last_raw_ms + HEARTBEAT_MS;
                inner.armed_ms.map_or(heartbeat, |at| (at + inner.stalled_ms).min(heartbeat))
            };
            let at = self.start + Duration::from_millis(raw_deadline_ms);
            tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {}
                _ = self.timer.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// At shutdown: answer every queued acquire (it hears "shutting down") and refuse
    /// new waits. Returns the clean-shutdown record for the next start, if any.
    pub fn close(&self) -> Option<u64> {
        let ids: Vec<RequestId> = {
            let mut inner = self.lock();
            inner.closed = true;
            inner.pending.drain().map(|(id, _)| id).collect()
        };
        for id in ids {
            self.withdraw(id);
        }
        let inner = self.lock();
        inner.table.clean_shutdown_grace_ms()
    }

    pub fn gauges(&self) -> crate::metrics::Gauges {
        self.view(|t, _| crate::metrics::Gauges {
            leases: t.lease_count(),
            locks: t.lock_count(),
            waiters: t.waiter_count(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_core::{LeaseId, Limits};
    use fenced_store::{Backend, MemoryBackend, StoreError, Txn};

    /// A disk whose every commit takes 200 ms: an answer that did not wait for its
    /// write comes back long before the write lands.
    struct SlowDisk(MemoryBackend);

    impl Backend for SlowDisk {
        fn transact(&self, body: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>) -> Result<(), StoreError> {
            std::thread::sleep(Duration::from_millis(200));
            self.0.transact(body)
        }
        fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
            self.0.kv_get(key)
        }
        fn kv_scan(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
            self.0.kv_scan(prefix, limit)
        }
    }

    /// What the disk has committed: (token ceiling, TTL mark).
    fn committed(disk: &SlowDisk) -> (u64, u64) {
        let mut out = (0, 0);
        disk.0
            .transact(&mut |t| {
                out = (t.meta_get("token_ceiling")?.unwrap_or(0), t.meta_get("ttl_ms_hwm")?.unwrap_or(0));
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn what_the_table_calls_urgent_is_durable_before_the_answer() {
        let disk = Arc::new(SlowDisk(MemoryBackend::default()));
        let (store, durable, _writer) = Store::with_backend(disk.clone()).unwrap();
        let (table, first) = LockTable::recover(Limits::default(), 2, durable);
        store.persist_blocking(first).unwrap();
        let locks = Locks::new(table, store, Arc::new(Metrics::default()));
        // A lease with a TTL above the mark: the mark is on disk when the answer is.
        let reply = locks.apply(Command::GrantLease { lease: LeaseId(1), ttl_ms: 5_000 });
        assert!(matches!(reply, Reply::Now(Ok(Answer::Lease(_)))));
        assert_eq!(committed(&disk).1, 5_000);
        // A token that reaches the ceiling: the next ceiling is on disk with the grant.
        for (i, name) in ["a", "b"].into_iter().enumerate() {
            let name = fenced_core::LockName::new(name).unwrap();
            let acquire = fenced_core::Acquire {
                name,
                lease: fenced_core::LeaseRef::Existing(LeaseId(1)),
                wait_ms: 0,
                lock_delay_ms: 0,
            };
            let Reply::Now(Ok(Answer::Granted(g))) = locks.apply(Command::Acquire(acquire)) else { panic!() };
            assert_eq!(g.token.get(), 1 + i as u64);
        }
        assert!(committed(&disk).0 > 2, "{:?}", committed(&disk));
    }
}
