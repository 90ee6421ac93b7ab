//! End-to-end tests of `fenced exec` against a real `fenced server` child process: the
//! child's environment, its exit status, a busy lock, a lease revoked from outside
//! stopping the child's whole process group, and nothing the command started outliving
//! the lock: not a process that left the group, not after `kill -9` of `fenced exec`,
//! not past the lease's deadline whatever the grace.
#![cfg(feature = "client")]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fenced_client::{Client, LeaseId};

use crate::support::{wait_exit, wait_for_file, TempDir};

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
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
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

#[test]
fn the_child_sees_the_lock_and_its_status_comes_back() {
    let server = Server::start("env");
    let out = output(server.exec(&[
        "nightly/report",
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        r#"echo "$FENCED_LOCK $FENCED_TOKEN $FENCED_LEASE_ID $FENCED_ENDPOINT"; exit 7"#,
    ]));
    assert_eq!(out.status.code(), Some(7), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{stdout}");
    assert_eq!(fields[0], "nightly/report");
    assert!(fields[1].parse::<u64>().unwrap() > 0);
    assert!(LeaseId::from_hex(fields[2]).is_some(), "lease id {}", fields[2]);
    assert_eq!(fields[3], server.endpoint);
    // Released on exit: the next run gets the lock at once, with a newer token.
    let again = output(server.exec(&["nightly/report", "--wait", "0s", "--", "sh", "-c", "echo $FENCED_TOKEN"]));
    assert_eq!(again.status.code(), Some(0));
    let token: u64 = String::from_utf8(again.stdout).unwrap().trim().parse().unwrap();
    assert!(token > fields[1].parse::<u64>().unwrap());
    // A command that cannot be run, like a shell would say.
    let missing = output(server.exec(&["nightly/report", "--", "/nonexistent/fenced-test-command"]));
    assert_eq!(missing.status.code(), Some(127));
}

#[test]
fn a_busy_lock_exits_1_without_running_the_command() {
    let server = Server::start("busy");
    let rt = rt();
    let client = server.client();
    let holder = rt.block_on(client.lock("held").ttl(Duration::from_secs(20)).try_acquire()).unwrap();
    let dir = TempDir::new("exec", "busy-marker");
    let marker = dir.0.join("ran");
    let script = format!("touch {}", marker.display());
    for wait in ["0s", "300ms"] {
        let out = output(server.exec(&["held", "--wait", wait, "--", "sh", "-c", &script]));
        assert_eq!(out.status.code(), Some(1), "--wait {wait}");
        assert!(!marker.exists(), "the command must not run without the lock");
    }
    rt.block_on(holder.release()).unwrap();
    // Bad arguments are status 2, not 1.
    let bad = output(server.exec(&["", "--", "true"]));
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_revoked_lease_stops_the_child_and_its_children() {
    let server = Server::start("revoke");
    let dir = TempDir::new("exec", "revoke-files");
    let (lease_file, pid_file) = (dir.0.join("lease"), dir.0.join("grandchild"));
    // The shell and its background child both ignore SIGTERM, so only SIGKILL after
    // the grace can stop them: the hardest case.
    let script = format!(
        "trap '' TERM; sleep 1000 & echo $! > {pids}; echo $FENCED_LEASE_ID > {lease}; wait",
        pids = pid_file.display(),
        lease = lease_file.display()
    );
    let (ttl_s, grace_s) = (2, 1);
    let mut exec = server
        .exec(&[
            "jobs/revoke",
            "--ttl",
            &format!("{ttl_s}s"),
            "--grace",
            &format!("{grace_s}s"),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lease = LeaseId::from_hex(&wait_for_file(&lease_file, &mut exec)).expect("the child saw its lease id");
    let grandchild: i32 = wait_for_file(&pid_file, &mut exec).parse().unwrap();
    assert!(!gone(grandchild));
    rt().block_on(server.client().revoke_lease(lease)).unwrap();
    let revoked_at = Instant::now();
    // TTL + grace is the promise; the rest is slack for a loaded machine, not a speed test.
    let status = wait_exit(&mut exec, Duration::from_secs(ttl_s + grace_s + 20));
    let stopped_after = revoked_at.elapsed();
    assert_eq!(status.code(), Some(3), "exit 3 when the lock is lost");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(grandchild) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(grandchild), "the grandchild {grandchild} outlived the lock");
    let mut stderr = String::new();
    std::io::Read::read_to_string(exec.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lost"), "says why: {stderr}");
    eprintln!("stopped {stopped_after:?} after the revocation");
}

#[test]
fn nothing_of_the_group_outlives_a_normal_exit() {
    let server = Server::start("leftover");
    let dir = TempDir::new("exec", "leftover-files");
    let pid_file = dir.0.join("bg");
    let script = format!("sleep 1000 & echo $! > {}; exit 0", pid_file.display());
    let out = output(server.exec(&["jobs/leftover", "--grace", "2s", "--", "sh", "-c", &script]));
    assert_eq!(out.status.code(), Some(0));
    let bg: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(bg) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(bg), "a background process of the command outlived the lock");
}

#[test]
fn lock_locks_put_and_get_speak_json() {
    let server = Server::start("cli");
    let cli = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(args).arg("--json").env("FENCED_ENDPOINT", &server.endpoint);
        c
    };
    let json = |out: &Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    // `lock` prints the grant and holds until interrupted.
    // `fenced lock` prints the grant, holds until interrupted, then releases.
    let take = || {
        let mut lock = cli(&["lock", "orders/42", "--ttl", "5s"]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(lock.stdout.take().unwrap()), &mut line).unwrap();
        let grant: serde_json::Value = serde_json::from_str(&line).unwrap();
        (lock, grant)
    };
    let (mut lock, grant) = take();
    assert_eq!(grant["name"], "orders/42");
    let token = grant["token"].as_u64().unwrap();
    assert!(LeaseId::from_hex(grant["lease_id"].as_str().unwrap()).is_some());
    let locks = json(&output(cli(&["locks", "--prefix", "orders/"])));
    assert_eq!(locks["locks"][0]["name"], "orders/42");
    assert_eq!(locks["locks"][0]["token"].as_u64(), Some(token));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(lock.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut lock, Duration::from_secs(20)).code(), Some(0));
    let locks = json(&output(cli(&["locks", "--prefix", "orders/"])));
    assert!(locks["locks"].as_array().unwrap().iter().all(|l| l["held"] == false), "released: {locks}");
    // A later holder (the store takes only tokens the service issued).
    let (mut later, grant) = take();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(later.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut later, Duration::from_secs(20)).code(), Some(0));
    let (stale_token, token) = (token, grant["token"].as_u64().unwrap());

    // The store: accepted, then refused with both tokens, and reads.
    let put = output(cli(&["put", "orders/42/state", "paid", "--token", &token.to_string()]));
    assert_eq!(put.status.code(), Some(0));
    assert_eq!(json(&put)["accepted"], true);
    let stale = output(cli(&["put", "orders/42/state", "refunded", "--token", &stale_token.to_string()]));
    assert_eq!(stale.status.code(), Some(1));
    let v = json(&stale);
    assert_eq!((v["accepted"].as_bool(), v["highest_seen"].as_u64()), (Some(false), Some(token)));
    let got = output(cli(&["get", "orders/42/state", "--token", &token.to_string()]));
    assert_eq!(got.status.code(), Some(0));
    assert_eq!(json(&got)["value"], "paid");
    let missing = output(cli(&["get", "nothing"]));
    assert_eq!((missing.status.code(), json(&missing)["found"].as_bool()), (Some(1), Some(false)));
    let zero = output(cli(&["put", "k", "v", "--token", "0"]));
    assert_eq!(zero.status.code(), Some(2), "token 0 is a bad argument");
}

#[test]
fn killing_exec_with_sigkill_kills_everything_it_started() {
    let server = Server::start("kill9");
    let dir = TempDir::new("exec", "kill9-files");
    let [beat, shell, bg, escaped] = ["beat", "shell", "bg", "escaped"].map(|f| dir.0.join(f));
    // A heartbeat written by the command itself, a background child in its group, and a
    // process that left the group: all three must die with `fenced exec`.
    let script = format!(
        "setsid sh -c 'echo $$ > {escaped}; while :; do sleep 0.1; done' & \
         sleep 1000 & echo $! > {bg}; echo $$ > {shell}; \
         while :; do echo beat >> {beat}; sleep 0.05; done",
        escaped = escaped.display(),
        bg = bg.display(),
        shell = shell.display(),
        beat = beat.display(),
    );
    let mut exec =
        server.exec(&["jobs/kill9", "--ttl", "5s", "--", "sh", "-c", &script]).stdin(Stdio::null()).spawn().unwrap();
    let pids: Vec<i32> = [&shell, &bg, &escaped].map(|f| wait_for_file(f, &mut exec).parse().unwrap()).to_vec();
    let _leftovers = KillLeftovers(pids.clone());
    assert!(pids.iter().all(|&p| !gone(p)));
    exec.kill().unwrap(); // SIGKILL: `fenced exec` cleans nothing up itself
    exec.wait().unwrap();
    // Not a speed test: the bound only keeps a failure from hanging the run.
    for pid in pids {
        assert!(wait_gone(pid, Duration::from_secs(20)), "{pid} outlived a killed fenced exec");
    }
    // Every writer is gone, so the heartbeat cannot grow any more.
    let len = file_len(&beat);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(file_len(&beat), len, "the heartbeat kept growing");
}

#[test]
fn a_process_that_left_the_group_dies_before_the_lock_is_released() {
    let server = Server::start("setsid");
    let dir = TempDir::new("exec", "setsid-files");
    let [looper, log, go] = ["loop", "log", "go"].map(|f| dir.0.join(f));
    // The review's case: a loop that setsid takes out of the group, and a command that
    // exits 0 while it runs on. The command waits for `go` so that the next holder
    // queues up behind it.
    let script = format!(
        "setsid sh -c 'echo $$ > {looper}; while :; do date >> {log}; sleep 0.1; done' & \
         while [ ! -e {go} ]; do sleep 0.05; done; exit 0",
        looper = looper.display(),
        log = log.display(),
        go = go.display(),
    );
    let mut first = server.exec(&["jobs/setsid", "--", "sh", "-c", &script]).stdin(Stdio::null()).spawn().unwrap();
    let pid: i32 = wait_for_file(&looper, &mut first).parse().unwrap();
    let _leftovers = KillLeftovers(vec![pid]);
    assert!(!gone(pid));
    // The next holder looks at the loop as soon as it has the lock.
    let check = format!("cat /proc/{pid}/stat 2>/dev/null || echo gone");
    let next = server
        .exec(&["jobs/setsid", "--wait", "60s", "--", "sh", "-c", &check])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut first, Duration::from_secs(30)).code(), Some(0));
    // Killed and reaped before `fenced exec` exits, so no polling here.
    assert!(gone(pid), "the loop {pid} outlived fenced exec");
    let len = file_len(&log);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(file_len(&log), len, "the loop kept writing");
    let seen = next.wait_with_output().unwrap();
    assert_eq!(seen.status.code(), Some(0));
    let seen = String::from_utf8(seen.stdout).unwrap();
    let zombie = seen.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'));
    assert!(seen.trim() == "gone" || zombie, "the next holder saw the loop running: {seen}");
}

#[test]
fn sigkill_comes_by_the_lease_deadline_whatever_the_grace() {
    let server = Server::start("deadline");
    let dir = TempDir::new("exec", "deadline-files");
    let [shell, escaped] = ["shell", "escaped"].map(|f| dir.0.join(f));
    // Both ignore SIGTERM (an ignored signal stays ignored across fork and exec), and
    // one has left the group: only SIGKILL, sent to more than the group, stops them.
    let script = format!(
        "trap '' TERM; setsid sh -c 'echo $$ > {escaped}; while :; do sleep 0.1; done' & \
         echo $$ > {shell}; while :; do sleep 0.1; done",
        escaped = escaped.display(),
        shell = shell.display(),
    );
    let ttl = Duration::from_secs(2);
    let mut exec = server
        .exec(&["jobs/deadline", "--ttl", "2s", "--grace", "30s", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids: Vec<i32> = [&shell, &escaped].map(|f| wait_for_file(f, &mut exec).parse().unwrap()).to_vec();
    let _leftovers = KillLeftovers(pids.clone());
    // A frozen server answers no keepalive: the lease runs out, as in a partition.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGSTOP) };
    let frozen_at = Instant::now();
    // The client-side deadline comes within one TTL of the last keepalive before the
    // freeze; the grace would have been 30 s on top. The slack is for a loaded machine.
    let within = ttl + Duration::from_secs(8);
    let dead = pids.iter().map(|&p| wait_gone(p, within.saturating_sub(frozen_at.elapsed()))).collect::<Vec<_>>();
    // SAFETY: as above.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGCONT) };
    assert_eq!(dead, [true, true], "{pids:?} still ran {within:?} after the keepalives stopped (grace 30 s)");
    let status = wait_exit(&mut exec, Duration::from_secs(30));
    assert_eq!(status.code(), Some(3), "exit 3 when the lock is lost");
    let mut stderr = String::new();
    std::io::Read::read_to_string(exec.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lost"), "says why: {stderr}");
}

/// issue 29: leader election. `fenced elect` campaigns and runs its command while
/// leader; a second campaigner waits and is elected with a higher token when the first
/// command exits (resigns); `fenced leader` names the leader by its label, and with
/// `--watch` follows every change.
#[test]
fn elect_runs_one_leader_at_a_time_and_leader_follows_the_changes() {
    use std::io::{BufRead, BufReader};
    let server = Server::start("elect");
    let dir = TempDir::new("exec", "elect-files");
    let a_file = dir.0.join("a");
    let elect = |holder: &str, script: String| {
        let mut c = Command::new(BIN);
        c.args(["elect", "jobs/leader", "--holder", holder, "--ttl", "3s", "--", "sh", "-c", &script]);
        c.env("FENCED_ENDPOINT", &server.endpoint).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let leader = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["--json", "leader", "jobs/leader"]).args(args).env("FENCED_ENDPOINT", &server.endpoint);
        c
    };
    let mut a = elect("host-a", format!("echo $FENCED_TOKEN > {}.tmp && mv {0}.tmp {0}; sleep 2", a_file.display()))
        .spawn()
        .unwrap();
    let a_token: u64 = wait_for_file(&a_file, &mut a).trim().parse().unwrap();
    let now = output(leader(&[]));
    let v: serde_json::Value = serde_json::from_slice(&now.stdout).unwrap();
    assert_eq!((v["leader"]["holder"].as_str(), v["leader"]["token"].as_u64()), (Some("host-a"), Some(a_token)), "{v}");
    // An observer from now on, and a second campaigner who must wait.
    let mut watch = leader(&["--watch"]).stdout(Stdio::piped()).spawn().unwrap();
    let lines = {
        let out = watch.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut lines = vec![];
            for l in BufReader::new(out).lines() {
                lines.push(l.unwrap());
                if lines.len() == 4 {
                    break;
                }
            }
            lines
        })
    };
    let b = elect("host-b", "echo $FENCED_TOKEN".into()).spawn().unwrap();
    let started = Instant::now();
    assert!(wait_exit(&mut a, Duration::from_secs(20)).success());
    let b = b.wait_with_output().unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let b_token: u64 = String::from_utf8(b.stdout).unwrap().trim().parse().unwrap();
    assert!(b_token > a_token, "the next leader's token {b_token} is not above {a_token}");
    assert!(started.elapsed() >= Duration::from_millis(500), "host-b was elected while host-a led");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lines.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let lines = lines.join().unwrap();
    let changes: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(changes[0]["leader"]["holder"].as_str(), Some("host-a"), "the first line is the leader then");
    let seen: Vec<(&str, u64)> =
        changes[1..].iter().map(|c| (c["change"].as_str().unwrap(), c["token"].as_u64().unwrap())).collect();
    assert_eq!(
        seen,
        [("vacated", a_token), ("elected", b_token), ("vacated", b_token)],
        "the first line is the current leader, then each change: {lines:?}"
    );
    assert_eq!(changes[2]["holder"].as_str(), Some("host-b"));
    // Nobody leads now: said, and exit 1.
    let none = output(leader(&[]));
    assert_eq!(none.status.code(), Some(1));
}
