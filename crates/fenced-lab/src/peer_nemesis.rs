//! The cluster nemesis against the peers' clusters (`fenced torture --target
//! etcd-cluster|zookeeper-ensemble --nemesis ...`): the plan of [`crate::nemesis`]
//! (its rounds, its draws, its partitions), struck at three etcd members or a
//! ZooKeeper ensemble ([`crate::ensemble`]) while the gated counter workload runs.
//!
//! | kind | variants |
//! |---|---|
//! | `kill` | kill -9 of the leader, of a follower, of every member at once; restarted on the same data |
//! | `pause` | SIGSTOP of the leader past the election timeout and past the TTL; of a worker holding the lock past its TTL |
//! | `partition` | as Fenced's, through the proxies between members (ZooKeeper's election callbacks excepted, see [`crate::ensemble`]) |
//! | `delay` | bytes held between the workers and every member; on every link of the leader |
//! | `clock` | not injected: refused before the run ([`clock_refusal`]) |

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ensemble::{Ensemble, Links};
use crate::history::Fault;
use crate::nemesis::{
    announce, first_answer_after, percentile, unavailable_us, ClusterFigures, Kind, Scheduled, Split,
};
use crate::peers::{signal, Service};
use crate::proxy::DelayProxy;
use crate::target::{Endpoints, Target};
use crate::torture::{read_counter, report, Progress, TortureConfig, TortureReport, Workers};
use crate::worker::now_us;

/// Why the clock nemesis cannot strike `target`, or `None` if it can.
pub fn clock_refusal(target: Target) -> Option<&'static str> {
    match target {
        // Go's runtime reads time through the vDSO itself, not through libc (Debian's
        // etcd links libc, for cgo): LD_PRELOAD (faketime) does not reach it, and etcd
        // has no clock hook of its own.
        Target::EtcdCluster => Some(
            "the clock nemesis cannot strike etcd-cluster: Go's runtime reads the clock through the vDSO, \
             not libc, out of faketime's reach, and etcd has no clock hook",
        ),
        // The JVM reads clock_gettime through libc, which Debian's faketime (LD_PRELOAD)
        // could redirect: possible, not built.
        Target::ZookeeperEnsemble => Some(
            "the clock nemesis is not built for zookeeper-ensemble: Debian's faketime could run the JVM's \
             clock at another rate, but is not wired up",
        ),
        _ => None,
    }
}

/// Runs the gated counter workload against a new etcd or ZooKeeper cluster under the
/// nemesis.
pub async fn run(cfg: &TortureConfig, progress: watch::Sender<Progress>) -> Result<TortureReport> {
    if cfg.nemesis.clock {
        anyhow::bail!("{}", clock_refusal(cfg.target).unwrap_or("the clock nemesis is not for this target"));
    }
    let (bin, target) = (cfg.fenced_bin.clone(), cfg.target);
    let (gate, ensemble) = tokio::task::spawn_blocking(move || -> Result<(Service, Ensemble)> {
        let gate = Service::fenced(&bin, &[])?;
        let ensemble = match target {
            Target::EtcdCluster => Ensemble::etcd(3, Links::Proxied)?,
            Target::ZookeeperEnsemble => Ensemble::zookeeper(3, Links::Proxied)?,
            other => anyhow::bail!("{other} is not a peer cluster"),
        };
        Ok((gate, ensemble))
    })
    .await??;
    let n = ensemble.len();
    let kind = ensemble.kind;
    let election_ms = kind.election_timeout().as_millis() as u64;
    let probe = ensemble.probe();
    let direct_addrs = ensemble.addrs();
    let ensemble = Arc::new(Mutex::new(ensemble));
    let mut client_proxies = Vec::new();
    for addr in &direct_addrs {
        client_proxies.push(DelayProxy::start(*addr).await?);
    }
    let endpoints_of = |lock: Vec<String>| Endpoints {
        lock: lock.join(","),
        pg: None,
        s3: None,
        dynamodb: None,
        gate: Some(gate.addr.to_string()),
    };
    let endpoints = endpoints_of(client_proxies.iter().map(|p| p.addr.to_string()).collect());

    // Who leads in which term, every 200 ms, on a thread of its own (a frozen member
    // makes a question last seconds).
    let leaders: Arc<Mutex<BTreeSet<(u64, usize)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (leaders, stop, probe) = (leaders.clone(), stop.clone(), probe.clone());
        tokio::task::spawn_blocking(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(seen) = probe.leader_term() {
                    leaders.lock().expect("leaders").insert(seen);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let leader_now = |within: Duration| {
        let probe = probe.clone();
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + within;
            loop {
                if let Some((_, i)) = probe.leader_term() {
                    return Some(i);
                }
                if std::time::Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    let start_us = now_us();
    let until_us = start_us + cfg.duration.as_micros() as u64;
    let faults_until = Instant::now() + cfg.duration - cfg.recovery;
    let mut w = Workers::spawn(cfg, &endpoints, start_us, until_us, progress)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let ttl_ms = cfg.ttl.as_millis() as u64;
    let mut plan: Vec<Kind> = Vec::new();
    let mut schedule = Vec::new();
    let mut aimed_at_leader: Vec<u64> = Vec::new();
    let (mut leader_kills, mut leader_freezes) = (0u64, 0u64);
    while Instant::now() < faults_until {
        let gap = Duration::from_millis(ttl_ms / 2 + rng.next_u64() % (ttl_ms + 1));
        w.pump_until((Instant::now() + gap).min(faults_until)).await;
        if Instant::now() >= faults_until {
            break;
        }
        let Some(fault) = cfg.nemesis.next_kind(&mut plan, &mut rng) else { continue };
        // Every draw of this fault is made now, whatever happens next.
        let (variant, p1, p2) = (rng.next_u64(), rng.next_u64(), rng.next_u64());
        let leader = leader_now(Duration::from_secs(2)).await?.unwrap_or(p2 as usize % n);
        let hold_ms = 1_000 + p1 % 2_000;
        let from = now_us();
        let until = |ms: u64| (Instant::now() + Duration::from_millis(ms)).min(faults_until + cfg.ttl);
        let id = |i: usize| i as u64 + 1;
        let what = match fault {
            Kind::Kill => {
                let (victims, label): (Vec<usize>, &str) = match variant % 3 {
                    0 => (vec![leader], "the leader"),
                    1 => (vec![(leader + 1 + p2 as usize % (n - 1)) % n], "a follower"),
                    _ => ((0..n).collect(), "every member"),
                };
                if variant % 3 != 1 {
                    aimed_at_leader.push(from);
                    leader_kills += 1;
                }
                // A leader is kept down past the election timeout, so the others elect.
                let down_ms = if variant % 3 == 0 { election_ms + 500 } else { 200 } + p1 % 800;
                let nodes: Vec<u64> = victims.iter().map(|&i| id(i)).collect();
                announce(start_us, fault, &format!("kill -9 {label} {nodes:?}, down {down_ms} ms"));
                let e = ensemble.clone();
                let killed = victims.clone();
                tokio::task::spawn_blocking(move || killed.iter().for_each(|&i| e.lock().expect("ensemble").kill(i)))
                    .await?;
                w.pump_until(Instant::now() + Duration::from_millis(down_ms)).await;
                let e = ensemble.clone();
                let back = victims.clone();
                // The restart waits for the members to serve; the workers' operations
                // are taken in meanwhile.
                let mut restart = tokio::task::spawn_blocking(move || e.lock().expect("ensemble").restart_all(&back));
                let restarted = loop {
                    tokio::select! {
                        r = &mut restart => break r?,
                        () = tokio::time::sleep(Duration::from_millis(50)) => w.pump(),
                    }
                };
                restarted.with_context(|| format!("restart {label} {nodes:?}"))?;
                w.faults.push(Fault::Kill { nodes: nodes.clone(), start_us: from, end_us: now_us() });
                format!("kill -9 {label} {nodes:?}")
            }
            Kind::Pause if variant % 2 == 0 => {
                let hold = election_ms + ttl_ms + p1 % (ttl_ms + 1);
                aimed_at_leader.push(from);
                leader_freezes += 1;
                let what = format!("SIGSTOP the leader {} for {hold} ms", id(leader));
                announce(start_us, fault, &what);
                let pid = ensemble.lock().expect("ensemble").pid(leader);
                if let Some(pid) = pid {
                    let _ = signal(pid, libc::SIGSTOP);
                    w.pump_until(Instant::now() + Duration::from_millis(hold)).await;
                    let _ = signal(pid, libc::SIGCONT);
                }
                w.faults.push(Fault::NodePause { node: id(leader), start_us: from, end_us: now_us() });
                what
            }
            Kind::Pause => {
                announce(start_us, fault, "SIGSTOP the next worker that has read, past its TTL");
                let paused = w.pause_one(cfg.ttl, &mut rng).await;
                format!("SIGSTOP a worker holding the lock past its TTL{}", if paused { "" } else { " (none read)" })
            }
            Kind::Partition => {
                let split = Split::draw(variant, p2, leader, n);
                if split.at_leader {
                    aimed_at_leader.push(from);
                }
                let cut = ensemble.lock().expect("ensemble").cut(&split.a, &split.b, split.both);
                let what = format!("{}, links cut {cut:?}, for {hold_ms} ms", split.label);
                announce(start_us, fault, &what);
                w.pump_until(until(hold_ms)).await;
                ensemble.lock().expect("ensemble").heal();
                w.faults.push(Fault::Partition { kind: split.label.into(), cut, start_us: from, end_us: now_us() });
                what
            }
            Kind::Delay => {
                let delay_ms = ttl_ms / 2 + p2 % (ttl_ms + 1);
                let d = Duration::from_millis(delay_ms);
                let to_clients = variant % 2 == 0;
                let what = if to_clients {
                    client_proxies.iter().for_each(|p| p.set_delay(d));
                    format!("every byte between workers and members held {delay_ms} ms, for {hold_ms} ms")
                } else {
                    ensemble.lock().expect("ensemble").delay_links(leader, d);
                    format!("every byte on the leader {}'s links held {delay_ms} ms, for {hold_ms} ms", id(leader))
                };
                announce(start_us, fault, &what);
                w.pump_until(until(hold_ms)).await;
                client_proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
                ensemble.lock().expect("ensemble").heal();
                let end_us = now_us();
                w.faults.push(if to_clients {
                    Fault::Delay { delay_ms, start_us: from, end_us }
                } else {
                    Fault::LinkDelay { node: id(leader), delay_ms, start_us: from, end_us }
                });
                what
            }
            Kind::Clock => unreachable!("refused before the run"),
        };
        schedule.push(Scheduled {
            at_ms: (from - start_us) / 1000,
            nemesis: fault.name(),
            what,
            duration_ms: (now_us() - from) / 1000,
        });
        w.pump();
    }
    let faults_end_us = now_us();

    // Recovery: every link whole, every member up; the workers finish and exit.
    ensemble.lock().expect("ensemble").heal();
    client_proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
    w.finish(cfg, until_us).await?;
    drop(client_proxies);
    let direct = endpoints_of(direct_addrs.iter().map(ToString::to_string).collect());
    let final_value = read_counter(cfg.target, &direct, cfg.op_timeout()).await?;
    stop.store(true, Ordering::Relaxed);
    monitor.await?;
    let terms: BTreeSet<u64> = leaders.lock().expect("leaders").iter().map(|(t, _)| *t).collect();

    let mut failovers: Vec<u64> =
        aimed_at_leader.iter().filter_map(|&t| first_answer_after(&w.history, t).map(|e| (e - t) / 1000)).collect();
    failovers.sort_unstable();
    let figures = ClusterFigures {
        nemesis: cfg.nemesis.to_string(),
        leader_changes: terms.len().saturating_sub(1) as u64,
        failover_ms_p50: percentile(&failovers, 50),
        failover_ms_p99: percentile(&failovers, 99),
        failovers_measured: failovers.len() as u64,
        unavailable_ms: unavailable_us(&w.history, start_us, faults_end_us, 250_000) / 1000,
        partitions_injected: schedule.iter().filter(|s| s.nemesis == "partition").count() as u64,
        clock_faults_injected: 0,
        // The plain readers (one per member) are fenced-cluster's.
        plain_reads: 0,
        replicas_agree: None,
        replicas: format!("not compared: {} exposes no state hash the harness reads", kind_name(cfg.target)),
        schedule,
    };
    let history = std::mem::take(&mut w.history);
    let faults = std::mem::take(&mut w.faults);
    drop(ensemble);
    drop(gate);
    let mut r = report(cfg, history, faults, final_value, Some(figures), None);
    r.leader_kills = Some(leader_kills);
    r.leader_freezes = Some(leader_freezes);
    Ok(r)
}

fn kind_name(target: Target) -> &'static str {
    if target == Target::EtcdCluster {
        "etcd"
    } else {
        "ZooKeeper"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::Nemesis;

    /// The first fault a seed's plan strikes, and its variant draw, as the run draws
    /// them (the gap, the round's shuffle, then the fault's own draws).
    fn first_fault(nemesis: Nemesis, seed: u64) -> (Kind, u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let _gap = rng.next_u64();
        let kind = nemesis.next_kind(&mut Vec::new(), &mut rng).expect("a kind");
        (kind, rng.next_u64())
    }

    /// The integration tests (crates/fenced/tests/it/peer_clusters.rs) count on seed 3
    /// striking the leader with kill -9 first under `kill,pause` (variant 2: every
    /// member, the leader among them).
    #[test]
    fn seed_3_kills_the_leader_first() {
        let n = Nemesis::parse("kill,pause").unwrap();
        let (kind, variant) = first_fault(n, 3);
        assert_eq!((kind, variant % 3), (Kind::Kill, 2), "{kind:?} variant {}", variant % 3);
        // The same seed, the same plan.
        assert_eq!(first_fault(n, 3), first_fault(n, 3));
    }

    /// The four partitions of the shared plan, on three and five members.
    #[test]
    fn partitions_cut_what_they_say() {
        for n in [3, 5] {
            let leader = 1;
            let isolated = Split::draw(0, 7, leader, n);
            assert_eq!((isolated.a.clone(), isolated.b.len(), isolated.both), (vec![leader], n - 1, true));
            assert!(!isolated.b.contains(&leader) && isolated.at_leader);
            let one_way = Split::draw(3, 7, leader, n);
            assert_eq!((one_way.a, one_way.both, one_way.at_leader), (vec![leader], false, true));
            for p2 in [0, 7, 0xdead_beef] {
                let split = Split::draw(1, p2, leader, n);
                let mut all: Vec<usize> = split.a.iter().chain(&split.b).copied().collect();
                all.sort_unstable();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "a split covers every member once");
                assert_eq!((split.a.len(), split.b.len()), ((n - 1) / 2, n - (n - 1) / 2), "minority and majority");
                let bridge = Split::draw(2, p2, leader, n);
                let sides = bridge.a.len() + bridge.b.len();
                assert_eq!(sides, n - 1, "one member, the bridge, on neither side");
                assert!(bridge.a.iter().all(|x| !bridge.b.contains(x)));
            }
        }
    }

    #[test]
    fn a_clock_fault_is_refused_for_the_peers_with_a_reason() {
        assert!(clock_refusal(Target::EtcdCluster).unwrap().contains("vDSO"));
        assert!(clock_refusal(Target::ZookeeperEnsemble).unwrap().contains("faketime"));
        assert_eq!(clock_refusal(Target::FencedCluster), None);
    }
}
