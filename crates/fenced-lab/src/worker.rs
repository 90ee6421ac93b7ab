//! A torture worker: one process running the counter workload (or its leader-election
//! form, [`Workload::Elect`]) against one target and printing every operation as a JSON
//! line on standard output.
//!
//! The cycle: take the lock, read the counter, work a little, write the counter plus
//! one, release. The worker does not consult its lease before writing, as in Jepsen's
//! etcd test: a check narrows the window but cannot close it, since the pause can fall
//! between the check and the write (the seeds' point). It stops by itself at its
//! deadline; the in-flight request is bounded by the driver's time-out.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::history::{Op, OpKind, OpResult};
use crate::target::{Driver, Endpoints, Grant, Outcome, Target};

/// Microseconds since the Unix epoch: the clock every process on the machine shares.
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Everything a worker process is told (passed as one JSON argument).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub target: Target,
    pub endpoints: Endpoints,
    pub worker: u32,
    pub seed: u64,
    /// When to stop starting cycles, Unix microseconds.
    pub until_us: u64,
    pub ttl_ms: u64,
    /// Upper bound of the work between read and write.
    pub work_ms: u64,
    pub op_timeout_ms: u64,
    /// The lock's name and the counter's key, for the workers written in another
    /// language (this binary's own know them from `target`).
    #[serde(default)]
    pub lock: String,
    #[serde(default)]
    pub counter_key: String,
    /// What the worker does with the lock (the other languages' workers know only the
    /// counter).
    #[serde(default)]
    pub workload: Workload,
}

/// What the workers do with the lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Take the lock, read the counter, write it plus one, release.
    #[default]
    Counter,
    /// Leader election: campaign (`campaign()`, waiting round after round), then as
    /// leader increment the counter for a few rounds while the client keeps the lease
    /// alive, asking before each round whether leadership is still held (as leader
    /// libraries do), then resign. A pause between a round's read and its write is not
    /// seen by that question: the zombie leader.
    Elect,
}

impl Workload {
    pub const NAMES: [&'static str; 2] = ["counter", "elect"];

    pub fn parse(s: &str) -> Result<Workload, String> {
        match s {
            "counter" => Ok(Workload::Counter),
            "elect" => Ok(Workload::Elect),
            _ => Err(format!("unknown workload {s:?}: one of {}", Workload::NAMES.join(", "))),
        }
    }

    pub fn name(self) -> &'static str {
        Workload::NAMES[self as usize]
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The most rounds a leader leads before it resigns (each term has 1 to this many).
const TERM_ROUNDS_MAX: u64 = 8;

/// Runs the workload until the deadline, writing each operation to `out` as it ends.
pub async fn run(spec: WorkerSpec, out: &mut impl Write) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ (u64::from(spec.worker) << 32));
    let op_timeout = Duration::from_millis(spec.op_timeout_ms);
    let mut driver: Option<Driver> = None;
    let mut cycle = 0u64;
    while now_us() < spec.until_us {
        cycle += 1;
        let d = match driver.as_mut() {
            Some(d) => d,
            None => match Driver::connect(spec.target, &spec.endpoints, op_timeout, rng.next_u64()).await {
                Ok(d) => driver.insert(d),
                Err(_) => {
                    // The service is down (the nemesis crashed it): try again shortly.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let mut rec =
            Recorder { out, worker: spec.worker, cycle, token: None, promised_until_us: None, lost_signalled: None };
        let start = now_us();
        let grant = match take(d, &spec, cycle).await {
            Ok(g) => g,
            Err(e) => {
                rec.emit(OpKind::Acquire, start, OpResult::Failed, None, Some(e.to_string()))?;
                // A broken connection is rebuilt; a lock not granted is tried again.
                driver = None;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        rec.token = grant.token;
        rec.emit(OpKind::Acquire, start, OpResult::Ok, None, None)?;
        let rounds = match spec.workload {
            Workload::Counter => 1,
            Workload::Elect => 1 + rng.next_u64() % TERM_ROUNDS_MAX,
        };
        for round in 0..rounds {
            // A leader asks whether it still leads before each round after the first.
            if round > 0 && (grant.lost_signalled() == Some(true) || now_us() >= spec.until_us) {
                break;
            }
            if !increment(d, &grant, &mut rec, &mut rng, spec.work_ms).await? {
                break;
            }
        }
        let start = now_us();
        match d.release(grant).await {
            Ok(()) => rec.emit(OpKind::Release, start, OpResult::Ok, None, None)?,
            Err(e) => rec.emit(OpKind::Release, start, OpResult::Unknown, None, Some(e.to_string()))?,
        }
    }
    Ok(())
}

/// Takes the lock as the workload does: an acquire that waits up to five TTLs, or a
/// campaign as `worker-N` bounded by what is left of the run.
async fn take(d: &mut Driver, spec: &WorkerSpec, cycle: u64) -> Result<Grant> {
    let ttl = Duration::from_millis(spec.ttl_ms);
    let remaining = Duration::from_micros(spec.until_us.saturating_sub(now_us()));
    match spec.workload {
        Workload::Counter => d.acquire(ttl, remaining.min(ttl * 5), cycle).await,
        Workload::Elect => {
            let holder = format!("worker-{}", spec.worker);
            match tokio::time::timeout(remaining, d.campaign(ttl, ttl, &holder)).await {
                Ok(got) => got,
                Err(_) => anyhow::bail!("the run ended while campaigning"),
            }
        }
    }
}

/// One increment under `grant`: read, work up to `work_ms`, write the value plus one.
/// The worker does not consult its lease between the read and the write, as in
/// Jepsen's etcd test. True when the write was acknowledged.
async fn increment<W: Write>(
    d: &mut Driver,
    grant: &Grant,
    rec: &mut Recorder<'_, W>,
    rng: &mut ChaCha8Rng,
    work_ms: u64,
) -> Result<bool> {
    let start = now_us();
    let v = match d.read(grant).await {
        Ok(Outcome::Ok(v)) => {
            rec.emit(OpKind::Read, start, OpResult::Ok, Some(v), None)?;
            v
        }
        Ok(Outcome::Rejected) => {
            rec.emit(OpKind::Read, start, OpResult::Rejected, None, None)?;
            return Ok(false);
        }
        Err(e) => {
            rec.emit(OpKind::Read, start, OpResult::Unknown, None, Some(e.to_string()))?;
            return Ok(false);
        }
    };
    tokio::time::sleep(Duration::from_millis(rng.next_u64() % (work_ms + 1))).await;
    let start = now_us();
    rec.promised_until_us = grant.promised_until_us();
    rec.lost_signalled = grant.lost_signalled();
    let (result, error) = match d.write(grant, v + 1).await {
        Ok(Outcome::Ok(())) => (OpResult::Ok, None),
        Ok(Outcome::Rejected) => (OpResult::Rejected, None),
        Err(e) => (OpResult::Unknown, Some(e.to_string())),
    };
    rec.emit(OpKind::Write, start, result, Some(v + 1), error)?;
    rec.promised_until_us = None;
    rec.lost_signalled = None;
    Ok(result == OpResult::Ok)
}

struct Recorder<'a, W: Write> {
    out: &'a mut W,
    worker: u32,
    cycle: u64,
    token: Option<u64>,
    promised_until_us: Option<u64>,
    lost_signalled: Option<bool>,
}

impl<W: Write> Recorder<'_, W> {
    fn emit(
        &mut self,
        kind: OpKind,
        start_us: u64,
        result: OpResult,
        value: Option<u64>,
        error: Option<String>,
    ) -> Result<()> {
        let op = Op {
            worker: self.worker,
            cycle: self.cycle,
            kind,
            start_us,
            end_us: now_us(),
            result,
            token: self.token,
            value,
            error,
            promised_until_us: self.promised_until_us,
            lost_signalled: self.lost_signalled,
        };
        serde_json::to_writer(&mut *self.out, &op)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }
}
