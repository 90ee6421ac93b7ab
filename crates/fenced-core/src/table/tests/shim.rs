//! The table behind a call-per-command shim, for the tests.

use super::*;

/// The table behind a call-per-command shim: each call is one `apply` with a fresh
/// request id (1, 2, ...), its answer returned, the rest of the output kept.
pub(super) struct T {
    pub(super) t: LockTable,
    pub(super) next: u64,
    pub(super) effects: Vec<Effect>,
    pub(super) answers: Vec<(RequestId, Result<Answer, Error>)>,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum AcquireOutcome {
    Granted { grant: Grant },
    Queued(RequestId),
    NotGranted { holder: Option<Token> },
}

impl T {
    pub(super) fn on(t: LockTable) -> T {
        T { t, next: 0, effects: vec![], answers: vec![] }
    }
    pub(super) fn run(&mut self, cmd: Command, now: u64) -> (RequestId, Option<Result<Answer, Error>>) {
        self.next += 1;
        let r = RequestId(self.next);
        let mut out = self.t.apply(r, cmd, now);
        let own = out.take_answer(r);
        self.effects.extend(out.effects);
        self.answers.extend(out.answers);
        (r, own)
    }
    pub(super) fn grant_lease(&mut self, id: LeaseId, ttl_ms: u64, now: u64) -> Result<LeaseInfo, Error> {
        match self.run(Command::GrantLease { lease: id, ttl_ms }, now).1.unwrap() {
            Ok(Answer::Lease(l)) => Ok(l),
            Ok(a) => panic!("{a:?}"),
            Err(e) => Err(e),
        }
    }
    pub(super) fn keepalive(&mut self, id: LeaseId, now: u64) -> Result<LeaseInfo, Error> {
        match self.run(Command::Keepalive { lease: id }, now).1.unwrap() {
            Ok(Answer::Lease(l)) => Ok(l),
            Ok(a) => panic!("{a:?}"),
            Err(e) => Err(e),
        }
    }
    pub(super) fn acquire(&mut self, req: Acquire, now: u64) -> Result<AcquireOutcome, Error> {
        match self.run(Command::Acquire(req), now) {
            (r, None) => Ok(AcquireOutcome::Queued(r)),
            (_, Some(Ok(Answer::Granted(grant)))) => Ok(AcquireOutcome::Granted { grant }),
            (_, Some(Err(Error::LockHeld { holder }))) => Ok(AcquireOutcome::NotGranted { holder }),
            (_, Some(Ok(a))) => panic!("{a:?}"),
            (_, Some(Err(e))) => Err(e),
        }
    }
    pub(super) fn release(&mut self, name: &LockName, lease: LeaseId, now: u64) -> Result<Token, Error> {
        match self.run(Command::Release { name: name.clone(), lease }, now).1.unwrap() {
            Ok(Answer::Released(t)) => Ok(t),
            Ok(a) => panic!("{a:?}"),
            Err(e) => Err(e),
        }
    }
    pub(super) fn revoke(&mut self, lease: LeaseId, now: u64) -> Result<(), Error> {
        self.run(Command::Revoke { lease }, now).1.unwrap().map(drop)
    }
    /// True when the request was still queued.
    pub(super) fn cancel_wait(&mut self, request: RequestId, now: u64) -> bool {
        let queued = self.t.waiters.contains_key(&request);
        self.run(Command::Cancel { request }, now);
        queued
    }
    pub(super) fn handle_timeout(&mut self, now: u64) {
        self.run(Command::Tick, now);
    }
    pub(super) fn drain_effects(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }
    pub(super) fn lock(&mut self, name: &LockName, now: u64) -> Option<LockInfo> {
        self.handle_timeout(now);
        self.t.lock(name)
    }
    pub(super) fn lease(&mut self, id: LeaseId, now: u64) -> Option<LeaseInfo> {
        self.handle_timeout(now);
        self.t.lease(id)
    }
    pub(super) fn check(&mut self, name: &LockName, token: Token, now: u64) -> (bool, Option<Token>) {
        self.handle_timeout(now);
        self.t.check(name, token)
    }
    pub(super) fn locks_with_prefix(&mut self, prefix: &str, limit: usize, now: u64) -> Vec<LockInfo> {
        self.handle_timeout(now);
        self.t.locks_with_prefix(prefix, limit)
    }
}

impl std::ops::Deref for T {
    type Target = LockTable;
    fn deref(&self) -> &LockTable {
        &self.t
    }
}
