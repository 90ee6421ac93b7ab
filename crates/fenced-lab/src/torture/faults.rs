//! The faults of a run on one lock service: pauses, crashes and held bytes (a cluster's are the nemesis's).

use super::*;

/// A fault of a run on one lock service (the clusters' are [`crate::nemesis`]'s).
#[derive(Clone, Copy, Debug)]
enum LocalFault {
    Pause,
    Crash,
    Delay,
}

/// One round of faults: every enabled kind, pauses twice (they are the seeds' story).
fn local_faults(faults: Faults) -> Vec<LocalFault> {
    let kinds = [
        (faults.pause, LocalFault::Pause),
        (faults.pause, LocalFault::Pause),
        (faults.crash, LocalFault::Crash),
        (faults.delay, LocalFault::Delay),
    ];
    kinds.into_iter().filter_map(|(on, f)| on.then_some(f)).collect()
}

/// The nemesis, while the history streams in: a seeded gap, then the next fault of
/// the plan, until the recovery phase.
pub(super) async fn inject_faults(
    cfg: &TortureConfig,
    w: &mut Workers,
    locks: &[Arc<Mutex<Service>>],
    proxies: &[DelayProxy],
    faults_until: Instant,
) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut plan = Vec::new();
    let ttl_ms = cfg.ttl.as_millis() as u64;
    while Instant::now() < faults_until {
        let gap = Duration::from_millis(ttl_ms / 2 + rng.next_u64() % (ttl_ms * 3 / 2 + 1));
        w.pump_until((Instant::now() + gap).min(faults_until)).await;
        if Instant::now() >= faults_until {
            break;
        }
        // Faults come in rounds, a seeded shuffle of every enabled kind, so a short run
        // still sees each kind.
        let Some(fault) = crate::nemesis::next_in_round(&mut plan, || local_faults(cfg.faults), &mut rng) else {
            continue;
        };
        match fault {
            LocalFault::Pause => {
                w.pause_one(cfg.ttl, &mut rng).await;
            }
            LocalFault::Crash => crash_one(cfg, w, locks, faults_until, &mut rng).await?,
            LocalFault::Delay => delay_links(w, proxies, ttl_ms, faults_until, &mut rng).await,
        }
        w.pump();
    }
    Ok(())
}

/// kill -9 one lock service and start it again on its data directory.
async fn crash_one(
    cfg: &TortureConfig,
    w: &mut Workers,
    locks: &[Arc<Mutex<Service>>],
    faults_until: Instant,
    rng: &mut ChaCha8Rng,
) -> Result<()> {
    // Aimed at a holder: just after a worker's read (a lock held, its lease to outlive
    // the restart), so the restart is judged on the lease it must keep, not on an idle
    // moment; within a TTL, before recovery.
    w.next_read(cfg.ttl.min(faults_until.saturating_duration_since(Instant::now()))).await;
    let from = now_us();
    let down = Duration::from_millis(100 + rng.next_u64() % 500);
    // Redlock's five instances: one crashes at a time (a draw only then, so the other
    // targets keep their plan).
    let which = if locks.len() > 1 { rng.next_u64() as usize % locks.len() } else { 0 };
    let svc = locks[which].clone();
    tokio::task::spawn_blocking(move || {
        let mut s = svc.lock().expect("service lock");
        s.crash();
        std::thread::sleep(down);
        s.restart()
    })
    .await??;
    w.faults.push(Fault::Restart { start_us: from, end_us: now_us() });
    Ok(())
}

/// Holds the bytes between the workers and the lock service for a seeded while.
async fn delay_links(
    w: &mut Workers,
    proxies: &[DelayProxy],
    ttl_ms: u64,
    faults_until: Instant,
    rng: &mut ChaCha8Rng,
) {
    let delay_ms = ttl_ms / 2 + rng.next_u64() % (ttl_ms + 1);
    let hold = Duration::from_millis(1000 + rng.next_u64() % 2000);
    let from = now_us();
    proxies.iter().for_each(|p| p.set_delay(Duration::from_millis(delay_ms)));
    w.pump_until((Instant::now() + hold).min(faults_until)).await;
    proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
    w.faults.push(Fault::Delay { delay_ms, start_us: from, end_us: now_us() });
}
