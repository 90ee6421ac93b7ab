//! The disk-space guard: the data directory's free space, probed with `statvfs` every
//! [`PROBE_EVERY`], against the reserve `min_free_bytes`. Under it, fenced-store writes
//! are refused (507 `insufficient_storage`) so that the room left goes to the lock
//! service's own log: a grant, a keepalive or a release needs a few hundred bytes of
//! log, a store value up to `value_bytes_max`. The lock service is never refused here;
//! if its log cannot be written all the same, the server stops (see `watch_fatal`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the free space is probed.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// The last probe's result, shared with the handlers.
#[derive(Debug, Default)]
pub struct DiskGuard {
    /// Bytes available to this process in the data directory's file system, at the
    /// last probe (`u64::MAX` before the first, or when the probe fails).
    free_bytes: AtomicU64,
    /// The reserve; 0: the guard is off.
    pub min_free_bytes: u64,
}

impl DiskGuard {
    pub fn new(min_free_bytes: u64) -> DiskGuard {
        DiskGuard { free_bytes: AtomicU64::new(u64::MAX), min_free_bytes }
    }

    /// `Some(free bytes)` when a store write must be refused.
    pub fn low(&self) -> Option<u64> {
        let free = self.free_bytes.load(Ordering::Acquire);
        (self.min_free_bytes > 0 && free < self.min_free_bytes).then_some(free)
    }

    fn probe(&self, dir: &Path) {
        let free = free_bytes(dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot read the data directory's free space");
            u64::MAX
        });
        let was_low = self.low().is_some();
        self.free_bytes.store(free, Ordering::Release);
        match (was_low, self.low().is_some()) {
            (false, true) => {
                tracing::warn!(free, min_free_bytes = self.min_free_bytes, "disk low: store writes refused")
            }
            (true, false) => tracing::info!(free, "disk space back above min_free_bytes: store writes taken again"),
            _ => {}
        }
    }
}

/// Probes at once, then every [`PROBE_EVERY`] until `stop` flips.
pub async fn watch(guard: Arc<DiskGuard>, dir: PathBuf, mut stop: tokio::sync::watch::Receiver<bool>) {
    if guard.min_free_bytes == 0 {
        return;
    }
    loop {
        guard.probe(&dir);
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
