//! issue 28: one address of any member serves the API; a follower forwards what needs
//! the leader, over HTTP and the event stream.

use super::*;

/// `GET /v1/events` on `addr`, once its head is read (the subscription exists then).
fn subscribe(addr: SocketAddr) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::{BufRead, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    write!(c, "GET /v1/events HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut reader = std::io::BufReader::new(c);
    let mut line = String::new();
    while line != "\r\n" {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the event stream closed in its head");
    }
    reader
}

/// The data of the next event of `kind` on `stream` (others are skipped).
fn next_event(stream: &mut std::io::BufReader<std::net::TcpStream>, kind: &str) -> Value {
    use std::io::BufRead;
    let mut line = String::new();
    let mut this_kind = false;
    loop {
        line.clear();
        assert!(stream.read_line(&mut line).unwrap() > 0, "the event stream ended before a {kind} event");
        if let Some(k) = line.trim().strip_prefix("event: ") {
            this_kind = k == kind;
        } else if let (true, Some(data)) = (this_kind, line.trim().strip_prefix("data: ")) {
            return serde_json::from_str(data).unwrap();
        }
    }
}

/// issue 28: one address of any member serves the API. A follower forwards to the
/// leader what needs it (grants, fenced writes and reads, waits, lock views) and serves
/// its own view; the Rust client given only that follower's URL works; with its leader
/// gone for good the follower says `not_leader`.
#[test]
fn a_client_given_only_a_followers_url_acquires_writes_and_waits() {
    let mut c = Cluster::start("forward", 3);
    let l = c.leader(20);
    let f = (0..3).find(|i| *i != l).unwrap();
    let at = c.members[f].addr;
    // Every member's event stream has the events of every entry it applies, the store's
    // included (they come from the log, not from the member that took the request).
    let third = (0..3).find(|i| *i != l && *i != f).unwrap();
    let mut streams = [subscribe(at), subscribe(c.members[third].addr), subscribe(c.members[l].addr)];
    // A grant first, so that the next token has one below it to be stale with.
    let (st, v) = call(at, "POST", "/v1/locks/fwd-first/acquire", "{\"ttl_ms\":10000}", &[]).unwrap();
    assert_eq!(st, 200, "{v}");
    let (st, g) = call(at, "POST", "/v1/locks/fwd/acquire", "{\"ttl_ms\":10000}", &[]).unwrap();
    assert_eq!(st, 200, "a follower did not forward the acquire: {g}");
    let token = g["token"].as_u64().unwrap();
    let fence = [("fencing-token", token.to_string())];
    let (st, v) = call(at, "PUT", "/v1/store/fwd-key", "forwarded", &fence).unwrap();
    assert_eq!(st, 200, "{v}");
    let stale = [("fencing-token", (token - 1).to_string())];
    let (st, v) = call(at, "PUT", "/v1/store/fwd-key", "stale", &stale).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("stale_token")), "{v}");
    for (i, stream) in streams.iter_mut().enumerate() {
        let e = next_event(stream, "store_accepted");
        assert_eq!(
            (e["key"].as_str(), e["token"].as_u64(), e["op"].as_str()),
            (Some("fwd-key"), Some(token), Some("write")),
            "stream {i}: {e}"
        );
        let e = next_event(stream, "store_rejected");
        assert_eq!((e["key"].as_str(), e["highest_seen"].as_u64()), (Some("fwd-key"), Some(token)), "stream {i}: {e}");
    }
    drop(streams);
    let (st, v) = call(at, "GET", "/v1/store/fwd-key", "", &[]).unwrap();
    assert_eq!((st, v.as_str()), (200, Some("forwarded")), "{v}");
    let (st, v) = call(at, "GET", "/v1/locks/fwd", "", &[]).unwrap();
    assert_eq!((st, v["token"].as_u64()), (200, Some(token)), "{v}");
    // A wait through the follower: granted when the holder releases, through it too.
    let waiter = std::thread::spawn(move || {
        call(at, "POST", "/v1/locks/fwd/acquire", "{\"ttl_ms\":10000,\"wait_ms\":10000}", &[])
    });
    std::thread::sleep(Duration::from_millis(300));
    let (st, v) = call(at, "GET", "/v1/locks/fwd", "", &[]).unwrap();
    assert_eq!((st, v["waiters"].as_u64()), (200, Some(1)), "{v}");
    let lease = g["lease_id"].as_str().unwrap();
    let (st, v) = call(at, "POST", "/v1/locks/fwd/release", &format!("{{\"lease_id\":\"{lease}\"}}"), &[]).unwrap();
    assert!(st == 200 || st == 204, "{st} {v}");
    let (st, w) = waiter.join().unwrap().unwrap();
    assert_eq!(st, 200, "{w}");
    assert!(w["token"].as_u64().unwrap() > token, "{w}");
    // The follower's own view is its own: it says who it is.
    let (st, v) = call(at, "GET", "/v1/cluster", "", &[]).unwrap();
    assert_eq!((st, v["id"].as_u64()), (200, Some(c.members[f].id)), "{v}");

    // The Rust client, given only the follower: a fenced write under a lock.
    let endpoint = format!("http://{at}");
    let out = Command::new(BIN)
        .args(["exec", "--endpoint", &endpoint, "--ttl", "5s", "fwd-exec", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "exec through a follower: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(BIN)
        .args(["put", "--endpoint", &endpoint, "fwd-cli", "v", "--token"])
        .arg(w["token"].as_u64().unwrap().to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "put through a follower: {}", String::from_utf8_lossy(&out.stderr));

    // A backup larger than any one peer message a member buffers (16 MiB), taken
    // through the follower: the leader's answer streams through it.
    let big = "b".repeat(256 << 10);
    for i in 0..70 {
        let (st, v) = call(c.members[l].addr, "PUT", &format!("/v1/store/big-{i}"), &big, &fence).unwrap();
        assert_eq!(st, 200, "{v}");
    }
    let file = c.members[f].dir.with_extension("backup");
    let out = Command::new(BIN).args(["snapshot", "save", "--endpoint", &endpoint]).arg(&file).output().unwrap();
    assert!(out.status.success(), "a backup through a follower: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::metadata(&file).unwrap().len();
    assert!(bytes > 17 << 20, "the backup is {bytes} bytes");
    let _ = std::fs::remove_file(&file);

    // Its leader and the third member gone: no live leader to forward to.
    c.kill9(third);
    c.kill9(l);
    let mut last = Value::Null;
    until(10, || match call(at, "POST", "/v1/locks/fwd/acquire", "{\"ttl_ms\":1000}", &[]) {
        Ok((503, v)) if v["error"]["code"] == "not_leader" => {
            last = v;
            true
        }
        _ => false,
    });
    // It names the leader it last knew, and where to find it.
    let (id, url) = (c.members[l].id, format!("http://{}", c.members[l].addr));
    assert_eq!(
        (last["error"]["leader_id"].as_u64(), last["error"]["leader_url"].as_str()),
        (Some(id), Some(url.as_str())),
        "{last}"
    );
}
