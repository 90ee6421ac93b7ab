//! Nothing the command started outlives the lock: not after `kill -9` of `fenced exec`,
//! not a process that left the group, not past the lease's deadline whatever the grace.

use super::*;

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
