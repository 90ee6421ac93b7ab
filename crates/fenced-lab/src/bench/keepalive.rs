//! The keepalive workload: M leases, each kept alive at a third of its TTL on a fixed
//! schedule (an open loop: latency counts from the moment a keepalive was due), spread
//! over the clients' connections; the server's CPU time over the measured window, and
//! the leases that expired although they were being kept alive. The schedule is kept
//! by the [`Pacer`]'s thread, not tokio's millisecond timer.
//!
//! The first third of a TTL creates the leases (on the same schedule, not measured);
//! the measured window follows. A connection sends each keepalive when it is due
//! without waiting for the ones before it (up to [`IN_FLIGHT_MAX`] in flight), so the
//! figure is the server's and not one round trip after another on 16 connections.
//! Fenced is driven through its client's lease calls, one
//! client (one connection) per bench connection, over whichever transport the endpoint
//! names; Redis's lease is a key with a TTL, kept alive by `PEXPIRE`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fenced_client::{Client, LeaseId};
use tokio::time::{sleep_until, timeout, Instant};

use tokio::sync::{Notify, Semaphore};

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
        let schedule = Schedule { n, ttl, first, slot, measure_from, end };
        handles.push(tokio::spawn(async move { one_connection(link, schedule, ops, bell).await }));
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

/// The most keepalives one connection has in flight: enough that the server, not the
/// round trip of one request after another, sets the pace (the clients multiplex a
/// connection: Fenced's wire protocol by request id, Redis's by pipelining).
pub const IN_FLIGHT_MAX: usize = 64;

#[derive(Clone)]
struct Lease {
    /// Fenced's lease id, or Redis's key.
    id: String,
    /// When the last successful create or keepalive was sent.
    sent_ok: Instant,
}

#[derive(Default)]
struct ConnOutcome {
    tally: Tally,
    false_expiries: u64,
    late: u64,
    unsent: u64,
}

/// One connection's leases and what its requests found, shared by its requests in flight.
struct ConnState {
    /// Each lease of the connection: none until created; `busy` while a request for it
    /// is in flight (a lease whose last keepalive has not come back is not sent again).
    leases: Vec<Option<Lease>>,
    busy: Vec<bool>,
    out: ConnOutcome,
}

/// What one connection's loop needs besides its link.
struct Schedule {
    n: usize,
    ttl: Duration,
    first: Instant,
    slot: Duration,
    measure_from: Instant,
    end: Instant,
}

/// Sends each of the connection's keepalives at its due time without waiting for the
/// ones before it to come back, at most [`IN_FLIGHT_MAX`] at once; the first round
/// creates the leases. Returns once the window is over and every request came back.
async fn one_connection(link: Link, s: Schedule, ops: Arc<AtomicU64>, bell: Arc<Notify>) -> ConnOutcome {
    if s.n == 0 {
        return ConnOutcome::default();
    }
    let state = Arc::new(std::sync::Mutex::new(ConnState {
        leases: vec![None; s.n],
        busy: vec![false; s.n],
        out: ConnOutcome::default(),
    }));
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let mut requests = tokio::task::JoinSet::new();
    let mut k: u64 = 0;
    let mut unsent = 0;
    loop {
        let due = s.first + Duration::from_nanos((s.slot.as_nanos() as u64).saturating_mul(k));
        if due >= s.end {
            break;
        }
        if Instant::now() >= s.end {
            // Behind schedule at the end: what was due and not sent is counted, not sent.
            let behind = s.end.saturating_duration_since(due.max(s.measure_from));
            unsent = (behind.as_nanos() / s.slot.as_nanos().max(1)) as u64 + 1;
            break;
        }
        let i = (k % s.n as u64) as usize;
        k += 1;
        pacer::until(&bell, due).await;
        let Ok(permit) = slots.clone().acquire_owned().await else { break };
        while requests.try_join_next().is_some() {}
        let lease = {
            let mut st = lock(&state);
            if st.busy[i] {
                // Its last request is still out: this one is due and not sent.
                st.out.unsent += u64::from(due >= s.measure_from);
                continue;
            }
            st.busy[i] = true;
            st.leases[i].clone()
        };
        let (link, state, ops) = (link.clone(), state.clone(), ops.clone());
        let (ttl, measured) = (s.ttl, due >= s.measure_from);
        requests.spawn(async move {
            let _permit = permit;
            one_request(link, &state, i, lease, ttl, due, measured, &ops).await;
            lock(&state).busy[i] = false;
        });
    }
    // Each request is bounded by the client's timeout.
    while requests.join_next().await.is_some() {}
    let mut out = std::mem::take(&mut lock(&state).out);
    out.unsent += unsent;
    out
}

fn lock(state: &std::sync::Mutex<ConnState>) -> std::sync::MutexGuard<'_, ConnState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// One lease's request: its creation, or a keepalive (and a new lease if it expired).
#[allow(clippy::too_many_arguments)]
async fn one_request(
    mut link: Link,
    state: &std::sync::Mutex<ConnState>,
    i: usize,
    lease: Option<Lease>,
    ttl: Duration,
    due: Instant,
    measured: bool,
    ops: &AtomicU64,
) {
    let sent = Instant::now();
    let Some(lease) = lease else {
        // The creation pass (or a creation that failed before: tried again).
        match link.create(ttl).await {
            Ok(id) => lock(state).leases[i] = Some(Lease { id, sent_ok: sent }),
            Err(e) => lock(state).out.tally.failed(&e),
        }
        return;
    };
    let alive = link.keepalive(&lease.id, ttl).await;
    let now = Instant::now();
    let mut st = lock(state);
    match alive {
        Ok(true) => {
            if now > lease.sent_ok + ttl {
                st.out.late += u64::from(measured);
            }
            st.leases[i] = Some(Lease { id: lease.id, sent_ok: sent });
            if measured {
                record(&mut st.out.tally.latency, now - due);
                st.out.tally.ops += 1;
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(false) => {
            st.out.false_expiries += u64::from(measured);
            // Created again on its next turn.
            st.leases[i] = None;
        }
        Err(e) => st.out.tally.failed(&e),
    }
}

/// One connection of the keepalive workload (clones share it).
#[derive(Clone)]
enum Link {
    /// Fenced's own client: one connection (a `fenced://` wire connection, or
    /// keep-alive HTTP/1.1 for an `http://` endpoint).
    Fenced(Client),
    Redis {
        conn: redis::aio::MultiplexedConnection,
        next_key: Arc<AtomicU64>,
        prefix: Arc<str>,
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
                Ok(Link::Redis { conn, next_key: Arc::new(AtomicU64::new(0)), prefix: prefix.into() })
            }
            other => bail!("the keepalive workload is built for fenced and redis, not {other}"),
        }
    }

    /// A new lease of `ttl`.
    async fn create(&mut self, ttl: Duration) -> Result<String> {
        match self {
            Link::Fenced(c) => Ok(c.create_lease(ttl).await?.to_hex()),
            Link::Redis { conn, next_key, prefix } => {
                let key = format!("{prefix}{}", next_key.fetch_add(1, Ordering::Relaxed));
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
