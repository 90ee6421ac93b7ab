//! A torture worker: one process running the counter workload against one target and
//! printing every operation as a JSON line on standard output.
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
use crate::target::{Driver, Endpoints, Outcome, Target};

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
}

/// Runs the workload until the deadline, writing each operation to `out` as it ends.
pub async fn run(spec: WorkerSpec, out: &mut impl Write) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ (u64::from(spec.worker) << 32));
    let op_timeout = Duration::from_millis(spec.op_timeout_ms);
    let ttl = Duration::from_millis(spec.ttl_ms);
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
        let remaining = Duration::from_micros(spec.until_us.saturating_sub(now_us()));
        let start = now_us();
        let grant = match d.acquire(ttl, remaining.min(ttl * 5), cycle).await {
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

        let start = now_us();
        let read = d.read(&grant).await;
        let value = match read {
            Ok(Outcome::Ok(v)) => {
                rec.emit(OpKind::Read, start, OpResult::Ok, Some(v), None)?;
                Some(v)
            }
            Ok(Outcome::Rejected) => {
                rec.emit(OpKind::Read, start, OpResult::Rejected, None, None)?;
                None
            }
            Err(e) => {
                rec.emit(OpKind::Read, start, OpResult::Unknown, None, Some(e.to_string()))?;
                None
            }
        };
        if let Some(v) = value {
            tokio::time::sleep(Duration::from_millis(rng.next_u64() % (spec.work_ms + 1))).await;
            let start = now_us();
            rec.promised_until_us = grant.promised_until_us();
            rec.lost_signalled = grant.lost_signalled();
            let (result, error) = match d.write(&grant, v + 1).await {
                Ok(Outcome::Ok(())) => (OpResult::Ok, None),
                Ok(Outcome::Rejected) => (OpResult::Rejected, None),
                Err(e) => (OpResult::Unknown, Some(e.to_string())),
            };
            rec.emit(OpKind::Write, start, result, Some(v + 1), error)?;
            rec.promised_until_us = None;
            rec.lost_signalled = None;
        }
        let start = now_us();
        match d.release(grant).await {
            Ok(()) => rec.emit(OpKind::Release, start, OpResult::Ok, None, None)?,
            Err(e) => rec.emit(OpKind::Release, start, OpResult::Unknown, None, Some(e.to_string()))?,
        }
    }
    Ok(())
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
