//! The audit log (`audit_log = PATH`): one JSON line per decision worth keeping, who
//! asked (identity and address), what (operation, lock or key, token) and the result.
//!
//! Lines go to a writer thread through a bounded queue: a call never waits for the
//! disk. A full queue, a full disk or a file that cannot be written drops the line and
//! counts it (`fenced_audit_lines_dropped_total`), so the audit log can never stop the
//! lock service. The file is rotated at `audit_log_bytes_max`: `PATH` becomes
//! `PATH.1`, `PATH.1` becomes `PATH.2`, ..., and the oldest of `audit_log_files`
//! goes.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Lines waiting for the writer; past it, lines are dropped.
const QUEUE_LINES_MAX: usize = 16_384;

/// One decision.
#[derive(Serialize)]
pub struct Line<'a> {
    /// UTC, RFC 3339 with milliseconds.
    pub at: String,
    pub identity: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<SocketAddr>,
    pub op: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// `ok`, or the error code the caller was answered.
    pub result: &'a str,
}

/// The audit log's sending side; a no-op when no log is configured.
#[derive(Default)]
pub struct Audit {
    tx: Option<SyncSender<Vec<u8>>>,
    /// Whether keepalives, checks and plain reads are written too (`audit_all`).
    pub all: bool,
    /// Lines dropped: the queue was full, or the file could not be written.
    pub dropped: Arc<AtomicU64>,
}

impl Audit {
    /// Starts the writer of `path` (created if absent, appended to).
    pub fn open(
        path: &Path,
        bytes_max: u64,
        files: usize,
        all: bool,
        dropped: Arc<AtomicU64>,
    ) -> Result<Audit, String> {
        let file = append(path).map_err(|e| format!("audit_log {}: {e}", path.display()))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (tx, rx) = sync_channel(QUEUE_LINES_MAX);
        let writer =
            Writer { path: path.to_path_buf(), file: Some(file), size, bytes_max, files, dropped: dropped.clone() };
        std::thread::Builder::new()
            .name("fenced-audit".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| format!("audit_log: cannot start its writer: {e}"))?;
        Ok(Audit { tx: Some(tx), all, dropped })
    }

    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues `line`; never blocks.
    pub fn write(&self, line: &Line<'_>) {
        let Some(tx) = &self.tx else { return };
        let mut bytes = serde_json::to_vec(line).expect("an audit line serializes");
        bytes.push(b'\n');
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(bytes) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

struct Writer {
    path: PathBuf,
    /// None after a failed rotation: reopened at the next line.
    file: Option<File>,
    size: u64,
    bytes_max: u64,
    files: usize,
    dropped: Arc<AtomicU64>,
}

impl Writer {
    fn run(mut self, rx: Receiver<Vec<u8>>) {
        while let Ok(line) = rx.recv() {
            if self.size + line.len() as u64 > self.bytes_max {
                self.rotate();
            }
            if self.file.is_none() {
                self.file = append(&self.path).ok();
            }
            match self.file.as_mut().map(|f| f.write_all(&line)) {
                Some(Ok(())) => self.size += line.len() as u64,
                _ => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn rotated(&self, n: usize) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn rotate(&mut self) {
        self.file = None;
        if self.files == 0 {
            let _ = std::fs::remove_file(&self.path);
        } else {
            let _ = std::fs::remove_file(self.rotated(self.files));
            for n in (1..self.files).rev() {
                let _ = std::fs::rename(self.rotated(n), self.rotated(n + 1));
            }
            let _ = std::fs::rename(&self.path, self.rotated(1));
        }
        self.size = 0;
    }
}

/// Now, as RFC 3339 in UTC with milliseconds (`2026-12-01T09:41:07.123Z`).
pub fn now_rfc3339() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let (secs, ms) = (d.as_secs(), d.subsec_millis());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, day) = civil_from_days(days);
    format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_the_calendars() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn lines_rotate_at_the_bound_and_the_oldest_goes() {
        let dir = std::env::temp_dir().join(format!("fenced-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let audit = Audit::open(&path, 400, 2, false, Arc::default()).unwrap();
        let line = Line {
            at: now_rfc3339(),
            identity: "t",
            remote: None,
            op: "acquire",
            name: Some("x"),
            token: Some(7),
            result: "ok",
        };
        for _ in 0..40 {
            audit.write(&line);
        }
        drop(audit);
        // The writer drains what was queued, then ends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_dir(&dir).unwrap().count() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let names: std::collections::BTreeSet<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, ["audit.log", "audit.log.1", "audit.log.2"].map(String::from).into(), "{names:?}");
        for n in &names {
            let text = std::fs::read_to_string(dir.join(n)).unwrap();
            assert!(text.len() <= 400, "{n}: {} bytes", text.len());
            for l in text.lines() {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert_eq!(
                    (v["op"].as_str(), v["token"].as_u64(), v["result"].as_str()),
                    (Some("acquire"), Some(7), Some("ok"))
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
