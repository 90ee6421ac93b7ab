//! `fenced exec NAME -- CMD ARGS...`: run a command while holding a lock, and let
//! nothing it started outlive the lock.
//!
//! The command runs in a process group of its own, with `FENCED_TOKEN`, `FENCED_LOCK`,
//! `FENCED_LEASE_ID` and `FENCED_ENDPOINT` in its environment, below a watchdog
//! (`watchdog.rs`) that kills everything under it if `fenced exec` dies. When the lock
//! is lost, the group and every other descendant (found through `/proc` on Linux, where
//! `fenced exec` is a child subreaper, see `procs.rs`) get SIGTERM, then SIGKILL after
//! the grace, but never later than the lease's client-side deadline: past it another
//! holder may already run. The exit status is then 3. Otherwise it is the command's
//! (128 + N when it died of signal N), or 1 when the lock was not acquired in time.
//! Whatever is left when the command exits is stopped the same way, and the lock is
//! released only once every descendant is gone and reaped.
//!
//! With `--lock-service etcd://HOST:PORT` the lock is etcd's (`fenced_client::etcd`),
//! the token its lock key's `create_revision`; with `zk://HOST:PORT` it is ZooKeeper's
//! (`fenced_client::zookeeper`), the token its node's `czxid`. The same deadline and
//! kill rules apply to their lease or session.

mod procs;
pub mod watchdog;

use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fenced_client::etcd::{Etcd, EtcdGuard};
use fenced_client::zookeeper::{self, ZkGuard};
use fenced_client::{Client, Error, LockGuard, LostReason};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{sleep, Instant};

use self::watchdog::Report;
use super::{hold_options, HoldArgs, EXIT_LOST, EXIT_NOT_ACQUIRED};
use crate::args::{duration_ms, Global};

/// How often the tree is looked at again while it is being stopped.
const STOP_POLL: Duration = Duration::from_millis(20);

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The lock's name (UTF-8, 1 to 256 bytes, `/` allowed).
    pub name: String,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// Between SIGTERM and SIGKILL when the lock is lost or the command leaves processes
    /// behind. Cut short so that SIGKILL comes no later than the lease's client-side
    /// deadline (the last keepalive's send time + TTL - a tenth of the TTL): when the
    /// lease simply ran out, SIGKILL follows SIGTERM at once.
    #[arg(long, default_value = "5s", value_parser = duration_ms)]
    pub grace: u64,
    /// Take the lock from another lock service instead of Fenced: `etcd://HOST:PORT`
    /// (its lock API on a kept-alive lease; FENCED_TOKEN is the lock key's
    /// create_revision, FENCED_LEASE_ID the etcd lease in hex; the TTL is rounded down
    /// to whole seconds) or `zk://HOST:PORT` (Curator's recipe in a session whose
    /// timeout is the TTL; FENCED_TOKEN is the lock node's czxid, FENCED_LEASE_ID the
    /// session in hex).
    #[arg(long, value_name = "URL")]
    pub lock_service: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
    /// Campaign (`fenced elect`): wait as long as it takes, one `--wait` after another.
    #[arg(skip)]
    pub campaign: bool,
}

/// How the command's run ended.
enum Ended {
    /// The command exited by itself with this status.
    Exited(ExitStatus),
    /// The lock was lost first.
    Lost(LostReason),
    /// The watchdog died (someone killed it); so did the command, by PDEATHSIG.
    WatchdogDied,
}

pub async fn run(client: &Client, a: ExecArgs, _global: &Global) -> anyhow::Result<ExitCode> {
    let (ttl, wait) = hold_options(&a.name, &a.hold)?;
    if a.hold.holder.is_some() && a.lock_service.is_some() {
        return Err(crate::args::BadArgument::error("--holder", "labels Fenced locks only, not --lock-service ones"));
    }
    let grace = Duration::from_millis(a.grace);
    // Before anything runs: an orphan must come to us, never to init.
    procs::become_subreaper().context("becoming a child subreaper")?;
    let acquired = match &a.lock_service {
        None => {
            let mut request = client.lock(&a.name).ttl(ttl).wait(wait);
            if let Some(h) = &a.hold.holder {
                request = request.holder(h);
            }
            if a.campaign {
                request.campaign().await.map(Held::Fenced)
            } else {
                request.acquire().await.map(Held::Fenced)
            }
        }
        Some(url) if url.starts_with("etcd://") => match Etcd::new(url, Duration::from_secs(2), Duration::from_secs(5))
        {
            Ok(etcd) => {
                etcd.acquire(&a.name, ttl, wait).await.map(|g| Held::Etcd(Box::new(g), etcd.endpoint().to_owned()))
            }
            Err(e) => Err(e),
        },
        Some(url) if url.starts_with("zk://") => {
            zookeeper::lock(url, &a.name, ttl, wait).await.map(|g| Held::Zk(Box::new(g), url.clone()))
        }
        Some(url) => {
            return Err(crate::args::BadArgument::error(
                "--lock-service",
                format!("'{url}' is not a lock service this exec knows (etcd://HOST:PORT or zk://HOST:PORT)"),
            ))
        }
    };
    let guard = match acquired {
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
    // Installed only now: until the lock is held, SIGINT and SIGTERM simply end us.
    let mut signals = match Forwarded::new() {
        Ok(s) => s,
        Err(e) => {
            let _ = guard.release().await;
            return Err(e.into());
        }
    };
    let (watchdog, mut reports) = match spawn_watchdog(client, &guard, &a.command) {
        Ok(w) => w,
        Err(e) => {
            let _ = guard.release().await;
            return Err(e.context("starting the watchdog"));
        }
    };
    let ended = match reports.next_line().await.ok().flatten().as_deref().and_then(Report::parse) {
        Some(Report::Started(pgid)) => supervise(&mut reports, pgid, &guard, &mut signals).await,
        Some(Report::Failed(code)) => {
            // The watchdog said why on standard error and exits by itself.
            stop_all(None, watchdog, &guard, grace).await;
            let _ = guard.release().await;
            return Ok(ExitCode::from(code));
        }
        _ => Ended::WatchdogDied,
    };
    match &ended {
        Ended::Lost(reason) => {
            eprintln!("fenced exec: lock '{}' lost ({reason}); stopping the command", guard.name());
        }
        Ended::WatchdogDied => eprintln!("fenced exec: the watchdog died; stopping what is left of the command"),
        Ended::Exited(_) => {}
    }
    stop_all(signals.pgid, watchdog, &guard, grace).await;
    // Only now: every descendant is gone and reaped.
    let lost = guard.lost_reason();
    let released = guard.release().await;
    let status = match ended {
        Ended::Lost(_) => return Ok(ExitCode::from(EXIT_LOST)),
        Ended::WatchdogDied => anyhow::bail!("the watchdog of lock '{}' died", a.name),
        Ended::Exited(status) => status,
    };
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

/// Starts `fenced exec-watchdog -- CMD ARGS...` with the lock's variables in its
/// environment (the command inherits them), in a process group of its own so that the
/// terminal's signals reach only us. Returns its pid and its reports.
fn spawn_watchdog(
    client: &Client,
    guard: &Held,
    command: &[String],
) -> anyhow::Result<(libc::pid_t, Lines<BufReader<UnixStream>>)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let mut c = std::process::Command::new(own_executable()?);
    c.arg0("fenced")
        .arg("exec-watchdog")
        .arg("--control-fd")
        .arg(fd.to_string())
        .arg("--")
        .args(command)
        .env("FENCED_TOKEN", guard.token().to_string())
        .env("FENCED_LOCK", guard.name())
        .env("FENCED_LEASE_ID", guard.lease_hex())
        .env("FENCED_ENDPOINT", guard.endpoint(client))
        .process_group(0);
    // SAFETY: between fork and exec, only fcntl (async-signal-safe) on a descriptor
    // that stays open in the parent until the spawn returns.
    unsafe {
        c.pre_exec(move || {
            // The pair is close-on-exec; the watchdog's end alone must cross the exec.
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Never waited on through `Child`: `stop_all` reaps it with every other orphan.
    let pid = c.spawn()?.id() as libc::pid_t;
    // Our copy of their end goes, so that their death reads as end of file.
    drop(theirs);
    ours.set_nonblocking(true)?;
    Ok((pid, BufReader::new(UnixStream::from_std(ours)?).lines()))
}

/// `/proc/self/exe` on Linux: it still runs this binary if the file was replaced since.
fn own_executable() -> std::io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// Waits for the command's end or the lock's loss, forwarding SIGINT, SIGTERM and
/// SIGHUP to the command's group meanwhile.
async fn supervise(
    reports: &mut Lines<BufReader<UnixStream>>,
    pgid: libc::pid_t,
    guard: &Held,
    signals: &mut Forwarded,
) -> Ended {
    signals.pgid = Some(pgid);
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            line = reports.next_line() => match line.ok().flatten().as_deref().and_then(Report::parse) {
                Some(Report::Exited(raw)) => return Ended::Exited(ExitStatus::from_raw(raw)),
                Some(_) => {}
                None => return Ended::WatchdogDied,
            },
            reason = &mut lost => return Ended::Lost(reason),
            _ = signals.int.recv() => procs::killpg(pgid, libc::SIGINT),
            _ = signals.term.recv() => procs::killpg(pgid, libc::SIGTERM),
            _ = signals.hup.recv() => procs::killpg(pgid, libc::SIGHUP),
        }
    }
}

/// The signals forwarded to the command's group, installed before the command starts.
struct Forwarded {
    int: Signal,
    term: Signal,
    hup: Signal,
    /// The command's process group, once it runs.
    pgid: Option<libc::pid_t>,
}

impl Forwarded {
    fn new() -> std::io::Result<Forwarded> {
        Ok(Forwarded {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            pgid: None,
        })
    }
}

/// Stops everything below us: SIGTERM to the command's group and to every descendant,
/// then SIGKILL once the grace is over or the lease's client-side deadline has come,
/// whichever is first; returns once nothing is left and everything is reaped.
///
/// The watchdog is spared the SIGTERM: its death would SIGKILL the command at once and
/// cut the grace short. With nothing else left it exits by itself.
async fn stop_all(pgid: Option<libc::pid_t>, watchdog: libc::pid_t, guard: &Held, grace: Duration) {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let grace_ends = Instant::now() + grace;
    let mut watchdog_reaped = false;
    let mut first = true;
    loop {
        watchdog_reaped |= procs::reap_exited().iter().any(|&(pid, _)| pid == watchdog);
        let left = procs::live_descendants(me);
        let group = pgid.is_some_and(procs::group_alive);
        if left.is_empty() && !group && watchdog_reaped {
            return;
        }
        // Read each round: keepalives move it on while the lock holds, never after a loss.
        let kill = Instant::now() >= grace_ends.min(guard.valid_until());
        let sig = if kill { libc::SIGKILL } else { libc::SIGTERM };
        if kill || first {
            if let Some(g) = pgid {
                procs::killpg(g, sig);
            }
            for &pid in left.iter().filter(|&&p| kill || p != watchdog) {
                procs::kill(pid, sig);
            }
            if kill && !watchdog_reaped {
                // Still unreaped, so the pid cannot belong to anyone else yet.
                procs::kill(watchdog, libc::SIGKILL);
            }
            first = false;
        }
        sleep(STOP_POLL).await;
    }
}

/// The lock the command runs under: Fenced's, or another service's with the same
/// deadline and lost-lock signal.
enum Held {
    Fenced(LockGuard),
    /// An etcd lock (boxed: it carries its own HTTP client), and the etcd endpoint
    /// (for `FENCED_ENDPOINT`).
    Etcd(Box<EtcdGuard>, String),
    /// A ZooKeeper lock, and its `zk://` URL.
    Zk(Box<ZkGuard>, String),
}

impl Held {
    fn token(&self) -> fenced_client::Token {
        match self {
            Held::Fenced(g) => g.token(),
            Held::Etcd(g, _) => g.token(),
            Held::Zk(g, _) => g.token(),
        }
    }

    fn name(&self) -> &str {
        match self {
            Held::Fenced(g) => g.name().as_str(),
            Held::Etcd(g, _) => g.name(),
            Held::Zk(g, _) => g.name(),
        }
    }

    fn lease_hex(&self) -> String {
        match self {
            Held::Fenced(g) => g.lease_id().to_hex(),
            Held::Etcd(g, _) => g.lease_hex(),
            Held::Zk(g, _) => g.session_hex(),
        }
    }

    fn endpoint(&self, client: &Client) -> String {
        match self {
            // Every member, the one that granted first: the command fails over as exec does.
            Held::Fenced(_) => client.endpoints(),
            Held::Etcd(_, endpoint) => format!("etcd://{}", endpoint.trim_start_matches("http://")),
            Held::Zk(_, url) => url.clone(),
        }
    }

    fn valid_until(&self) -> Instant {
        match self {
            Held::Fenced(g) => g.valid_until(),
            Held::Etcd(g, _) => g.valid_until(),
            Held::Zk(g, _) => g.valid_until(),
        }
    }

    fn lost_reason(&self) -> Option<LostReason> {
        match self {
            Held::Fenced(g) => g.lost_reason(),
            Held::Etcd(g, _) => g.lost_reason(),
            Held::Zk(g, _) => g.lost_reason(),
        }
    }

    fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = LostReason> + Send>> {
        match self {
            Held::Fenced(g) => Box::pin(g.lost()),
            Held::Etcd(g, _) => Box::pin(g.lost()),
            Held::Zk(g, _) => Box::pin(g.lost()),
        }
    }

    async fn release(self) -> Result<(), Error> {
        match self {
            Held::Fenced(g) => g.release().await,
            Held::Etcd(g, _) => (*g).release().await,
            Held::Zk(g, _) => (*g).release().await,
        }
    }
}

/// The shell's convention: the exit code, or 128 + the signal that ended the process.
fn exit_code(status: ExitStatus) -> u8 {
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
