//! End-to-end tests of `fenced exec` against a real `fenced server` child process: the
//! child's environment, its exit status, a busy lock, a lease revoked from outside
//! stopping the child's whole process group, and nothing the command started outliving
//! the lock: not a process that left the group, not after `kill -9` of `fenced exec`,
//! not past the lease's deadline whatever the grace.
#![cfg(feature = "client")]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fenced_client::{Client, LeaseId};

use crate::support::{wait_exit, wait_for_file, TempDir};

mod elect;
mod json;
mod outliving;
mod status;
mod stopping;

const BIN: &str = env!("CARGO_BIN_EXE_fenced");

/// A `fenced server` child on a free loopback port; SIGKILLed when dropped.
struct Server {
    child: Child,
    endpoint: String,
    _data: TempDir,
}

impl Server {
    fn start(tag: &str) -> Server {
        let data = TempDir::new("exec", tag);
        let addr = crate::server::free_addr();
        let child = Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--data-dir"])
            .arg(data.0.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, endpoint: format!("http://{addr}"), _data: data }
    }

    fn exec(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("exec").args(args).env("FENCED_ENDPOINT", &self.endpoint);
        c
    }

    fn client(&self) -> Client {
        Client::connect(&self.endpoint).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn output(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

/// Gone means: no such process, or a zombie waiting for its (new) parent to reap it.
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits until `pid` is gone, up to `within`; says whether it is.
fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !gone(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    gone(pid)
}

/// SIGKILLs the processes a test started that are still there when it ends, so that a
/// failing test (the behaviour it checks being broken) leaves nothing running.
struct KillLeftovers(Vec<i32>);

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        for &pid in self.0.iter().filter(|&&p| !gone(p)) {
            // SAFETY: kill(2) takes no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}
