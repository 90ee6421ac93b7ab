//! The watchdog between `fenced exec` and its command: the command's parent, so that
//! nothing the command started outlives `fenced exec`, even when `fenced exec` is
//! killed with SIGKILL and can clean nothing up itself.
//!
//! It is `fenced` itself, started again (`fenced exec-watchdog`, hidden) rather than a
//! fork of `fenced exec`: a fork of a threaded process may only call async-signal-safe
//! functions, and the watchdog reads `/proc` and allocates. It holds one end of a
//! socket pair whose other end only `fenced exec` holds; end of file on it means that
//! `fenced exec` is gone, and the watchdog then SIGKILLs every process below it and
//! exits. Every process below it is found because on Linux it is a child subreaper:
//! a process that leaves the group (setsid, double fork) re-parents to it, not to init.
//! The command gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies if the watchdog does; its
//! own children then re-parent to `fenced exec`, a subreaper too, which kills them.
//! A cgroup with `cgroup.kill` would be tighter still, but needs a writable cgroup v2
//! hierarchy, which containers and hybrid v1/v2 hosts (this project's CI among them)
//! often lack; a subreaper needs no privilege.
//!
//! It tells `fenced exec` what happens over the same socket, one line each (`Report`).

use std::io::{BufRead, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Args;

use super::procs;

/// How often the watchdog looks again for processes left to kill once `fenced exec` is gone.
const KILL_POLL: Duration = Duration::from_millis(10);

#[derive(Args, Debug)]
pub struct WatchdogArgs {
    /// The watchdog's end of the socket pair shared with `fenced exec`.
    #[arg(long)]
    pub control_fd: RawFd,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// What the watchdog tells `fenced exec`, one line each.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    /// The command runs with this pid, which is also its process group.
    Started(libc::pid_t),
    /// The command could not be run; `fenced exec` exits with this status.
    Failed(u8),
    /// The command ended with this raw wait status.
    Exited(libc::c_int),
}

impl Report {
    pub fn line(&self) -> String {
        match self {
            Report::Started(pid) => format!("started {pid}\n"),
            Report::Failed(code) => format!("failed {code}\n"),
            Report::Exited(status) => format!("exited {status}\n"),
        }
    }

    pub fn parse(line: &str) -> Option<Report> {
        let (kind, value) = line.trim_end().split_once(' ')?;
        match kind {
            "started" => value.parse().ok().map(Report::Started),
            "failed" => value.parse().ok().map(Report::Failed),
            "exited" => value.parse().ok().map(Report::Exited),
            _ => None,
        }
    }
}

pub fn run(a: WatchdogArgs) -> anyhow::Result<ExitCode> {
    // SAFETY: `fenced exec` passed this descriptor to us open, and nothing else owns it.
    let control = unsafe { UnixStream::from_raw_fd(a.control_fd) };
    // The command must not inherit it: `fenced exec` learns of our death by its closing.
    set_cloexec(a.control_fd)?;
    procs::become_subreaper()?;
    name_this_process();
    let (program, args) = a.command.split_first().expect("clap requires a command");
    let mut command = Command::new(program);
    command.args(args).process_group(0);
    die_with_parent(&mut command);
    let pgid = match command.spawn() {
        Ok(child) => child.id() as libc::pid_t,
        Err(e) => {
            eprintln!("fenced exec: cannot run '{program}': {e}");
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            let _ = (&control).write_all(Report::Failed(code).line().as_bytes());
            return Ok(ExitCode::from(code));
        }
    };
    let _ = (&control).write_all(Report::Started(pgid).line().as_bytes());
    let watch = control.try_clone()?;
    // Detached on purpose: it either ends the process itself or dies with it.
    std::thread::spawn(move || {
        // `fenced exec` never writes; end of file (or an error) means it is gone.
        let _ = std::io::BufReader::new(watch).read_line(&mut String::new());
        kill_everything(pgid);
        std::process::exit(1);
    });
    reap_until_alone(pgid, &control);
    Ok(ExitCode::SUCCESS)
}

/// Reaps the command and every orphan that re-parented here, reporting the command's
/// status; returns once no child is left, which for a subreaper means no descendant.
fn reap_until_alone(command: libc::pid_t, control: &UnixStream) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`, a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == command {
            let _ = (&*control).write_all(Report::Exited(status).line().as_bytes());
        } else if pid < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return; // ECHILD: nothing left below us
        }
    }
}

/// SIGKILLs the group and every descendant until none is left. A process that forks
/// between two rounds is found in the next: its child is below us either way.
fn kill_everything(pgid: libc::pid_t) {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    loop {
        procs::killpg(pgid, libc::SIGKILL);
        let left = procs::live_descendants(me);
        if left.is_empty() {
            return;
        }
        for pid in left {
            procs::kill(pid, libc::SIGKILL);
        }
        std::thread::sleep(KILL_POLL);
    }
}

/// The command gets SIGKILL when the watchdog dies. PDEATHSIG follows the thread that
/// forked, so the spawn stays on the main thread, which lives as long as the process.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only prctl and getppid,
    // both async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then no signal would ever come.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Without PDEATHSIG the command outlives a killed watchdog; `fenced exec` still stops
/// its group.
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// `ps` would otherwise show `exe`, the name of `/proc/self/exe` that started us.
#[cfg(target_os = "linux")]
fn name_this_process() {
    // SAFETY: the name is a NUL-terminated string of at most 16 bytes, as PR_SET_NAME wants.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"fenced-watchdog".as_ptr(), 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn name_this_process() {}

fn set_cloexec(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor number; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Report;

    #[test]
    fn reports_survive_a_line() {
        for r in [Report::Started(4242), Report::Failed(127), Report::Exited(9), Report::Exited(7 << 8)] {
            assert_eq!(Report::parse(&r.line()), Some(r));
        }
        assert_eq!(Report::parse("exited"), None);
        assert_eq!(Report::parse("other 1\n"), None);
    }
}
