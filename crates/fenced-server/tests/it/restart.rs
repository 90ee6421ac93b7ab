//! Restarts on the same data directory: tokens only go up, acknowledged store writes
//! stay, and the start-up grace follows what the previous run left. (The kill -9 test
//! is in the `fenced` binary's tests.)

use fenced_server::Config;

use crate::harness::TestServer;

#[test]
fn clean_restart_without_leases_has_no_grace_and_keeps_state() {
    let s = TestServer::start();
    let a = s.lease(60_000);
    let (_, g) = s.acquire("x", &format!("{{\"lease_id\":\"{a}\"}}"));
    let t1 = g["token"].as_u64().unwrap();
    assert_eq!(s.request("PUT", "/v1/store/k", &[("Fencing-Token", &t1.to_string())], b"kept").status, 200);
    s.call("DELETE", &format!("/v1/leases/{a}"), "");
    let dir = s.stop();

    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    assert_eq!(s.get("/readyz").json()["recovering"], false);
    let b = s.lease(1_000);
    let (st, g) = s.acquire("x", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!(st, 200, "no live lease at the clean shutdown: no grace: {g}");
    assert!(g["token"].as_u64().unwrap() > t1);
    let r = s.get("/v1/store/k");
    assert_eq!((r.text().as_str(), r.header("fencing-highest-seen")), ("kept", Some(t1.to_string().as_str())));
}

#[test]
fn restart_with_a_live_lease_grants_nothing_during_the_grace() {
    let s = TestServer::start();
    let a = s.lease(60_000);
    let (_, g) = s.acquire("held", &format!("{{\"lease_id\":\"{a}\"}}"));
    let t1 = g["token"].as_u64().unwrap();
    let dir = s.stop();

    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    let ready = s.get("/readyz").json();
    assert_eq!(ready["recovering"], true, "{ready}");
    let b = s.lease(1_000);
    let (st, e) = s.acquire("held", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (503, Some("recovering")), "{e}");
    assert!(e["error"]["retry_after_ms"].as_u64().unwrap() > 0);
    // A lock nobody held is held back too: the server cannot know which were held.
    let (st, _) = s.acquire("other", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!(st, 503);
    // A waiting acquire queues instead of failing.
    let (st, e) = s.acquire("held", &format!("{{\"lease_id\":\"{b}\",\"wait_ms\":100}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "{e}");
    // The store still works during the grace, and tokens stay above the old ones.
    let r = s.request("PUT", "/v1/store/k", &[("Fencing-Token", &t1.to_string())], b"v");
    assert_eq!(r.status, 200);
}

#[test]
fn grace_ends_and_queued_acquires_are_granted() {
    let s = TestServer::start();
    let a = s.lease(300);
    s.acquire("g", &format!("{{\"lease_id\":\"{a}\"}}"));
    let dir = s.stop();
    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    let b = s.lease(10_000);
    // Queued through the grace (at most 300 ms), then granted.
    let (st, g) = s.acquire("g", &format!("{{\"lease_id\":\"{b}\",\"wait_ms\":30000}}"));
    assert_eq!(st, 200, "{g}");
    assert_eq!(s.get("/readyz").json()["recovering"], false);
}

#[test]
fn tokens_cross_many_ceilings_and_stay_above_them_after_a_restart() {
    let s = TestServer::with(|c| c.token_block = 3);
    let a = s.lease(60_000);
    let mut last = 0;
    for i in 0..20 {
        let (st, g) = s.acquire(&format!("c{i}"), &format!("{{\"lease_id\":\"{a}\"}}"));
        assert_eq!(st, 200);
        let t = g["token"].as_u64().unwrap();
        assert!(t > last);
        last = t;
    }
    s.call("DELETE", &format!("/v1/leases/{a}"), "");
    let dir = s.stop();
    let s = TestServer::on(Config { data_dir: dir, token_block: 3, ..Config::default() });
    let (_, g) = s.acquire("after", "{\"ttl_ms\":1000}");
    let t = g["token"].as_u64().unwrap();
    assert!(t > last, "{t} after restart, {last} before");
    // The restart skips at most what the last block reserved, plus the start-up block.
    assert!(t <= last + 3 + 3, "{t} after restart, {last} before");
}
