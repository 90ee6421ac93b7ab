//! The disk-space guard: the data directory's free space (`statvfs`) against the
//! reserve `min_free_bytes`. Under it, fenced-store writes and fenced reads that would
//! create a key are refused (507 `insufficient_storage`) so that the room left goes to
//! the lock service's own log: a grant, a keepalive or a release needs a few hundred
//! bytes of log, a store value up to `value_bytes_max`. The lock service is never
//! refused here; if its log cannot be written all the same, the server stops (see
//! `watch_fatal`).
//!
//! The space is probed on the request's own path, just before its command is proposed
//! (a `statvfs` takes a microsecond or two, a commit a disk flush), so no write gets in
//! on a probe that is out of date; only requests already proposed when the disk fills
//! still land. A background probe every [`PROBE_EVERY`] only logs the changes while no
//! store request comes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the background probe looks, to log the disk going low or coming back.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

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
}

impl DiskGuard {
    pub fn new(min_free_bytes: u64, dir: PathBuf) -> DiskGuard {
        DiskGuard { free_bytes: AtomicU64::new(u64::MAX), min_free_bytes, dir }
    }

    /// Probes now: `Err(free bytes)` when taking `bytes` more would leave less than the
    /// reserve, so the request must be refused.
    pub fn room_for(&self, bytes: u64) -> Result<(), u64> {
        if self.min_free_bytes == 0 {
            return Ok(());
        }
        let free = self.probe();
        if free < self.min_free_bytes.saturating_add(bytes) {
            return Err(free);
        }
        Ok(())
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
        let free = free_bytes(&self.dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, dir = %self.dir.display(), "cannot read the data directory's free space");
            u64::MAX
        });
        let was = self.free_bytes.swap(free, Ordering::AcqRel);
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
