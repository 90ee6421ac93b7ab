//! The one nemesis loop: starts the workers against a cluster's [`Members`] (through a
//! delay proxy per member), strikes the seeded plan at it until the recovery phase, then
//! lets everything heal, reads the counter back and builds the report.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::figures::{LeaderWatch, Measured};
use super::{ClusterFigures, Kind, Members, Scheduled, Split};
use crate::history::Fault;
use crate::proxy::DelayProxy;
use crate::torture::{read_counter, report, Progress, TortureConfig, TortureReport, Workers};
use crate::worker::now_us;

/// Runs the workload against `members` under the nemesis of `cfg`.
pub(super) async fn run<M: Members>(
    cfg: &TortureConfig,
    progress: watch::Sender<Progress>,
    members: M,
) -> Result<TortureReport> {
    let members = Arc::new(members);
    let mut clients = Vec::new();
    for &addr in &members.launched().addrs {
        clients.push(DelayProxy::start(addr).await?);
    }
    let endpoints = members.endpoints(joined(clients.iter().map(|p| p.addr)));
    let leaders = LeaderWatch::start(members.clone(), members.aim().watch_every);

    let start_us = now_us();
    let until_us = start_us + cfg.duration.as_micros() as u64;
    let mut w = Workers::spawn(cfg, &endpoints, start_us, until_us, progress)?;
    let readers = members.readers(cfg.workers, until_us);
    let mut strike = Strike::new(cfg, &*members, &clients, start_us);
    strike.until_recovery(&mut w).await?;
    let faults_end_us = now_us();
    let Strike { schedule, aimed_at_leader, leader_kills, leader_freezes, .. } = strike;

    // Recovery: every link whole, every member up; the workers finish and exit.
    members.launched().locked().heal();
    clients.iter().for_each(|p| p.set_delay(Duration::ZERO));
    w.finish(cfg, until_us).await?;
    if let Some(readers) = readers {
        readers.finish(&mut w.history).await;
    }
    drop(clients);
    let direct = members.endpoints(joined(&members.launched().addrs));
    let final_value = read_counter(cfg.target, &direct, cfg.op_timeout()).await?;
    let replicas = members.replicas(cfg.ttl).await;
    let terms = leaders.terms().await;

    let proof = replicas.proof.clone().map(|p| vec![p]);
    let history = std::mem::take(&mut w.history);
    let measured = Measured {
        history: &history,
        schedule,
        aimed_at_leader: &aimed_at_leader,
        terms,
        start_us,
        faults_end_us,
        replicas,
    };
    let figures = ClusterFigures::new(cfg, measured);
    let faults = std::mem::take(&mut w.faults);
    let mut r = report(cfg, history, faults, final_value, Some(figures), proof);
    if members.aim().report_leader_faults {
        r.leader_kills = Some(leader_kills);
        r.leader_freezes = Some(leader_freezes);
    }
    Ok(r)
}

/// Addresses separated by commas, as [`crate::target::Endpoints::lock`] takes them.
fn joined(addrs: impl IntoIterator<Item = impl ToString>) -> String {
    addrs.into_iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

/// The nemesis's state over one run.
struct Strike<'a, M: Members> {
    cfg: &'a TortureConfig,
    members: &'a M,
    /// The proxies between the workers and the members.
    clients: &'a [DelayProxy],
    rng: ChaCha8Rng,
    /// What is left of the current round of kinds.
    plan: Vec<Kind>,
    /// When the workers started.
    start_us: u64,
    /// When the recovery phase begins: no fault starts after it.
    faults_until: Instant,
    /// When each fault aimed at the leader struck (a failover is measured after each).
    aimed_at_leader: Vec<u64>,
    leader_kills: u64,
    leader_freezes: u64,
    schedule: Vec<Scheduled>,
}

/// The draws of one fault, all made before it strikes, whatever happens next.
struct Draw {
    kind: Kind,
    variant: u64,
    p1: u64,
    p2: u64,
    /// The member that led when the fault was drawn (a seeded one if none did).
    leader: usize,
    /// How long a partition or a delay lasts.
    hold_ms: u64,
    from_us: u64,
}

impl<'a, M: Members> Strike<'a, M> {
    fn new(cfg: &'a TortureConfig, members: &'a M, clients: &'a [DelayProxy], start_us: u64) -> Strike<'a, M> {
        Strike {
            cfg,
            members,
            clients,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            plan: Vec::new(),
            start_us,
            faults_until: Instant::now() + cfg.duration - cfg.recovery,
            aimed_at_leader: Vec::new(),
            leader_kills: 0,
            leader_freezes: 0,
            schedule: Vec::new(),
        }
    }

    /// Strikes fault after fault, a seeded gap apart, until the recovery phase.
    async fn until_recovery(&mut self, w: &mut Workers) -> Result<()> {
        let ttl_ms = self.ttl_ms();
        while Instant::now() < self.faults_until {
            let gap = Duration::from_millis(ttl_ms / 2 + self.rng.next_u64() % (ttl_ms + 1));
            w.pump_until((Instant::now() + gap).min(self.faults_until)).await;
            if Instant::now() >= self.faults_until {
                break;
            }
            let Some(kind) = self.cfg.nemesis.next_kind(&mut self.plan, &mut self.rng) else { continue };
            let d = self.draw(kind).await;
            let what = match kind {
                Kind::Kill => self.kill(&d, w).await?,
                Kind::Pause if d.variant.is_multiple_of(2) => self.freeze_leader(&d, w).await,
                Kind::Pause => self.pause_worker(w).await,
                Kind::Partition => self.partition(&d, w).await,
                Kind::Delay => self.delay(&d, w).await,
                Kind::Clock => self.clock(&d, w).await?,
            };
            let (at_ms, duration_ms) = ((d.from_us - self.start_us) / 1000, (now_us() - d.from_us) / 1000);
            self.schedule.push(Scheduled { at_ms, nemesis: kind.name(), what, duration_ms });
            w.pump();
        }
        Ok(())
    }

    async fn draw(&mut self, kind: Kind) -> Draw {
        let (variant, p1, p2) = (self.rng.next_u64(), self.rng.next_u64(), self.rng.next_u64());
        let n = self.members.launched().len();
        let leader = self.leader_within(Duration::from_secs(2)).await.unwrap_or(p2 as usize % n);
        Draw { kind, variant, p1, p2, leader, hold_ms: 1_000 + p1 % 2_000, from_us: now_us() }
    }

    /// The member that leads, asked every 50 ms for up to `within`.
    async fn leader_within(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some((_, i)) = self.members.leader_term().await {
                return Some(i);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9 of the leader, a follower or every member; restarted on their data.
    async fn kill(&mut self, d: &Draw, w: &mut Workers) -> Result<String> {
        let n = self.members.launched().len();
        let (victims, label): (Vec<usize>, &str) = match d.variant % 3 {
            0 => (vec![d.leader], "the leader"),
            1 => (vec![(d.leader + 1 + d.p2 as usize % (n - 1)) % n], "a follower"),
            _ => ((0..n).collect(), "every member"),
        };
        let mut from_us = d.from_us;
        if d.variant % 3 != 1 {
            if self.members.aim().kill_after_read {
                // While a worker holds the lock, just after its read (its lease must
                // outlive the failover), when one reads within a TTL and before the
                // recovery phase.
                w.next_read(self.cfg.ttl.min(self.faults_until.saturating_duration_since(Instant::now()))).await;
                from_us = now_us();
            }
            self.aimed_at_leader.push(from_us);
            self.leader_kills += 1;
        }
        // A leader back soon resumes its term (openraft restores a leader whose vote is
        // committed): kept down well past the election timeout, the others elect.
        let base_ms = if d.variant.is_multiple_of(3) { self.members.aim().leader_down_ms } else { 200 };
        let down_ms = base_ms + d.p1 % 800;
        let nodes: Vec<u64> = victims.iter().map(|&i| id(i)).collect();
        self.announce(d.kind, &format!("kill -9 {label} {nodes:?}, down {down_ms} ms"));
        self.members.launched().kill(&victims).await?;
        w.pump_until(Instant::now() + Duration::from_millis(down_ms)).await;
        // The restart waits for the members to serve; the workers' operations are
        // taken in meanwhile.
        pumping(w, self.members.launched().restart(&victims))
            .await
            .with_context(|| format!("restart {label} {nodes:?}"))?;
        w.faults.push(Fault::Kill { nodes: nodes.clone(), start_us: from_us, end_us: now_us() });
        Ok(format!("kill -9 {label} {nodes:?}"))
    }

    /// SIGSTOP of the leader past the election timeout and past the TTL.
    async fn freeze_leader(&mut self, d: &Draw, w: &mut Workers) -> String {
        let ttl_ms = self.ttl_ms();
        let hold = self.members.aim().election_ms + ttl_ms + d.p1 % (ttl_ms + 1);
        self.aimed_at_leader.push(d.from_us);
        self.leader_freezes += 1;
        let what = format!("SIGSTOP the leader {} for {hold} ms", id(d.leader));
        self.announce(d.kind, &what);
        let pid = self.members.launched().locked().pid(d.leader);
        if let Some(pid) = pid {
            let _ = crate::peers::signal(pid, libc::SIGSTOP);
            w.pump_until(Instant::now() + Duration::from_millis(hold)).await;
            let _ = crate::peers::signal(pid, libc::SIGCONT);
        }
        w.faults.push(Fault::NodePause { node: id(d.leader), start_us: d.from_us, end_us: now_us() });
        what
    }

    /// SIGSTOP of the next worker that has read (it holds the lock), past its TTL.
    async fn pause_worker(&mut self, w: &mut Workers) -> String {
        self.announce(Kind::Pause, "SIGSTOP the next worker that has read, past its TTL");
        let paused = w.pause_one(self.cfg.ttl, &mut self.rng).await;
        format!("SIGSTOP a worker holding the lock past its TTL{}", if paused { "" } else { " (none read)" })
    }

    async fn partition(&mut self, d: &Draw, w: &mut Workers) -> String {
        let split = Split::draw(d.variant, d.p2, d.leader, self.members.launched().len());
        if split.at_leader {
            self.aimed_at_leader.push(d.from_us);
        }
        let cut = self.members.launched().locked().cut(&split.a, &split.b, split.both);
        let what = format!("{}, links cut {cut:?}, for {} ms", split.label, d.hold_ms);
        self.announce(d.kind, &what);
        w.pump_until(self.until(d.hold_ms)).await;
        self.members.launched().locked().heal();
        w.faults.push(Fault::Partition { kind: split.label.into(), cut, start_us: d.from_us, end_us: now_us() });
        what
    }

    /// Bytes held between the workers and every member, or on the leader's links.
    async fn delay(&mut self, d: &Draw, w: &mut Workers) -> String {
        let ttl_ms = self.ttl_ms();
        let delay_ms = ttl_ms / 2 + d.p2 % (ttl_ms + 1);
        let held = Duration::from_millis(delay_ms);
        let to_clients = d.variant.is_multiple_of(2);
        let what = if to_clients {
            self.clients.iter().for_each(|p| p.set_delay(held));
            format!("every byte between workers and members held {delay_ms} ms, for {} ms", d.hold_ms)
        } else {
            self.members.launched().locked().delay_links(d.leader, held);
            format!("every byte on the leader {}'s links held {delay_ms} ms, for {} ms", id(d.leader), d.hold_ms)
        };
        self.announce(d.kind, &what);
        w.pump_until(self.until(d.hold_ms)).await;
        self.clients.iter().for_each(|p| p.set_delay(Duration::ZERO));
        self.members.launched().locked().heal();
        let (start_us, end_us) = (d.from_us, now_us());
        w.faults.push(if to_clients {
            Fault::Delay { delay_ms, start_us, end_us }
        } else {
            Fault::LinkDelay { node: id(d.leader), delay_ms, start_us, end_us }
        });
        what
    }

    /// The leader's clock fast or slow for a while.
    async fn clock(&mut self, d: &Draw, w: &mut Workers) -> Result<String> {
        // Fast stays inside the client's margin (a tenth of the TTL): a lease must
        // still outlive its client-side deadline. Slow may be anything.
        let permille = if d.variant.is_multiple_of(2) { 1_020 + d.p2 % 61 } else { 500 + d.p2 % 401 };
        let rate = permille as f64 / 1000.0;
        let what = format!("the leader {}'s clock at {rate}x for {} ms", id(d.leader), d.hold_ms);
        self.announce(d.kind, &what);
        self.members.set_clock_rate(d.leader, rate)?;
        w.pump_until(self.until(d.hold_ms)).await;
        self.members.set_clock_rate(d.leader, 1.0)?;
        let node = id(d.leader);
        w.faults.push(Fault::Clock { node, rate_permille: permille, start_us: d.from_us, end_us: now_us() });
        Ok(what)
    }

    fn ttl_ms(&self) -> u64 {
        self.cfg.ttl.as_millis() as u64
    }

    /// `ms` from now, but no later than a TTL into the recovery phase.
    fn until(&self, ms: u64) -> Instant {
        (Instant::now() + Duration::from_millis(ms)).min(self.faults_until + self.cfg.ttl)
    }

    fn announce(&self, kind: Kind, what: &str) {
        eprintln!("nemesis +{:.1}s {}: {what}", (now_us() - self.start_us) as f64 / 1e6, kind.name());
    }
}

/// Member `i`'s node id.
fn id(i: usize) -> u64 {
    i as u64 + 1
}

/// Awaits `f`, taking in the workers' operations every 50 ms meanwhile.
async fn pumping<T>(w: &mut Workers, f: impl Future<Output = T>) -> T {
    tokio::pin!(f);
    loop {
        tokio::select! {
            out = &mut f => return out,
            () = sleep(Duration::from_millis(50)) => w.pump(),
        }
    }
}
