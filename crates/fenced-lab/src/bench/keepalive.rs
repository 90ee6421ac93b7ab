//! The keepalive workload: M leases, each kept alive at a third of its TTL on a fixed
//! schedule (an open loop: latency counts from the moment a keepalive was due), spread
//! over the clients' connections; the server's CPU time over the measured window, and
//! the leases that expired although they were being kept alive. The schedule is kept
//! by the [`Pacer`]'s thread, not tokio's millisecond timer.
//!
//! The first third of a TTL creates the leases (on the same schedule, not measured);
//! the measured window follows. Fenced is driven through its client's lease calls, one
//! client (one connection) per bench connection, over whichever transport the endpoint
//! names; Redis's lease is a key with a TTL, kept alive by `PEXPIRE`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fenced_client::{Client, LeaseId};
use tokio::time::{sleep_until, timeout, Instant};

use tokio::sync::Notify;

use super::driver::redis_connect;
use super::pacer::{self, Pacer};
use super::stats::{cpu_time, record, Tally};
use super::{BenchConfig, BenchTarget};

/// What the keepalive workload found.
#[derive(Debug)]
pub struct KeepaliveOutcome {
    /// Keepalives in the measured window, with their latencies.
    pub tally: Tally,
    /// Keepalives the server answered "no such lease": it expired while kept alive.
    pub false_expiries: u64,
    /// Keepalives that came back more than a TTL after the previous successful one was
    /// sent: a client could no longer trust its lease, whatever the server said.
    pub late: u64,
    /// Keepalives due in the window that were still unsent at its end: the client (or
    /// the server behind it) fell that far behind the schedule.
    pub unsent: u64,
    /// The measured window.
    pub window: Duration,
    /// The server's CPU time over the window, when its pid is known.
    pub server_cpu: Option<Duration>,
    /// This process's CPU time over the window.
    pub client_cpu: Option<Duration>,
}

/// Runs the workload: `cfg.leases` leases of `cfg.ttl` over `cfg.clients` connections,
/// measured for `cfg.duration` after the creation pass. `ops` counts keepalives for the
/// progress bar.
pub async fn run(
    cfg: &BenchConfig,
    endpoint: &str,
    server_pid: Option<u32>,
    ops: Arc<AtomicU64>,
) -> Result<KeepaliveOutcome> {
    let (target, leases, ttl, duration) = (cfg.target, cfg.leases, cfg.ttl, cfg.duration);
    let period = ttl / 3;
    let conns = cfg.clients.min(leases).max(1);
    let mut handles = Vec::new();
    let mut links = Vec::new();
    for _ in 0..conns {
        links.push(Link::connect(target, endpoint).await?);
    }
    let t0 = Instant::now() + Duration::from_millis(100);
    let measure_from = t0 + period;
    let end = measure_from + duration;
    // Connection c serves its n leases in turn, one every `slot`, from `t0 + offset`.
    let schedules: Vec<(usize, Instant, Duration)> = (0..conns as usize)
        .map(|c| {
            let n = (leases as usize).saturating_sub(c).div_ceil(conns as usize);
            let slot = period / n.max(1) as u32;
            (n, t0 + slot * c as u32 / conns, slot)
        })
        .collect();
    let pacer = Pacer::start(&schedules.iter().map(|&(_, first, slot)| (first, slot)).collect::<Vec<_>>(), end);
    for (c, (link, (n, first, slot))) in links.into_iter().zip(schedules).enumerate() {
        let (ops, bell) = (ops.clone(), pacer.bell(c));
        handles.push(tokio::spawn(async move {
            one_connection(link, n, ttl, first, slot, measure_from, end, ops, bell).await
        }));
    }
    let cpu_at = |pid: Option<u32>| pid.and_then(cpu_time);
    sleep_until(measure_from).await;
    let (server0, client0) = (cpu_at(server_pid), cpu_at(Some(std::process::id())));
    sleep_until(end).await;
    let (server1, client1) = (cpu_at(server_pid), cpu_at(Some(std::process::id())));
    let mut out = KeepaliveOutcome {
        tally: Tally::default(),
        false_expiries: 0,
        late: 0,
        unsent: 0,
        window: duration,
        server_cpu: server0.zip(server1).map(|(a, b)| b.saturating_sub(a)),
        client_cpu: client0.zip(client1).map(|(a, b)| b.saturating_sub(a)),
    };
    for h in handles {
        // Each connection stops at `end`; a request in flight is bounded by its timeout.
        let one = timeout(REQUEST_TIMEOUT * 2, h).await.context("a keepalive connection did not stop")??;
        out.tally.latency.add(&one.tally.latency)?;
        out.tally.ops += one.tally.ops;
        out.tally.errors += one.tally.errors;
        if out.tally.first_error.is_none() {
            out.tally.first_error = one.tally.first_error;
        }
        out.false_expiries += one.false_expiries;
        out.late += one.late;
        out.unsent += one.unsent;
    }
    Ok(out)
}

/// The bound on one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

struct Lease {
    /// Fenced's lease id, or Redis's key.
    id: String,
    /// When the last successful create or keepalive was sent.
    sent_ok: Instant,
}

struct ConnOutcome {
    tally: Tally,
    false_expiries: u64,
    late: u64,
    unsent: u64,
}

#[allow(clippy::too_many_arguments)]
async fn one_connection(
    mut link: Link,
    n: usize,
    ttl: Duration,
    first: Instant,
    slot: Duration,
    measure_from: Instant,
    end: Instant,
    ops: Arc<AtomicU64>,
    bell: Arc<Notify>,
) -> ConnOutcome {
    let mut out = ConnOutcome { tally: Tally::default(), false_expiries: 0, late: 0, unsent: 0 };
    let mut leases: Vec<Lease> = Vec::with_capacity(n);
    let mut k: u64 = 0;
    loop {
        let due = first + Duration::from_nanos((slot.as_nanos() as u64).saturating_mul(k));
        if due >= end || n == 0 {
            return out;
        }
        if Instant::now() >= end {
            // Behind schedule at the end: what was due and not sent is counted, not sent.
            let behind = end.saturating_duration_since(due.max(measure_from));
            out.unsent = (behind.as_nanos() / slot.as_nanos().max(1)) as u64 + 1;
            return out;
        }
        let i = (k % n as u64) as usize;
        k += 1;
        pacer::until(&bell, due).await;
        let sent = Instant::now();
        if i >= leases.len() {
            // The creation pass.
            match link.create(ttl).await {
                Ok(id) => leases.push(Lease { id, sent_ok: sent }),
                Err(e) => {
                    out.tally.failed(&e);
                    // Without its lease this connection has nothing to keep alive.
                    return out;
                }
            }
            continue;
        }
        let alive = link.keepalive(&leases[i].id, ttl).await;
        let now = Instant::now();
        let measured = due >= measure_from;
        match alive {
            Ok(true) => {
                if now > leases[i].sent_ok + ttl {
                    out.late += u64::from(measured);
                }
                leases[i].sent_ok = sent;
                if measured {
                    record(&mut out.tally.latency, now - due);
                    out.tally.ops += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(false) => {
                out.false_expiries += u64::from(measured);
                match link.create(ttl).await {
                    Ok(id) => leases[i] = Lease { id, sent_ok: sent },
                    Err(e) => {
                        out.tally.failed(&e);
                        return out;
                    }
                }
            }
            Err(e) => {
                out.tally.failed(&e);
                if link.reconnect().await.is_err() {
                    return out;
                }
            }
        }
    }
}

/// One connection of the keepalive workload.
enum Link {
    /// Fenced's own client: one connection (a `fenced://` wire connection, or
    /// keep-alive HTTP/1.1 for an `http://` endpoint).
    Fenced(Client),
    Redis {
        conn: redis::aio::MultiplexedConnection,
        next_key: u64,
        prefix: String,
    },
}

impl Link {
    async fn connect(target: BenchTarget, endpoint: &str) -> Result<Link> {
        let unreachable = || format!("cannot reach {target} at {endpoint}");
        match target {
            BenchTarget::Fenced => Ok(Link::Fenced(
                Client::builder()
                    .endpoint(endpoint)
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect_timeout(Duration::from_secs(2))
                    .build()
                    .with_context(unreachable)?,
            )),
            BenchTarget::Redis | BenchTarget::RedisAof => {
                static N: AtomicU64 = AtomicU64::new(0);
                let conn = redis_connect(endpoint, REQUEST_TIMEOUT).await.with_context(unreachable)?;
                let prefix = format!("bench:lease:{}:{}:", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
                Ok(Link::Redis { conn, next_key: 0, prefix })
            }
            other => bail!("the keepalive workload is built for fenced and redis, not {other}"),
        }
    }

    /// After a failed request: the clients reconnect by themselves on the next call.
    async fn reconnect(&mut self) -> Result<()> {
        Ok(())
    }

    /// A new lease of `ttl`.
    async fn create(&mut self, ttl: Duration) -> Result<String> {
        match self {
            Link::Fenced(c) => Ok(c.create_lease(ttl).await?.to_hex()),
            Link::Redis { conn, next_key, prefix } => {
                let key = format!("{prefix}{next_key}");
                *next_key += 1;
                redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl.as_millis() as u64)
                    .query_async::<()>(conn)
                    .await?;
                Ok(key)
            }
        }
    }

    /// Keeps `lease` alive; `false` when the server no longer has it.
    async fn keepalive(&mut self, lease: &str, ttl: Duration) -> Result<bool> {
        match self {
            Link::Fenced(c) => {
                let id = LeaseId::from_hex(lease).context("a lease id the server gave")?;
                match c.keepalive(id).await {
                    Ok(_) => Ok(true),
                    Err(fenced_client::Error::NotFound(_)) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Link::Redis { conn, .. } => {
                let set: i64 = redis::cmd("PEXPIRE").arg(lease).arg(ttl.as_millis() as u64).query_async(conn).await?;
                Ok(set == 1)
            }
        }
    }
}
