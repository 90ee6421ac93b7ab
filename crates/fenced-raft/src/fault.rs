//! Test-only faults in the leader's clock: compiled only with the `fault-injection`
//! feature (never in a default build) and switched on at run time, so that the torture
//! harness can show its checkers catch a cluster that breaks its promises.
//!
//! - `FENCED_BREAK=clock-fast`: this node's clock runs three times as fast from the
//!   start; as leader it expires every lease at a third of its TTL in real time.
//! - `FENCED_BREAK=jump-on-failover`: a node that takes office moves the replicated
//!   timeline a minute ahead once its first entry is committed, as a leader that took
//!   lease time from its own wall clock after a clock step would: every lease it
//!   inherits expires at once.
//! - `FENCED_BREAK=leader-restore`: a member of several that restarts as leader takes
//!   office again in its old term without an election (openraft's leader restore), as
//!   every member did before the kill nemesis caught it: a leader that lost entries its
//!   followers hold writes others under the same index and term.
//! - the file `fault-log-delay-ms` in the data directory: this member's log writes take
//!   that much longer (see `log_store`), so its followers hold entries before it does.
//! - the file `fault-log-fail` in the data directory: this member's log writes fail (as
//!   a disk that errors would), which stops openraft and so the server.
//! - `FENCED_BREAK=answer-before-commit`: the leader answers each batch's commands from a
//!   speculative copy of its table as it hands the batch to the log, before a quorum
//!   has it ([`speculate`]); the answers from the committed entry then find nobody
//!   waiting. A batch that never commits (a leader cut off) was answered all the same.
//! - `FENCED_BREAK=grant-deposed`: a node that does not lead applies what it is asked
//!   to its own table and answers, instead of `not_leader` ([`answer_locally`]).
//! - `FENCED_BREAK=read-local`: `check`, plain store reads and the lock views are served
//!   from the local table on any member, without the ReadIndex round (the hook is the
//!   server's `Locks::read`).
//! - `FENCED_BREAK=limits-unagreed`: a leader never proposes `Command::SetLimits`, so
//!   every member decides with its own configured limits, as before they were
//!   replicated: members configured apart decide one command differently.
//! - `FENCED_BREAK=keepalive-unconfirmed`: a cluster's leader answers a keepalive from
//!   memory at once, without the quorum round that confirms it still leads
//!   (`Node::keepalive_here`): a leader cut off from its followers keeps leases alive
//!   that a new leader will expire.
//! - the file `fault-clock-rate` in the data directory (the `clock` nemesis): a rate
//!   (`1.08`, `0.5`) that this node's clock runs at from now on, read every 100 ms.
//!
//! - `FENCED_FAULT_SNAPSHOT_CUT_AT=N`: the first snapshot this process sends from its
//!   first byte fails after N of its bytes, as a link cut midway would; the member keeps
//!   what arrived and the next transfer resumes there (`network`). A fault, not a broken
//!   promise: a correct cluster survives it.
//!
//! `FENCED_BREAK` takes several names separated by commas.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use fenced_core::{Batch, Command, LockTable, Output, RequestId};

use crate::state_machine::StateMachine;

/// Whether `FENCED_BREAK` names `what`.
pub fn broken(what: &str) -> bool {
    std::env::var("FENCED_BREAK").is_ok_and(|v| v.split(',').any(|p| p.trim() == what))
}

/// What befalls a member receiving a snapshot, `received` bytes of its message in
/// ([`receiving`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Receiving {
    /// It dies (the caller aborts, as kill -9 would stop it):
    /// `FENCED_FAULT_SNAPSHOT_DIE_AT`, once that many bytes arrived.
    Dies,
    /// It freezes (the caller stops its own process, as SIGSTOP would, until a
    /// SIGCONT): `FENCED_FAULT_SNAPSHOT_STOP_AT`, once that many arrived, once a process.
    Freezes,
}

/// [`Receiving`], if anything, at `received` bytes.
pub fn receiving(received: u64) -> Option<Receiving> {
    static FROZEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let at = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok()).filter(|at| received >= *at);
    if at("FENCED_FAULT_SNAPSHOT_DIE_AT").is_some() {
        return Some(Receiving::Dies);
    }
    if at("FENCED_FAULT_SNAPSHOT_STOP_AT").is_some() && !FROZEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Some(Receiving::Freezes);
    }
    None
}

/// The bytes of a snapshot to send from `offset`: with `FENCED_FAULT_SNAPSHOT_CUT_AT`
/// set, the first sent from its start fails after that many bytes.
pub fn cut_snapshot(reader: Box<dyn std::io::Read + Send + Sync>, offset: u64) -> Box<dyn std::io::Read + Send + Sync> {
    static CUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let at = std::env::var("FENCED_FAULT_SNAPSHOT_CUT_AT").ok().and_then(|v| v.parse::<u64>().ok());
    let Some(at) = at.filter(|_| offset == 0) else { return reader };
    if CUT.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return reader;
    }
    tracing::warn!(at, "fault: this snapshot transfer is cut after {at} bytes");
    Box::new(CutAt { inner: reader.take(at) })
}

/// A reader that fails where its bytes end.
struct CutAt {
    inner: std::io::Take<Box<dyn std::io::Read + Send + Sync>>,
}

impl std::io::Read for CutAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.inner.read(buf)? {
            0 if !buf.is_empty() => Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "fault: cut")),
            n => Ok(n),
        }
    }
}

/// How far `jump-on-failover` moves the timeline when a node takes office.
pub fn office_jump_ms() -> u64 {
    if broken("jump-on-failover") {
        60_000
    } else {
        0
    }
}

/// The speculative table of `answer-before-commit`, and the term (the committed leader
/// id) it was copied in. One node per process: a process-wide slot.
type Speculative = (openraft::alias::CommittedLeaderIdOf<crate::TypeConfig>, LockTable);
static SPECULATIVE: Mutex<Option<Speculative>> = Mutex::new(None);

/// `answer-before-commit`: applies a batch the leader is about to hand to the log to a
/// copy of its table (taken from the applied table at the term's first batch) and
/// answers its callers from that copy at once. The effects are dropped (the committed
/// entry publishes them); queued acquires are left for the committed entry to report.
pub(crate) fn speculate(
    sm: &StateMachine,
    leader: openraft::alias::CommittedLeaderIdOf<crate::TypeConfig>,
    items: &[(RequestId, Command)],
    now_ms: u64,
) {
    let mut slot = SPECULATIVE.lock().unwrap_or_else(|p| p.into_inner());
    if slot.as_ref().is_none_or(|(l, _)| *l != leader) {
        let copy = {
            let st = sm.state();
            let limits = st.table.limits().clone();
            serde_json::to_value(&st.table).and_then(serde_json::from_value::<LockTable>).map(|mut t| {
                t.set_limits(limits);
                t
            })
        };
        let Ok(table) = copy else { return };
        *slot = Some((leader, table));
    }
    let Some((_, table)) = slot.as_mut() else { return };
    let mut out = Output::default();
    table.apply_batch(Batch { items: items.to_vec(), now_ms }, &mut out, |out| {
        out.effects.clear();
        out.queued.clear();
        sm.sink().applied(out);
    });
}

/// `grant-deposed`: applies one command to this (not leading) node's own table at the
/// table's time and answers from it, as the leader's apply would. The table then holds
/// what no log entry explains.
pub(crate) fn answer_locally(sm: &StateMachine, request: RequestId, cmd: Command) {
    let mut st = sm.state();
    let now_ms = st.table.now_ms();
    let mut out = Output::default();
    st.table.apply_batch(Batch::one(request, cmd, now_ms), &mut out, |out| sm.sink().applied(out));
}

/// A clock rate that can change while the node runs: the local clock is piecewise
/// linear in real time, continuous and never going back.
pub struct Rate {
    file: PathBuf,
    rate: f64,
    read_at: Option<Instant>,
    /// The real and scaled milliseconds at the last rate change.
    base_raw_ms: u64,
    base_ms: u64,
}

impl Rate {
    pub fn new(dir: &Path) -> Rate {
        let rate = if broken("clock-fast") { 3.0 } else { 1.0 };
        Rate { file: dir.join("fault-clock-rate"), rate, read_at: None, base_raw_ms: 0, base_ms: 0 }
    }

    /// `raw_ms` of real time since the node started, on this node's clock.
    pub fn scale(&mut self, raw_ms: u64) -> u64 {
        if self.read_at.is_none_or(|t| t.elapsed().as_millis() >= 100) {
            self.read_at = Some(Instant::now());
            let fixed = broken("clock-fast").then_some(3.0);
            let from_file = std::fs::read_to_string(&self.file).ok().and_then(|s| s.trim().parse::<f64>().ok());
            let rate = fixed.or(from_file).filter(|r| r.is_finite() && *r > 0.0 && *r <= 100.0).unwrap_or(1.0);
            if rate != self.rate {
                self.base_ms = self.at(raw_ms);
                self.base_raw_ms = raw_ms.max(self.base_raw_ms);
                self.rate = rate;
                tracing::warn!(rate, "fault injection: this node's clock runs at {rate}x");
            }
        }
        self.at(raw_ms)
    }

    fn at(&self, raw_ms: u64) -> u64 {
        self.base_ms + (raw_ms.saturating_sub(self.base_raw_ms) as f64 * self.rate) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_file_bends_the_clock_without_a_step_back() {
        let dir = std::env::temp_dir().join(format!("fenced-fault-rate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = Rate::new(&dir);
        assert_eq!(r.scale(1_000), 1_000);
        std::fs::write(dir.join("fault-clock-rate"), "2").unwrap();
        r.read_at = None;
        assert_eq!(r.scale(1_000), 1_000, "continuous at the change");
        assert_eq!(r.scale(1_500), 2_000);
        std::fs::write(dir.join("fault-clock-rate"), "0.5").unwrap();
        r.read_at = None;
        assert_eq!(r.scale(2_000), 3_000);
        assert_eq!(r.scale(3_000), 3_500);
        std::fs::write(dir.join("fault-clock-rate"), "nonsense").unwrap();
        r.read_at = None;
        assert_eq!(r.scale(4_000), 4_000, "a bad rate is 1");
        assert_eq!(r.scale(5_000), 5_000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
