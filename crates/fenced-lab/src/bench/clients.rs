//! The clients of a closed- or open-loop run: each its own connection, its work, its tally.

use super::*;

/// One bench client's connection, for the workload at hand.
enum Work {
    Lock(Conn),
    Store(Writer),
}

/// The lock and store workloads: connect every client, warm each connection with one
/// operation, then run them together for the duration.
pub(super) async fn run_clients(cfg: &BenchConfig, peer: &Peer, ops: Arc<AtomicU64>) -> Result<BenchReport> {
    let o = cfg.options();
    driver::prepare(cfg.target, &peer.endpoint, o).await?;
    let mut connecting = JoinSet::new();
    for id in 0..cfg.clients {
        let (cfg, endpoint) = (cfg.clone(), peer.endpoint.clone());
        connecting.spawn(async move {
            let mut work = if cfg.workload.locks() {
                Work::Lock(Conn::connect(cfg.target, &endpoint, id, o).await?)
            } else {
                Work::Store(Writer::connect(cfg.target, &endpoint, id, o).await?)
            };
            // Warm-up, not measured: the connection is open and the names exist.
            once(&mut work, &cfg, id).await.with_context(|| format!("cannot reach {} at {endpoint}", cfg.target))?;
            anyhow::Ok((id, work))
        });
    }
    let mut works = Vec::new();
    let connected = timeout(Duration::from_secs(30), async {
        while let Some(joined) = connecting.join_next().await {
            works.push(joined??);
        }
        anyhow::Ok(())
    })
    .await;
    match connected {
        Ok(r) => r?,
        Err(_) => bail!("{} at {}: the clients could not connect within 30 s", cfg.target, peer.endpoint),
    }

    let start = Instant::now() + Duration::from_millis(50);
    let end = start + cfg.duration;
    // Client id's operations are due at start + (id + k * clients) / rate.
    let pacer = cfg.rate.map(|rate| {
        let every = Duration::from_secs_f64(f64::from(cfg.clients) / rate);
        let schedules: Vec<_> = (0..cfg.clients).map(|id| (start + every * id / cfg.clients, every)).collect();
        Pacer::start(&schedules, end)
    });
    let mut clients = JoinSet::new();
    for (id, work) in works {
        let (cfg, ops) = (cfg.clone(), ops.clone());
        let due = pacer.as_ref().map(|p| p.bell(id as usize));
        clients.spawn(async move { client_loop(work, cfg, id, start, end, ops, due).await });
    }
    sleep_until(start).await;
    let (server0, client0) = (peer.server_cpu(), cpu_time(std::process::id()));
    let drain = cfg.wait() + o.op_timeout + Duration::from_secs(5);
    let mut tallies = Vec::new();
    let joined = timeout(cfg.duration + drain, async {
        while let Some(t) = clients.join_next().await {
            tallies.push(t?);
        }
        anyhow::Ok(())
    })
    .await;
    let finished = Instant::now();
    let (server1, client1) = (peer.server_cpu(), cpu_time(std::process::id()));
    match joined {
        Ok(r) => r?,
        Err(_) => bail!("{} {}: clients still busy {drain:?} after the end of the run", cfg.target, cfg.workload),
    }

    let mut r = blank_report(cfg);
    let elapsed = finished - start;
    r.duration_ms = elapsed.as_millis() as u64;
    let mut latency = stats::histogram();
    let mut acquire = stats::histogram();
    let mut lag = stats::histogram();
    let mut per_client = Vec::new();
    for t in &tallies {
        latency.add(&t.latency)?;
        acquire.add(&t.acquire)?;
        lag.add(&t.lag)?;
        r.ops += t.ops;
        r.errors += t.errors;
        per_client.push(t.ops);
        if r.first_error.is_none() {
            r.first_error.clone_from(&t.first_error);
        }
    }
    [r.p50_us, r.p99_us, r.p999_us, r.max_us] = percentiles(&latency);
    r.ops_per_s = r.ops as f64 / elapsed.as_secs_f64();
    if cfg.rate.is_some() {
        let [l50, l99, ..] = percentiles(&lag);
        (r.send_lag_p50_us, r.send_lag_p99_us) = (Some(l50), Some(l99));
    }
    if cfg.workload.locks() {
        let [a50, a99, ..] = percentiles(&acquire);
        r.acquire_p50_us = Some(a50);
        r.acquire_p99_us = Some(a99);
        r.grants_per_client_min = per_client.iter().min().copied();
        r.grants_per_client_max = per_client.iter().max().copied();
        r.starved_clients = Some(per_client.iter().filter(|&&n| n == 0).count() as u64);
    }
    cpu_fields(&mut r, server0.zip(server1), client0.zip(client1));
    Ok(r)
}

pub(super) fn cpu_fields(
    r: &mut BenchReport,
    server: Option<(Duration, Duration)>,
    client: Option<(Duration, Duration)>,
) {
    if let Some((a, b)) = server {
        let cpu = b.saturating_sub(a);
        r.server_cpu_s = Some(cpu.as_secs_f64());
        r.server_cpu_us_per_op = (r.ops > 0).then(|| cpu.as_secs_f64() * 1e6 / r.ops as f64);
    }
    if let Some((a, b)) = client {
        r.client_cpu_s = Some(b.saturating_sub(a).as_secs_f64());
    }
}

/// The name client `id` locks, or the key it writes.
fn name(w: Workload, id: u32) -> String {
    match w {
        Workload::Contended => "bench/one".into(),
        Workload::Store => format!("bench/store/{id}"),
        _ => format!("bench/own/{id}"),
    }
}

/// One operation; for the lock workloads returns when the lock was acquired.
async fn once(work: &mut Work, cfg: &BenchConfig, id: u32) -> Result<Option<Instant>> {
    let o = cfg.options();
    let name = name(cfg.workload, id);
    match work {
        Work::Lock(conn) => {
            let held: Held = conn.acquire(&name, o, cfg.wait()).await?;
            let acquired = Instant::now();
            if !cfg.hold.is_zero() {
                sleep(cfg.hold).await;
            }
            conn.release(held, o).await?;
            Ok(Some(acquired))
        }
        Work::Store(w) => {
            w.write(&name, o).await?;
            Ok(None)
        }
    }
}

/// Client `id`'s loop until `end`: back to back (closed loop), or each operation at
/// its due time (open loop, `rate / clients` per second, latency from the due time,
/// woken by the pacer's `bell`).
async fn client_loop(
    mut work: Work,
    cfg: BenchConfig,
    id: u32,
    start: Instant,
    end: Instant,
    ops: Arc<AtomicU64>,
    bell: Option<Arc<Notify>>,
) -> Tally {
    let mut t = Tally::default();
    let interval = cfg.rate.map(|r| Duration::from_secs_f64(f64::from(cfg.clients) / r));
    let phase = interval.map_or(Duration::ZERO, |iv| iv * id / cfg.clients);
    sleep_until(start).await;
    let mut k: u32 = 0;
    loop {
        let due = match interval {
            Some(iv) => start + phase + iv.saturating_mul(k),
            None => Instant::now(),
        };
        if due >= end {
            break;
        }
        k = k.saturating_add(1);
        // A closed loop never sleeps: tokio rounds a timer up to its next millisecond
        // tick, even one due now.
        if let Some(bell) = &bell {
            pacer::until(bell, due).await;
            record(&mut t.lag, Instant::now().saturating_duration_since(due));
        }
        match once(&mut work, &cfg, id).await {
            Ok(acquired) => {
                let done = Instant::now();
                record(&mut t.latency, done - due);
                if let Some(a) = acquired {
                    record(&mut t.acquire, a - due);
                }
                t.ops += 1;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                t.failed(&e);
                if interval.is_none() {
                    // Do not spin on a failing target.
                    sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    if let Work::Store(w) = work {
        w.close().await;
    }
    t
}
