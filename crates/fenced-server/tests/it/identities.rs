//! Identities and permissions (`identities_file`), leases that belong to their
//! identity, the audit log, and a reload on SIGHUP: a permissions matrix over HTTP and
//! the wire protocol, each refusal 403 `forbidden` naming the operation and the name
//! and changing nothing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fenced_core::Token;
use fenced_wire::{decode_response, encode_request, split_frame, Request, Response, PREAMBLE};
use serde_json::Value;

use crate::harness::{eventually, scratch_dir, TestServer};

/// Every identity of the matrix: its token is `NAME-token`.
const IDENTITIES: &str = r#"
[[identity]]
name = "billing"
token_file = "billing.token"
allow = [{ prefix = "billing/", ops = ["lock", "store_read"] }]

[[identity]]
name = "reader"
token_file = "reader.token"
allow = [{ prefix = "", ops = ["store_read"] }]

[[identity]]
name = "locker"
token_file = "locker.token"
allow = [{ prefix = "", ops = ["lock"] }]

[[identity]]
name = "writer"
token_file = "writer.token"
allow = [{ prefix = "", ops = ["lock"] }, { prefix = "acct/", ops = ["lock", "store_read", "store_write"] }]

[[identity]]
name = "admin"
token_file = "admin.token"
allow = [{ prefix = "", ops = ["lock", "store_read", "store_write", "admin"] }]
"#;

const NAMES: [&str; 5] = ["billing", "reader", "locker", "writer", "admin"];

fn setup(dir: &Path, audit: Option<PathBuf>) -> (TestServer, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    for n in NAMES {
        std::fs::write(dir.join(format!("{n}.token")), format!("{n}-token\n")).unwrap();
    }
    let file = dir.join("identities.toml");
    std::fs::write(&file, IDENTITIES).unwrap();
    let f = file.clone();
    let server = TestServer::with(move |c| {
        c.identities_file = Some(f);
        c.audit_log = audit;
    });
    (server, file)
}

fn call_as(s: &TestServer, who: &str, method: &str, path: &str, body: &str, extra: &[(&str, &str)]) -> (u16, Value) {
    let auth = format!("Bearer {who}-token");
    let mut headers = vec![("authorization", auth.as_str()), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    let r = s.request(method, path, &headers, body.as_bytes());
    // A store value comes back as it is, not as JSON.
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// What an identity gets for one call: the status, and the code when refused.
fn outcome(r: &(u16, Value)) -> (u16, String) {
    (r.0, r.1["error"]["code"].as_str().unwrap_or("").to_string())
}

#[test]
fn a_permissions_matrix_over_http_each_refusal_forbidden_and_changing_nothing() {
    let dir = scratch_dir();
    let (s, _) = setup(&dir, None);
    s.mint_tokens_as("admin", 5);
    let forbidden = (403, "forbidden".to_string());
    // (call, [billing, reader, locker, writer, admin]): true = allowed.
    type Call<'a> = (&'a str, &'a str, &'a str, Vec<(&'a str, &'a str)>);
    let rows: Vec<(Call, [bool; 5])> = vec![
        (("POST", "/v1/locks/billing/run/acquire", r#"{"ttl_ms":5000}"#, vec![]), [true, false, true, true, true]),
        (("POST", "/v1/locks/orders/1/acquire", r#"{"ttl_ms":5000}"#, vec![]), [false, false, true, true, true]),
        (("GET", "/v1/locks/billing/run", "", vec![]), [true, false, true, true, true]),
        (("POST", "/v1/locks/orders/1/check", r#"{"token":1}"#, vec![]), [false, false, true, true, true]),
        (("POST", "/v1/leases", r#"{"ttl_ms":5000}"#, vec![]), [true, false, true, true, true]),
        (("PUT", "/v1/store/acct/x", "v", vec![("fencing-token", "5")]), [false, false, false, true, true]),
        (("PUT", "/v1/store/billing/x", "v", vec![("fencing-token", "5")]), [false, false, false, false, true]),
        (("GET", "/v1/store/acct/x", "", vec![]), [false, true, false, true, true]),
        (("GET", "/v1/store/billing/x", "", vec![]), [true, true, false, false, true]),
        (
            ("POST", "/v1/cluster/members", r#"{"id":2,"url":"http://127.0.0.1:1"}"#, vec![]),
            [false, false, false, false, true],
        ),
        (("DELETE", "/v1/cluster/members/2", "", vec![]), [false, false, false, false, true]),
        // A backup holds every lease id and value: an admin's alone.
        (("GET", "/v1/cluster/snapshot", "", vec![]), [false, false, false, false, true]),
        (("POST", "/v1/sim/runs", "{}", vec![]), [false, false, false, false, true]),
        // Taking a lock from its holder by name is the admin right on the name, not lock.
        (("POST", "/v1/locks/orders/1/revoke", "", vec![]), [false, false, false, false, true]),
    ];
    for ((method, path, body, extra), allowed) in &rows {
        for (who, ok) in NAMES.iter().zip(allowed) {
            let got = outcome(&call_as(&s, who, method, path, body, extra));
            if *ok {
                assert_ne!(got, forbidden, "{who} {method} {path}: allowed, refused");
                assert_ne!(got.0, 401, "{who} {method} {path}");
            } else {
                assert_eq!(got, forbidden, "{who} {method} {path}: refused, got {got:?}");
            }
        }
    }
    // A refusal names the operation and the name.
    let (_, e) = call_as(&s, "billing", "POST", "/v1/locks/orders/2/acquire", r#"{"ttl_ms":5000}"#, &[]);
    assert_eq!(
        (e["error"]["operation"].as_str(), e["error"]["name"].as_str()),
        (Some("lock"), Some("orders/2")),
        "{e}"
    );
    // ... and changed nothing: orders/2 was never taken.
    let (_, v) = call_as(&s, "admin", "GET", "/v1/locks/orders/2", "", &[]);
    assert_eq!(v["held"], false, "{v}");
    // Listings show an identity only its own names.
    let (_, v) = call_as(&s, "billing", "GET", "/v1/locks", "", &[]);
    let names: Vec<&str> = v["locks"].as_array().unwrap().iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert!(!names.is_empty() && names.iter().all(|n| n.starts_with("billing/")), "{names:?}");
    let (_, v) = call_as(&s, "writer", "GET", "/v1/store", "", &[]);
    let keys: Vec<&str> = v["keys"].as_array().unwrap().iter().map(|k| k["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["acct/x"], "{v}");
    // No token, or a token nobody has: 401.
    assert_eq!(s.call("POST", "/v1/leases", r#"{"ttl_ms":5000}"#).0, 401);
    assert_eq!(call_as(&s, "nobody", "POST", "/v1/leases", r#"{"ttl_ms":5000}"#, &[]).0, 401);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lease_belongs_to_the_identity_that_created_it() {
    let dir = scratch_dir();
    let (s, _) = setup(&dir, None);
    let (st, l) = call_as(&s, "locker", "POST", "/v1/leases", r#"{"ttl_ms":10000}"#, &[]);
    assert_eq!(st, 201, "{l}");
    let lease = l["lease_id"].as_str().unwrap();
    let body = format!(r#"{{"lease_id":"{lease}"}}"#);
    let (st, g) = call_as(&s, "locker", "POST", "/v1/locks/shared/acquire", &body, &[]);
    assert_eq!(st, 200, "{g}");
    assert_eq!(g["lease_id"].as_str(), Some(lease), "the caller sees its own id");
    // Another identity with the same id: not its lease.
    let keepalive = format!("/v1/leases/{lease}/keepalive");
    assert_eq!(outcome(&call_as(&s, "admin", "POST", &keepalive, "", &[])), (404, "lease_not_found".into()));
    let (st, e) = call_as(&s, "admin", "POST", "/v1/locks/shared/release", &body, &[]);
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("not_holder")), "{e}");
    assert_eq!(call_as(&s, "admin", "DELETE", &format!("/v1/leases/{lease}"), "", &[]).0, 404);
    // A caller-named implicit lease: the same id from another identity is another lease.
    let id = "5eed00c0ffee00000000000000000abc";
    let implicit = format!(r#"{{"lease_id":"{id}","ttl_ms":10000}}"#);
    let (st, first) = call_as(&s, "locker", "POST", "/v1/locks/named/acquire", &implicit, &[]);
    assert_eq!(st, 200, "{first}");
    let (st, again) = call_as(&s, "locker", "POST", "/v1/locks/named/acquire", &implicit, &[]);
    assert_eq!((st, &again["token"]), (200, &first["token"]), "the retry of the same identity: the same grant");
    let (st, other) = call_as(&s, "admin", "POST", "/v1/locks/named/acquire", &implicit, &[]);
    assert_eq!((st, other["error"]["code"].as_str()), (409, Some("lock_held")), "{other}");
    // The owner still holds both, and keeps its lease alive.
    assert_eq!(call_as(&s, "locker", "POST", &keepalive, "", &[]).0, 200);
    assert_eq!(call_as(&s, "locker", "POST", "/v1/locks/shared/release", &body, &[]).0, 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One wire connection authenticated as `who`.
struct Wire {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    fn open(s: &TestServer, who: &str) -> Wire {
        let stream = TcpStream::connect(s.wire).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = Wire { s: stream, buf: Vec::new() };
        w.s.write_all(&PREAMBLE).unwrap();
        let token = format!("{who}-token");
        let code = w.code(1, &Request::Auth { token: token.as_bytes() });
        assert_eq!(code, "", "AUTH as {who}");
        w
    }

    /// The error code of the answer to `req`, or "" for a success.
    fn code(&mut self, id: u32, req: &Request<'_>) -> String {
        let mut out = Vec::new();
        encode_request(&mut out, id, req);
        self.s.write_all(&out).unwrap();
        loop {
            if let Some((rid, kind, payload, used)) = split_frame(&self.buf, usize::MAX).unwrap() {
                assert_eq!(rid, id);
                let code = match decode_response(rid, kind, payload).unwrap() {
                    Response::Error { code, .. } => code.to_string(),
                    _ => String::new(),
                };
                self.buf.drain(..used);
                return code;
            }
            let mut chunk = [0u8; 4096];
            let n = self.s.read(&mut chunk).unwrap();
            assert!(n > 0, "the connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn implicit(name: &str) -> Request<'_> {
    Request::Acquire { name, lease: None, ttl_ms: Some(5000), wait_ms: 0, lock_delay_ms: 0, holder: None }
}

#[test]
fn the_same_permissions_hold_over_the_wire_protocol() {
    let dir = scratch_dir();
    let (s, _) = setup(&dir, None);
    s.mint_tokens_as("admin", 3);
    let mut billing = Wire::open(&s, "billing");
    assert_eq!(billing.code(2, &implicit("billing/w")), "");
    assert_eq!(billing.code(3, &implicit("orders/w")), "forbidden");
    assert_eq!(billing.code(4, &Request::Put { key: "billing/k", token: Token::new(3), value: b"v" }), "forbidden");
    assert_eq!(billing.code(5, &Request::Get { key: "acct/k", token: None }), "forbidden");
    let mut reader = Wire::open(&s, "reader");
    assert_eq!(reader.code(2, &Request::CreateLease { ttl_ms: 5000 }), "forbidden");
    assert_eq!(reader.code(3, &Request::Get { key: "acct/k", token: None }), "not_found");
    let mut writer = Wire::open(&s, "writer");
    assert_eq!(writer.code(2, &Request::Put { key: "acct/k", token: Token::new(3), value: b"v" }), "");
    assert_eq!(writer.code(3, &Request::Put { key: "billing/k", token: Token::new(3), value: b"v" }), "forbidden");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The events stream of `who`, read for `ms` after `during` ran: the names it saw.
fn events_seen(s: &TestServer, who: &str, during: impl FnOnce()) -> String {
    let mut c = TcpStream::connect(s.addr).unwrap();
    let req = format!("GET /v1/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {who}-token\r\n\r\n");
    c.write_all(req.as_bytes()).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    during();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let mut chunk = [0u8; 4096];
        match c.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
        if String::from_utf8_lossy(&seen).contains("billing/late") {
            break;
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[test]
fn events_show_an_identity_only_what_it_may_read() {
    let dir = scratch_dir();
    let (s, _) = setup(&dir, None);
    let seen = events_seen(&s, "billing", || {
        assert_eq!(call_as(&s, "admin", "POST", "/v1/locks/orders/e/acquire", r#"{"ttl_ms":5000}"#, &[]).0, 200);
        assert_eq!(call_as(&s, "billing", "POST", "/v1/locks/billing/late/acquire", r#"{"ttl_ms":5000}"#, &[]).0, 200);
    });
    assert!(seen.contains("billing/late"), "billing sees its own lock: {seen}");
    assert!(!seen.contains("orders/e"), "billing must not see orders/: {seen}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_reloads_the_identities_and_a_bad_file_keeps_the_old_ones() {
    let dir = scratch_dir();
    let (s, file) = setup(&dir, None);
    let acquire =
        |name: &str| call_as(&s, "billing", "POST", &format!("/v1/locks/{name}/acquire"), r#"{"ttl_ms":5000}"#, &[]).0;
    let mut wire = Wire::open(&s, "billing");
    assert_eq!(acquire("billing/a"), 200);
    let hup = || {
        let st = std::process::Command::new("kill").args(["-HUP", &std::process::id().to_string()]).status().unwrap();
        assert!(st.success());
    };
    // A file that does not parse: refused, the identities in force stay.
    std::fs::write(&file, "[[identity]\nname=").unwrap();
    hup();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(acquire("billing/b"), 200);
    // billing loses its lock right; the open wire connection loses it too.
    std::fs::write(&file, IDENTITIES.replace(r#"ops = ["lock", "store_read"] }]"#, r#"ops = ["store_read"] }]"#))
        .unwrap();
    hup();
    eventually(5, || acquire("billing/c") == 403);
    assert_eq!(wire.code(9, &implicit("billing/d")), "forbidden");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn the_audit_log_holds_each_decision_and_a_full_audit_disk_stops_nothing() {
    let dir = scratch_dir();
    let path = dir.join("audit.log");
    let (s, _) = setup(&dir, Some(path.clone()));
    let (_, g) = call_as(&s, "billing", "POST", "/v1/locks/billing/run/acquire", r#"{"ttl_ms":5000}"#, &[]);
    let token = g["token"].as_u64().unwrap();
    call_as(&s, "billing", "POST", "/v1/locks/orders/1/acquire", r#"{"ttl_ms":5000}"#, &[]);
    let t = token.to_string();
    call_as(&s, "writer", "PUT", "/v1/store/acct/x", "v", &[("fencing-token", &t)]);
    call_as(&s, "admin", "POST", "/v1/cluster/members", r#"{"id":2,"url":"http://127.0.0.1:1"}"#, &[]);
    call_as(&s, "nobody", "POST", "/v1/leases", r#"{"ttl_ms":5000}"#, &[]);
    let want = |l: &Value, who: &str, op: &str, name: Option<&str>, result: &str| {
        l["identity"] == who && l["op"] == op && l["name"].as_str() == name && l["result"] == result
    };
    eventually(5, || audit_lines(&path).len() >= 5);
    let lines = audit_lines(&path);
    let has = |who, op, name, result| lines.iter().any(|l| want(l, who, op, name, result));
    assert!(has("billing", "acquire", Some("billing/run"), "ok"), "{lines:#?}");
    let grant = lines.iter().find(|l| want(l, "billing", "acquire", Some("billing/run"), "ok")).unwrap();
    assert_eq!(grant["token"].as_u64(), Some(token));
    assert!(grant["remote"].as_str().is_some_and(|r| r.starts_with("127.0.0.1:")), "{grant}");
    assert!(grant["at"].as_str().is_some_and(|a| a.ends_with('Z') && a.len() == 24), "{grant}");
    assert!(has("billing", "acquire", Some("orders/1"), "forbidden"), "{lines:#?}");
    assert!(has("writer", "store_write", Some("acct/x"), "ok"), "{lines:#?}");
    assert!(has("admin", "member_add", None, "membership_change_failed"), "{lines:#?}");
    assert!(has("-", "authenticate", Some("/v1/leases"), "unauthorized"), "{lines:#?}");
    drop(s);
    // An audit log on a full disk (/dev/full: every write fails): the service serves,
    // and the lines it could not keep are counted.
    let full = TestServer::with(|c| c.audit_log = Some(PathBuf::from("/dev/full")));
    for i in 0..5 {
        assert_eq!(full.acquire(&format!("full/{i}"), r#"{"ttl_ms":5000}"#).0, 200);
    }
    eventually(5, || {
        let m = full.get("/metrics").text();
        m.lines().any(|l| l.strip_prefix("fenced_audit_lines_dropped_total ").is_some_and(|n| n.trim() != "0"))
    });
    drop(full);
    let _ = std::fs::remove_dir_all(&dir);
}

impl TestServer {
    /// [`TestServer::mint_tokens`] for a server with identities: as `who`.
    fn mint_tokens_as(&self, who: &str, up_to: u64) {
        loop {
            let (st, g) = call_as(self, who, "POST", "/v1/locks/test/mint/acquire", r#"{"ttl_ms":5000}"#, &[]);
            assert_eq!(st, 200, "{g}");
            let body = format!(r#"{{"lease_id":"{}"}}"#, g["lease_id"].as_str().unwrap());
            assert_eq!(call_as(self, who, "POST", "/v1/locks/test/mint/release", &body, &[]).0, 200);
            if g["token"].as_u64().unwrap() >= up_to {
                return;
            }
        }
    }
}

/// A set of locks needs the lock right on every name: one name outside the identity's
/// prefix refuses the whole set, and nothing of it is taken.
#[test]
fn a_set_of_locks_needs_the_lock_right_on_every_name() {
    let dir = scratch_dir().join("multi-rights");
    let (s, _) = setup(&dir, None);
    let body = r#"{"names":["billing/a","other/b"],"ttl_ms":5000}"#;
    let r = call_as(&s, "billing", "POST", "/v1/locks/acquire", body, &[]);
    assert_eq!(outcome(&r), (403, "forbidden".into()), "{}", r.1);
    let a = call_as(&s, "admin", "GET", "/v1/locks/billing/a", "", &[]);
    assert_eq!((a.0, a.1["held"].as_bool()), (200, Some(false)), "billing/a untouched: {}", a.1);
    let ok = call_as(
        &s,
        "billing",
        "POST",
        "/v1/locks/acquire",
        r#"{"names":["billing/a","billing/b"],"ttl_ms":5000}"#,
        &[],
    );
    assert_eq!(ok.0, 200, "{}", ok.1);
}
