//! Every limit: over it, the status from the design (413, 429 or 503) with a JSON
//! error, and nothing changes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::{eventually, TestServer};

fn code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[test]
fn lease_lock_and_waiter_counts() {
    let s = TestServer::with(|c| {
        c.leases_max = 3;
        c.locks_max = 2;
        c.waiters_max = 1;
    });
    let (a, b, w) = (s.lease(30_000), s.lease(30_000), s.lease(30_000));
    let (st, e) = s.call("POST", "/v1/leases", "{\"ttl_ms\":1000}");
    assert_eq!((st, code(&e)), (429, "too_many_leases"), "{e}");
    assert_eq!(e["error"]["limit"], 3);
    // Implicit leases count too.
    let (st, e) = s.acquire("i", "{\"ttl_ms\":1000}");
    assert_eq!((st, code(&e)), (429, "too_many_leases"));

    assert_eq!(s.acquire("l1", &format!("{{\"lease_id\":\"{a}\"}}")).0, 200);
    assert_eq!(s.acquire("l2", &format!("{{\"lease_id\":\"{a}\"}}")).0, 200);
    let (st, e) = s.acquire("l3", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!((st, code(&e)), (429, "too_many_locks"), "{e}");
    assert_eq!(s.call("GET", "/v1/locks/l3", "").1["held"], false);

    let addr = s.addr;
    let body = format!("{{\"lease_id\":\"{b}\",\"wait_ms\":30000}}");
    let waiter =
        std::thread::spawn(move || crate::harness::request(addr, "POST", "/v1/locks/l1/acquire", &[], body.as_bytes()));
    eventually(10, || s.call("GET", "/v1/locks/l1", "").1["waiters"] == 1);
    let (st, e) = s.acquire("l2", &format!("{{\"lease_id\":\"{w}\",\"wait_ms\":30000}}"));
    assert_eq!((st, code(&e)), (429, "too_many_waiters"), "{e}");
    assert_eq!(s.call("GET", "/v1/locks/l2", "").1["waiters"], 0);
    s.call("POST", "/v1/locks/l1/release", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!(waiter.join().unwrap().status, 200);
}

#[test]
fn waiters_per_lock() {
    let s = TestServer::with(|c| c.waiters_per_lock_max = 1);
    let (a, b, w) = (s.lease(30_000), s.lease(30_000), s.lease(30_000));
    s.acquire("p1", &format!("{{\"lease_id\":\"{a}\"}}"));
    s.acquire("p2", &format!("{{\"lease_id\":\"{a}\"}}"));
    let addr = s.addr;
    let body = format!("{{\"lease_id\":\"{b}\",\"wait_ms\":30000}}");
    let first =
        std::thread::spawn(move || crate::harness::request(addr, "POST", "/v1/locks/p1/acquire", &[], body.as_bytes()));
    eventually(10, || s.call("GET", "/v1/locks/p1", "").1["waiters"] == 1);
    let (st, e) = s.acquire("p1", &format!("{{\"lease_id\":\"{w}\",\"wait_ms\":30000}}"));
    assert_eq!((st, code(&e)), (429, "too_many_waiters"), "{e}");
    // Another lock still has room.
    let body = format!("{{\"lease_id\":\"{w}\",\"wait_ms\":30000}}");
    let second =
        std::thread::spawn(move || crate::harness::request(addr, "POST", "/v1/locks/p2/acquire", &[], body.as_bytes()));
    eventually(10, || s.call("GET", "/v1/locks/p2", "").1["waiters"] == 1);
    s.call("DELETE", &format!("/v1/leases/{a}"), "");
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(second.join().unwrap().status, 200);
}

#[test]
fn ttl_wait_and_lock_delay_ranges() {
    let s = TestServer::with(|c| {
        c.ttl_ms_min = 500;
        c.ttl_ms_max = 5_000;
        c.wait_ms_max = 1_000;
        c.lock_delay_ms_max = 2_000;
    });
    let (st, e) = s.call("POST", "/v1/leases", "{\"ttl_ms\":499}");
    assert_eq!((st, code(&e)), (400, "ttl_out_of_range"));
    assert_eq!((e["error"]["ttl_ms_min"].as_u64(), e["error"]["ttl_ms_max"].as_u64()), (Some(500), Some(5000)));
    assert_eq!(s.call("POST", "/v1/leases", "{\"ttl_ms\":5001}").0, 400);
    let a = s.lease(5_000);
    let (st, e) = s.acquire("x", &format!("{{\"lease_id\":\"{a}\",\"wait_ms\":1001}}"));
    assert_eq!((st, code(&e)), (400, "wait_out_of_range"));
    let (st, e) = s.acquire("x", &format!("{{\"lease_id\":\"{a}\",\"lock_delay_ms\":2001}}"));
    assert_eq!((st, code(&e)), (400, "lock_delay_out_of_range"));
    assert_eq!(s.call("GET", "/v1/locks/x", "").1["held"], false);
    assert_eq!(s.acquire("x", &format!("{{\"lease_id\":\"{a}\",\"wait_ms\":1000,\"lock_delay_ms\":2000}}")).0, 200);
}

#[test]
fn name_body_and_value_sizes() {
    let s = TestServer::with(|c| {
        c.lock_name_bytes_max = 8;
        c.store_key_bytes_max = 8;
        c.body_bytes_max = 1024;
        c.value_bytes_max = 100;
    });
    let a = s.lease(10_000);
    let body = format!("{{\"lease_id\":\"{a}\"}}");
    assert_eq!(s.acquire("12345678", &body).0, 200);
    let (st, e) = s.acquire("123456789", &body);
    assert_eq!((st, code(&e)), (400, "invalid_name"));
    assert_eq!(e["error"]["len_max"], 8);
    let big = format!("{{\"ttl_ms\":1000,\"pad\":\"{}\"}}", "x".repeat(2000));
    let (st, e) = s.call("POST", "/v1/leases", &big);
    assert_eq!((st, code(&e)), (413, "too_large"), "{e}");
    let r = s.request("PUT", "/v1/store/k", &[("Fencing-Token", "1")], &[b'v'; 101]);
    assert_eq!((r.status, code(&r.json())), (413, "too_large"));
    assert_eq!(s.get("/v1/store/k").status, 404, "an oversize value changes nothing");
    assert_eq!(s.request("PUT", "/v1/store/k", &[("Fencing-Token", "1")], &[b'v'; 100]).status, 200);
    let r = s.request("PUT", "/v1/store/123456789", &[("Fencing-Token", "1")], b"v");
    assert_eq!((r.status, code(&r.json())), (400, "invalid_key"));
}

/// A keep-alive connection that the server has accepted and answered once, so it
/// holds a connection permit; None when the server refused it.
fn held_connection(addr: std::net::SocketAddr) -> Option<TcpStream> {
    let mut c = TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n").ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    // The answer to /livez is small: read until its body has arrived.
    while !String::from_utf8_lossy(&got).contains("}") {
        let n = c.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200").then_some(c)
}

#[test]
fn connections_over_the_limit_get_503() {
    let s = TestServer::with(|c| c.connections_max = 2);
    // Connections of the start-up probe may still hold permits for a moment: retry
    // until two connections are held for sure.
    let mut held = Vec::new();
    eventually(10, || {
        if let Some(c) = held_connection(s.addr) {
            held.push(c);
        }
        held.len() == 2
    });
    // A third connection is answered 503 and closed without a request.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 503") && text.contains("too_many_connections"), "{text}");
    drop(held);
    eventually(10, || held_connection(s.addr).is_some());
    let m = s.get("/metrics").text();
    assert!(!m.contains("fenced_connections_refused_total 0"), "{m}");
}

#[test]
fn idle_connections_are_closed_but_waiting_requests_are_not() {
    let s = TestServer::with(|c| c.idle_timeout_ms = 300);
    let closed = |mut c: TcpStream| {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut raw = Vec::new();
        // EOF or a reset: either way the server let go; a read time-out panics.
        match c.read_to_end(&mut raw) {
            Ok(_) => {}
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "still open after 10 s"),
        }
        raw
    };
    // Silent, and a request head that never ends.
    assert!(closed(TcpStream::connect(s.addr).unwrap()).is_empty());
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n").unwrap();
    closed(slow);
    // A keep-alive connection after its answer.
    let kept = held_connection(s.addr).expect("accepted");
    closed(kept);
    // A waiting acquire outlives the idle timeout many times over.
    let (a, b) = (s.lease(30_000), s.lease(30_000));
    s.acquire("idle", &format!("{{\"lease_id\":\"{a}\"}}"));
    let addr = s.addr;
    let body = format!("{{\"lease_id\":\"{b}\",\"wait_ms\":30000}}");
    let w = std::thread::spawn(move || {
        crate::harness::request(addr, "POST", "/v1/locks/idle/acquire", &[], body.as_bytes())
    });
    eventually(10, || s.call("GET", "/v1/locks/idle", "").1["waiters"] == 1);
    std::thread::sleep(Duration::from_millis(1500));
    s.call("POST", "/v1/locks/idle/release", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!(w.join().unwrap().status, 200);
}

#[test]
fn a_full_store_refuses_new_room_while_locks_go_on() {
    let s = TestServer::with(|c| {
        c.store_keys_max = 2;
        c.store_bytes_max = 200;
    });
    let a = s.lease(10_000);
    let (_, g) = s.acquire("q", &format!("{{\"lease_id\":\"{a}\"}}"));
    let t = g["token"].as_u64().unwrap().to_string();
    let put = |k: &str, v: &[u8]| s.request("PUT", &format!("/v1/store/{k}"), &[("Fencing-Token", &t)], v);
    assert_eq!(put("k1", b"v").status, 200);
    assert_eq!(put("k2", b"v").status, 200);
    let r = put("k3", b"v");
    let e = r.json();
    assert_eq!(
        (r.status, e["error"]["code"].as_str(), e["error"]["what"].as_str()),
        (507, Some("store_full"), Some("keys"))
    );
    let r = put("k1", &[b'x'; 300]);
    assert_eq!((r.status, r.json()["error"]["what"].as_str()), (507, Some("bytes")));
    assert_eq!(s.get("/v1/store/k1").text(), "v", "refused writes change nothing");
    assert_eq!(put("k1", b"w").status, 200, "an overwrite that needs no new room goes on");
    // The lock service needs no new room: it goes on.
    assert_eq!(s.call("POST", "/v1/locks/q/release", &format!("{{\"lease_id\":\"{a}\"}}")).0, 200);
    assert_eq!(s.acquire("q2", "{\"ttl_ms\":1000}").0, 200);
}

/// A reserve no disk can meet: the real probe finds every disk below it. Store writes
/// are refused 507 `insufficient_storage` and change nothing; locks, leases and store
/// reads go on.
#[test]
fn a_disk_below_its_reserve_refuses_store_writes_while_locks_go_on() {
    let s = TestServer::with(|c| {
        c.min_free_bytes = u64::MAX;
        c.unfenced_prefix = "demo/".into();
    });
    let a = s.lease(10_000);
    let (st, g) = s.acquire("d", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!(st, 200, "{g}");
    let t = g["token"].to_string();
    let put = |k: &str, token: Option<&str>| {
        let headers: Vec<(&str, &str)> = token.map(|t| ("Fencing-Token", t)).into_iter().collect();
        s.request("PUT", &format!("/v1/store/{k}"), &headers, b"v")
    };
    crate::harness::eventually(5, || put("k", Some(&t)).status == 507);
    for r in [put("k", Some(&t)), put("demo/k", None)] {
        let e = r.json();
        assert_eq!((r.status, e["error"]["code"].as_str()), (507, Some("insufficient_storage")), "{e}");
        assert_eq!(e["error"]["min_free_bytes"], u64::MAX);
        assert!(e["error"]["free_bytes"].as_u64().is_some(), "{e}");
    }
    assert_eq!(s.get("/v1/store/k").status, 404, "a refused write changed nothing");
    assert_eq!(s.get("/v1/store/demo/k").status, 404, "a refused write changed nothing");
    // A fenced read of a new key would create its mark: refused alike.
    let r = s.request("GET", "/v1/store/new", &[("Fencing-Token", &t)], b"");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (507, Some("insufficient_storage")), "{}", r.text());
    assert_eq!(s.get("/v1/store").json()["keys"], serde_json::json!([]), "the refused read marked nothing");
    assert_eq!(s.call("POST", "/v1/locks/d/release", &format!("{{\"lease_id\":\"{a}\"}}")).0, 200);
    assert_eq!(s.acquire("d2", "{\"ttl_ms\":1000}").0, 200, "the lock service goes on");
    assert_eq!(s.call("POST", &format!("/v1/leases/{a}/keepalive"), "").0, 200);
    assert!(s.get("/metrics").text().contains("fenced_store_writes_disk_low_total "));
}

/// A real full disk: a small tmpfs, filled by another file until it is below the
/// reserve. Store writes are refused, the lock service (whose log still has the
/// reserve) goes on, and writes are taken again once room comes back. Needs root to
/// mount; outside CI it skips with a printed reason.
#[test]
fn a_filling_disk_stops_store_writes_before_the_lock_service() {
    let mnt = crate::harness::scratch_dir().with_extension("tmpfs");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        let _ = std::fs::remove_dir(&mnt);
        let why = "cannot mount a tmpfs (needs root): the full-disk test did not run";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _unmount = Unmount(mnt.clone());
    let data = mnt.join("data");
    let reserve: u64 = 8 << 20;
    let s = TestServer::on(fenced_server::Config {
        data_dir: data.clone(),
        min_free_bytes: reserve,
        ..fenced_server::Config::default()
    });
    let (st, g) = s.acquire("full", "{\"ttl_ms\":60000}");
    assert_eq!(st, 200, "{g}");
    let t = g["token"].to_string();
    let put = |v: &[u8]| s.request("PUT", "/v1/store/k", &[("Fencing-Token", &t)], v);
    assert_eq!(put(b"before").status, 200);
    // Fill the file system until 4 MiB are left: under the reserve, above zero.
    let avail = || -> u64 {
        let out = std::process::Command::new("df").args(["--output=avail", "-B1"]).arg(&mnt).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
    };
    let filler = mnt.join("filler");
    let fill = avail().saturating_sub(4 << 20);
    std::fs::write(&filler, vec![0u8; fill as usize]).unwrap();
    assert!(avail() < reserve, "filled to {} bytes free", avail());
    // The guard probes on the write's own path: the first write after the fill is
    // refused, not one half a second later.
    let r = put(b"refused");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (507, Some("insufficient_storage")), "{}", r.text());
    assert_eq!(s.get("/v1/store/k").text(), "before", "a refused write changed nothing");
    // A fenced read of a new key would create a mark: refused. One of a key that has a
    // mark moves it in place: taken.
    let (_, g2) = s.acquire("full-2", "{\"ttl_ms\":60000}");
    let read = |key: &str, token: &str| s.request("GET", &format!("/v1/store/{key}"), &[("Fencing-Token", token)], b"");
    let r = read("new", &t);
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (507, Some("insufficient_storage")), "{}", r.text());
    assert_eq!(s.get("/v1/store/new").status, 404, "the refused read marked nothing");
    let t2 = g2["token"].to_string();
    let r = read("k", &t2);
    assert_eq!((r.status, r.text()), (200, "before".to_string()), "a fenced read of a marked key goes on");
    assert_eq!(r.header("fencing-highest-seen"), Some(t2.as_str()));
    // The lock service's log has the reserve: grants, keepalives and releases go on.
    for i in 0..20 {
        let (st, g) = s.acquire(&format!("during-{i}"), "{\"ttl_ms\":60000}");
        assert_eq!(st, 200, "grant {i} with the disk low: {g}");
    }
    std::fs::remove_file(&filler).unwrap();
    let put = |v: &[u8]| s.request("PUT", "/v1/store/k", &[("Fencing-Token", &t2)], v);
    assert_eq!(put(b"after").status, 200, "taken again as soon as the room is back");
    assert_eq!(s.get("/v1/store/k").text(), "after");
    drop(s);
}
