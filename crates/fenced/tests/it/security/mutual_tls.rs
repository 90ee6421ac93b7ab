//! A cluster over mutual TLS serves HTTPS and loses nothing when its leader is killed.

use super::*;

#[test]
fn three_members_over_mutual_tls_serve_https_and_lose_nothing_when_the_leader_is_killed() {
    let dir = scratch("tls-cluster-pki");
    let pki = Pki::new(&dir, "cluster");
    let mut c = TlsCluster::start("tls", &pki, 3);
    let l = c.leader();
    let (st, g) = c.settled(l, "POST", "/v1/locks/held/acquire", r#"{"ttl_ms":60000}"#);
    assert_eq!(st, 200, "{g}");
    let token = g["token"].as_u64().unwrap();
    let auth = format!("authorization: Bearer {TOKEN}");
    let put = curl(
        &c.url(l, "/v1/store/acct"),
        "PUT",
        "balance=1000",
        &["--cacert", c.members[l].ca.to_str().unwrap(), "-H", &auth, "-H", &format!("fencing-token: {token}")],
    );
    assert_eq!(put.as_ref().map(|p| p.0), Some(200), "{put:?}");
    c.kill9(l);
    let l2 = c.leader();
    assert_ne!(l, l2);
    // The held lock kept its holder and token; the store write is there; tokens go on.
    let (st, v) = c.settled(l2, "GET", "/v1/locks/held", "");
    assert_eq!((st, v["held"].as_bool(), v["token"].as_u64()), (200, Some(true), Some(token)), "{v}");
    let (st, v) = c.call(l2, "GET", "/v1/store/acct", "").unwrap();
    assert_eq!((st, v.as_str()), (200, Some("balance=1000")), "{v}");
    let (st, g) = c.call(l2, "POST", "/v1/locks/next/acquire", r#"{"ttl_ms":5000}"#).unwrap();
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > token, "{g}");
    // The killed member comes back over TLS and catches up.
    let target = c.status(l2).and_then(|s| s["commit_index"].as_u64()).expect("the new leader's commit index");
    c.spawn(l);
    until(20, || c.status(l).and_then(|s| s["last_applied_index"].as_u64()) >= Some(target));
    // A follower that served (forwarded) requests stops on SIGTERM as fast as a leader:
    // its peer listener's connections (the leader's appends) do not hold it open.
    for i in 0..3 {
        let (st, v) = c.call(l, "POST", &format!("/v1/locks/f{i}/acquire"), r#"{"ttl_ms":5000}"#).unwrap();
        assert_eq!(st, 200, "{v}");
    }
    // A holder whose keepalives go through this follower, connected when it stops.
    let holder = Command::new(BIN)
        .args(["lock", "--ttl", "3s", "--endpoint", &c.url(l, ""), "held-through-follower"])
        .env("FENCED_CA_FILE", &c.members[l].ca)
        .env("FENCED_AUTH_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut holder = Killed(holder);
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(holder.0.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains("token"), "the holder printed {line:?}");
    }
    std::thread::sleep(Duration::from_millis(1_500));
    // And fenced writes through it, going on while it stops.
    let writes = {
        let (url, ca) = (c.url(l, "/v1/store/through-follower"), c.members[l].ca.clone());
        let fence = format!("fencing-token: {}", g["token"].as_u64().unwrap());
        std::thread::spawn(move || {
            let auth = format!("authorization: Bearer {TOKEN}");
            for _ in 0..30 {
                let extra = ["--cacert", ca.to_str().unwrap(), "-H", &auth, "-H", &fence];
                if curl(&url, "PUT", "v", &extra).is_none() {
                    break;
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let pid = c.members[l].child.as_ref().unwrap().id().to_string();
    let asked = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut child = c.members[l].child.take().unwrap();
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(asked.elapsed() < Duration::from_secs(10), "a follower took over 10 s to stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exited.success(), "{exited}");
    assert!(asked.elapsed() < Duration::from_secs(3), "a follower took {:?} to stop on SIGTERM", asked.elapsed());
    drop(holder);
    writes.join().unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
