//! Counters and the request-latency histogram, rendered by hand as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
    pub expired_releases: AtomicU64,
    pub lease_expiries: AtomicU64,
    pub leases_created: AtomicU64,
    pub keepalives: AtomicU64,
    pub wait_timeouts: AtomicU64,
    pub store_writes_accepted: AtomicU64,
    pub stale_writes_rejected: AtomicU64,
    pub stale_reads_rejected: AtomicU64,
    /// Fenced-store operations refused for a token above every token issued.
    pub tokens_not_issued: AtomicU64,
    pub connections_refused: AtomicU64,
    /// Request bodies refused because the budget of bodies in flight was spent.
    pub bodies_refused: AtomicU64,
    /// Request bodies that did not arrive within `body_timeout_ms`.
    pub body_timeouts: AtomicU64,
    /// Connections closed because a request head did not arrive within `head_timeout_ms`.
    pub head_timeouts: AtomicU64,
    /// Wire connections closed because a frame begun did not arrive whole in time.
    pub wire_frame_timeouts: AtomicU64,
    /// Audit lines dropped (queue full, disk full, file not writable); shared with the
    /// audit log's writer.
    pub audit_dropped: std::sync::Arc<AtomicU64>,
    /// Store writes refused because the disk was below `min_free_bytes`.
    pub store_writes_disk_low: AtomicU64,
    /// Connections that opened with HTTP/2's preface (h2c is not served).
    pub h2c_refused: AtomicU64,
    /// Frames received on wire-protocol connections.
    pub wire_requests: AtomicU64,
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

    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::with_capacity(4096);
        let counters: [(&str, &str, u64); 21] = [
            ("fenced_grants_total", "Locks granted.", self.grants.load(Relaxed)),
            ("fenced_releases_total", "Locks released explicitly.", self.releases.load(Relaxed)),
            ("fenced_revoked_releases_total", "Locks released by a lease revoke.", self.revoked_releases.load(Relaxed)),
            ("fenced_expired_releases_total", "Locks released by lease expiry.", self.expired_releases.load(Relaxed)),
            ("fenced_lease_expiries_total", "Leases that expired.", self.lease_expiries.load(Relaxed)),
            ("fenced_leases_created_total", "Leases created.", self.leases_created.load(Relaxed)),
            ("fenced_keepalives_total", "Successful keepalives.", self.keepalives.load(Relaxed)),
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
                "fenced_audit_lines_dropped_total",
                "Audit lines dropped: the queue was full or the file could not be written.",
                self.audit_dropped.load(Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let gauges = [
            ("fenced_leases", "Live leases.", g.leases),
            ("fenced_locks", "Lock entries (held, waited on or in lock-delay).", g.locks),
            ("fenced_waiters", "Queued acquires.", g.waiters),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
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
        out
    }
}
