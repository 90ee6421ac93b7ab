//! The lock service's rules as an outside reviewer broke them (issue 12's defects),
//! over HTTP: each test fails on the code before the fix.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use fenced_server::Config;

use crate::harness::{eventually, parse_response, TestServer};

/// Sends a request without waiting for its answer.
fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s
}

fn answer(mut s: TcpStream) -> (u16, serde_json::Value) {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let r = parse_response(&raw);
    (r.status, r.json())
}

/// Review defect 1 over HTTP, 1,000 times: H holds X; lease L waits on X twice (a
/// retried request); H releases and B's client hangs up at once. A was answered
/// "granted": X must stay L's with A's token.
#[test]
fn a_hung_up_twin_never_revokes_the_grant_its_original_was_told() {
    let s = TestServer::start();
    let (h, l) = (s.lease(60_000), s.lease(60_000));
    let (by_h, by_l) = (format!("{{\"lease_id\":\"{h}\"}}"), format!("{{\"lease_id\":\"{l}\"}}"));
    let wait = format!("{{\"lease_id\":\"{l}\",\"wait_ms\":30000}}");
    for i in 0..1_000 {
        assert_eq!(s.acquire("x", &by_h).0, 200);
        let a = send(s.addr, "POST", "/v1/locks/x/acquire", &wait);
        let b = send(s.addr, "POST", "/v1/locks/x/acquire", &wait);
        eventually(10, || s.call("GET", "/v1/locks/x", "").1["waiters"] == 2);
        let release = send(s.addr, "POST", "/v1/locks/x/release", &by_h);
        b.shutdown(Shutdown::Both).unwrap();
        drop(b);
        assert_eq!(answer(release).0, 200);
        let (st, g) = answer(a);
        assert_eq!(st, 200, "iteration {i}: {g}");
        let token = g["token"].as_u64().unwrap();
        let (_, c) = s.call("POST", "/v1/locks/x/check", &format!("{{\"token\":{token}}}"));
        assert_eq!(c["current"], true, "iteration {i}: the grant A was told of was revoked: {c}");
        assert_eq!(s.call("POST", "/v1/locks/x/release", &by_l).0, 200, "iteration {i}");
    }
}

/// Review defect 5: a token the service never issued is refused with its own code and
/// changes nothing; the real holder still writes.
#[test]
fn a_token_never_issued_is_refused_and_shuts_nobody_out() {
    let s = TestServer::start();
    let a = s.lease(10_000);
    let (_, g) = s.acquire("k", &format!("{{\"lease_id\":\"{a}\"}}"));
    let token = g["token"].as_u64().unwrap();
    for (method, t) in [("PUT", u64::MAX), ("GET", u64::MAX), ("PUT", token + 1)] {
        let r = s.request(method, "/v1/store/k", &[("Fencing-Token", &t.to_string())], b"poison");
        let e = r.json();
        assert_eq!((r.status, e["error"]["code"].as_str()), (409, Some("token_not_issued")), "{method} {t}: {e}");
        assert_eq!((e["error"]["token"].as_u64(), e["error"]["highest_issued"].as_u64()), (Some(t), Some(token)));
    }
    assert_eq!(s.get("/v1/store/k").status, 404, "nothing was written, no mark was left");
    let r = s.request("PUT", "/v1/store/k", &[("Fencing-Token", &token.to_string())], b"real");
    assert_eq!(r.status, 200, "the real holder writes");
    assert!(s.get("/metrics").text().contains("fenced_tokens_not_issued_total 3"));
}

/// Review defects 2 and 3 on a clean restart: a lock-delay in progress is served in
/// full after the restart, and a refused try-lock with a huge TTL raises nothing.
#[test]
fn a_lock_delay_survives_a_clean_restart_and_a_refused_try_lock_raises_nothing() {
    let s = TestServer::start();
    let a = s.lease(200);
    let (st, _) = s.acquire("d", &format!("{{\"lease_id\":\"{a}\",\"lock_delay_ms\":30000}}"));
    assert_eq!(st, 200);
    let b = s.lease(10_000);
    let (st, e) = s.acquire("d", "{\"ttl_ms\":300000}");
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "{e}");
    // A's lease expires: the lock-delay starts.
    eventually(10, || s.call("GET", "/v1/locks/d", "").1["held"] == false);
    assert!(s.call("GET", "/v1/locks/d", "").1["blocked_for_ms"].as_u64().unwrap() > 20_000);
    s.call("DELETE", &format!("/v1/leases/{b}"), "");
    let dir = s.stop();

    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    let ready = s.get("/readyz").json();
    assert_eq!(ready["recovering"], false, "no live lease at the clean stop, whatever the refused TTL: {ready}");
    let (st, e) = s.acquire("d", "{\"ttl_ms\":1000}");
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "still in lock-delay: {e}");
    let v = s.call("GET", "/v1/locks/d", "").1;
    assert!(v["blocked_for_ms"].as_u64().unwrap() > 25_000, "the delay is served in full from the restart: {v}");
    // Other locks are free at once.
    assert_eq!(s.acquire("other", "{\"ttl_ms\":1000}").0, 200);
}
