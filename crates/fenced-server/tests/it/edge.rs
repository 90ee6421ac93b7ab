//! The HTTP edge against hostile or odd clients, over raw sockets: a request head
//! trickled byte by byte, a body that stalls, more bodies in flight than the budget,
//! and a client that half-closes after its request. Each answers or closes in bounded
//! time, and leaves the server serving everyone else.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::{parse_response, TestServer};

/// Reads until the server closes or `secs` pass; the bytes and whether it closed.
fn read_until_closed(s: &mut TcpStream, secs: u64) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

#[test]
fn a_trickled_head_is_cut_at_its_deadline_while_quick_requests_keep_their_connection() {
    let s = TestServer::with(|c| {
        c.head_timeout_ms = 1_000;
        c.idle_timeout_ms = 60_000;
    });
    // One header byte every 100 ms: every read makes progress, none finishes the head.
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n").unwrap();
    let started = Instant::now();
    let mut cut = false;
    for b in b"x-trickle: ".iter().cycle().take(200) {
        if slow.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let (_, closed) = read_until_closed(&mut slow, 0);
        if closed {
            cut = true;
            break;
        }
    }
    assert!(cut, "a head trickled for {:?} kept its connection", started.elapsed());
    // A keep-alive connection sending quick requests for longer than the head deadline
    // is never cut: each head arrives whole at once.
    let mut quick = TcpStream::connect(s.addr).unwrap();
    quick.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let until = Instant::now() + Duration::from_millis(2_500);
    let mut answered = 0;
    while Instant::now() < until {
        quick.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        let n = quick.read(&mut buf).unwrap();
        assert!(n > 0 && buf[..n].starts_with(b"HTTP/1.1 200"), "request {answered} on the kept connection");
        answered += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.get("/metrics").text().contains("fenced_head_timeouts_total 1"));
}

#[test]
fn a_stalled_body_is_answered_408_and_frees_its_budget() {
    let s = TestServer::with(|c| {
        c.body_timeout_ms = 1_000;
        c.body_bytes_in_flight_max = 1 << 20; // the body limit: one large body in flight at once
    });
    let mut stalled = TcpStream::connect(s.addr).unwrap();
    stalled
        .write_all(b"POST /v1/leases HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1048570\r\n\r\n{\"ttl")
        .unwrap();
    // While it stalls it holds the whole budget: another body waits for none of it.
    std::thread::sleep(Duration::from_millis(200));
    let (st, e) = s.call("POST", "/v1/leases", "{\"ttl_ms\":1000}");
    assert_eq!((st, e["error"]["code"].as_str()), (503, Some("too_busy")), "{e}");
    assert!(e["error"]["retry_after_ms"].as_u64().is_some());
    // Then its deadline passes: 408, and the budget is free again.
    let (raw, _) = read_until_closed(&mut stalled, 10);
    let r = parse_response(&raw);
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (408, Some("body_timeout")), "{}", r.text());
    assert_eq!(s.call("POST", "/v1/leases", "{\"ttl_ms\":1000}").0, 201);
    let m = s.get("/metrics").text();
    assert!(m.contains("fenced_body_timeouts_total 1") && m.contains("fenced_bodies_refused_total 1"), "{m}");
}

#[test]
fn a_request_followed_by_a_half_close_is_answered_and_done() {
    let s = TestServer::start();
    for i in 0..10 {
        let mut c = TcpStream::connect(s.addr).unwrap();
        let body = "{\"ttl_ms\":5000}";
        let req = format!(
            "POST /v1/locks/half-{i}/acquire HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let (raw, closed) = read_until_closed(&mut c, 10);
        assert!(closed, "try {i}: the server closes after answering");
        let r = parse_response(&raw);
        assert_eq!(r.status, 200, "try {i}: {}", r.text());
        assert_eq!(s.call("GET", &format!("/v1/locks/half-{i}"), "").1["held"], true, "try {i}: executed");
    }
}

#[test]
fn every_error_is_the_documented_json() {
    let s = TestServer::start();
    let raw = |bytes: &[u8]| parse_response(&crate::harness::request_raw(s.addr, bytes));
    // A path that is not UTF-8: the framework's own rejection, made JSON, naming no
    // internal parameter.
    for path in ["/v1/locks/%FF%FE/acquire", "/v1/store/%C3%28"] {
        let method = if path.starts_with("/v1/store") { "GET" } else { "POST" };
        let r =
            raw(format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{{}}")
                .as_bytes());
        let e = r.json();
        assert_eq!((r.status, e["error"]["code"].as_str()), (400, Some("invalid_request")), "{path}: {e}");
        assert!(!r.text().contains("rest") && !r.text().contains("`key`"), "{path}: {}", r.text());
    }
    // HTTP/1.1 without Host (RFC 9112: 400).
    let r = raw(b"GET /livez HTTP/1.1\r\nconnection: close\r\n\r\n");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("missing_host")));
    // Two Fencing-Token headers: neither is taken silently.
    let r = raw(b"PUT /v1/store/k HTTP/1.1\r\nhost: x\r\nconnection: close\r\nfencing-token: 1\r\nfencing-token: 9\r\ncontent-length: 1\r\n\r\nv");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_token")), "{}", r.text());
    // A number out of every range is well-formed JSON that does not fit the call.
    let (st, e) = s.call("POST", "/v1/leases", "{\"ttl_ms\":1e309}");
    assert_eq!((st, e["error"]["code"].as_str()), (400, Some("invalid_field")), "{e}");
}

#[test]
fn an_operator_can_leave_the_laboratory_api_out() {
    let s = TestServer::with(|c| c.lab_api = false);
    let (st, e) = s.call("POST", "/v1/sim/runs", "{\"duration_ms\":1000}");
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("not_found")), "{e}");
    assert_eq!(s.call("POST", "/v1/leases", "{\"ttl_ms\":1000}").0, 201, "the lock service serves on");
    let on = TestServer::start();
    assert_eq!(on.call("POST", "/v1/sim/runs", "{\"duration_ms\":1000}").0, 200);
}

#[test]
fn hypers_own_answers_to_a_bad_head_are_the_documented_json() {
    let s = TestServer::start();
    let raw = |bytes: &[u8]| parse_response(&crate::harness::request_raw(s.addr, bytes));
    let mut many = b"GET /livez HTTP/1.1\r\nhost: x\r\n".to_vec();
    for i in 0..120 {
        many.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let mut huge = b"GET /livez HTTP/1.1\r\nhost: x\r\nx-big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 2_000_000));
    huge.extend_from_slice(b"\r\n\r\n");
    let long_uri = format!("GET /v1/locks/{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000));
    let cases: [(&[u8], u16, &str); 5] = [
        (b"GARBAGE\r\n\r\n", 400, "malformed_request"),
        (b"GET /livez HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n", 400, "malformed_request"),
        (&many, 431, "headers_too_large"),
        (&huge, 431, "headers_too_large"),
        (long_uri.as_bytes(), 414, "uri_too_long"),
    ];
    for (bytes, status, code) in cases {
        let r = raw(bytes);
        let what = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned();
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
        assert_eq!(r.json()["error"]["code"], code, "{what}: {}", r.text());
        assert!(r.json()["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}");
    }
    assert_eq!(s.get("/livez").status, 200, "the server serves on");
}

#[test]
fn a_bad_chunk_size_is_an_unreadable_body_not_a_large_one() {
    let s = TestServer::with(|c| c.body_bytes_max = 1024);
    let raw = |bytes: &[u8]| parse_response(&crate::harness::request_raw(s.addr, bytes));
    let head = "POST /v1/leases HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n\
                transfer-encoding: chunked\r\n\r\n";
    let r = raw(format!("{head}zz\r\n{{\"ttl_ms\":1000}}\r\n0\r\n\r\n").as_bytes());
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_body")), "{}", r.text());
    // A chunked body that is really over the limit is still 413.
    let big = format!("{{\"ttl_ms\":1000,\"x\":\"{}\"}}", "a".repeat(2000));
    let r = raw(format!("{head}{:x}\r\n{big}\r\n0\r\n\r\n", big.len()).as_bytes());
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (413, Some("too_large")), "{}", r.text());
    // A well-formed chunked body is taken; the refused ones changed nothing.
    let r = raw(format!("{head}f\r\n{{\"ttl_ms\":1000}}\r\n0\r\n\r\n").as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(s.get("/metrics").text().contains("fenced_leases_created_total 1"));
}

#[test]
fn h2c_is_refused_with_http2s_own_goaway_and_http1_goes_on() {
    let s = TestServer::start();
    // Prior knowledge: the preface, then an empty SETTINGS frame.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").unwrap();
    let (got, closed) = read_until_closed(&mut c, 10);
    assert!(closed, "the connection closes");
    // SETTINGS (type 4, stream 0) first, as RFC 9113 wants from a server, then GOAWAY
    // (type 7) with error code 0xd, HTTP_1_1_REQUIRED.
    assert!(got.len() >= 9 + 9 + 8, "{got:?}");
    assert_eq!(&got[..9], b"\x00\x00\x00\x04\x00\x00\x00\x00\x00", "{got:?}");
    assert_eq!(got[9 + 3], 7, "a GOAWAY frame: {got:?}");
    assert_eq!(&got[9 + 9 + 4..9 + 9 + 8], &[0, 0, 0, 0x0d], "HTTP_1_1_REQUIRED: {got:?}");
    // An HTTP/1.1 upgrade to h2c is not taken: the request is answered over HTTP/1.1.
    let r = s.request("GET", "/livez", &[("upgrade", "h2c"), ("http2-settings", "AAMAAABkAAQCAAAAAAIAAAAA")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(s.get("/metrics").text().contains("fenced_h2c_refused_total 1"));
}
