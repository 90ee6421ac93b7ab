//! The disk-space guard: the data directory's free space (`statvfs`) against the
//! reserve `min_free_bytes`. Under it, fenced-store writes and fenced reads that would
//! create a key are refused (507 `insufficient_storage`) so that the room left goes to
//! the lock service's own log: a grant, a keepalive or a release needs a few hundred
//! bytes of log, a store value up to `value_bytes_max`. The lock service is never
//! refused here; if its log cannot be written all the same, the server stops (see
//! `watch_fatal`).
//!
//! The space is probed on the request's own path, just before its command is proposed,
//! so no write gets in on a probe that is out of date; only requests already proposed
//! when the disk fills still land. A probe younger than [`FRESH`] stands in for a new
//! one while it showed the reserve, the request and [`TRUSTED_HEADROOM`] more free:
//! no disk writes that much in that time, so the answer is the one a new probe would
//! give, and a busy store does not pay a `statvfs` (a path lookup and the file
//! system's count, about 3% of the server's CPU per write) on every write. Near the
//! reserve every request probes. A background probe every [`PROBE_EVERY`] only logs
//! the changes while no store request comes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the background probe looks, to log the disk going low or coming back.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// How long a probe may answer for the requests after it, when it showed
/// [`TRUSTED_HEADROOM`] above what they need.
pub const FRESH: Duration = Duration::from_millis(10);

/// Free space beyond the reserve and the request that lets a [`FRESH`] probe answer:
/// 256 MiB in 10 ms is 25 GB/s, more than any disk takes.
pub const TRUSTED_HEADROOM: u64 = 256 << 20;

/// The data directory's free space, probed when asked.
#[derive(Debug)]
pub struct DiskGuard {
    /// Bytes available to this process in the data directory's file system, at the
    /// last probe (`u64::MAX` before the first, or when the probe fails).
    free_bytes: AtomicU64,
    /// The reserve; 0: the guard is off.
    pub min_free_bytes: u64,
    /// The data directory whose file system is probed.
    dir: PathBuf,
    /// When the last probe was taken, in microseconds after `born` (0: none yet).
    probed_at_us: AtomicU64,
    born: Instant,
    /// How long a probe answers for the requests after it ([`FRESH`]).
    fresh: Duration,
    /// Reads the free space of a directory's file system (`statvfs`; a fake in tests).
    read: fn(&Path) -> std::io::Result<u64>,
}

impl DiskGuard {
    pub fn new(min_free_bytes: u64, dir: PathBuf) -> DiskGuard {
        DiskGuard {
            free_bytes: AtomicU64::new(u64::MAX),
            min_free_bytes,
            dir,
            probed_at_us: AtomicU64::new(0),
            born: Instant::now(),
            fresh: FRESH,
            read: free_bytes,
        }
    }

    /// `Err(free bytes)` when taking `bytes` more would leave less than the reserve, so
    /// the request must be refused. Probes now, unless the last probe is [`FRESH`] and
    /// showed [`TRUSTED_HEADROOM`] beyond what this request needs.
    pub fn room_for(&self, bytes: u64) -> Result<(), u64> {
        if self.min_free_bytes == 0 {
            return Ok(());
        }
        let needed = self.min_free_bytes.saturating_add(bytes);
        let free = match self.recent() {
            Some(free) if free >= needed.saturating_add(TRUSTED_HEADROOM) => free,
            _ => self.probe(),
        };
        if free < needed {
            return Err(free);
        }
        Ok(())
    }

    /// The free space of the last probe, if it was taken within `fresh`.
    fn recent(&self) -> Option<u64> {
        let at = self.probed_at_us.load(Ordering::Acquire);
        let now = self.born.elapsed().as_micros() as u64;
        (at > 0 && now.saturating_sub(at) < self.fresh.as_micros() as u64)
            .then(|| self.free_bytes.load(Ordering::Acquire))
    }

    /// `fenced_disk_free_bytes` (read now) and `fenced_disk_min_free_bytes`, in
    /// Prometheus text: the figures the disk-low alert compares.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let name = "fenced_disk_free_bytes";
        out.push_str(&format!(
            "# HELP {name} Bytes available in the data directory's file system.\n# TYPE {name} gauge\n"
        ));
        match free_bytes(&self.dir) {
            Ok(free) => out.push_str(&format!("{name} {free}\n")),
            Err(e) => tracing::debug!(error = %e, "no free-space figure for /metrics"),
        }
        let name = "fenced_disk_min_free_bytes";
        out.push_str(&format!(
            "# HELP {name} The reserve under which store writes are refused (0: off).\n# TYPE {name} gauge\n{name} {}\n",
            self.min_free_bytes
        ));
        out
    }

    fn low(&self, free: u64) -> bool {
        self.min_free_bytes > 0 && free < self.min_free_bytes
    }

    /// Reads the free space, keeps it, logs a crossing of the reserve, and returns it.
    fn probe(&self) -> u64 {
        let free = (self.read)(&self.dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, dir = %self.dir.display(), "cannot read the data directory's free space");
            u64::MAX
        });
        let was = self.free_bytes.swap(free, Ordering::AcqRel);
        // At least 1: 0 means no probe yet.
        self.probed_at_us.store((self.born.elapsed().as_micros() as u64).max(1), Ordering::Release);
        match (self.low(was), self.low(free)) {
            (false, true) => {
                tracing::warn!(free, min_free_bytes = self.min_free_bytes, "disk low: store writes refused")
            }
            (true, false) => tracing::info!(free, "disk space back above min_free_bytes: store writes taken again"),
            _ => {}
        }
        free
    }
}

/// Probes at once, then every [`PROBE_EVERY`] until `stop` flips (for the logs).
pub async fn watch(guard: Arc<DiskGuard>, mut stop: tokio::sync::watch::Receiver<bool>) {
    if guard.min_free_bytes == 0 {
        return;
    }
    loop {
        guard.probe();
        tokio::select! {
            _ = tokio::time::sleep(PROBE_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Bytes available to an unprivileged writer in the file system holding `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    static FREE: AtomicU64 = AtomicU64::new(0);
    static PROBES: AtomicU64 = AtomicU64::new(0);

    fn fake(_: &Path) -> std::io::Result<u64> {
        PROBES.fetch_add(1, Ordering::SeqCst);
        Ok(FREE.load(Ordering::SeqCst))
    }

    fn guard(min: u64, fresh: Duration) -> DiskGuard {
        DiskGuard { fresh, read: fake, ..DiskGuard::new(min, PathBuf::from("/nonexistent")) }
    }

    fn probes_for(g: &DiskGuard, requests: &[u64]) -> (u64, Vec<bool>) {
        let before = PROBES.load(Ordering::SeqCst);
        let answers = requests.iter().map(|b| g.room_for(*b).is_ok()).collect();
        (PROBES.load(Ordering::SeqCst) - before, answers)
    }

    /// One test, so the fake disk is not shared between threads.
    #[test]
    fn a_recent_probe_answers_only_far_from_the_reserve() {
        const MIB: u64 = 1 << 20;
        // Far from the reserve: one probe answers for the requests after it.
        FREE.store(10 << 30, Ordering::SeqCst);
        let g = guard(64 * MIB, Duration::from_secs(3600));
        assert_eq!(probes_for(&g, &[MIB, MIB, MIB]), (1, vec![true; 3]));
        // A request whose own size eats the trusted headroom probes again.
        assert_eq!(probes_for(&g, &[10 << 30]), (1, vec![false]));
        // Near the reserve (the last probe showed less than the headroom): every request
        // probes, and the one that would cross the reserve is refused.
        FREE.store(64 * MIB + 100 * MIB, Ordering::SeqCst);
        let g = guard(64 * MIB, Duration::from_secs(3600));
        assert_eq!(probes_for(&g, &[MIB, MIB, 200 * MIB]), (3, vec![true, true, false]));
        // The space coming back is seen by the next probe, the probe after that trusted.
        FREE.store(10 << 30, Ordering::SeqCst);
        assert_eq!(probes_for(&g, &[MIB, MIB]), (1, vec![true, true]));
        // A probe older than `fresh` answers for nothing.
        let g = guard(64 * MIB, Duration::ZERO);
        assert_eq!(probes_for(&g, &[MIB, MIB, MIB]), (3, vec![true; 3]));
        // The guard off: no probe at all.
        let g = guard(0, Duration::from_secs(3600));
        assert_eq!(probes_for(&g, &[u64::MAX]), (0, vec![true]));
    }
}
