//! What an operator watches first on a member (etcd's `etcd_server_has_leader`,
//! `etcd_server_leader_changes_seen_total`, `etcd_disk_wal_fsync_duration_seconds`):
//! [`RaftFigures`], read from openraft's metrics at scrape time, and the counters this
//! crate keeps as it goes ([`LogMetrics`]: the log's durable commits, each one fsync;
//! leader changes and snapshots seen). The server renders them as Prometheus text.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::NodeId;

/// Upper bounds of the log commit buckets, in seconds (etcd's WAL fsync buckets, from
/// 1 ms doubling, with two below for fast disks).
pub const COMMIT_BUCKETS_S: [f64; 14] =
    [0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048];

/// Counters kept while the member runs.
#[derive(Default)]
pub struct LogMetrics {
    commit_buckets: [AtomicU64; COMMIT_BUCKETS_S.len()],
    commits: AtomicU64,
    commit_sum_us: AtomicU64,
    /// Log entries made durable.
    pub entries_written: AtomicU64,
    /// Transactions that failed (the member stops on the first: see the server).
    pub commit_failures: AtomicU64,
    /// A new leader seen (another id than the last one known, or the first).
    pub leader_changes: AtomicU64,
    /// The snapshot index moved up: a snapshot built here or installed from a leader.
    pub snapshots: AtomicU64,
    /// Commands taken for the log and not yet committed or refused (etcd's
    /// `etcd_server_proposals_pending`): queued for a batch, or in a batch in flight.
    pub proposals_pending: AtomicU64,
    /// The bytes of those commands (`Command::size_hint`): what the bound on waiting
    /// proposals counts ([`crate::node::NodeOptions::proposal_bytes_max`]).
    pub proposal_bytes_pending: AtomicU64,
    /// Client commands refused `too_busy` because the waiting proposals were at their
    /// bound (by count or by bytes).
    pub proposals_refused: AtomicU64,
    /// On a leader: append streams opened to followers (`crate::append_stream`). A
    /// steady cluster opens one a follower; a count that keeps rising says streams
    /// break (a member slow to answer, a flaky link).
    pub append_streams_opened: AtomicU64,
}

/// A histogram's cumulative buckets, count and sum, as Prometheus wants them.
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl LogMetrics {
    /// One durable commit of the log (its write and fsync) took `d`.
    pub fn observe_commit(&self, d: Duration) {
        let s = d.as_secs_f64();
        self.commits.fetch_add(1, Relaxed);
        self.commit_sum_us.fetch_add(d.as_micros() as u64, Relaxed);
        if let Some(i) = COMMIT_BUCKETS_S.iter().position(|b| s <= *b) {
            self.commit_buckets[i].fetch_add(1, Relaxed);
        }
    }

    pub fn commit_histogram(&self) -> Histogram {
        let mut cumulative = 0;
        let buckets = COMMIT_BUCKETS_S
            .iter()
            .zip(&self.commit_buckets)
            .map(|(b, c)| {
                cumulative += c.load(Relaxed);
                (*b, cumulative)
            })
            .collect();
        Histogram {
            buckets,
            count: self.commits.load(Relaxed),
            sum_seconds: self.commit_sum_us.load(Relaxed) as f64 / 1e6,
        }
    }
}

/// The member's raft state at one moment.
#[derive(Clone, Debug, Default)]
pub struct RaftFigures {
    pub id: NodeId,
    /// A leader is known and was heard from within the contact window
    /// ([`crate::Node::leader_alive`]).
    pub has_leader: bool,
    /// Since this member last had word of a live leader, in milliseconds
    /// ([`crate::Node::leader_contact_age`]).
    pub leader_contact_age_ms: Option<u64>,
    pub is_leader: bool,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    pub voters: u64,
    pub members: u64,
    /// On the leader: how many entries each other member is behind this one's log
    /// (its whole log when nothing it holds is known yet).
    pub replication_lag: Vec<(NodeId, u64)>,
    /// On the leader: since a quorum last acknowledged it, in milliseconds.
    pub quorum_ack_age_ms: Option<u64>,
    /// On the leader: since each other member last acknowledged a heartbeat or an
    /// append, in milliseconds (`None`: never since this leader took office).
    pub peer_ack_age_ms: Vec<(NodeId, Option<u64>)>,
    /// The size of the log on disk: its segments (written and prepared) and `raft.redb`
    /// (the base state), in bytes. The snapshot file is not counted.
    pub db_bytes: u64,
}
