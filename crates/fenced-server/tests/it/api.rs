//! The API of version 1, call by call, over a real socket.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{eventually, TestServer};

fn token(v: &Value) -> u64 {
    v["token"].as_u64().unwrap_or_else(|| panic!("no token in {v}"))
}

#[test]
fn grant_release_check_and_views() {
    let s = TestServer::start();
    let a = s.lease(10_000);
    let (st, g) = s.acquire("orders%2F7", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!(st, 200, "{g}");
    assert_eq!(g["name"], "orders/7");
    assert_eq!(g["lease_id"], a.as_str());
    assert_eq!(g["ttl_ms"], 10_000);
    let t = token(&g);
    assert!(t >= 1);

    let (st, v) = s.call("GET", "/v1/locks/orders%2F7", "");
    assert_eq!(st, 200);
    assert_eq!((v["held"].as_bool(), v["token"].as_u64(), v["waiters"].as_u64()), (Some(true), Some(t), Some(0)));
    assert!(v.get("lease_id").is_none(), "the lease id is a capability and must not be shown: {v}");
    let (_, list) = s.call("GET", "/v1/locks?prefix=orders", "");
    assert_eq!(list["locks"].as_array().unwrap().len(), 1);
    let (_, list) = s.call("GET", "/v1/locks?prefix=zzz", "");
    assert_eq!(list["locks"].as_array().unwrap().len(), 0);

    let (_, c) = s.call("POST", "/v1/locks/orders%2F7/check", &format!("{{\"token\":{t}}}"));
    assert_eq!((c["current"].as_bool(), c["token"].as_u64()), (Some(true), Some(t)));
    let (_, c) = s.call("POST", "/v1/locks/orders%2F7/check", &format!("{{\"token\":{}}}", t + 1));
    assert_eq!(c["current"].as_bool(), Some(false));

    // Unencoded slashes in the name reach the same lock.
    let (st, r) = s.call("POST", "/v1/locks/orders/7/release", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!(st, 200, "{r}");
    assert_eq!(token(&r), t);
    let (_, v) = s.call("GET", "/v1/locks/orders%2F7", "");
    assert_eq!(v["held"], false);
    // The next grant carries a higher token.
    let (_, g2) = s.acquire("orders%2F7", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert!(token(&g2) > t);
}

#[test]
fn try_lock_stranger_release_and_idempotent_reacquire() {
    let s = TestServer::start();
    let (a, b) = (s.lease(10_000), s.lease(10_000));
    let (_, g) = s.acquire("x", &format!("{{\"lease_id\":\"{a}\"}}"));
    let (st, e) = s.acquire("x", &format!("{{\"lease_id\":\"{b}\",\"wait_ms\":0}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "{e}");
    assert_eq!(e["error"]["holder_token"].as_u64(), Some(token(&g)));
    let (st, e) = s.call("POST", "/v1/locks/x/release", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("not_holder")));
    // A retried acquire by the holder gets the same grant, not a new token.
    let (st, again) = s.acquire("x", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!((st, token(&again)), (200, token(&g)));
    // Still held by a after all that.
    let (_, c) = s.call("POST", "/v1/locks/x/check", &format!("{{\"token\":{}}}", token(&g)));
    assert_eq!(c["current"], true);
}

#[test]
fn fifo_hand_off_to_several_waiters() {
    let s = TestServer::start();
    let holder = s.lease(30_000);
    let (_, g0) = s.acquire("fifo", &format!("{{\"lease_id\":\"{holder}\"}}"));
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..3 {
        let lease = s.lease(30_000);
        let addr = s.addr;
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            let body = format!("{{\"lease_id\":\"{lease}\",\"wait_ms\":30000}}");
            let r = crate::harness::request(addr, "POST", "/v1/locks/fifo/acquire", &[], body.as_bytes());
            let g = r.json();
            assert_eq!(r.status, 200, "{g}");
            tx.send((i, token(&g))).unwrap();
            let rel = format!("{{\"lease_id\":\"{lease}\"}}");
            let r = crate::harness::request(addr, "POST", "/v1/locks/fifo/release", &[], rel.as_bytes());
            assert_eq!(r.status, 200);
        }));
        // Queue them one after the other so that their order is known.
        eventually(10, || s.call("GET", "/v1/locks/fifo", "").1["waiters"] == i + 1);
    }
    s.call("POST", "/v1/locks/fifo/release", &format!("{{\"lease_id\":\"{holder}\"}}"));
    for t in threads {
        t.join().unwrap();
    }
    let got: Vec<(i32, u64)> = rx.try_iter().collect();
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![0, 1, 2], "granted first in, first out");
    let tokens: Vec<u64> = got.iter().map(|g| g.1).collect();
    assert!(token(&g0) < tokens[0] && tokens[0] < tokens[1] && tokens[1] < tokens[2], "{tokens:?}");
}

#[test]
fn wait_times_out_and_leaves_the_queue() {
    let s = TestServer::start();
    let (a, b) = (s.lease(30_000), s.lease(30_000));
    s.acquire("w", &format!("{{\"lease_id\":\"{a}\"}}"));
    let (st, e) = s.acquire("w", &format!("{{\"lease_id\":\"{b}\",\"wait_ms\":200}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "{e}");
    assert_eq!(s.call("GET", "/v1/locks/w", "").1["waiters"], 0);
}

#[test]
fn a_disconnected_waiter_leaves_the_queue() {
    let s = TestServer::start();
    let (a, b) = (s.lease(30_000), s.lease(30_000));
    s.acquire("d", &format!("{{\"lease_id\":\"{a}\"}}"));
    let body = format!("{{\"lease_id\":\"{b}\",\"wait_ms\":30000}}");
    let mut c = TcpStream::connect(s.addr).unwrap();
    write!(c, "POST /v1/locks/d/acquire HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
    eventually(10, || s.call("GET", "/v1/locks/d", "").1["waiters"] == 1);
    drop(c);
    eventually(10, || s.call("GET", "/v1/locks/d", "").1["waiters"] == 0);
    // And the lock does not go to the departed waiter on release.
    s.call("POST", "/v1/locks/d/release", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!(s.call("GET", "/v1/locks/d", "").1["held"], false);
}

#[test]
fn implicit_lease_grant_and_its_lease_works() {
    let s = TestServer::start();
    let (st, g) = s.acquire("imp", "{\"ttl_ms\":10000}");
    assert_eq!(st, 200, "{g}");
    let lease = g["lease_id"].as_str().unwrap();
    assert_eq!(lease.len(), 32);
    assert!(lease.bytes().all(|b| b.is_ascii_hexdigit()));
    let (st, _) = s.call("POST", &format!("/v1/leases/{lease}/keepalive"), "");
    assert_eq!(st, 200);
    // An implicit lease that waits for longer than its TTL is kept alive by the wait.
    let (st, w) = s.call("POST", "/v1/locks/other/acquire", "{\"ttl_ms\":100}");
    assert_eq!(st, 200, "{w}");
    let addr = s.addr;
    let waiter = std::thread::spawn(move || {
        let r =
            crate::harness::request(addr, "POST", "/v1/locks/imp/acquire", &[], b"{\"ttl_ms\":150,\"wait_ms\":30000}");
        (r.status, r.json())
    });
    eventually(10, || s.call("GET", "/v1/locks/imp", "").1["waiters"] == 1);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(s.call("GET", "/v1/locks/imp", "").1["waiters"], 1, "the waiting implicit lease must not expire");
    s.call("DELETE", &format!("/v1/leases/{lease}"), "");
    let (st, g2) = waiter.join().unwrap();
    assert_eq!(st, 200, "{g2}");
    assert!(token(&g2) > token(&g));
}

#[test]
fn expiry_releases_and_keepalive_after_expiry_is_404() {
    let s = TestServer::start();
    let a = s.lease(150);
    let (_, g) = s.acquire("e", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert!(g["token"].is_u64());
    eventually(10, || s.call("GET", "/v1/locks/e", "").1["held"] == false);
    let (st, e) = s.call("POST", &format!("/v1/leases/{a}/keepalive"), "");
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("lease_not_found")));
    let (st, e) = s.call("DELETE", &format!("/v1/leases/{a}"), "");
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("lease_not_found")));
    let (st, e) = s.acquire("e", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("lease_not_found")));
}

#[test]
fn keepalive_keeps_a_lease() {
    let s = TestServer::start();
    let a = s.lease(1_000);
    s.acquire("k", &format!("{{\"lease_id\":\"{a}\"}}"));
    for _ in 0..10 {
        let (st, v) = s.call("POST", &format!("/v1/leases/{a}/keepalive"), "{}");
        assert_eq!((st, v["ttl_ms"].as_u64()), (200, Some(1_000)));
        std::thread::sleep(Duration::from_millis(150));
    }
    // 1.5 s have passed, over the TTL: only the keepalives explain the lock still held.
    assert_eq!(s.call("GET", "/v1/locks/k", "").1["held"], true);
}

/// On a cluster of one, a keepalive is answered from memory (issue 25): the renewals
/// reach the log together with the next batch, at least every 100 ms, so keepalives as
/// fast as one caller sends them for 1.5 s grow the log by a few entries a tenth of a
/// second, not one each; and the lease, with a TTL of 1 s, outlives them by those
/// renewals alone, its lock still held.
#[test]
fn keepalives_on_a_cluster_of_one_are_answered_from_memory() {
    let s = TestServer::start();
    let a = s.lease(1_000);
    s.acquire("m", &format!("{{\"lease_id\":\"{a}\"}}"));
    let index = || s.call("GET", "/v1/cluster", "").1["last_log_index"].as_u64().unwrap();
    let before = index();
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_millis(1_500) {
        let (st, v) = s.call("POST", &format!("/v1/leases/{a}/keepalive"), "");
        assert_eq!((st, v["ttl_ms"].as_u64()), (200, Some(1_000)), "{v}");
        sent += 1;
    }
    let grown = index() - before;
    assert!(sent >= 100, "only {sent} keepalives in 1.5 s");
    assert!(grown * 4 < sent, "{sent} keepalives grew the log by {grown} entries");
    assert_eq!(s.call("GET", "/v1/locks/m", "").1["held"], true);
    // Without keepalives the lease ends.
    eventually(10, || s.call("GET", "/v1/locks/m", "").1["held"] == false);
}

#[test]
fn revoke_releases_and_hands_off() {
    let s = TestServer::start();
    let (a, b) = (s.lease(30_000), s.lease(30_000));
    let (_, g) = s.acquire("r", &format!("{{\"lease_id\":\"{a}\"}}"));
    let addr = s.addr;
    let body = format!("{{\"lease_id\":\"{b}\",\"wait_ms\":30000}}");
    let w =
        std::thread::spawn(move || crate::harness::request(addr, "POST", "/v1/locks/r/acquire", &[], body.as_bytes()));
    eventually(10, || s.call("GET", "/v1/locks/r", "").1["waiters"] == 1);
    let (st, _) = s.call("DELETE", &format!("/v1/leases/{a}"), "");
    assert_eq!(st, 204);
    let r = w.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(token(&r.json()) > token(&g));
}

#[test]
fn lock_delay_after_expiry_but_not_after_release() {
    let s = TestServer::start();
    let a = s.lease(150);
    let (st, _) = s.acquire("ld", &format!("{{\"lease_id\":\"{a}\",\"lock_delay_ms\":30000}}"));
    assert_eq!(st, 200);
    eventually(10, || s.call("GET", "/v1/locks/ld", "").1["held"] == false);
    let (_, v) = s.call("GET", "/v1/locks/ld", "");
    assert!(v["blocked_for_ms"].as_u64().unwrap() > 0, "{v}");
    let b = s.lease(30_000);
    let (st, e) = s.acquire("ld", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "{e}");
    // An explicit release leaves no lock-delay.
    s.acquire("ld2", &format!("{{\"lease_id\":\"{b}\",\"lock_delay_ms\":30000}}"));
    s.call("POST", "/v1/locks/ld2/release", &format!("{{\"lease_id\":\"{b}\"}}"));
    let c = s.lease(30_000);
    assert_eq!(s.acquire("ld2", &format!("{{\"lease_id\":\"{c}\"}}")).0, 200);
}

#[test]
fn fenced_store_fresh_stale_and_fenced_reads() {
    let s = TestServer::start();
    s.mint_tokens(40);
    let put = |key: &str, tok: Option<u64>, body: &str| {
        let t = tok.map(|t| t.to_string());
        let h: Vec<(&str, &str)> = t.iter().map(|t| ("Fencing-Token", t.as_str())).collect();
        s.request("PUT", &format!("/v1/store/{key}"), &h, body.as_bytes())
    };
    let get = |key: &str, tok: Option<u64>| {
        let t = tok.map(|t| t.to_string());
        let h: Vec<(&str, &str)> = t.iter().map(|t| ("Fencing-Token", t.as_str())).collect();
        s.request("GET", &format!("/v1/store/{key}"), &h, b"")
    };
    let r = put("k", Some(33), "a");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"key":"k","token":33,"highest_seen":33}));
    assert_eq!(put("k", Some(34), "b").status, 200);
    // Equal tokens pass: a holder writes many times.
    assert_eq!(put("k", Some(34), "c").status, 200);
    let r = put("k", Some(33), "zombie");
    let e = r.json();
    assert_eq!((r.status, e["error"]["code"].as_str()), (409, Some("stale_token")));
    assert_eq!((e["error"]["token"].as_u64(), e["error"]["highest_seen"].as_u64()), (Some(33), Some(34)));
    let r = put("k", None, "none");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (428, Some("token_required")));
    let r = get("k", None);
    assert_eq!((r.status, r.text().as_str(), r.header("fencing-highest-seen")), (200, "c", Some("34")));
    // A fenced read by a newer holder shuts the older one out before it writes.
    let r = get("k", Some(40));
    assert_eq!((r.status, r.text().as_str(), r.header("fencing-highest-seen")), (200, "c", Some("40")));
    let r = put("k", Some(34), "late");
    assert_eq!((r.status, r.json()["error"]["highest_seen"].as_u64()), (409, Some(40)));
    let r = get("k", Some(39));
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (409, Some("stale_token")));
    assert_eq!(get("k", None).text(), "c");
    let r = get("absent", None);
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (404, Some("not_found")));
    // Binary values round-trip.
    let r = s.request("PUT", "/v1/store/bin", &[("Fencing-Token", "1")], &[0, 159, 255, 10]);
    assert_eq!(r.status, 200);
    assert_eq!(get("bin", None).body, vec![0, 159, 255, 10]);
}

#[test]
fn store_keys_are_listed_with_their_marks() {
    let s = TestServer::start();
    s.mint_tokens(11);
    for (key, tok, body) in [("orders/2", "7", "bb"), ("orders/1", "5", "a"), ("jobs/1", "9", "ccc")] {
        assert_eq!(
            s.request("PUT", &format!("/v1/store/{key}"), &[("Fencing-Token", tok)], body.as_bytes()).status,
            200
        );
    }
    // A fenced read of a key never written still leaves a mark.
    assert_eq!(s.request("GET", "/v1/store/orders/3", &[("Fencing-Token", "11")], b"").status, 404);
    // A refused write changes nothing in the listing.
    assert_eq!(s.request("PUT", "/v1/store/orders/2", &[("Fencing-Token", "6")], b"zzzz").status, 409);
    let r = s.get("/v1/store?prefix=orders/");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        serde_json::json!({"keys": [
            {"key": "orders/1", "highest_seen": 5, "value_bytes": 1},
            {"key": "orders/2", "highest_seen": 7, "value_bytes": 2},
            {"key": "orders/3", "highest_seen": 11, "value_bytes": null},
        ]})
    );
    assert_eq!(s.get("/v1/store").json()["keys"].as_array().unwrap().len(), 4);
    assert_eq!(s.get("/v1/store?limit=1").json()["keys"][0]["key"], "jobs/1");
    for bad in ["/v1/store?limit=0", "/v1/store?limit=x", &format!("/v1/store?prefix={}", "p".repeat(5_000))] {
        let r = s.get(bad);
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_query")), "{bad}");
    }
}

#[test]
fn events_stream_grants_releases_expiries_and_store_outcomes() {
    let s = TestServer::start();
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(c, "GET /v1/events HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut reader = BufReader::new(c);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("200"), "{line}");
    // The subscription exists once the response head is out.
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    s.mint_tokens(5);
    let a = s.lease(150);
    s.acquire("ev", &format!("{{\"lease_id\":\"{a}\"}}"));
    s.request("PUT", "/v1/store/ek", &[("Fencing-Token", "5")], b"v");
    s.request("PUT", "/v1/store/ek", &[("Fencing-Token", "4")], b"v");
    let mut seen = Vec::new();
    let wanted = ["granted", "store_accepted", "store_rejected", "expired"];
    while !wanted.iter().all(|w| seen.iter().any(|s: &String| s == w)) {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "stream ended; saw {seen:?}");
        if let Some(kind) = line.trim().strip_prefix("event: ") {
            seen.push(kind.to_string());
        }
        assert!(!line.contains(&a), "a lease id leaked into the event stream");
    }
}

#[test]
fn health_metrics_index_and_openapi() {
    let s = TestServer::start();
    assert_eq!(s.get("/livez").status, 200);
    let r = s.get("/readyz");
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("ready")));
    let a = s.lease(10_000);
    s.acquire("m", &format!("{{\"lease_id\":\"{a}\"}}"));
    s.acquire("m2", &format!("{{\"lease_id\":\"{a}\"}}"));
    s.call("POST", &format!("/v1/leases/{a}/keepalive"), "");
    s.request("PUT", "/v1/store/m", &[("Fencing-Token", "2")], b"v");
    s.request("PUT", "/v1/store/m", &[("Fencing-Token", "1")], b"v");
    let m = s.get("/metrics").text();
    for needle in [
        "fenced_grants_total 2",
        "fenced_keepalives_total 1",
        "fenced_stale_writes_rejected_total 1",
        "fenced_leases 1",
        "fenced_waiters 0",
        "fenced_lease_expiries_total 0",
        "fenced_releases_total 0",
        "fenced_http_request_duration_seconds_count",
        // A single server is a cluster of one that leads: one leader seen, one voter.
        "fenced_raft_has_leader 1",
        "fenced_raft_is_leader 1",
        "fenced_raft_leader_changes_total 1",
        "fenced_raft_voters 1",
        "fenced_raft_log_commit_failures_total 0",
        "fenced_raft_log_commit_duration_seconds_bucket{le=\"+Inf\"}",
    ] {
        assert!(m.contains(needle), "metrics lack {needle}:\n{m}");
    }
    let value = |name: &str| -> f64 {
        let line = m.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name}"));
        line[name.len() + 1..].parse().expect("a number")
    };
    // Every acknowledged change is in the log, fsynced, and applied.
    assert!(value("fenced_raft_applied_index") >= 5.0, "{m}");
    assert!(value("fenced_raft_log_commit_duration_seconds_count") >= 5.0, "{m}");
    assert!(value("fenced_raft_log_entries_written_total") >= 5.0, "{m}");
    assert!(value("fenced_raft_term") >= 1.0 && value("fenced_raft_db_bytes") > 0.0, "{m}");
    assert_exposition_format(&m);
    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("/v1/locks") && page.text().contains("/metrics"));
    let doc: Value = s.get("/openapi.json").json();
    let config = fenced_server::Config { data_dir: s.dir.clone(), ..fenced_server::Config::default() };
    assert_eq!(serde_json::from_str::<Value>(&fenced_server::openapi_json(&config)).unwrap(), doc);
    for (method, path) in fenced_server::ROUTES {
        assert!(doc["paths"][path][method].is_object(), "openapi.json lacks {method} {path}");
    }
    let documented: usize = doc["paths"].as_object().unwrap().values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(documented, fenced_server::ROUTES.len(), "openapi.json documents a call the server does not have");
}

#[test]
fn bearer_auth_guards_v1_only() {
    let token_file = crate::harness::token_file("s3cret");
    let tf = token_file.clone();
    let s = TestServer::with(move |c| c.auth_token_file = Some(tf));
    let (st, e) = s.call("POST", "/v1/leases", "{\"ttl_ms\":1000}");
    assert_eq!((st, e["error"]["code"].as_str()), (401, Some("unauthorized")));
    let r = s.request("POST", "/v1/leases", &[("authorization", "Bearer wrong!")], b"{\"ttl_ms\":1000}");
    assert_eq!(r.status, 401);
    let r = s.request("GET", "/v1/locks", &[("authorization", "Bearer s3cret")], b"");
    assert_eq!(r.status, 200);
    let r = s.request("POST", "/v1/leases", &[("authorization", "Bearer s3cret")], b"{\"ttl_ms\":1000}");
    assert_eq!(r.status, 201);
    for open in ["/livez", "/readyz", "/metrics", "/openapi.json", "/"] {
        assert_eq!(s.get(open).status, 200, "{open} must stay open");
    }
    let _ = std::fs::remove_file(token_file);
}

#[test]
fn mutual_exclusion_under_contention_with_the_store_as_witness() {
    let s = TestServer::start();
    let addr = s.addr;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut tokens = Vec::new();
                for _ in 0..25 {
                    let r = crate::harness::request(
                        addr,
                        "POST",
                        "/v1/locks/mx/acquire",
                        &[],
                        b"{\"ttl_ms\":30000,\"wait_ms\":60000}",
                    );
                    let g = r.json();
                    assert_eq!(r.status, 200, "{g}");
                    let (t, lease) = (token(&g), g["lease_id"].as_str().unwrap().to_string());
                    // While we hold it, we are the holder and the newest writer.
                    let v = crate::harness::request(addr, "GET", "/v1/locks/mx", &[], b"").json();
                    assert_eq!(v["token"].as_u64(), Some(t), "{v}");
                    let ts = t.to_string();
                    let w =
                        crate::harness::request(addr, "PUT", "/v1/store/mx", &[("fencing-token", &ts)], ts.as_bytes());
                    assert_eq!(w.status, 200, "holder {t} refused: {}", w.text());
                    let rel = format!("{{\"lease_id\":\"{lease}\"}}");
                    let r = crate::harness::request(addr, "POST", "/v1/locks/mx/release", &[], rel.as_bytes());
                    assert_eq!(r.status, 200);
                    let r = crate::harness::request(addr, "DELETE", &format!("/v1/leases/{lease}"), &[], b"");
                    assert_eq!(r.status, 204);
                    tokens.push(t);
                }
                tokens
            })
        })
        .collect();
    let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a token was granted twice");
    assert_eq!(s.get("/v1/store/mx").text(), all.last().unwrap().to_string(), "the last holder wrote last");
    assert_eq!(s.call("GET", "/v1/locks/mx", "").1["held"], false);
}

/// The Prometheus text format as promtool checks it: every family announced once by
/// HELP and TYPE before its samples, sample names of the family (a histogram's
/// `_bucket`, `_sum`, `_count`), well-formed labels and a number for each value.
fn assert_exposition_format(text: &str) {
    use std::collections::{HashMap, HashSet};
    let mut kinds: HashMap<String, String> = HashMap::new();
    let mut helped: HashSet<String> = HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap().to_string();
            assert!(helped.insert(name.clone()), "HELP twice for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap().to_string(), parts.next().unwrap_or("").to_string());
            assert!(["counter", "gauge", "histogram"].contains(&kind.as_str()), "{line}");
            assert!(helped.contains(&name), "TYPE before HELP for {name}");
            assert!(kinds.insert(name.clone(), kind).is_none(), "TYPE twice for {name}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        assert!(value.parse::<f64>().is_ok(), "not a number in {line}");
        let name = series.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            for pair in labels[1..labels.len() - 1].split(',') {
                let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
                assert!(!k.is_empty() && v.starts_with('"') && v.ends_with('"'), "{line}");
            }
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| kinds.get(*f).is_some_and(|k| k == "histogram")))
            .unwrap_or(name);
        assert!(kinds.contains_key(family), "a sample before its TYPE: {line}");
        if kinds[family] == "counter" {
            assert!(name.ends_with("_total"), "a counter's name ends in _total: {line}");
        }
    }
}

/// issue 29: "who holds it?". A holder label given on acquire is shown in the lock's
/// views and in its `granted` event, kept by a queued waiter until its grant, kept in
/// the replicated state across a restart, and checked: a bad label is refused and
/// changes nothing.
#[test]
fn a_holder_label_is_shown_in_views_and_events_and_survives_a_restart() {
    let s = TestServer::start();
    let mut events = s.subscribe();
    let mut line = String::new();
    let (st, g) = s.acquire("job", r#"{"ttl_ms":60000,"holder":"billing-worker-3 on host-b"}"#);
    assert_eq!(st, 200, "{g}");
    let (_, v) = s.call("GET", "/v1/locks/job", "");
    assert_eq!(v["holder"].as_str(), Some("billing-worker-3 on host-b"), "{v}");
    let (_, list) = s.call("GET", "/v1/locks?prefix=jo", "");
    assert_eq!(list["locks"][0]["holder"].as_str(), Some("billing-worker-3 on host-b"), "{list}");
    let granted = loop {
        line.clear();
        assert!(events.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(data) = line.trim().strip_prefix("data: ") {
            break serde_json::from_str::<Value>(data).unwrap();
        }
    };
    assert_eq!(
        (granted["type"].as_str(), granted["holder"].as_str()),
        (Some("granted"), Some("billing-worker-3 on host-b"))
    );
    // Refused labels: empty, too long, with a control character; nothing is granted.
    for bad in ["\"\"".to_string(), format!("\"{}\"", "x".repeat(257)), "\"a\\nb\"".to_string()] {
        let (st, v) = s.acquire("other", &format!("{{\"ttl_ms\":1000,\"holder\":{bad}}}"));
        assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_holder")), "{bad}: {v}");
    }
    let (_, v) = s.call("GET", "/v1/locks/other", "");
    assert_eq!(v["held"], false, "a refused acquire took the lock: {v}");
    // A waiter's label is its own, shown once it is granted; a holder without one shows null.
    let waiter = {
        let addr = s.addr;
        std::thread::spawn(move || {
            let body = r#"{"ttl_ms":60000,"wait_ms":20000,"holder":"next"}"#;
            let r = crate::harness::request(addr, "POST", "/v1/locks/job/acquire", &[], body.as_bytes());
            (r.status, r.json())
        })
    };
    eventually(10, || s.call("GET", "/v1/locks/job", "").1["waiters"] == 1);
    let lease = g["lease_id"].as_str().unwrap();
    let (st, _) = s.call("POST", "/v1/locks/job/release", &format!("{{\"lease_id\":\"{lease}\"}}"));
    assert_eq!(st, 200);
    let (st, next) = waiter.join().unwrap();
    assert_eq!(st, 200, "{next}");
    let (_, v) = s.call("GET", "/v1/locks/job", "");
    assert_eq!(v["holder"].as_str(), Some("next"), "{v}");
    let (_, plain) = s.acquire("plain", r#"{"ttl_ms":60000}"#);
    let (_, v) = s.call("GET", "/v1/locks/plain", "");
    assert!(v["holder"].is_null() && v["token"] == plain["token"], "{v}");
    // Kept in the replicated state: after a restart the label is still there.
    let dir = s.stop();
    let s = TestServer::on(fenced_server::Config { data_dir: dir, ..Default::default() });
    let (_, v) = s.call("GET", "/v1/locks/job", "");
    assert_eq!((v["held"].as_bool(), v["holder"].as_str()), (Some(true), Some("next")), "{v}");
}
