//! Bad input of every class: 400 with a code and a message, never a 500, and nothing
//! changes.

use crate::harness::TestServer;

/// Asserts a 400 with `code` and a message.
fn bad(s: &TestServer, method: &str, path: &str, body: &str, code: &str) {
    let (st, e) = s.call(method, path, body);
    assert_eq!(st, 400, "{method} {path} {body}: {e}");
    assert_eq!(e["error"]["code"], code, "{method} {path} {body}: {e}");
    assert!(!e["error"]["message"].as_str().unwrap_or("").is_empty());
}

#[test]
fn malformed_json_wrong_types_unknown_fields() {
    let s = TestServer::start();
    let lease = s.lease(10_000);
    for body in ["{\"ttl_ms\":", "not json", "{\"ttl_ms\":1000,}", "[", "\u{0}"] {
        bad(&s, "POST", "/v1/leases", body, "invalid_json");
    }
    for body in [
        "{\"ttl_ms\":\"1000\"}",
        "{\"ttl_ms\":1000.5}",
        "{\"ttl_ms\":true}",
        "{\"ttl_ms\":null}",
        "{\"ttl_ms\":1000,\"extra\":1}",
        "{\"ttl\":1000}",
        "[1000]",
        "1000",
    ] {
        bad(&s, "POST", "/v1/leases", body, "invalid_field");
    }
    let acquire = "/v1/locks/x/acquire";
    bad(&s, "POST", acquire, &format!("{{\"lease_id\":\"{lease}\",\"wait\":5}}"), "invalid_field");
    bad(&s, "POST", acquire, &format!("{{\"lease_id\":\"{lease}\",\"wait_ms\":\"5\"}}"), "invalid_field");
    bad(&s, "POST", acquire, "{}", "invalid_field");
    bad(&s, "POST", acquire, "{\"lease_id\":\"nothex\",\"ttl_ms\":1000}", "invalid_lease_id");
    // A caller-named implicit lease is a capability: an id plainly not drawn at random
    // (one digit, a short cycle) is refused, so two callers cannot share it by accident.
    for weak in ["00000000000000000000000000000000", "12341234123412341234123412341234"] {
        bad(&s, "POST", acquire, &format!("{{\"lease_id\":\"{weak}\",\"ttl_ms\":1000}}"), "invalid_lease_id");
    }
    // Both name an implicit lease; a live explicit lease's id is refused, changing nothing.
    let (st, e) = s.call("POST", acquire, &format!("{{\"lease_id\":\"{lease}\",\"ttl_ms\":1000}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lease_exists")), "{e}");
    bad(&s, "POST", "/v1/locks/x/release", "{}", "invalid_field");
    bad(&s, "POST", "/v1/locks/x/check", "{\"token\":\"1\"}", "invalid_field");
    bad(&s, "POST", &format!("/v1/leases/{lease}/keepalive"), "{\"x\":1}", "invalid_field");
    assert_eq!(s.call("GET", "/v1/locks", "").1["locks"].as_array().unwrap().len(), 0, "nothing changed");
}

#[test]
fn negative_and_absurd_numbers() {
    let s = TestServer::start();
    let lease = s.lease(10_000);
    for body in ["{\"ttl_ms\":-1}", "{\"ttl_ms\":99999999999999999999999}", "{\"ttl_ms\":1e30}"] {
        bad(&s, "POST", "/v1/leases", body, "invalid_field");
    }
    bad(&s, "POST", "/v1/leases", "{\"ttl_ms\":0}", "ttl_out_of_range");
    bad(&s, "POST", "/v1/leases", "{\"ttl_ms\":18446744073709551615}", "ttl_out_of_range");
    let acquire = "/v1/locks/x/acquire";
    bad(&s, "POST", acquire, &format!("{{\"lease_id\":\"{lease}\",\"wait_ms\":-5}}"), "invalid_field");
    bad(
        &s,
        "POST",
        acquire,
        &format!("{{\"lease_id\":\"{lease}\",\"wait_ms\":18446744073709551615}}"),
        "wait_out_of_range",
    );
    bad(
        &s,
        "POST",
        acquire,
        &format!("{{\"lease_id\":\"{lease}\",\"lock_delay_ms\":18446744073709551615}}"),
        "lock_delay_out_of_range",
    );
    bad(&s, "POST", acquire, "{\"ttl_ms\":18446744073709551615}", "ttl_out_of_range");
    bad(&s, "POST", "/v1/locks/x/check", "{\"token\":0}", "invalid_token");
    bad(&s, "POST", "/v1/locks/x/check", "{\"token\":-3}", "invalid_field");
    for t in ["0", "-1", "abc", "18446744073709551616", ""] {
        let r = s.request("PUT", "/v1/store/k", &[("Fencing-Token", t)], b"v");
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_token")), "token {t:?}");
    }
    assert_eq!(s.get("/v1/store/k").status, 404, "nothing was written");
    let r = s.get("/v1/locks?limit=0");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_query")));
    let r = s.get("/v1/locks?limit=-1");
    assert_eq!(r.status, 400);
}

#[test]
fn empty_and_bad_names_and_lease_ids() {
    let s = TestServer::start();
    let lease = s.lease(10_000);
    let body = format!("{{\"lease_id\":\"{lease}\"}}");
    bad(&s, "POST", "/v1/locks/%0A/acquire", &body, "invalid_name");
    bad(&s, "GET", "/v1/locks/a%00b", "", "invalid_name");
    // An empty name: the path has nothing between the slashes.
    let (st, _) = s.call("POST", "/v1/locks//acquire", &body);
    assert!(st == 400 || st == 404, "empty name: {st}");
    for id in ["abc", "zz2f6d0b8f8e4a1c9d3b7e5f1a2c4e6d", "0123456789abcdef0123456789abcdef00", ""] {
        bad(&s, "POST", "/v1/locks/x/acquire", &format!("{{\"lease_id\":\"{id}\"}}"), "invalid_lease_id");
        bad(&s, "POST", "/v1/locks/x/release", &format!("{{\"lease_id\":\"{id}\"}}"), "invalid_lease_id");
    }
    bad(&s, "POST", "/v1/leases/not-a-lease/keepalive", "", "invalid_lease_id");
    bad(&s, "DELETE", "/v1/leases/not-a-lease", "", "invalid_lease_id");
    // A well-formed id nobody holds.
    let (st, e) = s.call("POST", "/v1/leases/0123456789abcdef0123456789abcdef/keepalive", "");
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("lease_not_found")));
    bad(&s, "PUT", "/v1/store/%07", "", "invalid_key");
    // Unknown routes and methods answer JSON errors too.
    let (st, e) = s.call("GET", "/v1/nope", "");
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("not_found")));
    let (st, e) = s.call("POST", "/v1/locks/x/frobnicate", &body);
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("not_found")));
    let (st, e) = s.call("PATCH", "/v1/leases", "");
    assert_eq!((st, e["error"]["code"].as_str()), (405, Some("method_not_allowed")));
}
