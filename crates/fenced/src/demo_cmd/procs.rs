//! The processes `fenced demo` starts, and their clean-up: a temporary directory, the
//! server and the workers. Dropping [`Procs`] kills every child (a stopped one too:
//! SIGKILL needs no SIGCONT), waits for it, and removes the directory, on every way
//! out: success, error, panic, or SIGINT/SIGTERM turned into an early return.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::sync::mpsc::UnboundedSender;

/// How long the server gets to shut down cleanly before SIGKILL.
const SERVER_STOP_MS: u64 = 3000;

/// A line from a worker's stdout (`None` at its end), with the worker's name.
pub type Line = (char, Option<String>);

pub struct Procs {
    /// The temporary directory: the server's data and every child's log.
    pub dir: PathBuf,
    /// The server, once started.
    server: Option<Child>,
    /// The workers by name.
    workers: Vec<(char, Child)>,
}

impl Procs {
    /// Creates a fresh temporary directory under `$TMPDIR`.
    pub fn new() -> anyhow::Result<Procs> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let dir = std::env::temp_dir().join(format!("fenced-demo-{}-{}", std::process::id(), nanos % 1_000_000_000));
        std::fs::create_dir(&dir).with_context(|| format!("creating the temporary directory {}", dir.display()))?;
        Ok(Procs { dir, server: None, workers: Vec::new() })
    }

    /// Starts `fenced server` on `addr` with its data in the temporary directory.
    pub fn start_server(&mut self, addr: SocketAddr, unfenced_prefix: &str) -> anyhow::Result<u32> {
        let mut cmd = child_command(&self.dir, "server.log")?;
        cmd.args(["server", "--listen", &addr.to_string(), "--unfenced-prefix", unfenced_prefix, "--data-dir"])
            .arg(self.dir.join("data"))
            .env("FENCED_SHUTDOWN_DRAIN_MS", "1000")
            .stdout(Stdio::null());
        let child = cmd.spawn().context("starting fenced server")?;
        let pid = child.id();
        self.server = Some(child);
        Ok(pid)
    }

    /// Polls `GET /readyz` until the server is ready and out of any start-up grace.
    pub async fn wait_ready(&mut self, addr: SocketAddr, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if readyz(addr).is_some_and(|body| body.contains("\"recovering\":false")) {
                return Ok(());
            }
            if let Some(status) = self.server.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("fenced server exited ({status}) before it was ready:\n{}", self.log_tail("server.log"));
            }
            if Instant::now() > deadline {
                bail!("fenced server was not ready within {} ms:\n{}", within.as_millis(), self.log_tail("server.log"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts `fenced demo-worker --name NAME ARGS` and forwards its stdout lines to `tx`.
    pub fn start_worker(&mut self, name: char, args: &[String], tx: UnboundedSender<Line>) -> anyhow::Result<u32> {
        let mut cmd = child_command(&self.dir, &format!("worker-{name}.log"))?;
        cmd.arg("demo-worker").args(args).stdout(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting worker {name}"))?;
        let out = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send((name, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((name, None));
        });
        let pid = child.id();
        self.workers.push((name, child));
        Ok(pid)
    }

    /// Waits for worker `name` to exit (its stdout has ended, so this is quick).
    pub fn worker_status(&mut self, name: char) -> anyhow::Result<ExitStatus> {
        let (_, child) = self.workers.iter_mut().find(|(n, _)| *n == name).context("no such worker")?;
        Ok(child.wait()?)
    }

    /// The last lines of a child's log, for an error message.
    pub fn log_tail(&self, file: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(12)..].join("\n");
        if tail.is_empty() {
            format!("({file} is empty)")
        } else {
            tail
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, child) in &mut self.workers {
            // SIGKILL ends a stopped process as well; wait reaps it.
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut server) = self.server.take() {
            signal(server.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_millis(SERVER_STOP_MS);
            while matches!(server.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// The process's state letter from `/proc/PID/stat` (`T`: stopped by a signal).
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything; the state follows it.
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// A child of this very binary, in a process group of its own (a Ctrl-C at the
/// terminal reaches only the parent, which then stops everything in order), killed by
/// the kernel if the parent dies without cleaning up, with stderr to `log`, and with
/// none of the user's `FENCED_*` settings.
fn child_command(dir: &Path, log: &str) -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("finding the fenced binary")?;
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FENCED_") {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null()).stderr(File::create(dir.join(log))?).process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    Ok(cmd)
}

/// The body of `GET /readyz` when it answers 200.
fn readyz(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /readyz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    raw.starts_with("HTTP/1.1 200").then_some(raw)
}
