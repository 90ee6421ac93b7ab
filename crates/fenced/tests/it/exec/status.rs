//! The child sees the lock in its environment and its exit status comes back; a busy
//! lock exits 1 without running the command.

use super::*;

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
