//! The driver of the replicated lock table: the runtime around the engine.
//!
//! Every change is a `Command` proposed to the node's log ([`fenced_raft::Node`]) under
//! a request id; the answer comes back only when the entry is committed and applied (on
//! a single node: written and fsynced, one fsync per group of commands that arrived
//! together). The state machine hands every applied output to [`Router`], which runs its
//! effects (events, counters) and delivers answers to the callers waiting on this node:
//! the command's own, and later those of queued acquires. An answer nobody takes any
//! more becomes `Command::Cancel`, as before: the table decides what a departure means.
//!
//! Time, expiry and the token counter are the log's: this driver reads no clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use fenced_core::{
    Answer, Command, Effect, Error, Grant, LeaseInfo, LockTable, Op, Output, ReleaseReason, RequestId, StoreAnswer,
    StoreOutcome, Token, WaitEnd,
};
use fenced_raft::{Applied, Node, NodeId, Refusals};
use tokio::sync::oneshot;

use crate::events::{Event, EventLog, Indexed};
use crate::metrics::{inc, Metrics};

/// What one kind of command answers, narrowed from [`Answer`]: the one place an answer
/// is matched against the command that asked for it. A mismatch is this server's bug:
/// [`Unanswered::Mismatch`], answered 500 `internal` and logged, never a panic in a
/// handler.
pub trait Narrow: Sized {
    /// The command's answer, for the log line of a mismatch.
    const WHAT: &'static str;
    /// The answer as `Self`, or given back when it is of another kind.
    fn narrow(answer: Answer) -> Result<Self, Answer>;
}

/// [`Narrow`] for a type that is the payload of one variant of [`Answer`].
macro_rules! narrow_to_one {
    ($ty:ty, $what:literal, $variant:ident) => {
        impl Narrow for $ty {
            const WHAT: &'static str = $what;
            fn narrow(answer: Answer) -> Result<$ty, Answer> {
                match answer {
                    Answer::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    };
}

narrow_to_one!(Grant, "a grant", Granted);

/// An acquire of several names: one grant per name, in the names' sorted order.
impl Narrow for Vec<Grant> {
    const WHAT: &'static str = "grants";
    fn narrow(answer: Answer) -> Result<Vec<Grant>, Answer> {
        match answer {
            Answer::GrantedAll(grants) => Ok(grants),
            Answer::Granted(g) => Ok(vec![g]),
            other => Err(other),
        }
    }
}

// A release or an operator's revoke: the released grant's token.
narrow_to_one!(Token, "a released token", Released);
narrow_to_one!(LeaseInfo, "a lease", Lease);
narrow_to_one!(StoreAnswer, "a store answer", Store);

/// A lease's revoke: done.
impl Narrow for () {
    const WHAT: &'static str = "done";
    fn narrow(answer: Answer) -> Result<(), Answer> {
        match answer {
            Answer::Done => Ok(()),
            other => Err(other),
        }
    }
}

/// Why a command has no answer of its kind.
#[derive(Debug)]
pub enum Unanswered {
    /// The table (or the log) refused it.
    Refused(Error),
    /// It was answered with another kind of answer, or queued where it never queues.
    Mismatch(String),
}

impl From<Error> for Unanswered {
    fn from(e: Error) -> Unanswered {
        Unanswered::Refused(e)
    }
}

/// `answer` narrowed to `T`.
pub fn narrow<T: Narrow>(answer: Result<Answer, Error>) -> Result<T, Unanswered> {
    T::narrow(answer?).map_err(|other| Unanswered::Mismatch(format!("expected {}, answered {other:?}", T::WHAT)))
}

/// How a command's request was answered.
pub enum Reply {
    /// With its entry.
    Now(Result<Answer, Error>),
    /// Queued: the answer comes on `rx`. Dropping the request must withdraw it
    /// ([`Locks::withdraw`]).
    Queued { id: RequestId, rx: oneshot::Receiver<Result<Answer, Error>> },
}

/// What a caller on this node hears first.
enum Step {
    Answer(Result<Answer, Error>),
    Queued(oneshot::Receiver<Result<Answer, Error>>),
}

enum Slot {
    Now(oneshot::Sender<Step>),
    Later(oneshot::Sender<Result<Answer, Error>>),
}

/// Where applied output goes: the callers waiting here, the events, the counters.
pub struct Router {
    pending: Mutex<HashMap<RequestId, Slot>>,
    /// The recent events, numbered, for every watcher on this member.
    pub events: Arc<EventLog>,
    pub metrics: Arc<Metrics>,
    /// Where a request whose caller left after it was granted (or queued) is withdrawn:
    /// its `Cancel` is proposed at once, with no queue of its own between (set by
    /// [`Locks::new`]; before, no caller waits here).
    node: OnceLock<Weak<Node>>,
}

impl Router {
    pub fn new(metrics: Arc<Metrics>, events_retained: usize) -> Arc<Router> {
        let events = Arc::new(EventLog::new(events_retained));
        Arc::new(Router { pending: Mutex::new(HashMap::new()), events, metrics, node: OnceLock::new() })
    }

    /// Withdraws `request`, whose caller left: proposes its `Cancel` (an internal
    /// command, never refused for room: it follows a request already admitted, so the
    /// waiting proposals stay bounded by what was admitted). Off the leader the
    /// proposal is refused, and the new leader's `Promote` clears what nobody waits for.
    fn withdraw(&self, request: RequestId) {
        if let Some(node) = self.node.get().and_then(Weak::upgrade) {
            let _ = node.propose(fenced_raft::state_machine::NO_REQUEST, Command::Cancel { request });
        }
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<RequestId, Slot>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, request: RequestId, answer: Result<Answer, Error>) {
        let Some(slot) = self.pending().remove(&request) else { return };
        let granted = matches!(answer, Ok(Answer::Granted(_) | Answer::GrantedAll(_)));
        let taken = match slot {
            Slot::Now(tx) => tx.send(Step::Answer(answer)).is_ok(),
            Slot::Later(tx) => tx.send(answer).is_ok(),
        };
        if !taken && granted {
            self.withdraw(request);
        }
    }

    /// Counts the effect, and returns the event it is, if it is one.
    fn execute(&self, e: Effect) -> Option<Event> {
        let m = &self.metrics;
        match e {
            Effect::Granted { at_ms, grant, holder, .. } => {
                inc(&m.grants);
                Some(Event::Granted {
                    at_ms,
                    name: grant.name.to_string(),
                    token: grant.token.get(),
                    ttl_ms: grant.ttl_ms,
                    holder,
                })
            }
            Effect::Released { at_ms, name, token, reason, .. } => {
                let (counter, kind) = match reason {
                    ReleaseReason::Released => (&m.releases, "released"),
                    ReleaseReason::Revoked => (&m.revoked_releases, "revoked"),
                    ReleaseReason::Expired => (&m.expired_releases, "expired"),
                    ReleaseReason::Forced => (&m.forced_releases, "forced"),
                };
                inc(counter);
                let name = name.to_string();
                let token = token.get();
                Some(if reason == ReleaseReason::Expired {
                    Event::Expired { at_ms, name, token }
                } else {
                    Event::Released { at_ms, name, token, reason: kind }
                })
            }
            Effect::LeaseExpired { .. } => {
                inc(&m.lease_expiries);
                None
            }
            Effect::StoreFenced { at_ms, key, op, token, outcome } => self.store_fenced(at_ms, key, op, token, outcome),
            Effect::WaitEnded { reason, .. } => {
                if reason == WaitEnd::TimedOut {
                    inc(&m.wait_timeouts);
                }
                None
            }
        }
    }

    /// The fenced store's gate decided: counted, and published, on every member that
    /// applies the entry (so a follower's event stream has the store's events too).
    fn store_fenced(&self, at_ms: u64, key: String, op: Op, token: Token, outcome: StoreOutcome) -> Option<Event> {
        let m = &self.metrics;
        let (op, token) = (if op == Op::Write { "write" } else { "read" }, token.get());
        match outcome {
            StoreOutcome::Accepted => {
                if op == "write" {
                    inc(&m.store_writes_accepted);
                }
                Some(Event::StoreAccepted { at_ms, key, token, op })
            }
            StoreOutcome::Stale { highest_seen } => {
                inc(if op == "write" { &m.stale_writes_rejected } else { &m.stale_reads_rejected });
                Some(Event::StoreRejected { at_ms, key, token, highest_seen: highest_seen.get(), op })
            }
            StoreOutcome::NotIssued => {
                inc(&m.tokens_not_issued);
                None
            }
        }
    }

    /// Tells every caller still waiting here `error` (shutdown, leadership lost).
    fn fail_all(&self, error: Error) {
        let slots: Vec<Slot> = self.pending().drain().map(|(_, s)| s).collect();
        for slot in slots {
            match slot {
                Slot::Now(tx) => drop(tx.send(Step::Answer(Err(error.clone())))),
                Slot::Later(tx) => drop(tx.send(Err(error.clone()))),
            }
        }
    }
}

impl Applied for Router {
    fn reset(&self, effects_seq: u64) {
        self.events.reset(effects_seq);
    }

    fn applied(&self, out: &mut Output) {
        // Effects first: an event never trails the answer it explains.
        let first = out.effects_through + 1 - out.effects.len() as u64;
        let events: Vec<Indexed> = (first..)
            .zip(out.effects.drain(..))
            .filter_map(|(index, e)| self.execute(e).map(|event| Indexed { index, event }))
            .collect();
        self.events.append(events, out.effects_through);
        for (request, answer) in out.answers.drain(..) {
            self.deliver(request, answer);
        }
        for id in out.queued.drain(..) {
            let mut pending = self.pending();
            if let Some(Slot::Now(tx)) = pending.remove(&id) {
                let (later, rx) = oneshot::channel();
                pending.insert(id, Slot::Later(later));
                drop(pending);
                if tx.send(Step::Queued(rx)).is_err() {
                    // The caller left before it heard: withdraw the request.
                    self.pending().remove(&id);
                    self.withdraw(id);
                }
            }
        }
    }
}

impl Refusals for Router {
    fn refused(&self, requests: &[RequestId], error: Error) {
        for r in requests {
            self.deliver(*r, Err(error.clone()));
        }
    }

    fn leadership_lost(&self, leader: Option<NodeId>) {
        self.fail_all(Error::NotLeader { leader });
    }
}

pub struct Locks {
    pub node: Arc<Node>,
    router: Arc<Router>,
    /// Request ids are unique across the cluster and across restarts, because every
    /// member applies every entry and routes answers by id to its own callers: the
    /// high 16 bits are the node id, the next 16 a random draw at start (this process),
    /// the low 32 a counter (it wraps after 4 billion requests, long after any request
    /// that used the id has ended: a wait is bounded by `wait_ms_max`).
    id_prefix: u64,
    next_request: AtomicU64,
    pub events: Arc<EventLog>,
}

impl Locks {
    /// The driver of `node`, whose applied output goes to `router`.
    pub fn new(node: Arc<Node>, router: Arc<Router>) -> Arc<Locks> {
        let mut draw = [0u8; 2];
        // Without OS randomness the clock's nanoseconds still tell two starts apart.
        if getrandom::fill(&mut draw).is_err() {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            draw = (nanos.subsec_nanos() as u16).to_le_bytes();
        }
        let incarnation = u16::from_le_bytes(draw) as u64;
        // Never 0: that is the log's "nobody waits" id (node ids start at 1).
        let id_prefix = ((node.id() & 0xffff).max(1) << 48) | (incarnation << 32);
        let _ = router.node.set(Arc::downgrade(&node));
        Arc::new(Locks { node, events: router.events.clone(), router, id_prefix, next_request: AtomicU64::new(1) })
    }

    fn next_id(&self) -> RequestId {
        RequestId(self.id_prefix | (self.next_request.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff))
    }

    /// Proposes one command and waits for its entry to be applied. Dropping the future
    /// before the answer withdraws nothing by itself; a grant that finds its caller gone
    /// is given back (the router proposes `Cancel`).
    pub async fn apply(&self, cmd: Command) -> Reply {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        self.router.pending().insert(id, Slot::Now(tx));
        if let Err(refused) = self.node.propose(id, cmd) {
            self.router.pending().remove(&id);
            return Reply::Now(Err(refused));
        }
        match rx.await {
            Ok(Step::Answer(a)) => Reply::Now(a),
            Ok(Step::Queued(rx)) => Reply::Queued { id, rx },
            Err(_) => Reply::Now(Err(Error::ShuttingDown)),
        }
    }

    /// [`apply`](Self::apply) for a command answered with its entry (every command but
    /// an acquire, which may queue), narrowed to its kind of answer.
    pub async fn answered<T: Narrow>(&self, cmd: Command) -> Result<T, Unanswered> {
        match self.apply(cmd).await {
            Reply::Now(answer) => narrow(answer),
            Reply::Queued { id, .. } => {
                self.withdraw(id);
                Err(Unanswered::Mismatch(format!("expected {} at once, the command was queued", T::WHAT)))
            }
        }
    }

    /// Reads the table as of the last applied entry (no quorum round): for metrics and
    /// what may be a moment old.
    pub fn view<R>(&self, f: impl FnOnce(&LockTable, u64) -> R) -> R {
        let st = self.node.state_machine().state();
        f(&st.table, st.table.now_ms())
    }

    /// Reads the table after a quorum confirmed this node still leads and the table
    /// reflects every entry committed before the call (ReadIndex): what `check`, fenced
    /// reads and lock views see is never stale.
    pub async fn read<R>(&self, f: impl FnOnce(&LockTable, u64) -> R) -> Result<R, Error> {
        #[cfg(feature = "fault-injection")]
        if fenced_raft::fault::broken("read-local") {
            return Ok(self.view(f));
        }
        self.node.linearize().await.map_err(Error::from)?;
        Ok(self.view(f))
    }

    /// The caller of a queued acquire went away. The table decides what that means:
    /// the request leaves its queue, or a grant it was answered with is given back
    /// unless another request of the same lease was told of it.
    pub fn withdraw(&self, id: RequestId) {
        self.router.pending().remove(&id);
        let _ = self.node.propose(fenced_raft::state_machine::NO_REQUEST, Command::Cancel { request: id });
    }

    /// At shutdown: every caller still waiting hears "shutting down".
    pub fn close(&self) {
        self.router.fail_all(Error::ShuttingDown);
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
    use fenced_core::{LeaseId, LockName};

    use super::*;

    fn grant() -> Grant {
        Grant { name: LockName::new("a").unwrap(), token: Token::FIRST, lease: LeaseId(7), ttl_ms: 1_000 }
    }

    #[test]
    fn each_kind_of_answer_narrows_to_its_own_and_nothing_else() {
        assert_eq!(narrow::<Grant>(Ok(Answer::Granted(grant()))).unwrap(), grant());
        assert_eq!(narrow::<Vec<Grant>>(Ok(Answer::Granted(grant()))).unwrap(), vec![grant()]);
        assert_eq!(narrow::<Token>(Ok(Answer::Released(Token::FIRST))).unwrap(), Token::FIRST);
        narrow::<()>(Ok(Answer::Done)).unwrap();
        // Another kind: the server's bug, named, never a panic.
        match narrow::<Token>(Ok(Answer::Granted(grant()))) {
            Err(Unanswered::Mismatch(why)) => assert!(why.starts_with("expected a released token, answered Granted")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(narrow::<()>(Ok(Answer::Store(StoreAnswer::Done))), Err(Unanswered::Mismatch(_))));
        // A refusal stays the table's error.
        assert!(matches!(narrow::<Grant>(Err(Error::LeaseNotFound)), Err(Unanswered::Refused(Error::LeaseNotFound))));
    }
}
