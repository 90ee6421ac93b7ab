//! The nemesis of `fenced torture --target fenced-cluster`: a seeded schedule of faults
//! against a Fenced cluster ([`crate::cluster`]) while the counter workload runs, and
//! the figures a cluster run adds to the report.
//!
//! Faults come in rounds: each round is a seeded shuffle of the selected kinds, and each
//! fault's variant and parameters are drawn from the seed before it is injected, so the
//! same seed gives the same schedule (which member is the leader at that moment is the
//! run's, not the seed's). Each fault is printed on stderr as it starts and listed in
//! the report's `schedule`.
//!
//! | kind | variants |
//! |---|---|
//! | `kill` | kill -9 of the leader, of a follower, of every member at once (those aimed at the leader just after a worker's read, so that a lease spans the failover); restarted on the same data |
//! | `pause` | SIGSTOP of the leader past the election timeout and past the TTL; of a worker holding the lock past its TTL |
//! | `partition` | the leader isolated; a majority/minority split; a bridge (one member sees both halves); one-way (the leader's requests to the others lost, theirs to it delivered) |
//! | `delay` | bytes held between the workers and every member; on every link of the leader |
//! | `clock` | the leader's clock fast (up to 1.08x, inside the client's margin) or slow (0.5x to 0.9x); test-only builds |

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, Instant};

use crate::cluster::{leader_of, Agreement, Cluster};
use crate::history::{Fault, Op, OpKind, OpResult};
use crate::proxy::DelayProxy;
use crate::target::{Endpoints, LOCK};
use crate::torture::{read_counter, report, Progress, TortureConfig, TortureReport, Workers};
use crate::worker::now_us;

/// The faults a cluster run may inject.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize)]
pub struct Nemesis {
    pub kill: bool,
    pub pause: bool,
    pub partition: bool,
    pub delay: bool,
    /// Needs a `fenced` built with the `fault-injection` feature (test-only).
    pub clock: bool,
}

impl Nemesis {
    pub const NAMES: [&'static str; 5] = ["kill", "pause", "partition", "delay", "clock"];

    /// `kill,pause,...` (or `none`) into a selection; an unknown name is an error.
    pub fn parse(s: &str) -> Result<Nemesis, String> {
        let mut n = Nemesis::default();
        if s.trim() == "none" {
            return Ok(n);
        }
        for part in s.split(',').map(str::trim) {
            match part {
                "kill" => n.kill = true,
                "pause" => n.pause = true,
                "partition" => n.partition = true,
                "delay" => n.delay = true,
                "clock" => n.clock = true,
                other => {
                    return Err(format!("unknown nemesis '{other}' ({}, or none)", Nemesis::NAMES.join(", ")));
                }
            }
        }
        Ok(n)
    }

    /// The next fault of the plan: each round is a seeded shuffle of the selected kinds,
    /// drawn when the last round is spent (shared with the peers' clusters,
    /// [`crate::peer_nemesis`], so one seed gives one schedule for every target).
    pub(crate) fn next_kind(self, plan: &mut Vec<Kind>, rng: &mut ChaCha8Rng) -> Option<Kind> {
        if plan.is_empty() {
            *plan = self.kinds();
            for i in (1..plan.len()).rev() {
                plan.swap(i, rng.next_u64() as usize % (i + 1));
            }
        }
        plan.pop()
    }

    fn kinds(self) -> Vec<Kind> {
        [
            (self.kill, Kind::Kill),
            (self.pause, Kind::Pause),
            (self.partition, Kind::Partition),
            (self.delay, Kind::Delay),
            (self.clock, Kind::Clock),
        ]
        .into_iter()
        .filter_map(|(on, k)| on.then_some(k))
        .collect()
    }
}

impl fmt::Display for Nemesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.kinds().iter().map(|k| k.name()).collect();
        f.write_str(&if names.is_empty() { "none".to_owned() } else { names.join(",") })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Kill,
    Pause,
    Partition,
    Delay,
    Clock,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Pause => "pause",
            Kind::Partition => "partition",
            Kind::Delay => "delay",
            Kind::Clock => "clock",
        }
    }
}

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

/// Runs the workload against a new cluster under the nemesis.
pub async fn run(cfg: &TortureConfig, progress: watch::Sender<Progress>) -> Result<TortureReport> {
    let cluster = Arc::new(Cluster::start(&cfg.fenced_bin, cfg.nodes as usize).await?);
    let n = cluster.len();
    let mut client_proxies = Vec::new();
    for addr in &cluster.addrs {
        client_proxies.push(DelayProxy::start(*addr).await?);
    }
    // The counter is in the cluster's own fenced store (replicated with the locks).
    let addrs_of = |a: Vec<String>| Endpoints { lock: a.join(","), pg: None, s3: None, dynamodb: None, gate: None };
    let endpoints = addrs_of(client_proxies.iter().map(|p| p.addr.to_string()).collect());

    // Who leads, every 100 ms, while the run lasts.
    let leaders: Arc<Mutex<BTreeSet<(u64, u64)>>> = Arc::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let monitor = tokio::spawn(watch_leaders(cluster.clone(), leaders.clone(), stop_rx));

    let start_us = now_us();
    let until_us = start_us + cfg.duration.as_micros() as u64;
    let faults_until = Instant::now() + cfg.duration - cfg.recovery;
    let mut w = Workers::spawn(cfg, &endpoints, start_us, until_us, progress)?;
    // Plain reads of the counter, one reader per member, beside the workers.
    let (reads_tx, mut reads_rx) = mpsc::unbounded_channel();
    let mut readers = crate::reader::spawn(&cluster.addrs, &format!("{LOCK}/counter"), cfg.workers, until_us, reads_tx);
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let ttl_ms = cfg.ttl.as_millis() as u64;
    let mut plan: Vec<Kind> = Vec::new();
    let mut schedule = Vec::new();
    let mut aimed_at_leader: Vec<u64> = Vec::new();
    while Instant::now() < faults_until {
        let gap = Duration::from_millis(ttl_ms / 2 + rng.next_u64() % (ttl_ms + 1));
        w.pump_until((Instant::now() + gap).min(faults_until)).await;
        if Instant::now() >= faults_until {
            break;
        }
        let Some(kind) = cfg.nemesis.next_kind(&mut plan, &mut rng) else { continue };
        // Every draw of this fault is made now, whatever happens next.
        let (variant, p1, p2) = (rng.next_u64(), rng.next_u64(), rng.next_u64());
        let leader = cluster.leader(Duration::from_secs(2)).await.unwrap_or(p2 as usize % n);
        let hold_ms = 1_000 + p1 % 2_000;
        let from = now_us();
        let until = |ms: u64| (Instant::now() + Duration::from_millis(ms)).min(faults_until + cfg.ttl);
        let id = |i: usize| i as u64 + 1;
        let what = match kind {
            Kind::Kill => {
                let (victims, label): (Vec<usize>, &str) = match variant % 3 {
                    0 => (vec![leader], "the leader"),
                    1 => (vec![(leader + 1 + p2 as usize % (n - 1)) % n], "a follower"),
                    _ => ((0..n).collect(), "every member"),
                };
                // Aimed at the leader: while a worker holds the lock, just after its read
                // (its lease must outlive the failover), when one reads within a TTL and
                // before the recovery phase.
                let from = if variant % 3 != 1 {
                    w.next_read(cfg.ttl.min(faults_until.saturating_duration_since(Instant::now()))).await;
                    aimed_at_leader.push(now_us());
                    now_us()
                } else {
                    from
                };
                // A leader back soon resumes its term (openraft restores a leader whose
                // vote is committed): kept down well past the election timeout (600 ms
                // at most), the others elect a new one.
                let down = Duration::from_millis(if variant % 3 == 0 { 1_500 } else { 200 } + p1 % 800);
                let nodes: Vec<u64> = victims.iter().map(|&i| id(i)).collect();
                announce(start_us, kind, &format!("kill -9 {label} {nodes:?}, down {} ms", down.as_millis()));
                for &i in &victims {
                    let m = cluster.members[i].clone();
                    tokio::task::spawn_blocking(move || m.lock().expect("member").crash()).await?;
                }
                w.pump_until(Instant::now() + down).await;
                for &i in &victims {
                    let m = cluster.members[i].clone();
                    tokio::task::spawn_blocking(move || m.lock().expect("member").restart()).await??;
                }
                w.faults.push(Fault::Kill { nodes: nodes.clone(), start_us: from, end_us: now_us() });
                format!("kill -9 {label} {nodes:?}")
            }
            Kind::Pause if variant % 2 == 0 => {
                // Past the election timeout (600 ms at most) and past the TTL.
                let hold = 600 + ttl_ms + p1 % (ttl_ms + 1);
                aimed_at_leader.push(from);
                announce(start_us, kind, &format!("SIGSTOP the leader {} for {hold} ms", id(leader)));
                let pid = cluster.members[leader].lock().expect("member").pid();
                if let Some(pid) = pid {
                    let _ = crate::peers::signal(pid, libc::SIGSTOP);
                    w.pump_until(Instant::now() + Duration::from_millis(hold)).await;
                    let _ = crate::peers::signal(pid, libc::SIGCONT);
                }
                w.faults.push(Fault::NodePause { node: id(leader), start_us: from, end_us: now_us() });
                format!("SIGSTOP the leader {} for {hold} ms", id(leader))
            }
            Kind::Pause => {
                announce(start_us, kind, "SIGSTOP the next worker that has read, past its TTL");
                let paused = w.pause_one(cfg.ttl, &mut rng).await;
                format!("SIGSTOP a worker holding the lock past its TTL{}", if paused { "" } else { " (none read)" })
            }
            Kind::Partition => {
                let split = Split::draw(variant, p2, leader, n);
                if split.at_leader {
                    aimed_at_leader.push(from);
                }
                let (label, cut) = (split.label, cluster.cut(&split.a, &split.b, split.both));
                let what = format!("{label}, links cut {cut:?}, for {hold_ms} ms");
                announce(start_us, kind, &what);
                w.pump_until(until(hold_ms)).await;
                cluster.heal();
                w.faults.push(Fault::Partition { kind: label.into(), cut, start_us: from, end_us: now_us() });
                what
            }
            Kind::Delay => {
                let delay_ms = ttl_ms / 2 + p2 % (ttl_ms + 1);
                let d = Duration::from_millis(delay_ms);
                let what = if variant % 2 == 0 {
                    client_proxies.iter().for_each(|p| p.set_delay(d));
                    format!("every byte between workers and members held {delay_ms} ms, for {hold_ms} ms")
                } else {
                    for ((a, b), p) in &cluster.links {
                        if *a == leader || *b == leader {
                            p.set_delay(d);
                        }
                    }
                    format!("every byte on the leader {}'s links held {delay_ms} ms, for {hold_ms} ms", id(leader))
                };
                announce(start_us, kind, &what);
                w.pump_until(until(hold_ms)).await;
                client_proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
                cluster.heal();
                let node = if variant % 2 == 0 { 0 } else { id(leader) };
                if node == 0 {
                    w.faults.push(Fault::Delay { delay_ms, start_us: from, end_us: now_us() });
                } else {
                    w.faults.push(Fault::LinkDelay { node, delay_ms, start_us: from, end_us: now_us() });
                }
                what
            }
            Kind::Clock => {
                // Fast stays inside the client's margin (a tenth of the TTL): a lease must
                // still outlive its client-side deadline. Slow may be anything.
                let permille = if variant % 2 == 0 { 1_020 + p2 % 61 } else { 500 + p2 % 401 };
                let rate = permille as f64 / 1000.0;
                let what = format!("the leader {}'s clock at {rate}x for {hold_ms} ms", id(leader));
                announce(start_us, kind, &what);
                let file = cluster.members[leader].lock().expect("member").dir().join("data/fault-clock-rate");
                std::fs::write(&file, format!("{rate}\n"))?;
                w.pump_until(until(hold_ms)).await;
                std::fs::write(&file, "1\n")?;
                w.faults.push(Fault::Clock {
                    node: id(leader),
                    rate_permille: permille,
                    start_us: from,
                    end_us: now_us(),
                });
                what
            }
        };
        schedule.push(Scheduled {
            at_ms: (from - start_us) / 1000,
            nemesis: kind.name(),
            what,
            duration_ms: (now_us() - from) / 1000,
        });
        w.pump();
    }
    let faults_end_us = now_us();

    // Recovery: every link whole, every member up; the workers finish and exit.
    cluster.heal();
    client_proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
    w.finish(cfg, until_us).await?;
    while readers.join_next().await.is_some() {}
    while let Some(op) = reads_rx.recv().await {
        w.history.push(op);
    }
    drop(client_proxies);
    let direct = addrs_of(cluster.addrs.iter().map(ToString::to_string).collect());
    let final_value = read_counter(cfg.target, &direct, cfg.op_timeout()).await?;

    // Replicas agree: once the last leases have run out, every member at one applied
    // index must hold one state.
    sleep(cfg.ttl * 2).await;
    let agreement = cluster.replicas_agree(Duration::from_secs(20)).await;
    let _ = stop_tx.send(true);
    let _ = monitor.await;
    let terms: BTreeSet<u64> = leaders.lock().expect("leaders").iter().map(|(t, _)| *t).collect();

    let mut failovers: Vec<u64> =
        aimed_at_leader.iter().filter_map(|&t| first_answer_after(&w.history, t).map(|e| (e - t) / 1000)).collect();
    failovers.sort_unstable();
    let (replicas_agree, replicas, proof) = match &agreement {
        Agreement::Agree { applied_index } => (Some(true), format!("agree at applied index {applied_index}"), None),
        Agreement::Differ { applied_index, hashes } => {
            let text = format!("replicas disagree: at applied index {applied_index} the state hashes are {hashes:?}");
            (Some(false), text.clone(), Some(text))
        }
        Agreement::Unsettled { indexes } => {
            let text = format!("replicas disagree: no common applied index within 20 s: {indexes:?}");
            (Some(false), text.clone(), Some(text))
        }
        Agreement::NoHash => (None, "the members report no state_hash: not compared".into(), None),
    };
    let figures = ClusterFigures {
        nemesis: cfg.nemesis.to_string(),
        leader_changes: terms.len().saturating_sub(1) as u64,
        failover_ms_p50: percentile(&failovers, 50),
        failover_ms_p99: percentile(&failovers, 99),
        failovers_measured: failovers.len() as u64,
        unavailable_ms: unavailable_us(&w.history, start_us, faults_end_us, 250_000) / 1000,
        partitions_injected: schedule.iter().filter(|s| s.nemesis == "partition").count() as u64,
        clock_faults_injected: schedule.iter().filter(|s| s.nemesis == "clock").count() as u64,
        plain_reads: w.history.iter().filter(|o| o.kind == OpKind::Get && o.result == OpResult::Ok).count() as u64,
        replicas_agree,
        replicas,
        schedule,
    };
    let history = std::mem::take(&mut w.history);
    let faults = std::mem::take(&mut w.faults);
    Ok(report(cfg, history, faults, final_value, Some(figures), proof.map(|p| vec![p])))
}

/// One partition of the schedule: every link from a member of `a` to a member of `b`
/// cut (and back, when `both`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub label: &'static str,
    pub a: Vec<usize>,
    pub b: Vec<usize>,
    pub both: bool,
    /// Whether it strikes the leader (a failover is measured after it).
    pub at_leader: bool,
}

impl Split {
    /// The partition that the draws `variant` and `p2` make of `n` members led by
    /// `leader`: the leader isolated, a majority/minority split, a bridge (one member
    /// sees both halves, which do not see each other), or one-way (the leader's
    /// requests to the others lost).
    pub(crate) fn draw(variant: u64, p2: u64, leader: usize, n: usize) -> Split {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, (p2 >> (i * 4)) as usize % (i + 1));
        }
        let rest: Vec<usize> = (0..n).filter(|&i| i != leader).collect();
        let split = |label, a: &[usize], b: &[usize], both, at_leader| Split {
            label,
            a: a.to_vec(),
            b: b.to_vec(),
            both,
            at_leader,
        };
        match variant % 4 {
            0 => split("the leader isolated", &[leader], &rest, true, true),
            1 => {
                let (minority, majority) = order.split_at((n - 1) / 2);
                split("a majority/minority split", minority, majority, true, false)
            }
            2 => {
                let rest = &order[1..];
                let (a, b) = rest.split_at(rest.len() / 2);
                split("a bridge", a, b, true, false)
            }
            _ => split("one-way: the leader's requests lost", &[leader], &rest, false, true),
        }
    }
}

pub(crate) fn announce(start_us: u64, kind: Kind, what: &str) {
    eprintln!("nemesis +{:.1}s {}: {what}", (now_us() - start_us) as f64 / 1e6, kind.name());
}

/// Records `(term, leader)` whenever a member says it leads, until `stop`.
async fn watch_leaders(cluster: Arc<Cluster>, seen: Arc<Mutex<BTreeSet<(u64, u64)>>>, mut stop: watch::Receiver<bool>) {
    loop {
        let statuses = cluster.statuses().await;
        if let Some(i) = leader_of(&statuses) {
            let term = statuses[i].as_ref().and_then(|s| s["term"].as_u64()).unwrap_or(0);
            seen.lock().expect("leaders").insert((term, i as u64 + 1));
        }
        tokio::select! {
            _ = sleep(Duration::from_millis(100)) => {}
            _ = stop.changed() => return,
        }
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
    fn selection_parses_and_refuses_unknown_kinds() {
        let n = Nemesis::parse("kill,partition").unwrap();
        assert!(n.kill && n.partition && !n.pause && !n.delay && !n.clock);
        assert_eq!(n.to_string(), "kill,partition");
        assert_eq!(Nemesis::parse("none").unwrap().to_string(), "none");
        assert!(Nemesis::parse("kill,fire").unwrap_err().contains("unknown nemesis 'fire'"));
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
