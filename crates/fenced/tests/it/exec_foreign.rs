//! `fenced exec --lock-service etcd://HOST:PORT|zk://HOST:PORT` against a real etcd
//! and a real ZooKeeper (Debian's, started by the lab on free loopback ports): the
//! command gets the lock key's create_revision or the lock node's czxid as its token,
//! tokens grow from run to run, a busy lock exits 1, and a lost lock (a lease revoked
//! from outside; `fenced exec` frozen past its session) stops the command (exit 3).
#![cfg(all(feature = "client", feature = "lab"))]

use std::process::{Command, Stdio};
use std::time::Duration;

use fenced_client::etcd::Etcd;
use fenced_lab::peers::Service;

use crate::support::{wait_exit, wait_for_file, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_fenced");

/// One etcd at a time in this file: each picks two free ports, and two starting at
/// once can pick the same one.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A fresh etcd and this test's turn; `None` (the test skips) without it, outside CI.
fn etcd() -> Option<(Service, std::sync::MutexGuard<'static, ()>)> {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    match Service::etcd() {
        Ok(s) => Some((s, turn)),
        Err(e) if std::env::var_os("CI").is_none() && e.to_string().contains("not found on PATH") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("cannot start etcd: {e:#}"),
    }
}

fn exec(service: &Service, args: &[&str]) -> Command {
    let scheme = if service.name == "zookeeper" { "zk" } else { "etcd" };
    let mut c = Command::new(BIN);
    c.args(["exec", "--lock-service", &format!("{scheme}://{}", service.addr)]).args(args).stdin(Stdio::null());
    c
}

/// The command's `FENCED_TOKEN FENCED_ENDPOINT` line, after a successful run.
fn run_and_print(service: &Service) -> (u64, String) {
    let out = exec(service, &["jobs/etcd", "--ttl", "2s", "--", "sh", "-c", "echo $FENCED_TOKEN $FENCED_ENDPOINT"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}: {stdout} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let (token, endpoint) = stdout.trim().split_once(' ').expect("token and endpoint");
    (token.parse().expect("a numeric token"), endpoint.to_owned())
}

#[test]
fn etcd_locks_hand_the_command_their_create_revision_and_tokens_grow() {
    let Some((service, _turn)) = etcd() else { return };
    let (first, endpoint) = run_and_print(&service);
    let (second, _) = run_and_print(&service);
    assert_eq!(endpoint, format!("etcd://{}", service.addr));
    assert!(first > 0 && second > first, "tokens {first} then {second}");
    // A lock service this exec does not know is a bad argument: exit 2, nothing run.
    let out = Command::new(BIN)
        .args(["exec", "--lock-service", "consul://127.0.0.1:8500", "j", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_etcd_lock_held_elsewhere_exits_1_and_a_revoked_lease_exits_3() {
    let Some((service, _turn)) = etcd() else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let etcd = Etcd::new(&service.url(), Duration::from_secs(1), Duration::from_secs(5)).unwrap();
    // Held by a lease of ours: exec waits its 300 ms, runs nothing, exits 1.
    let lease = rt.block_on(etcd.lease_grant(30)).unwrap();
    let held = rt.block_on(etcd.lock(b"jobs/busy", lease, Duration::from_secs(5))).unwrap().expect("granted");
    let out = exec(&service, &["jobs/busy", "--wait", "300ms", "--", "sh", "-c", "echo ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "the command ran without the lock");
    rt.block_on(etcd.unlock(&held.key)).unwrap();

    // Its lease revoked from outside while the command runs: stopped, exit 3.
    let dir = TempDir::new("exec", "etcd");
    let lease_file = dir.0.join("lease");
    let script = format!("echo $FENCED_LEASE_ID > {}; sleep 1000", lease_file.display());
    let mut child =
        exec(&service, &["jobs/revoke", "--ttl", "2s", "--grace", "1s", "--", "sh", "-c", &script]).spawn().unwrap();
    let hex = wait_for_file(&lease_file, &mut child);
    rt.block_on(etcd.lease_revoke(i64::from_str_radix(&hex, 16).expect("a hex lease"))).unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(3), "exit 3 when the etcd lock is lost");
}

/// A fresh ZooKeeper; `None` (the test skips) without it, outside CI.
fn zookeeper() -> Option<Service> {
    match Service::zookeeper() {
        Ok(s) => Some(s),
        Err(e) if std::env::var_os("CI").is_none() && e.to_string().contains("not") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("cannot start ZooKeeper: {e:#}"),
    }
}

#[test]
fn zookeeper_locks_hand_the_command_their_czxid_and_a_frozen_exec_loses_its_lock() {
    let Some(service) = zookeeper() else { return };
    let (first, endpoint) = run_and_print(&service);
    let (second, _) = run_and_print(&service);
    assert_eq!(endpoint, format!("zk://{}", service.addr));
    assert!(first > 0 && second > first, "tokens {first} then {second}");

    // Held by a running exec: a second one waits 300 ms, runs nothing, exits 1.
    let dir = TempDir::new("exec", "zk");
    let ready = dir.0.join("ready");
    let script = format!("echo up > {}; sleep 1000", ready.display());
    let mut holder =
        exec(&service, &["jobs/zk", "--ttl", "2s", "--grace", "1s", "--", "sh", "-c", &script]).spawn().unwrap();
    wait_for_file(&ready, &mut holder);
    let out = exec(&service, &["jobs/zk", "--wait", "300ms", "--", "sh", "-c", "echo ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "the command ran without the lock");

    // The holder frozen past its session (a GC pause of fenced exec itself): when it
    // wakes, its lock is lost and its command is stopped, exit 3.
    let pid = holder.id() as libc::pid_t;
    // SAFETY: kill(2) takes no memory; the pid is our unreaped child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_secs(6));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(3), "exit 3 when the ZooKeeper lock is lost");
}
