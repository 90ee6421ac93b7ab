//! issue 29: several locks at once (`POST /v1/locks/acquire`): all or nothing, a token
//! per name, bad input refused changing nothing, the lock right needed on every name,
//! and a waiter for a set granted as soon as its last lock is free.

use std::time::Duration;

use serde_json::Value;

use crate::harness::TestServer;

fn all(s: &TestServer, body: &str) -> (u16, Value) {
    s.call("POST", "/v1/locks/acquire", body)
}

fn code(r: &(u16, Value)) -> (u16, &str) {
    (r.0, r.1["error"]["code"].as_str().unwrap_or(""))
}

#[test]
fn a_set_is_granted_together_with_a_token_each_or_not_at_all() {
    let s = TestServer::start();
    let (st, g) = all(&s, r#"{"names":["m/b","m/a","m/c"],"ttl_ms":10000,"holder":"job-7"}"#);
    assert_eq!(st, 200, "{g}");
    let grants = g["grants"].as_array().unwrap();
    let names: Vec<&str> = grants.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["m/a", "m/b", "m/c"], "sorted");
    let tokens: Vec<u64> = grants.iter().map(|g| g["token"].as_u64().unwrap()).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let lease = g["lease_id"].as_str().unwrap();
    assert!(grants.iter().all(|g| g["lease_id"] == lease), "one lease: {g}");
    let view = s.call("GET", "/v1/locks/m/b", "").1;
    assert_eq!((view["token"].as_u64(), view["holder"].as_str()), (Some(tokens[1]), Some("job-7")), "{view}");
    // One of the set held elsewhere: nothing of the new set is taken.
    let other = s.lease(10_000);
    let refused = all(&s, &format!(r#"{{"names":["m/c","m/z"],"lease_id":"{other}"}}"#));
    assert_eq!(code(&refused), (409, "lock_held"), "{}", refused.1);
    assert_eq!(refused.1["error"]["holder_token"].as_u64(), Some(tokens[2]));
    assert_eq!(s.call("GET", "/v1/locks/m/z", "").1["held"], false, "m/z untouched");
    // Ending the lease frees every lock of the set; then the same set is granted above.
    assert_eq!(s.call("DELETE", &format!("/v1/leases/{lease}"), "").0, 204);
    let again = all(&s, &format!(r#"{{"names":["m/c","m/z"],"lease_id":"{other}"}}"#));
    assert_eq!(again.0, 200, "{}", again.1);
    assert!(again.1["grants"][0]["token"].as_u64().unwrap() > tokens[2]);
}

#[test]
fn bad_sets_are_refused_with_a_code_and_change_nothing() {
    let s = TestServer::start();
    let lease = s.lease(10_000);
    let names = |n: usize| (0..n).map(|i| format!("\"b/{i}\"")).collect::<Vec<_>>().join(",");
    for (body, want) in [
        (r#"{"names":[],"ttl_ms":1000}"#.to_string(), (400, "invalid_names")),
        (format!(r#"{{"names":[{}],"ttl_ms":1000}}"#, names(65)), (400, "invalid_names")),
        (r#"{"names":["ok",""],"ttl_ms":1000}"#.to_string(), (400, "invalid_name")),
        (r#"{"names":["ok","a\u0001"],"ttl_ms":1000}"#.to_string(), (400, "invalid_name")),
        (r#"{"names":"ok","ttl_ms":1000}"#.to_string(), (400, "invalid_field")),
        (r#"{"names":["ok"]}"#.to_string(), (400, "invalid_field")),
        (r#"{"names":["ok"],"ttl_ms":1000,"extra":1}"#.to_string(), (400, "invalid_field")),
        (r#"{"names":["ok"],"ttl_ms":1000,"holder":""}"#.to_string(), (400, "invalid_holder")),
        (r#"{"names":["ok"],"ttl_ms":1000,"wait_ms":999999999}"#.to_string(), (400, "wait_out_of_range")),
        (format!(r#"{{"names":["ok"],"lease_id":"{}"}}"#, "ab".repeat(16)), (404, "lease_not_found")),
        ("{\"names\":[\"ok\"],".to_string(), (400, "invalid_json")),
    ] {
        let r = all(&s, &body);
        assert_eq!(code(&r), want, "{body}: {}", r.1);
    }
    // 64 names is the limit, and it is allowed.
    let r = all(&s, &format!(r#"{{"names":[{}],"lease_id":"{lease}"}}"#, names(64)));
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["grants"].as_array().unwrap().len(), 64);
    let listed = s.call("GET", "/v1/locks?prefix=ok", "").1;
    assert_eq!(listed["locks"].as_array().unwrap().len(), 0, "nothing of the refused sets was taken: {listed}");
}

#[test]
fn a_waiting_set_is_granted_when_its_last_lock_is_freed_and_single_waiters_queue_behind_it() {
    let s = TestServer::start();
    let holder = s.lease(30_000);
    assert_eq!(s.acquire("w/b", &format!(r#"{{"lease_id":"{holder}"}}"#)).0, 200);
    let addr = s.addr;
    let set = std::thread::spawn(move || {
        let body = r#"{"names":["w/a","w/b"],"ttl_ms":10000,"wait_ms":20000}"#;
        crate::harness::post_json(addr, "/v1/locks/acquire", body)
    });
    crate::harness::eventually(5, || s.call("GET", "/v1/locks/w/b", "").1["waiters"].as_u64() == Some(1));
    // A single waiter for w/a comes after the set: w/a is free, yet it waits.
    let single = std::thread::spawn(move || {
        crate::harness::post_json(addr, "/v1/locks/w/a/acquire", r#"{"ttl_ms":10000,"wait_ms":20000}"#)
    });
    crate::harness::eventually(5, || s.call("GET", "/v1/locks/w/a", "").1["waiters"].as_u64() == Some(2));
    std::thread::sleep(Duration::from_millis(300));
    let a = s.call("GET", "/v1/locks/w/a", "").1;
    assert!(a["token"].is_null(), "w/a stays free for the set, not given to the later single waiter: {a}");
    assert_eq!(s.call("POST", "/v1/locks/w/b/release", &format!(r#"{{"lease_id":"{holder}"}}"#)).0, 200);
    let granted = set.join().unwrap();
    assert_eq!(granted.status, 200, "{}", granted.text());
    let g = granted.json();
    let set_lease = g["lease_id"].as_str().unwrap().to_string();
    let a_token = g["grants"][0]["token"].as_u64().unwrap();
    assert_eq!(s.call("DELETE", &format!("/v1/leases/{set_lease}"), "").0, 204);
    let after = single.join().unwrap();
    assert_eq!(after.status, 200, "{}", after.text());
    assert!(after.json()["token"].as_u64().unwrap() > a_token, "the single waiter came next, above the set");
}
