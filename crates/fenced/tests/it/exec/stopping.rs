//! A lease revoked from outside stops the child and its children; nothing of the group
//! outlives a normal exit.

use super::*;

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
