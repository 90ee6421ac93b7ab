//! `fenced exec NAME -- CMD ARGS...`: run a command while holding a lock.
//!
//! The command runs in a process group of its own, with `FENCED_TOKEN`, `FENCED_LOCK`,
//! `FENCED_LEASE_ID` and `FENCED_ENDPOINT` in its environment. When the lock is lost,
//! the whole group gets SIGTERM, then SIGKILL after the grace, so `sh -c` wrappers
//! leave nothing running; the exit status is then 3. Otherwise it is the command's
//! (128 + N when it died of signal N), or 1 when the lock was not acquired in time.
//! Whatever is left of the group when the command exits is stopped the same way before
//! the lock is released: nothing of it may outlive the lock.

use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use clap::Args;
use fenced_client::{Client, Error, LockGuard};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep, Instant};

use super::{hold_options, HoldArgs, EXIT_LOST, EXIT_NOT_ACQUIRED};
use crate::args::{duration_ms, BadArgument, Global};

/// How often the group is polled while it is being stopped.
const STOP_POLL: Duration = Duration::from_millis(20);

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The lock's name (UTF-8, 1 to 256 bytes, `/` allowed).
    pub name: String,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// Between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, default_value = "5s", value_parser = duration_ms)]
    pub grace: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

pub async fn run(client: &Client, a: ExecArgs, _global: &Global) -> anyhow::Result<ExitCode> {
    let (ttl, wait) = hold_options(&a.name, &a.hold)?;
    let grace = Duration::from_millis(a.grace);
    let (program, args) = a.command.split_first().ok_or_else(|| BadArgument::error("CMD", "no command given"))?;
    let guard = match client.lock(&a.name).ttl(ttl).wait(wait).acquire().await {
        Ok(g) => g,
        Err(Error::LockHeld { name }) => {
            eprintln!("fenced exec: lock '{name}' was not acquired within {} ms", wait.as_millis());
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
        Err(e) => {
            eprintln!("fenced exec: lock '{}' was not acquired: {e}", a.name);
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
    };
    let mut child = match Command::new(program)
        .args(args)
        .env("FENCED_TOKEN", guard.token().to_string())
        .env("FENCED_LOCK", guard.name().as_str())
        .env("FENCED_LEASE_ID", guard.lease_id().to_hex())
        .env("FENCED_ENDPOINT", client.endpoint())
        .stdin(Stdio::inherit())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fenced exec: cannot run '{program}': {e}");
            let _ = guard.release().await;
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Ok(ExitCode::from(code));
        }
    };
    let pgid = child.id().expect("a child just spawned has a pid") as libc::pid_t;
    let (status, stopped_for_loss) = supervise(&mut child, pgid, &guard, grace).await?;
    let lost = guard.lost_reason();
    let released = guard.release().await;
    if stopped_for_loss {
        return Ok(ExitCode::from(EXIT_LOST));
    }
    // The command finished, but the lock may have been lost while it was finishing.
    if let Some(reason) = lost.or(match released {
        Err(Error::Lost(r)) => Some(r),
        _ => None,
    }) {
        eprintln!("fenced exec: lock '{}' lost before the command finished: {reason}", a.name);
        return Ok(ExitCode::from(EXIT_LOST));
    }
    Ok(ExitCode::from(exit_code(status)))
}

/// Waits for the command, forwarding SIGINT, SIGTERM and SIGHUP to its group and
/// stopping the group when the lock is lost. Returns the command's status once nothing
/// of its group is left running, and whether it was stopped because the lock was lost.
async fn supervise(
    child: &mut Child,
    pgid: libc::pid_t,
    guard: &LockGuard,
    grace: Duration,
) -> anyhow::Result<(ExitStatus, bool)> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                // The command is done; whatever it left in its group must not outlive the lock.
                stop_group(child, pgid, grace).await?;
                return Ok((status, false));
            }
            reason = &mut lost => {
                eprintln!("fenced exec: lock '{}' lost ({reason}); stopping the command", guard.name());
                return Ok((stop_group(child, pgid, grace).await?, true));
            }
            _ = sigint.recv() => killpg(pgid, libc::SIGINT),
            _ = sigterm.recv() => killpg(pgid, libc::SIGTERM),
            _ = sighup.recv() => killpg(pgid, libc::SIGHUP),
        }
    }
}

/// SIGTERM to the group, SIGKILL after `grace` to whatever is left; returns the
/// command's status. Reaps the command while polling, since a zombie leader still
/// counts as a member of its group.
async fn stop_group(child: &mut Child, pgid: libc::pid_t, grace: Duration) -> anyhow::Result<ExitStatus> {
    let mut status = child.try_wait()?;
    if !group_alive(pgid) {
        return Ok(match status {
            Some(s) => s,
            None => child.wait().await?,
        });
    }
    killpg(pgid, libc::SIGTERM);
    let kill_at = Instant::now() + grace;
    while Instant::now() < kill_at {
        if status.is_none() {
            status = child.try_wait()?;
        }
        if let Some(s) = status.filter(|_| !group_alive(pgid)) {
            return Ok(s);
        }
        sleep(STOP_POLL).await;
    }
    killpg(pgid, libc::SIGKILL);
    Ok(match status {
        Some(s) => s,
        None => child.wait().await?,
    })
}

fn killpg(pgid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Whether any process of the group is still there (zombies of processes that are not
/// our children are reaped by their new parent, not us, so they may linger here briefly).
fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the group exists and may be signalled.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// The shell's convention: the exit code, or 128 + the signal that ended the process.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::exit_code;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(5 << 8)), 5);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 128 + 9);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 128 + 15);
    }
}
