//! Moving between the members of a cluster: which member a call goes to, when it moves
//! on, and how a silent member is told from a busy one.
//!
//! A call goes to the member that answered last. It moves on when that member cannot
//! be reached, answers that it is not the leader (or is shutting down), or falls
//! silent; round after round (100 ms apart) until the call's deadline.
//!
//! **Silent or busy.** A member may hold a request for long on purpose: a blocking
//! acquire parks in the lock's queue, a membership change waits for a learner. So the
//! request itself gets no deadline of its own; the *member* does. When a request has
//! had no answer for half the attempt time-out, the member is asked whether it is
//! alive (`GET /readyz` over HTTP, which also says whether it leads; an `AUTH` on the
//! wire; both answered by the member alone, no quorum round), and must say so within
//! the other half. While it does, the request keeps waiting,
//! however long its wait; a member that answers nothing for the whole attempt time-out
//! (SIGSTOP, a lost host, a cut link) is left, and skipped by every call for one
//! attempt time-out. Any answer from a member counts as such a proof for the calls
//! waiting on it, so a busy leader is not probed once per request.
//!
//! Leaving a request does not undo it: the silent member may have applied it before it
//! fell silent. The call reports that it was retried after such an attempt
//! ([`Tried::uncertain`]); each call decides what that means for its answer.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{sleep, sleep_until, Instant};

use crate::conn::Endpoint;
use crate::error::Error;

/// A pause between rounds over every member while none takes the call.
const ROUND_PAUSE: Duration = Duration::from_millis(100);

/// The default attempt time-out: a cluster's default election time-out (300 to
/// 600 ms) plus a margin, so that a client that leaves a silent leader usually finds
/// its successor in office, and far below the request time-out.
pub const ATTEMPT_TIMEOUT_DEFAULT: Duration = Duration::from_millis(750);

/// The shortest attempt time-out: half of it is the probe's bound, which must leave
/// a live member on loopback time to answer.
pub const ATTEMPT_TIMEOUT_MIN: Duration = Duration::from_millis(20);

/// The members a client knows and what it has learnt of them. Shared by the clones of a
/// client.
#[derive(Debug)]
pub(crate) struct Members {
    /// In the order given.
    pub endpoints: Box<[Endpoint]>,
    /// The member that answered last.
    current: AtomicUsize,
    /// One per endpoint.
    health: Box<[Health]>,
    /// How long a member may leave a request and a probe unanswered before a call
    /// moves on (only with several members).
    attempt_timeout: Duration,
    /// The origin of `health`'s millisecond stamps.
    epoch: Instant,
}

/// What calls have seen of one member, in milliseconds since `Members::epoch` (plus
/// one, so that zero is "never").
#[derive(Debug, Default)]
struct Health {
    /// Its last answer (or probe) showing it alive and not refusing as a follower.
    answered_ms: AtomicU64,
    /// Calls skip it until then: it was found silent.
    silent_until_ms: AtomicU64,
}

/// A call's result, and whether it was retried after an attempt that may have reached
/// a member (a member left silent, or a connection broken after the send).
pub(crate) struct Tried<R> {
    pub result: Result<R, Error>,
    pub uncertain: bool,
}

/// One attempt on one member.
enum Attempt<R> {
    /// The member answered (or its transport failed).
    Answered(Result<R, Error>),
    /// Neither the request nor a probe was answered within the attempt time-out.
    Silent,
    /// The call's deadline passed.
    TimedOut,
}

impl Members {
    pub fn new(endpoints: Vec<Endpoint>, attempt_timeout: Duration) -> Members {
        let health = endpoints.iter().map(|_| Health::default()).collect();
        Members {
            endpoints: endpoints.into(),
            current: AtomicUsize::new(0),
            health,
            attempt_timeout,
            epoch: Instant::now(),
        }
    }

    pub fn current(&self) -> &Endpoint {
        &self.endpoints[self.current.load(Ordering::Relaxed) % self.endpoints.len()]
    }

    /// Every member, the current one first, then the others in their order after it.
    pub fn current_first(&self) -> impl Iterator<Item = &Endpoint> {
        let at = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        self.endpoints[at..].iter().chain(&self.endpoints[..at])
    }

    /// Runs `call` on the current member, and on the next ones while `moves_on` says so
    /// or the member falls silent, until `deadline`. With one member, runs it once,
    /// bounded by the transport's own time-outs only.
    pub async fn each_by<'a, R, F, Fut>(
        &'a self,
        deadline: Instant,
        call: F,
        moves_on: impl Fn(&Result<R, Error>) -> bool,
    ) -> Tried<R>
    where
        F: Fn(&'a Endpoint) -> Fut,
        Fut: Future<Output = Result<R, Error>> + 'a,
    {
        let n = self.endpoints.len();
        if n == 1 {
            return Tried { result: call(&self.endpoints[0]).await, uncertain: false };
        }
        let started = Instant::now();
        let first = self.current.load(Ordering::Relaxed);
        let mut uncertain = false;
        let mut last = None;
        for k in 0.. {
            let i = (first + k) % n;
            // A member found silent is skipped for a while, unless every one was.
            let skip = self.is_silent(i) && !(0..n).all(|j| self.is_silent(j));
            if !skip {
                match self.attempt(i, call(&self.endpoints[i]), deadline).await {
                    Attempt::Answered(r) => {
                        if r.is_ok() && !moves_on(&r) {
                            self.mark_answered(i);
                        }
                        if !moves_on(&r) {
                            self.current.store(i, Ordering::Relaxed);
                            return Tried { result: r, uncertain };
                        }
                        // A connection that broke may have carried the request.
                        uncertain |= r.is_err();
                        last = Some(r);
                    }
                    Attempt::Silent => {
                        uncertain = true;
                        let ep = self.endpoints[i].endpoint();
                        let ms = self.attempt_timeout.as_millis();
                        last = Some(Err(Error::unavailable(format!("{ep}: silent for {ms} ms; moved on"))));
                    }
                    Attempt::TimedOut => break,
                }
            }
            if (k + 1) % n == 0 {
                if Instant::now() + ROUND_PAUSE > deadline {
                    break;
                }
                sleep(ROUND_PAUSE).await;
            }
        }
        let result = match last {
            Some(r) if Instant::now() < deadline => r,
            _ => Err(Error::unavailable(format!(
                "no member answered within {} ms (tried {})",
                deadline.saturating_duration_since(started).as_millis(),
                self.endpoints.iter().map(Endpoint::endpoint).collect::<Vec<_>>().join(", ")
            ))),
        };
        Tried { result, uncertain: true }
    }

    /// Waits for `fut` on member `i` while the member shows it is alive (see the module).
    async fn attempt<R>(&self, i: usize, fut: impl Future<Output = Result<R, Error>>, deadline: Instant) -> Attempt<R> {
        tokio::pin!(fut);
        let half = self.attempt_timeout / 2;
        let started_ms = self.now_ms();
        loop {
            tokio::select! {
                biased;
                r = &mut fut => return Attempt::Answered(r),
                _ = sleep_until(deadline) => return Attempt::TimedOut,
                _ = sleep(half) => {}
            }
            if self.found_silent_since(i, started_ms) {
                // Another call found it silent meanwhile (an older verdict does not
                // count: every member may have been, and this one was tried anyway).
                return Attempt::Silent;
            }
            if self.answered_within(i, half) {
                continue;
            }
            let probe = self.endpoints[i].probe(half);
            tokio::select! {
                biased;
                r = &mut fut => return Attempt::Answered(r),
                _ = sleep_until(deadline) => return Attempt::TimedOut,
                alive = probe => {
                    if !alive {
                        self.mark_silent(i);
                        return Attempt::Silent;
                    }
                    self.mark_answered(i);
                }
            }
        }
    }

    fn now_ms(&self) -> u64 {
        Instant::now().duration_since(self.epoch).as_millis() as u64 + 1
    }

    fn mark_answered(&self, i: usize) {
        self.health[i].answered_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
        self.health[i].silent_until_ms.store(0, Ordering::Relaxed);
    }

    fn answered_within(&self, i: usize, d: Duration) -> bool {
        let at = self.health[i].answered_ms.load(Ordering::Relaxed);
        at != 0 && self.now_ms().saturating_sub(at) < d.as_millis() as u64
    }

    fn mark_silent(&self, i: usize) {
        let until = self.now_ms() + self.attempt_timeout.as_millis() as u64;
        self.health[i].silent_until_ms.fetch_max(until, Ordering::Relaxed);
    }

    /// Found silent, by a probe that ended at or after `since_ms`.
    fn found_silent_since(&self, i: usize, since_ms: u64) -> bool {
        let until = self.health[i].silent_until_ms.load(Ordering::Relaxed);
        until > self.now_ms() && until.saturating_sub(self.attempt_timeout.as_millis() as u64) >= since_ms
    }

    fn is_silent(&self, i: usize) -> bool {
        self.health[i].silent_until_ms.load(Ordering::Relaxed) > self.now_ms()
    }
}
