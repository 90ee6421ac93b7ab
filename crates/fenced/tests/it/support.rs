//! What the subcommands' tests share: running the binary, reading its JSON, and
//! finding the programs a test needs.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// `fenced ARGS...`, run to its end.
pub fn fenced(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fenced")).args(args).output().expect("run fenced")
}

/// A report's numeric field; a report without it fails the test.
pub fn num(v: &serde_json::Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} is not a number in {v}"))
}

/// Whether `program` is on the PATH (and `file`, if named, exists): without them the
/// test skips with the reason, except under CI, where they must be there.
pub fn installed(program: &str, file: Option<&str>, install: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        && file.is_none_or(|f| Path::new(f).exists());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{program} is needed ({install})");
        eprintln!("skipping: {program} is not installed ({install})");
    }
    found
}

/// A directory of one test (`fenced-{kind}-{tag}-{pid}` under the temp dir), empty
/// at first and removed when dropped.
#[cfg(feature = "client")]
pub struct TempDir(pub std::path::PathBuf);

#[cfg(feature = "client")]
impl TempDir {
    pub fn new(kind: &str, tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("fenced-{kind}-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

#[cfg(feature = "client")]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What `child` (a `fenced exec`) wrote to `path` once it wrote a whole line, up to
/// 20 s; the test fails if `child` exits first.
#[cfg(feature = "client")]
pub fn wait_for_file(path: &Path, child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_owned();
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("fenced exec exited early: {status}");
        }
        assert!(Instant::now() < deadline, "the child never wrote {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `child`'s exit status, waiting up to `within`; past it the child is killed and the
/// test fails.
#[cfg(feature = "client")]
pub fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    exit_within(child, within).unwrap_or_else(|| panic!("fenced exec still running after {within:?}"))
}

/// `child`'s exit status, waiting up to `within`; `None` when it ran over and was killed
/// (its output can still be read, to say why).
pub fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
