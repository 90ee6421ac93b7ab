//! Counters and the request-latency histogram, rendered by hand as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use fenced_raft::metrics::{LogMetrics, RaftFigures};

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS_S: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0];

/// Process-wide counters; gauges (leases, locks, waiters) are read from the table at
/// scrape time.
#[derive(Default)]
pub struct Metrics {
    pub grants: AtomicU64,
    pub releases: AtomicU64,
    pub revoked_releases: AtomicU64,
    pub forced_releases: AtomicU64,
    pub expired_releases: AtomicU64,
    pub lease_expiries: AtomicU64,
    pub leases_created: AtomicU64,
    pub keepalives: AtomicU64,
    /// Keepalives the leader answered from memory (`Node::keepalive_here`).
    pub keepalives_from_memory: AtomicU64,
    pub wait_timeouts: AtomicU64,
    pub store_writes_accepted: AtomicU64,
    pub stale_writes_rejected: AtomicU64,
    pub stale_reads_rejected: AtomicU64,
    /// Fenced-store operations refused for a token above every token issued.
    pub tokens_not_issued: AtomicU64,
    /// Fenced-store operations on a signed key refused for a token without a valid
    /// signature for the key's lock.
    pub bad_signatures: AtomicU64,
    pub connections_refused: AtomicU64,
    /// Request bodies refused because the budget of bodies in flight was spent.
    pub bodies_refused: AtomicU64,
    /// Request bodies that did not arrive within `body_timeout_ms`.
    pub body_timeouts: AtomicU64,
    /// Connections closed because a request head did not arrive within `head_timeout_ms`.
    pub head_timeouts: AtomicU64,
    /// Wire connections closed because a frame begun did not arrive whole in time.
    pub wire_frame_timeouts: AtomicU64,
    /// Large wire frames whose reading waited for room among the leader's proposals.
    pub wire_frames_held: AtomicU64,
    /// Audit lines dropped (queue full, disk full, file not writable); shared with the
    /// audit log's writer.
    pub audit_dropped: std::sync::Arc<AtomicU64>,
    /// Store writes refused because the disk was below `min_free_bytes`.
    pub store_writes_disk_low: AtomicU64,
    /// Connections that opened with HTTP/2's preface (h2c is not served).
    pub h2c_refused: AtomicU64,
    /// Frames received on wire-protocol connections.
    pub wire_requests: AtomicU64,
    /// Bytes of snapshots received from the leader (into `snapshot.incoming`).
    pub snapshot_bytes_received: AtomicU64,
    /// Snapshot messages that resumed a cut transfer where it stopped.
    pub snapshot_transfers_resumed: AtomicU64,
    requests: AtomicU64,
    latency_buckets: [AtomicU64; BUCKETS_S.len()],
    latency_sum_us: AtomicU64,
}

/// The table's sizes at scrape time.
pub struct Gauges {
    pub leases: usize,
    pub locks: usize,
    pub waiters: usize,
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

impl Metrics {
    pub fn observe_request(&self, elapsed: std::time::Duration) {
        let s = elapsed.as_secs_f64();
        self.requests.fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(elapsed.as_micros() as u64, Relaxed);
        if let Some(i) = BUCKETS_S.iter().position(|b| s <= *b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
    }

    pub fn render(&self, g: &Gauges, raft: &RaftFigures, log: &LogMetrics) -> String {
        let mut out = String::with_capacity(4096);
        for (name, help, v) in self.counters() {
            write_one(&mut out, "counter", name, help, v);
        }
        let gauges = [
            ("fenced_leases", "Live leases.", g.leases),
            ("fenced_locks", "Lock entries (held, waited on or in lock-delay).", g.locks),
            ("fenced_waiters", "Queued acquires.", g.waiters),
        ];
        for (name, help, v) in gauges {
            write_one(&mut out, "gauge", name, help, v);
        }
        render_raft(&mut out, raft, log);
        self.render_latency(&mut out);
        out
    }

    /// The request counters, by name, with their help lines.
    fn counters(&self) -> [(&'static str, &'static str, u64); 27] {
        [
            ("fenced_grants_total", "Locks granted.", self.grants.load(Relaxed)),
            ("fenced_releases_total", "Locks released explicitly.", self.releases.load(Relaxed)),
            ("fenced_revoked_releases_total", "Locks released by a lease revoke.", self.revoked_releases.load(Relaxed)),
            (
                "fenced_forced_releases_total",
                "Locks taken from their holder by an operator (POST /v1/locks/{name}/revoke).",
                self.forced_releases.load(Relaxed),
            ),
            ("fenced_expired_releases_total", "Locks released by lease expiry.", self.expired_releases.load(Relaxed)),
            ("fenced_lease_expiries_total", "Leases that expired.", self.lease_expiries.load(Relaxed)),
            ("fenced_leases_created_total", "Leases created.", self.leases_created.load(Relaxed)),
            ("fenced_keepalives_total", "Successful keepalives.", self.keepalives.load(Relaxed)),
            (
                "fenced_keepalives_from_memory_total",
                "Keepalives the leader answered from memory, their renewals in the log with its next batch.",
                self.keepalives_from_memory.load(Relaxed),
            ),
            ("fenced_wait_timeouts_total", "Acquires that waited and timed out.", self.wait_timeouts.load(Relaxed)),
            (
                "fenced_store_writes_accepted_total",
                "Fenced-store writes accepted.",
                self.store_writes_accepted.load(Relaxed),
            ),
            (
                "fenced_stale_writes_rejected_total",
                "Fenced-store writes refused for a stale token.",
                self.stale_writes_rejected.load(Relaxed),
            ),
            (
                "fenced_stale_reads_rejected_total",
                "Fenced reads refused for a stale token.",
                self.stale_reads_rejected.load(Relaxed),
            ),
            (
                "fenced_tokens_not_issued_total",
                "Fenced-store operations refused for a token the service never issued.",
                self.tokens_not_issued.load(Relaxed),
            ),
            (
                "fenced_bad_signatures_total",
                "Fenced-store operations on signed keys refused for a token without this service's signature for the key's lock.",
                self.bad_signatures.load(Relaxed),
            ),
            (
                "fenced_connections_refused_total",
                "Connections refused over connections_max.",
                self.connections_refused.load(Relaxed),
            ),
            (
                "fenced_bodies_refused_total",
                "Request bodies refused over body_bytes_in_flight_max.",
                self.bodies_refused.load(Relaxed),
            ),
            (
                "fenced_body_timeouts_total",
                "Request bodies not read within body_timeout_ms.",
                self.body_timeouts.load(Relaxed),
            ),
            (
                "fenced_wire_frame_timeouts_total",
                "Wire connections closed for a frame slower than head_timeout_ms (before AUTH) or body_timeout_ms.",
                self.wire_frame_timeouts.load(Relaxed),
            ),
            (
                "fenced_wire_frames_held_total",
                "Large wire frames not read until the leader had room for their command.",
                self.wire_frames_held.load(Relaxed),
            ),
            (
                "fenced_head_timeouts_total",
                "Connections closed for a request head slower than head_timeout_ms.",
                self.head_timeouts.load(Relaxed),
            ),
            (
                "fenced_store_writes_disk_low_total",
                "Store writes refused with the disk below min_free_bytes.",
                self.store_writes_disk_low.load(Relaxed),
            ),
            (
                "fenced_h2c_refused_total",
                "Connections refused for opening with HTTP/2's preface.",
                self.h2c_refused.load(Relaxed),
            ),
            ("fenced_wire_requests_total", "Requests on wire-protocol connections.", self.wire_requests.load(Relaxed)),
            (
                "fenced_raft_snapshot_received_bytes_total",
                "Bytes of snapshots received from the leader.",
                self.snapshot_bytes_received.load(Relaxed),
            ),
            (
                "fenced_raft_snapshot_transfers_resumed_total",
                "Snapshot transfers from the leader resumed where a cut one stopped.",
                self.snapshot_transfers_resumed.load(Relaxed),
            ),
            (
                "fenced_audit_lines_dropped_total",
                "Audit lines dropped: the queue was full or the file could not be written.",
                self.audit_dropped.load(Relaxed),
            ),
        ]
    }

    /// The HTTP request latency histogram.
    fn render_latency(&self, out: &mut String) {
        let name = "fenced_http_request_duration_seconds";
        let _ = writeln!(out, "# HELP {name} HTTP request latency.\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in BUCKETS_S.iter().zip(&self.latency_buckets) {
            cumulative += c.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.requests.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.latency_sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// One metric of one value: its help line, its type line and its value.
fn write_one(out: &mut String, kind: &str, name: &str, help: &str, v: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

/// The member's raft and log figures (`fenced_raft_*`): what an operator of etcd
/// watches first, under Fenced's names.
fn render_raft(out: &mut String, r: &RaftFigures, log: &LogMetrics) {
    let b = |v: bool| u64::from(v);
    let gauges = [
        (
            "fenced_raft_has_leader",
            "1 when this member knows a leader and heard from it lately (a leader: from a quorum).",
            b(r.has_leader),
        ),
        ("fenced_raft_is_leader", "1 when this member leads.", b(r.is_leader)),
        ("fenced_raft_term", "The raft term this member is in.", r.term),
        ("fenced_raft_last_log_index", "The index of the last entry of this member's log.", r.last_log_index),
        ("fenced_raft_commit_index", "The index of the last entry known committed.", r.commit_index),
        ("fenced_raft_applied_index", "The index of the last entry applied to the lock table.", r.applied_index),
        (
            "fenced_raft_apply_lag_entries",
            "Entries in this member's log not yet applied.",
            r.last_log_index.saturating_sub(r.applied_index),
        ),
        ("fenced_raft_snapshot_index", "The last index the latest snapshot covers.", r.snapshot_index),
        ("fenced_raft_purged_index", "The last index purged from the log.", r.purged_index),
        ("fenced_raft_voters", "Voters in the membership this member follows.", r.voters),
        ("fenced_raft_members", "Members (voters and learners) in that membership.", r.members),
        (
            "fenced_raft_db_bytes",
            "Size of the raft log on disk: its segments (written and prepared) and raft.redb.",
            r.db_bytes,
        ),
        (
            "fenced_raft_proposals_pending",
            "Commands taken for the log and not yet committed or refused.",
            log.proposals_pending.load(Relaxed),
        ),
        (
            "fenced_raft_proposal_bytes_pending",
            "Bytes of the commands taken for the log and not yet committed or refused.",
            log.proposal_bytes_pending.load(Relaxed),
        ),
    ];
    for (name, help, v) in gauges {
        write_one(out, "gauge", name, help, v);
    }
    let name = "fenced_raft_quorum_ack_age_seconds";
    let _ = writeln!(out, "# HELP {name} On the leader: since a quorum last acknowledged it.\n# TYPE {name} gauge");
    if let Some(ms) = r.quorum_ack_age_ms {
        let _ = writeln!(out, "{name} {}", ms as f64 / 1000.0);
    }
    let name = "fenced_raft_leader_contact_age_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Since this member last heard from its leader (the leader: from a quorum).\n# TYPE {name} gauge"
    );
    if let Some(ms) = r.leader_contact_age_ms {
        let _ = writeln!(out, "{name} {}", ms as f64 / 1000.0);
    }
    let name = "fenced_raft_replication_lag_entries";
    let _ = writeln!(out, "# HELP {name} On the leader: entries each other member is behind.\n# TYPE {name} gauge");
    for (peer, lag) in &r.replication_lag {
        let _ = writeln!(out, "{name}{{peer=\"{peer}\"}} {lag}");
    }
    let name = "fenced_raft_peer_ack_age_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} On the leader: since each other member last acknowledged a heartbeat or an append.\n# TYPE \
         {name} gauge"
    );
    for (peer, ms) in &r.peer_ack_age_ms {
        // Never acknowledged since this leader took office: +Inf, which any alert's
        // threshold is below.
        let age = ms.map_or_else(|| "+Inf".to_string(), |ms| (ms as f64 / 1000.0).to_string());
        let _ = writeln!(out, "{name}{{peer=\"{peer}\"}} {age}");
    }
    let counters = [
        ("fenced_raft_leader_changes_total", "Leaders seen by this member since it started.", &log.leader_changes),
        ("fenced_raft_snapshots_total", "Snapshots built or installed since start.", &log.snapshots),
        ("fenced_raft_log_entries_written_total", "Log entries made durable.", &log.entries_written),
        ("fenced_raft_log_commit_failures_total", "Log writes that failed.", &log.commit_failures),
        (
            "fenced_raft_append_streams_opened_total",
            "On a leader: pipelined append streams opened to followers (one each while nothing breaks).",
            &log.append_streams_opened,
        ),
        (
            "fenced_raft_proposals_refused_total",
            "Client commands refused too_busy: the proposals waiting for the log were at their bound.",
            &log.proposals_refused,
        ),
    ];
    for (name, help, v) in counters {
        write_one(out, "counter", name, help, v.load(Relaxed));
    }
    let h = log.commit_histogram();
    let name = "fenced_raft_log_commit_duration_seconds";
    let _ = writeln!(out, "# HELP {name} One durable write of the log (one fsync).\n# TYPE {name} histogram");
    for (le, c) in &h.buckets {
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {c}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", h.sum_seconds, h.count);
}
