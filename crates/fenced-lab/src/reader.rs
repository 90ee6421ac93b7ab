//! The plain readers of a cluster run: one per member, each asking that member alone,
//! without a token and without failing over, for the counter (`GET /v1/store/{key}`),
//! one read after the other. Their reads join the counter's history as
//! [`OpKind::Get`], so the linearizability check judges them with the workers' fenced
//! reads and writes: a member that serves a read from its own, possibly stale, table
//! (a follower, a leader cut off from the others) is caught when a write acknowledged
//! before the read was sent is missing from it. A member that does not lead answers
//! `not_leader`: that read took no effect and is left out.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::sleep;

use crate::history::{Op, OpKind, OpResult};
use crate::worker::now_us;

/// The pause between two reads of one reader.
const READ_EVERY: Duration = Duration::from_millis(40);
/// The longest one read may take before it counts as not done.
const READ_BOUND: Duration = Duration::from_secs(1);

/// The readers of a run. Each keeps its own reads until the end (no queue between
/// them and the run): at most one per [`READ_EVERY`] of the run, so a reader's
/// history is bounded by the run's duration (90,000 reads in the longest, an hour).
pub struct Readers {
    set: JoinSet<Vec<Op>>,
}

impl Readers {
    /// Starts a reader per member (`addrs`, reached directly) reading `key` until
    /// `until_us`; reader `i` records its operations as worker `first_worker + i`.
    pub fn spawn(addrs: &[SocketAddr], key: &str, first_worker: u32, until_us: u64) -> Readers {
        let mut set = JoinSet::new();
        for (i, addr) in addrs.iter().copied().enumerate() {
            let path = format!("/v1/store/{key}");
            set.spawn(read_until(addr, path, first_worker + i as u32, until_us));
        }
        Readers { set }
    }

    /// Waits for every reader to stop (at `until_us`), adding their reads to `history`
    /// in the order they ended.
    pub async fn finish(mut self, history: &mut Vec<Op>) {
        let mut reads = Vec::new();
        while let Some(done) = self.set.join_next().await {
            reads.extend(done.unwrap_or_default());
        }
        reads.sort_by_key(|op| op.end_us);
        history.extend(reads);
    }
}

/// One reader: reads of `path` at `addr`, one after the other, until `until_us`.
async fn read_until(addr: SocketAddr, path: String, worker: u32, until_us: u64) -> Vec<Op> {
    let mut reads = Vec::new();
    let mut cycle = 0;
    while now_us() < until_us {
        cycle += 1;
        let start_us = now_us();
        let (result, value, error) = match get(addr, &path).await {
            Ok(value) => (OpResult::Ok, value, None),
            Err(e) => (OpResult::Failed, None, Some(e)),
        };
        let op = Op {
            worker,
            cycle,
            kind: OpKind::Get,
            start_us,
            end_us: now_us(),
            result,
            token: None,
            value,
            error,
            promised_until_us: None,
            lost_signalled: None,
        };
        reads.push(op);
        sleep(READ_EVERY).await;
    }
    reads
}

/// One plain read: the counter (`None` when absent), or why there is no answer to
/// judge (`not_leader`, a time-out, a refused connection: none of them read anything).
async fn get(addr: SocketAddr, path: &str) -> Result<Option<u64>, String> {
    let answer = crate::http::get(addr, path, READ_BOUND).await?;
    let body = answer.text();
    match answer.status {
        200 => body.parse().map(Some).map_err(|_| format!("the counter holds {body:?}, not a number")),
        404 => Ok(None),
        status => Err(format!("HTTP {status}: {body}")),
    }
}
