//! The wire protocol (`wire_listen`) frame by frame over a std socket: every op, many
//! requests in flight on one connection, bad frames, auth. The same table as HTTP:
//! what one transport does, the other sees.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use fenced_core::{LeaseId, Token};
use fenced_wire::{decode_response, encode_request, op, split_frame, Detail, Request, Response, Version};
use serde_json::Value;

use crate::harness::TestServer;

/// One raw wire connection.
pub struct Wire {
    s: TcpStream,
    buf: Vec<u8>,
}

/// An answer frame: id, kind, payload.
pub struct Frame(u32, u8, Vec<u8>);

impl Frame {
    fn decode(&self) -> Response<'_> {
        decode_response(self.0, self.1, &self.2).expect("a well-formed answer")
    }

    /// The code and the typed fields of an error answer (whose message says something).
    fn error(&self) -> (String, Vec<Detail<'static>>) {
        match self.decode() {
            Response::Error { code, message, details } => {
                assert!(!message.is_empty(), "{code}: a message for a person");
                (code.to_string(), details.into_iter().map(Detail::into_owned).collect())
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }

    pub fn code(&self) -> String {
        self.error().0
    }

    /// A version-2 error answer: its code and the HTTP API's JSON error body.
    fn json_error(&self) -> (String, Value) {
        assert_eq!(self.1, op::ERROR, "an error answer");
        let (code, body) = fenced_wire::v2::decode_error(&self.2).expect("a version-2 error");
        let body: Value = serde_json::from_slice(body).expect("JSON error body");
        assert_eq!(body["error"]["code"], code, "the frame's code is the body's");
        (code.to_string(), body)
    }
}

impl Wire {
    pub fn open(addr: SocketAddr) -> Wire {
        Wire::open_in(addr, Version::CURRENT)
    }

    /// A connection whose preamble names `version`.
    fn open_in(addr: SocketAddr, version: Version) -> Wire {
        let mut w = Wire::raw(addr);
        w.s.write_all(&version.preamble()).unwrap();
        w
    }

    fn raw(addr: SocketAddr) -> Wire {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Wire { s, buf: Vec::new() }
    }

    fn send(&mut self, id: u32, req: &Request<'_>) {
        let mut out = Vec::new();
        encode_request(&mut out, id, req);
        self.s.write_all(&out).unwrap();
    }

    /// The next answer; panics if the connection closes first.
    fn recv(&mut self) -> Frame {
        self.try_recv().expect("an answer before the connection closed")
    }

    fn try_recv(&mut self) -> Option<Frame> {
        loop {
            if let Some((id, kind, payload, used)) = split_frame(&self.buf, usize::MAX).unwrap() {
                let f = Frame(id, kind, payload.to_vec());
                self.buf.drain(..used);
                return Some(f);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn call(&mut self, id: u32, req: &Request<'_>) -> Frame {
        self.send(id, req);
        let f = self.recv();
        assert_eq!(f.0, id, "answers of one-at-a-time calls come in order");
        f
    }

    fn lease(&mut self, ttl_ms: u64) -> LeaseId {
        match self.call(1, &Request::CreateLease { ttl_ms }).decode() {
            Response::Lease { lease, ttl_ms: t, .. } => {
                assert_eq!(t, ttl_ms);
                lease
            }
            other => panic!("{other:?}"),
        }
    }
}

fn acquire(name: &str, lease: LeaseId, wait_ms: u64) -> Request<'_> {
    Request::Acquire { name, lease: Some(lease), ttl_ms: None, wait_ms, lock_delay_ms: 0, holder: None }
}

fn granted(f: &Frame) -> Token {
    match f.decode() {
        Response::Granted { token, .. } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn every_op_round_trips_on_the_same_table_as_http() {
    let server = TestServer::start();
    let mut w = Wire::open(server.wire);
    let lease = w.lease(5000);
    assert!(matches!(w.call(2, &Request::Keepalive { lease }).decode(), Response::Lease { op: op::KEEPALIVE, .. }));
    let t1 = granted(&w.call(3, &acquire("a/b", lease, 0)));
    // Idempotent re-acquire by the holder: same token.
    assert_eq!(granted(&w.call(4, &acquire("a/b", lease, 0))), t1);
    let (s, v) = server.call("GET", "/v1/locks/a%2Fb", "");
    assert_eq!((s, v["token"].as_u64()), (200, Some(t1.get())), "HTTP sees the wire's grant");
    let checked = w.call(5, &Request::Check { name: "a/b", token: t1.get() });
    assert_eq!(checked.decode(), Response::Checked { current: true, token: Some(t1) });
    assert_eq!(w.call(6, &Request::Release { name: "a/b", lease }).decode(), Response::Released { token: t1 });
    assert_eq!(w.call(7, &Request::Release { name: "a/b", lease }).code(), "not_holder");
    // An implicit lease, as the client uses.
    let implicit =
        Request::Acquire { name: "c", lease: None, ttl_ms: Some(2000), wait_ms: 0, lock_delay_ms: 0, holder: None };
    let (t2, l2) = match w.call(8, &implicit).decode() {
        Response::Granted { token, lease, ttl_ms: 2000, signature: None } => (token, lease),
        other => panic!("{other:?}"),
    };
    assert!(t2 > t1);
    assert_eq!(w.call(9, &Request::Revoke { lease: l2 }).decode(), Response::Done { op: op::REVOKE });
    assert_eq!(w.call(10, &Request::Keepalive { lease: l2 }).code(), "lease_not_found");
    let (s, v) = server.call("GET", "/v1/locks/c", "");
    assert_eq!((s, v["held"].as_bool()), (200, Some(false)), "the revoke released it");
    // The fenced store.
    let put = |token| Request::Put { key: "k", token: Token::new(token), value: b"v" };
    assert_eq!(
        w.call(11, &put(1)).decode(),
        Response::Written { token: Token::new(1).unwrap(), highest_seen: Token::new(1).unwrap() }
    );
    let read = w.call(12, &Request::Get { key: "k", token: Token::new(2) });
    assert_eq!(read.decode(), Response::Read { highest_seen: Token::new(2), value: b"v" });
    let r = server.request("GET", "/v1/store/k", &[], b"");
    assert_eq!(r.header("fencing-highest-seen"), Some("2"), "the fenced read raised the mark for HTTP too");
    let (code, details) = w.call(13, &put(1)).error();
    let t = |n| Token::new(n).unwrap();
    assert_eq!((code.as_str(), &details[..]), ("stale_token", &[Detail::Token(t(1)), Detail::HighestSeen(t(2))][..]));
    assert_eq!(w.call(14, &put(0)).code(), "token_required");
    // Only two tokens were ever issued: a third is refused, not taken as a mark.
    let (code, details) = w.call(14, &put(3)).error();
    let want = [Detail::Token(t(3)), Detail::HighestIssued(t(2))];
    assert_eq!((code.as_str(), &details[..]), ("token_not_issued", &want[..]));
    assert_eq!(w.call(15, &Request::Get { key: "nope", token: None }).code(), "not_found");
    // Limits and input errors are the HTTP API's.
    assert_eq!(w.call(16, &Request::CreateLease { ttl_ms: 1 }).code(), "ttl_out_of_range");
    assert_eq!(w.call(17, &acquire("", lease, 0)).code(), "invalid_name");
    assert_eq!(w.call(18, &acquire("x", lease, 10_000_000)).code(), "wait_out_of_range");
    // Both a lease and a TTL name an implicit lease: not a live explicit lease's id.
    let both = Request::Acquire {
        name: "x",
        lease: Some(lease),
        ttl_ms: Some(1000),
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: None,
    };
    assert_eq!(w.call(19, &both).code(), "lease_exists");
    assert_eq!(w.call(20, &Request::Check { name: "x", token: 0 }).code(), "invalid_token");
    let metrics = server.get("/metrics").text();
    assert!(metrics.contains("fenced_grants_total 2"), "{metrics}");
    assert!(metrics.contains("fenced_wire_requests_total 21"), "{metrics}");
}

#[test]
fn many_requests_in_flight_on_one_connection() {
    let server = TestServer::start();
    let mut w = Wire::open(server.wire);
    let lease = w.lease(10_000);
    // 200 requests in one write: acquire and release 100 locks.
    let names: Vec<String> = (0..100).map(|i| format!("p/{i}")).collect();
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        encode_request(&mut out, 1000 + 2 * i as u32, &acquire(name, lease, 0));
        encode_request(&mut out, 1001 + 2 * i as u32, &Request::Release { name, lease });
    }
    w.s.write_all(&out).unwrap();
    // Answers come as their entries are applied, by id (not necessarily in order).
    let mut answers = std::collections::BTreeMap::new();
    for _ in 0..200u32 {
        let f = w.recv();
        assert!(answers.insert(f.0, f).is_none(), "one answer per call");
    }
    let mut tokens = Vec::new();
    for i in 0..100u32 {
        let Response::Granted { token, .. } = answers[&(1000 + 2 * i)].decode() else { panic!("call {i} not granted") };
        assert_eq!(
            answers[&(1001 + 2 * i)].decode(),
            Response::Released { token },
            "each release gives back its grant"
        );
        tokens.push(token);
    }
    assert!(tokens.windows(2).all(|p| p[0] < p[1]), "tokens strictly increase in request order");
    // A queued acquire does not hold up the calls behind it.
    let mut other = Wire::open(server.wire);
    let holder = other.lease(10_000);
    granted(&other.call(2, &acquire("busy", holder, 0)));
    w.send(50, &acquire("busy", lease, 20_000));
    w.send(51, &Request::Keepalive { lease });
    assert_eq!(w.recv().0, 51, "the keepalive overtakes the waiting acquire");
    other.call(3, &Request::Release { name: "busy", lease: holder });
    let f = w.recv();
    assert_eq!(f.0, 50);
    granted(&f);
    // CANCEL withdraws a queued acquire: answered `cancelled`, the queue is empty.
    w.send(60, &acquire("busy", holder, 20_000));
    let mut check = Wire::open(server.wire);
    let lease3 = check.lease(10_000);
    check.send(2, &acquire("busy", lease3, 20_000));
    crate::harness::eventually(10, || server.call("GET", "/v1/locks/busy", "").1["waiters"] == 2);
    check.send(3, &Request::Cancel { target: 2 });
    let f = check.recv();
    assert_eq!((f.0, f.code()), (2, "cancelled".to_string()));
    // The withdrawal is a log entry of its own, applied just after the answer.
    crate::harness::eventually(10, || server.call("GET", "/v1/locks/busy", "").1["waiters"] == 1);
    // Closing a connection withdraws what it had queued, like an HTTP disconnect; the
    // grant it holds under an explicit lease stays until the lease ends.
    drop(w);
    crate::harness::eventually(10, || server.call("GET", "/v1/locks/busy", "").1["waiters"] == 0);
    assert_eq!(server.call("GET", "/v1/locks/busy", "").1["held"], true);
    drop(other);
}

/// The refusals a client acts on arrive with their fields typed (the holder's token,
/// the limits), and a client of version 2 still gets the code and the HTTP API's JSON
/// error body, byte for byte what HTTP sends.
#[test]
fn errors_travel_as_typed_fields_and_a_version_2_client_still_gets_json() {
    let server = TestServer::start();
    let mut w = Wire::open(server.wire);
    let (holder, other) = (w.lease(5000), w.lease(5000));
    let t = granted(&w.call(2, &acquire("held", holder, 0)));
    assert_eq!(w.call(3, &acquire("held", other, 0)).error(), ("lock_held".into(), vec![Detail::HolderToken(t)]));
    let release = Request::Release { name: "held", lease: other };
    assert_eq!(w.call(4, &release).error(), ("not_holder".into(), vec![Detail::HolderToken(t)]));
    match w.call(5, &Request::Keepalive { lease: LeaseId(7) }).decode() {
        Response::Error { code: "lease_not_found", message, details } => {
            assert_eq!((message, details), (fenced_core::Error::LeaseNotFound.to_string().as_str(), vec![]));
        }
        other => panic!("{other:?}"),
    }
    let (code, details) = w.call(6, &Request::CreateLease { ttl_ms: 1 }).error();
    assert!(code == "ttl_out_of_range" && matches!(details[..], [Detail::TtlMsMin(1..), Detail::TtlMsMax(_)]));
    let (code, details) = w.call(7, &acquire("", holder, 0)).error();
    assert!(code == "invalid_name" && matches!(details[..], [Detail::LenMax(1..)]), "{details:?}");

    let mut old = Wire::open_in(server.wire, Version::V2);
    let (code, body) = old.call(1, &acquire("held", other, 0)).json_error();
    assert_eq!((code.as_str(), body["error"]["holder_token"].as_u64()), ("lock_held", Some(t.get())));
    let (status, http) = server.call("POST", "/v1/locks/held/acquire", &format!(r#"{{"lease_id":"{other}"}}"#));
    assert_eq!((status, &http), (409, &body), "the HTTP API's body");
    assert!(matches!(old.call(2, &Request::Keepalive { lease: holder }).decode(), Response::Lease { .. }));
}

#[test]
fn bad_frames_get_a_clear_error_and_change_nothing() {
    let server = TestServer::start();
    // Not the preamble (an HTTP request on the wire port): named, then closed.
    let mut w = Wire::raw(server.wire);
    w.s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let f = w.recv();
    assert_eq!((f.0, f.code()), (0, "bad_preamble".to_string()));
    assert!(w.try_recv().is_none(), "closed");
    // A version this server does not speak, older or newer: named, then closed.
    for (version, says) in [(1, "upgrade the client"), (4, "upgrade servers before their clients")] {
        let mut w = Wire::raw(server.wire);
        w.s.write_all(&[b'F', b'E', b'N', b'C', b'E', b'D', 0, version]).unwrap();
        match w.recv().decode() {
            Response::Error { code: "bad_preamble", message, .. } => assert!(message.contains(says), "{message}"),
            other => panic!("{other:?}"),
        }
        assert!(w.try_recv().is_none(), "closed");
    }
    // An unknown op and a payload that does not fit: named, and the connection goes on.
    let mut w = Wire::open(server.wire);
    let mut out = Vec::new();
    encode_request(&mut out, 7, &Request::CreateLease { ttl_ms: 1000 });
    out[8] = 99;
    w.s.write_all(&out).unwrap();
    let f = w.recv();
    assert_eq!((f.0, f.code()), (7, "unknown_op".to_string()));
    let short = [0, 0, 0, 7, 0, 0, 0, 8, op::KEEPALIVE, 1, 2];
    w.s.write_all(&short).unwrap();
    let f = w.recv();
    assert_eq!((f.0, f.code()), (8, "invalid_frame".to_string()));
    let mut bad_name = Vec::new();
    encode_request(&mut bad_name, 9, &Request::Release { name: "x", lease: LeaseId(1) });
    let last = bad_name.len() - 1;
    bad_name[last] = 0xff;
    w.s.write_all(&bad_name).unwrap();
    assert_eq!(w.recv().code(), "invalid_frame");
    assert!(matches!(w.call(10, &Request::Keepalive { lease: LeaseId(1) }).code().as_str(), "lease_not_found"));
    // A length over the limit: 413 with its id, then closed (the stream cannot be trusted).
    let mut w = Wire::open(server.wire);
    let huge = (2u32 << 20).to_be_bytes();
    w.s.write_all(&[&huge[..], &[0, 0, 0, 11, op::PUT]].concat()).unwrap();
    let f = w.recv();
    assert_eq!((f.0, f.code()), (11, "too_large".to_string()));
    assert!(w.try_recv().is_none(), "closed");
    // A length below the header's: closed.
    let mut w = Wire::open(server.wire);
    w.s.write_all(&[0, 0, 0, 1, 0]).unwrap();
    assert_eq!(w.recv().code(), "invalid_frame");
    assert!(w.try_recv().is_none(), "closed");
    // Nothing changed.
    let (_, v) = server.call("GET", "/v1/locks", "");
    assert_eq!(v["locks"], serde_json::json!([]));
    let metrics = server.get("/metrics").text();
    assert!(metrics.contains("fenced_leases 0") && metrics.contains("fenced_grants_total 0"), "{metrics}");
}

#[test]
fn without_the_token_every_call_is_refused() {
    let file = crate::harness::token_file("s3cret");
    let server = TestServer::with(|c| c.auth_token_file = Some(file.clone()));
    let mut w = Wire::open(server.wire);
    assert_eq!(w.call(1, &Request::CreateLease { ttl_ms: 1000 }).code(), "unauthorized");
    assert_eq!(w.call(2, &Request::Auth { token: b"wrong" }).code(), "unauthorized");
    assert_eq!(w.call(3, &Request::CreateLease { ttl_ms: 1000 }).code(), "unauthorized");
    assert_eq!(w.call(4, &Request::Auth { token: b"s3cret" }).decode(), Response::Done { op: op::AUTH });
    w.lease(1000);
    let _ = std::fs::remove_file(&file);
}

/// Review defect 1 over the wire, 1,000 times: H holds X; lease L queues acquires A and
/// B on X (a retried request); one write releases X by H and cancels B. A was told
/// "granted": X must stay L's, with A's token, until L releases it.
#[test]
fn a_cancelled_twin_never_revokes_the_grant_its_original_was_told() {
    let server = TestServer::start();
    let mut w = Wire::open(server.wire);
    // Every step is a committed entry now (an fsync each): 300 rounds fit well inside
    // the leases' TTL, and the defect this guards against showed at round 0.
    let (h, l) = (w.lease(300_000), w.lease(300_000));
    let mut twins_cancelled_while_queued = 0;
    for i in 0..300u32 {
        let id = 100 + i * 10;
        let held = granted(&w.call(id, &acquire("x", h, 0)));
        w.send(id + 1, &acquire("x", l, 30_000));
        w.send(id + 2, &acquire("x", l, 30_000));
        crate::harness::eventually(10, || server.call("GET", "/v1/locks/x", "").1["waiters"] == 2);
        let mut out = Vec::new();
        encode_request(&mut out, id + 3, &Request::Release { name: "x", lease: h });
        encode_request(&mut out, id + 4, &Request::Cancel { target: id + 2 });
        w.s.write_all(&out).unwrap();
        let mut a_token = None;
        for _ in 0..3 {
            let f = w.recv();
            match (f.0 - id, f.decode()) {
                (1, Response::Granted { token, .. }) => a_token = Some(token),
                (2, Response::Granted { .. }) => {}
                (2, _) => {
                    assert_eq!(f.code(), "cancelled");
                    twins_cancelled_while_queued += 1;
                }
                (3, Response::Released { token }) => assert_eq!(token, held),
                (k, other) => panic!("iteration {i}: answer {k} was {other:?}"),
            }
        }
        let a = a_token.unwrap_or_else(|| panic!("iteration {i}: A was not granted"));
        let checked = w.call(id + 5, &Request::Check { name: "x", token: a.get() });
        assert_eq!(checked.decode(), Response::Checked { current: true, token: Some(a) }, "iteration {i}");
        assert_eq!(w.call(id + 6, &Request::Release { name: "x", lease: l }).decode(), Response::Released { token: a });
    }
    // Both orders happened: the cancel caught B queued, or after its grant.
    println!("B cancelled while still queued in {twins_cancelled_while_queued} of 300");
}

/// The edge before AUTH and after: a frame larger than an AUTH frame can be, sent
/// before authenticating, closes that connection at once; a frame trickled slower than
/// the deadline closes its connection; others are served throughout.
#[test]
fn oversized_or_trickled_frames_close_only_their_own_connection() {
    let file = crate::harness::token_file("s3cret");
    let server = TestServer::with(|c| {
        c.auth_token_file = Some(file.clone());
        c.head_timeout_ms = 500;
    });
    // Before AUTH: a header announcing a 512 KiB frame (an authenticated client may
    // send that much): refused, closed, nothing buffered.
    let mut big = Wire::open(server.wire);
    let mut header = Vec::new();
    header.extend_from_slice(&(512u32 << 10).to_be_bytes());
    header.extend_from_slice(&1u32.to_be_bytes());
    header.push(op::AUTH);
    big.s.write_all(&header).unwrap();
    let f = big.try_recv().expect("an answer before the close");
    assert_eq!(f.code(), "too_large", "{:?}", f.error());
    assert!(big.try_recv().is_none(), "the connection is closed");
    // A frame begun and never finished: closed after the head deadline.
    let mut slow = Wire::open(server.wire);
    let mut auth = Vec::new();
    encode_request(&mut auth, 1, &Request::Auth { token: b"s3cret" });
    slow.s.write_all(&auth[..auth.len() - 2]).unwrap();
    let started = std::time::Instant::now();
    assert!(slow.try_recv().is_none(), "a trickled frame closes its connection");
    assert!(started.elapsed() < Duration::from_secs(5), "closed by the frame deadline, not the read timeout");
    // Meanwhile a well-behaved client is served.
    let mut good = Wire::open(server.wire);
    assert_eq!(good.call(1, &Request::Auth { token: b"s3cret" }).decode(), Response::Done { op: op::AUTH });
    good.lease(1000);
    let metrics = server.get("/metrics").text();
    assert!(metrics.contains("fenced_wire_frame_timeouts_total 1"), "{metrics}");
    let _ = std::fs::remove_file(&file);
}

/// Large frames take their length from the budget of bodies in flight, as HTTP bodies
/// do: with a 2 MiB budget, two connections that began 1 MiB frames hold it all, a third
/// large frame is refused `too_busy` and closes its connection only, small frames are
/// served meanwhile, and once a large frame is done its share comes back.
#[test]
fn large_frames_share_the_body_budget_with_http() {
    let server = TestServer::with(|c| {
        c.body_bytes_max = 1 << 20;
        c.value_bytes_max = 1 << 20;
        c.body_bytes_in_flight_max = 2 << 20;
        c.body_timeout_ms = 20_000;
    });
    let started = |len: u32| {
        let mut w = Wire::open(server.wire);
        let mut header = Vec::new();
        header.extend_from_slice(&len.to_be_bytes());
        header.extend_from_slice(&7u32.to_be_bytes());
        header.push(op::CREATE_LEASE);
        w.s.write_all(&header).unwrap();
        w
    };
    // The server reads the headers on its own time: the holders begin first, and the
    // third one after a pause; on a machine so loaded that the third was read first
    // (a holder refused instead), all three are dropped and it starts again.
    let mut refused = None;
    for attempt in 0..10 {
        let holders = [started(1 << 20), started(1 << 20)];
        std::thread::sleep(Duration::from_millis(300 * (attempt + 1)));
        let mut third = started(1 << 20);
        third.s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        if let Some(f) = third.try_recv() {
            refused = Some((f, third, holders));
            break;
        }
    }
    let (f, mut third, holders) = refused.expect("a large frame over the budget is answered");
    assert_eq!(f.0, 7, "the answer names the frame");
    assert_eq!(f.error(), ("too_busy".to_string(), vec![Detail::RetryAfterMs(100)]), "typed, as HTTP's JSON");
    third.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(third.try_recv().is_none(), "that connection is closed");
    // Small frames are not held back by it.
    let mut small = Wire::open(server.wire);
    small.lease(1000);
    let metrics = server.get("/metrics").text();
    assert!(!metrics.contains("fenced_bodies_refused_total 0\n"), "{metrics}");
    // One holder gone: its share returns, and a large frame is taken again.
    drop(holders);
    let mut later = Wire::open(server.wire);
    let value = vec![b'x'; 900 << 10];
    let lease = later.lease(5000);
    let f = later.call(2, &acquire("budget/lock", lease, 0));
    let token = granted(&f);
    let f = later.call(3, &Request::Put { key: "budget/key", token: Some(token), value: &value });
    assert!(matches!(f.decode(), Response::Written { .. }), "{:?}", f.decode());
}

/// The holder label over the wire: shown in the HTTP view of the wire's grant; a bad
/// label refused as over HTTP.
#[test]
fn a_holder_label_travels_over_the_wire() {
    let server = TestServer::start();
    let mut w = Wire::open(server.wire);
    let labelled = Request::Acquire {
        name: "w",
        lease: None,
        ttl_ms: Some(5000),
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: Some("wire-7"),
    };
    let token = granted(&w.call(2, &labelled));
    let (_, v) = server.call("GET", "/v1/locks/w", "");
    assert_eq!((v["token"].as_u64(), v["holder"].as_str()), (Some(token.get()), Some("wire-7")), "{v}");
    let long = "x".repeat(300);
    let bad = Request::Acquire {
        name: "w2",
        lease: None,
        ttl_ms: Some(5000),
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: Some(&long),
    };
    assert_eq!(w.call(3, &bad).code(), "invalid_holder");
    let (_, v) = server.call("GET", "/v1/locks/w2", "");
    assert_eq!(v["held"], false, "{v}");
}

/// WATCH: a stream of frames under the watch's id, the same events and indexes as
/// `GET /v1/events`; a start marker first; `since` resumes exactly after it; CANCEL ends
/// it with `cancelled` and nothing more; a connection holds 16 at most.
#[test]
fn a_watch_streams_events_resumes_and_ends_on_cancel() {
    let server = TestServer::start();
    let mut w = Wire::open(server.wire);
    w.send(5, &Request::Watch { prefix: "wt/", since: None, tail: None });
    let start = match w.recv() {
        f if f.0 == 5 => match f.decode() {
            Response::Mark { index } => index,
            other => panic!("the first frame is the start marker, not {other:?}"),
        },
        f => panic!("a frame of id {}", f.0),
    };
    let (_, g) = server.acquire("wt/a", r#"{"ttl_ms":5000}"#);
    let _ = server.acquire("elsewhere", r#"{"ttl_ms":5000}"#); // outside the prefix: not sent
    let event = |f: &Frame| match f.decode() {
        Response::Event { index, data } => (index, serde_json::from_slice::<Value>(data).unwrap()),
        other => panic!("expected an event, got {other:?}"),
    };
    let f = w.recv();
    let (index, e) = event(&f);
    assert_eq!((f.0, e["type"].as_str(), e["name"].as_str()), (5, Some("granted"), Some("wt/a")), "{e}");
    assert_eq!((e["index"].as_u64(), e["token"].as_u64()), (Some(index), g["token"].as_u64()));
    assert!(index > start);

    // A second watch from the start position gets the same event, with the same index.
    w.send(6, &Request::Watch { prefix: "wt/", since: Some(start), tail: None });
    assert!(matches!(w.recv().decode(), Response::Mark { index } if index == start));
    let again = w.recv();
    assert_eq!((again.0, event(&again).0), (6, index));

    // CANCEL: `cancelled`, and later events reach only the other watch.
    w.send(7, &Request::Cancel { target: 5 });
    let f = w.recv();
    assert_eq!((f.0, f.code()), (5, "cancelled".to_string()));
    let _ = server.acquire("wt/b", r#"{"ttl_ms":5000}"#);
    let f = w.recv();
    assert_eq!((f.0, event(&f).1["name"].as_str()), (6, Some("wt/b")));

    // The sixteenth watch opens, the seventeenth is refused; every other call goes on.
    for id in 100..115 {
        w.send(id, &Request::Watch { prefix: "zz/", since: None, tail: None });
        assert!(matches!(w.recv().decode(), Response::Mark { .. }));
    }
    w.send(200, &Request::Watch { prefix: "zz/", since: None, tail: None });
    let f = w.recv();
    assert_eq!((f.0, f.code()), (200, "too_busy".to_string()));
    let lease = w.lease(5000);
    assert_ne!(lease.0, 0);
}

/// A watch from a position older than every event held: `compacted` with the oldest
/// index, as over HTTP.
#[test]
fn a_watch_from_a_position_no_longer_held_is_refused_compacted() {
    let server = TestServer::with(|c| c.events_retained = 4);
    for _ in 0..6 {
        let (_, g) = server.acquire("wc/x", r#"{"ttl_ms":5000}"#);
        let body = format!(r#"{{"lease_id":"{}"}}"#, g["lease_id"].as_str().unwrap());
        assert_eq!(server.call("POST", "/v1/locks/wc/x/release", &body).0, 200);
    }
    let mut w = Wire::open(server.wire);
    let (code, details) = w.call(1, &Request::Watch { prefix: "wc/", since: Some(0), tail: None }).error();
    assert_eq!(code, "compacted");
    assert!(matches!(details[..], [Detail::OldestIndex(i)] if i > 1), "{details:?}");
    // `tail` starts with the last events held.
    w.send(2, &Request::Watch { prefix: "wc/", since: None, tail: Some(2) });
    let mut kinds = vec![];
    while kinds.len() < 2 {
        if let Response::Event { data, .. } = w.recv().decode() {
            kinds.push(serde_json::from_slice::<Value>(data).unwrap()["type"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(kinds, ["granted", "released"]);
}
