//! issue 29: leader election with `fenced elect` and `fenced leader`.

use super::*;

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
