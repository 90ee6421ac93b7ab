//! What a cluster run adds to the report: the schedule as it happened, who led in
//! which term (the leader watch), failover and unavailability from the workers'
//! answers, and the replica check's verdict.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::{Members, Replicas};
use crate::history::{Op, OpKind, OpResult};
use crate::torture::TortureConfig;

/// One fault of the schedule, as it happened.
#[derive(Clone, Debug, Serialize)]
pub struct Scheduled {
    /// Since the workers started.
    pub at_ms: u64,
    pub nemesis: &'static str,
    pub what: String,
    pub duration_ms: u64,
}

/// What a cluster run adds to the report.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterFigures {
    pub nemesis: String,
    /// Distinct terms in which a leader was seen, less the first.
    pub leader_changes: u64,
    /// After each fault aimed at the leader (kill, pause, isolation, one-way loss, kill
    /// of all): from the fault to the answer of the first lock request (acquire or
    /// release) sent after it.
    pub failover_ms_p50: Option<u64>,
    pub failover_ms_p99: Option<u64>,
    pub failovers_measured: u64,
    /// Until the recovery phase: the sum of the gaps over 250 ms in which no lock request
    /// of any worker was answered (a wait behind a frozen holder counts too).
    pub unavailable_ms: u64,
    pub partitions_injected: u64,
    pub clock_faults_injected: u64,
    /// Plain reads of the counter answered by the members' readers ([`crate::reader`]),
    /// judged with the workers' operations by the linearizability check.
    pub plain_reads: u64,
    /// Every member at one applied index with one state hash after the run; `null`
    /// when the members report no `state_hash`.
    pub replicas_agree: Option<bool>,
    /// What the replica check saw, for a person.
    pub replicas: String,
    pub schedule: Vec<Scheduled>,
}

/// What the run measured, for [`ClusterFigures::new`].
pub(super) struct Measured<'a> {
    pub history: &'a [Op],
    pub schedule: Vec<Scheduled>,
    /// When each fault aimed at the leader struck.
    pub aimed_at_leader: &'a [u64],
    /// Distinct terms in which a leader was seen.
    pub terms: u64,
    /// The faults' phase, from the workers' start to the recovery.
    pub start_us: u64,
    pub faults_end_us: u64,
    pub replicas: Replicas,
}

impl ClusterFigures {
    pub(super) fn new(cfg: &TortureConfig, m: Measured<'_>) -> ClusterFigures {
        let mut failovers: Vec<u64> = m
            .aimed_at_leader
            .iter()
            .filter_map(|&t| first_answer_after(m.history, t).map(|e| (e - t) / 1000))
            .collect();
        failovers.sort_unstable();
        let injected = |kind: &str| m.schedule.iter().filter(|s| s.nemesis == kind).count() as u64;
        ClusterFigures {
            nemesis: cfg.nemesis.to_string(),
            leader_changes: m.terms.saturating_sub(1),
            failover_ms_p50: percentile(&failovers, 50),
            failover_ms_p99: percentile(&failovers, 99),
            failovers_measured: failovers.len() as u64,
            unavailable_ms: unavailable_us(m.history, m.start_us, m.faults_end_us, 250_000) / 1000,
            partitions_injected: injected("partition"),
            clock_faults_injected: injected("clock"),
            plain_reads: m.history.iter().filter(|o| o.kind == OpKind::Get && o.result == OpResult::Ok).count() as u64,
            replicas_agree: m.replicas.agree,
            replicas: m.replicas.text,
            schedule: m.schedule,
        }
    }
}

/// Records in which terms a member said it led, while the run lasts.
pub(super) struct LeaderWatch {
    seen: Arc<Mutex<BTreeSet<(u64, usize)>>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl LeaderWatch {
    /// Asks `members` who leads every `every` (each question in a task of its own: a
    /// frozen member makes one last seconds).
    pub(super) fn start<M: Members>(members: Arc<M>, every: Duration) -> LeaderWatch {
        let seen: Arc<Mutex<BTreeSet<(u64, usize)>>> = Arc::default();
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    if let Some(led) = members.leader_term().await {
                        seen.lock().expect("leaders").insert(led);
                    }
                    tokio::select! {
                        () = sleep(every) => {}
                        _ = stopped.changed() => return,
                    }
                }
            }
        });
        LeaderWatch { seen, stop, task }
    }

    /// Stops the watch; how many distinct terms had a leader.
    pub(super) async fn terms(self) -> u64 {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let terms: BTreeSet<u64> = self.seen.lock().expect("leaders").iter().map(|(t, _)| *t).collect();
        terms.len() as u64
    }
}

/// A request to the lock service (the counter's requests go to the gate) that was answered.
fn answered_lock_call(o: &Op) -> bool {
    matches!(o.kind, OpKind::Acquire | OpKind::Release) && o.result == OpResult::Ok
}

/// When the first lock request sent at or after `t_us` was answered.
pub(crate) fn first_answer_after(history: &[Op], t_us: u64) -> Option<u64> {
    history.iter().filter(|o| o.start_us >= t_us && answered_lock_call(o)).map(|o| o.end_us).min()
}

/// The sum of the gaps longer than `gap_us` between answered lock requests in `[from, to]`.
pub fn unavailable_us(history: &[Op], from_us: u64, to_us: u64, gap_us: u64) -> u64 {
    let mut ends: Vec<u64> = history
        .iter()
        .filter(|o| answered_lock_call(o) && o.end_us >= from_us && o.end_us <= to_us)
        .map(|o| o.end_us)
        .collect();
    ends.push(from_us);
    ends.push(to_us);
    ends.sort_unstable();
    ends.windows(2).map(|p| p[1] - p[0]).filter(|g| *g > gap_us).sum()
}

/// The nearest-rank percentile of sorted `xs`.
pub(crate) fn percentile(xs: &[u64], p: usize) -> Option<u64> {
    if xs.is_empty() {
        return None;
    }
    let rank = (p * xs.len()).div_ceil(100).max(1);
    Some(xs[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start_us: u64, end_us: u64) -> Op {
        Op {
            worker: 0,
            cycle: 1,
            kind: OpKind::Acquire,
            start_us,
            end_us,
            result: OpResult::Ok,
            token: Some(1),
            value: None,
            error: None,
            promised_until_us: None,
            lost_signalled: None,
        }
    }

    #[test]
    fn failover_and_unavailability_come_from_the_answers() {
        let h = vec![ok(0, 100_000), ok(150_000, 200_000), ok(1_100_000, 1_300_000), ok(1_200_000, 1_250_000)];
        // A fault at 120 ms: the first request sent after it answered at 200 ms.
        assert_eq!(first_answer_after(&h, 120_000), Some(200_000));
        // Gaps over 250 ms between answers: 200 ms..1250 ms, and 1300 ms..2000 ms.
        assert_eq!(unavailable_us(&h, 0, 2_000_000, 250_000), 1_050_000 + 700_000);
        assert_eq!(percentile(&[10, 20, 30, 40], 50), Some(20));
        assert_eq!(percentile(&[10, 20, 30, 40], 99), Some(40));
        assert_eq!(percentile(&[], 50), None);
    }
}
