//! `/openapi.json` against the server that serves it: the document is valid OpenAPI
//! 3.1 (checked by `openapi-spec-validator`, when it is installed), every bound it
//! states is the server's (a value at the bound is taken, one past it refused), and
//! every answer and event seen here fits the schema the document gives for it.

use std::io::BufRead;

use serde_json::{json, Value};

use crate::harness::{eventually, Resp, TestServer};

/// The validator: on the PATH, or in the virtual environment `.ci/run` makes.
fn validator() -> Option<std::path::PathBuf> {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-ci/bin/openapi-spec-validator");
    if venv.exists() {
        return Some(venv);
    }
    let ok =
        std::process::Command::new("openapi-spec-validator").arg("--help").output().is_ok_and(|o| o.status.success());
    ok.then(|| "openapi-spec-validator".into())
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let s = TestServer::start();
    let r = s.get("/openapi.json");
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/json")));
    let doc = r.json();
    assert_eq!(doc["openapi"], "3.1.0");
    // 3.0's keyword has no place in a 3.1 document: null is a type there.
    assert!(!r.text().contains("\"nullable\""), "a 3.0 keyword in a 3.1 document");
    let Some(validator) = validator() else {
        let why =
            "openapi-spec-validator is not installed (pip install openapi-spec-validator): document not validated";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    };
    let file = crate::harness::scratch_dir().with_extension("openapi.json");
    std::fs::write(&file, &r.body).unwrap();
    let out = std::process::Command::new(&validator).arg(&file).output().expect("the validator runs");
    let _ = std::fs::remove_file(&file);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openapi-spec-validator refused the document:\n{text}");
}

/// The document's bounds follow the configuration, and the server keeps to each:
/// at the bound taken, past it refused with 400.
#[test]
fn every_documented_bound_is_the_servers() {
    let s = TestServer::with(|c| {
        c.ttl_ms_max = 70_000;
        c.wait_ms_max = 4_000;
        c.lock_delay_ms_max = 3_000;
        c.lock_name_bytes_max = 40;
        c.store_key_bytes_max = 30;
        c.list_locks_max = 7;
    });
    let doc = s.get("/openapi.json").json();
    let schema = |name: &str| doc["components"]["schemas"][name].clone();
    let num = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a bound: {v}"));
    let ttl = &schema("LeaseRequest")["properties"]["ttl_ms"];
    let (ttl_min, ttl_max) = (num(&ttl["minimum"]), num(&ttl["maximum"]));
    assert_eq!((ttl_min, ttl_max), (100, 70_000), "the configured TTL range");
    assert_eq!(schema("LeaseRequest")["required"], json!(["ttl_ms"]));
    for (ttl, want) in [(ttl_min, 201), (ttl_max, 201), (ttl_min - 1, 400), (ttl_max + 1, 400)] {
        assert_eq!(s.call("POST", "/v1/leases", &format!("{{\"ttl_ms\":{ttl}}}")).0, want, "ttl_ms {ttl}");
    }
    let acquire = schema("AcquireRequest");
    for (field, bound) in [("wait_ms", 4_000), ("lock_delay_ms", 3_000)] {
        let max = num(&acquire["properties"][field]["maximum"]);
        assert_eq!(max, bound, "{field}");
        for (v, want) in [(max, 200), (max + 1, 400)] {
            let (st, b) = s.acquire(&format!("bound-{field}-{v}"), &format!("{{\"ttl_ms\":1000,\"{field}\":{v}}}"));
            assert_eq!(st, want, "{field} {v}: {b}");
        }
    }
    // lease_id, ttl_ms, or both, as the document's oneOf says; both name an implicit
    // lease, refused when the id is a live lease's.
    assert_eq!(s.acquire("bound-neither", "{}").0, 400);
    let lease = s.lease(10_000);
    let (st, e) = s.acquire("bound-both", &format!("{{\"lease_id\":\"{lease}\",\"ttl_ms\":1000}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lease_exists")), "{e}");
    let fresh = "0123456789abcdef0123456789abcdef";
    assert_eq!(s.acquire("bound-both", &format!("{{\"lease_id\":\"{fresh}\",\"ttl_ms\":1000}}")).0, 200);
    assert_eq!(s.acquire("bound-null", &format!("{{\"lease_id\":\"{lease}\",\"ttl_ms\":null}}")).0, 200);
    // Path and query parameters.
    let param = |path: &str, method: &str, name: &str| -> Value {
        let params = doc["paths"][path][method]["parameters"].as_array().unwrap_or_else(|| panic!("{method} {path}"));
        params.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{method} {path} lacks {name}")).clone()
    };
    let name_max = num(&param("/v1/locks/{name}/acquire", "post", "name")["schema"]["maxLength"]) as usize;
    assert_eq!(name_max, 40);
    assert_eq!(s.acquire(&"n".repeat(name_max), "{\"ttl_ms\":1000}").0, 200);
    assert_eq!(s.acquire(&"n".repeat(name_max + 1), "{\"ttl_ms\":1000}").0, 400);
    // maxLength counts characters, the server bytes: a name of two-byte characters at
    // maxLength is over the byte bound, a documented 400, and half as many fit.
    let e_acute = |n: usize| "%C3%A9".repeat(n);
    let (st, e) = s.acquire(&e_acute(name_max), "{\"ttl_ms\":1000}");
    assert_eq!((st, e["error"]["code"].as_str()), (400, Some("invalid_name")), "{e}");
    assert_eq!(s.acquire(&e_acute(name_max / 2), "{\"ttl_ms\":1000}").0, 200);
    let name_doc = param("/v1/locks/{name}/acquire", "post", "name");
    assert!(name_doc["description"].as_str().unwrap().contains("At most 40 bytes of UTF-8"), "{name_doc}");
    let prefix = param("/v1/locks", "get", "prefix");
    assert_eq!(num(&prefix["schema"]["maxLength"]), 40);
    assert!(prefix["schema"].get("pattern").is_none(), "an empty prefix is taken: {prefix}");
    assert_eq!(s.get("/v1/locks?prefix=").status, 200);
    assert_eq!(s.get(&format!("/v1/locks?prefix={}", "p".repeat(40))).status, 200);
    assert_eq!(s.get(&format!("/v1/locks?prefix={}", "p".repeat(41))).status, 400);
    let limit = param("/v1/locks", "get", "limit");
    let (lo, hi) = (num(&limit["schema"]["minimum"]), num(&limit["schema"]["maximum"]));
    assert_eq!((lo, hi), (1, 7));
    for (v, want) in [(lo, 200), (hi, 200), (lo - 1, 400), (hi + 1, 400)] {
        assert_eq!(s.get(&format!("/v1/locks?limit={v}")).status, want, "limit {v}");
        assert_eq!(s.get(&format!("/v1/store?limit={v}")).status, want, "store limit {v}");
    }
    // The store: the key's length, and Fencing-Token required on a PUT, any u64 >= 1.
    s.mint_tokens(1);
    let key_max = num(&param("/v1/store/{key}", "put", "key")["schema"]["maxLength"]) as usize;
    assert_eq!(key_max, 30);
    let token = param("/v1/store/{key}", "put", "Fencing-Token");
    assert_eq!(token["required"], true, "{token}");
    assert_eq!((num(&token["schema"]["minimum"]), num(&token["schema"]["maximum"])), (1, u64::MAX));
    let put = |key: &str, token: Option<&str>| {
        let headers: Vec<(&str, &str)> = token.map(|t| ("Fencing-Token", t)).into_iter().collect();
        s.request("PUT", &format!("/v1/store/{key}"), &headers, b"v").status
    };
    assert_eq!(put(&"k".repeat(key_max), Some("1")), 200);
    assert_eq!(put(&"k".repeat(key_max + 1), Some("1")), 400);
    assert_eq!(put(&"%C3%A9".repeat(key_max), Some("1")), 400, "two-byte characters at maxLength");
    assert_eq!(s.get(&format!("/v1/store/{}", "%C3%A9".repeat(key_max))).status, 400);
    assert_eq!(s.get(&format!("/v1/store?prefix={}", "%C3%A9".repeat(key_max))).status, 400);
    assert_eq!(s.get(&format!("/v1/locks?prefix={}", "%C3%A9".repeat(name_max))).status, 400);
    assert_eq!(put("k", None), 428, "no token");
    assert_eq!(put("k", Some("0")), 400, "below the minimum");
    // u64::MAX is a token the parser takes (never issued: 409), one more is not one.
    assert_eq!(put("k", Some(&u64::MAX.to_string())), 409);
    assert_eq!(put("k", Some("18446744073709551616")), 400);
    let check = &schema("CheckRequest")["properties"]["token"];
    assert_eq!((num(&check["minimum"]), num(&check["maximum"])), (1, u64::MAX), "{check}");
}

/// With `unfenced_prefix` set a PUT may come without a token: the document says so.
#[test]
fn fencing_token_is_optional_on_a_put_only_where_the_server_takes_one_without() {
    let s = TestServer::with(|c| c.unfenced_prefix = "demo/".into());
    let doc = s.get("/openapi.json").json();
    let params = doc["paths"]["/v1/store/{key}"]["put"]["parameters"].as_array().unwrap().clone();
    let token = params.iter().find(|p| p["name"] == "Fencing-Token").unwrap();
    assert_ne!(token["required"], true, "{token}");
    assert_eq!(s.request("PUT", "/v1/store/demo/x", &[], b"v").status, 200);
}

/// What schemathesis (4.32.5, 2026-12-06, seeds 20261206, 4242, 5150) built as valid
/// by the document and the server refused for its shape: an acquire of several
/// documented without the bounds of an acquire of one, a holder label with a control
/// character, a header that may be `null`, a body that may be JSON `null`. The
/// document now says what the server takes.
#[test]
fn the_document_admits_no_shape_the_server_refuses() {
    let s = TestServer::start();
    let doc = s.get("/openapi.json").json();
    let schema = |name: &str| doc["components"]["schemas"][name].clone();
    // An acquire of several: the bounds, the choice of lease and the names of one.
    let (one, all) = (schema("AcquireRequest"), schema("AcquireAllRequest"));
    for field in ["ttl_ms", "wait_ms", "lock_delay_ms"] {
        for bound in ["minimum", "maximum"] {
            let v = &all["properties"][field][bound];
            assert!(v.is_u64() && *v == one["properties"][field][bound], "{field} {bound}: {all}");
        }
    }
    assert!(all["oneOf"].is_array() && all["oneOf"] == one["oneOf"], "{all}");
    let params = doc["paths"]["/v1/locks/{name}/acquire"]["post"]["parameters"].as_array().unwrap();
    let name = &params.iter().find(|p| p["name"] == "name").unwrap()["schema"];
    let each = &all["properties"]["names"]["items"];
    for k in ["minLength", "maxLength", "pattern"] {
        assert!(!each[k].is_null() && each[k] == name[k], "names' {k}: {each} against {name}");
    }
    // A holder label, of one lock or several, is refused with a control character.
    for (schema, path, names) in [(&one, "/v1/locks/h1/acquire", ""), (&all, "/v1/locks/acquire", r#""names":["h2"],"#)]
    {
        assert_eq!(schema["properties"]["holder"]["pattern"], name["pattern"], "{schema}");
        let (st, e) = s.call("POST", path, &format!(r#"{{{names}"ttl_ms":1000,"holder":"a\u0007"}}"#));
        assert_eq!((st, e["error"]["code"].as_str()), (400, Some("invalid_holder")), "{path}: {e}");
    }
    let long = "n".repeat(257);
    for (body, want) in [
        (r#"{"names":["a1"],"ttl_ms":100,"wait_ms":300000,"lock_delay_ms":60000}"#.to_string(), 200),
        (r#"{"names":["a2"],"ttl_ms":99}"#.into(), 400),
        (r#"{"names":["a3"],"ttl_ms":300001}"#.into(), 400),
        (r#"{"names":["a4"],"ttl_ms":1000,"wait_ms":300001}"#.into(), 400),
        (r#"{"names":["a5"],"ttl_ms":1000,"lock_delay_ms":60001}"#.into(), 400),
        (r#"{"names":["a6"]}"#.into(), 400),
        (r#"{"names":[""],"ttl_ms":1000}"#.into(), 400),
        (r#"{"names":["a\u0085"],"ttl_ms":1000}"#.into(), 400),
        (format!(r#"{{"names":["{}"],"ttl_ms":1000}}"#, &long[..256]), 200),
        (format!(r#"{{"names":["{long}"],"ttl_ms":1000}}"#), 400),
    ] {
        let (st, e) = s.call("POST", "/v1/locks/acquire", &body);
        assert_eq!(st, want, "{body}: {e}");
    }
    // A header is never null: `Fencing-Token: null` is no token.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for p in op["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "header") {
                let types = p["schema"]["type"].as_array().cloned().unwrap_or_default();
                assert!(!types.contains(&json!("null")), "{method} {path}: {p}");
            }
        }
    }
    let r = s.request("GET", "/v1/store/k", &[("Fencing-Token", "null")], b"");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_token")));
    // A body of the lock service is never JSON null: "empty, or {}" is an optional body.
    for (path, item) in doc["paths"].as_object().unwrap().iter().filter(|(p, _)| !p.starts_with("/v1/sim")) {
        for (method, op) in item.as_object().unwrap() {
            let body = &op["requestBody"]["content"]["application/json"]["schema"];
            assert!(!body.to_string().contains(r#"{"type":"null"}"#), "{method} {path}: {body}");
        }
    }
    let lease = s.lease(10_000);
    let keepalive = format!("/v1/leases/{lease}/keepalive");
    let body = &doc["paths"]["/v1/leases/{lease_id}/keepalive"]["post"]["requestBody"];
    assert_ne!(body["required"], true, "{body}");
    assert_eq!(body["content"]["application/json"]["schema"], json!({ "$ref": "#/components/schemas/Empty" }));
    assert_eq!(s.request("POST", &keepalive, &[], b"").status, 200, "no body");
    assert_eq!(s.call("POST", &keepalive, "{}").0, 200);
    assert_eq!(s.call("POST", &keepalive, "null").0, 400);
    let body = &doc["paths"]["/v1/locks/{name}/revoke"]["post"]["requestBody"];
    assert_ne!(body["required"], true, "{body}");
    assert_eq!(body["content"]["application/json"]["schema"], json!({ "$ref": "#/components/schemas/RevokeRequest" }));
    assert_eq!(s.acquire("revoked", &format!("{{\"lease_id\":\"{lease}\"}}")).0, 200);
    assert_eq!(s.call("POST", "/v1/locks/revoked/revoke", "null").0, 400);
    assert_eq!(s.request("POST", "/v1/locks/revoked/revoke", &[], b"").status, 200, "no body");
}

/// Every answer and event a client sees fits the schema the document gives for it:
/// held and free lock views alike carry every required field, nulls where nullable.
#[test]
fn answers_and_events_fit_their_documented_schemas() {
    let s = TestServer::start();
    let doc = s.get("/openapi.json").json();
    let mut events = s.subscribe();
    let mut line = String::new();
    let fits = |method: &str, path: &str, r: &Resp| {
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        let answer = &op["responses"][r.status.to_string()];
        assert!(answer.is_object(), "{method} {path}: status {} is not documented: {}", r.status, r.text());
        let Some(schema) = answer["content"]["application/json"].get("schema") else { return };
        if let Err(e) = conforms(&doc, &r.json(), schema) {
            panic!("{method} {path} {}: {e}\n{}", r.status, r.text());
        }
    };
    let call = |method: &str, path: &str, doc_path: &str, headers: &[(&str, &str)], body: &str| {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        let r = s.request(method, path, &h, body.as_bytes());
        fits(method, doc_path, &r);
        r
    };
    let lease = call("POST", "/v1/leases", "/v1/leases", &[], "{\"ttl_ms\":300}").json()["lease_id"].clone();
    let lease = lease.as_str().unwrap().to_string();
    call("POST", &format!("/v1/leases/{lease}/keepalive"), "/v1/leases/{lease_id}/keepalive", &[], "");
    let acquire = "/v1/locks/{name}/acquire";
    let by_lease = format!("{{\"lease_id\":\"{lease}\"}}");
    let g = call("POST", "/v1/locks/a/acquire", acquire, &[], &by_lease).json();
    call("POST", "/v1/locks/a/acquire", acquire, &[], "{\"ttl_ms\":1000}"); // 409 lock_held
    call("POST", "/v1/locks/a/acquire", acquire, &[], "{\"ttl_ms\":1}"); // 400
    call("GET", "/v1/locks/a", "/v1/locks/{name}", &[], ""); // held
    call("GET", "/v1/locks/free", "/v1/locks/{name}", &[], ""); // free: nulls
    call("GET", "/v1/locks", "/v1/locks", &[], "");
    call("POST", "/v1/locks/a/check", "/v1/locks/{name}/check", &[], &format!("{{\"token\":{}}}", g["token"]));
    call("POST", "/v1/locks/free/check", "/v1/locks/{name}/check", &[], "{\"token\":1}");
    let t = g["token"].to_string();
    call("PUT", "/v1/store/k", "/v1/store/{key}", &[("fencing-token", &t)], "v");
    call("PUT", "/v1/store/k", "/v1/store/{key}", &[], "v"); // 428
    call("GET", "/v1/store", "/v1/store", &[], "");
    call("POST", "/v1/locks/a/release", "/v1/locks/{name}/release", &[], &by_lease);
    s.mint_tokens(g["token"].as_u64().unwrap() + 1);
    let newer = (g["token"].as_u64().unwrap() + 1).to_string();
    call("PUT", "/v1/store/k", "/v1/store/{key}", &[("fencing-token", &newer)], "new");
    call("PUT", "/v1/store/k", "/v1/store/{key}", &[("fencing-token", &t)], "old"); // 409 stale
    call("DELETE", &format!("/v1/leases/{lease}"), "/v1/leases/{lease_id}", &[], "");
    call("GET", "/readyz", "/readyz", &[], "");
    call("GET", "/livez", "/livez", &[], "");
    call("GET", "/v1/cluster", "/v1/cluster", &[], "");
    // An implicit lease expires: the expired event.
    call("POST", "/v1/locks/e/acquire", acquire, &[], "{\"ttl_ms\":100}");
    let event_schema = &doc["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"];
    let mut seen = std::collections::BTreeSet::new();
    eventually(10, || {
        line.clear();
        if events.read_line(&mut line).is_err() {
            return false;
        }
        if let Some(data) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data.trim()).unwrap();
            if let Err(e) = conforms(&doc, &v, event_schema) {
                panic!("event {v} does not fit /v1/events' schema: {e}");
            }
            seen.insert(v["type"].as_str().unwrap_or("?").to_string());
        }
        ["granted", "released", "expired", "store_accepted", "store_rejected"].iter().all(|k| seen.contains(*k))
    });
}

/// A small JSON Schema check, enough for the document's own schemas: `$ref`, `oneOf`,
/// `type` (one or several), `enum`, `required`, `properties`, `additionalProperties:
/// false`, `items`, `minimum`, `maximum`.
fn conforms(doc: &Value, v: &Value, schema: &Value) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let target = doc.pointer(r.trim_start_matches('#')).ok_or_else(|| format!("no {r}"))?;
        return conforms(doc, v, target);
    }
    if let Some(all) = schema["allOf"].as_array() {
        for s in all {
            conforms(doc, v, s)?;
        }
    }
    if let Some(one) = schema["oneOf"].as_array() {
        let fit = one.iter().filter(|s| conforms(doc, v, s).is_ok()).count();
        if fit != 1 {
            let why: Vec<String> = one.iter().filter_map(|s| conforms(doc, v, s).err()).collect();
            return Err(format!("{v} fits {fit} of oneOf's {} schemas: {why:?}", one.len()));
        }
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let type_of = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if !types.is_empty() && !types.iter().any(|t| *t == type_of || (*t == "number" && type_of == "integer")) {
        return Err(format!("{v} is {type_of}, not {types:?}"));
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(v) {
            return Err(format!("{v} is not one of {values:?}"));
        }
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_f64(), v.as_f64()) {
        if n < min {
            return Err(format!("{v} is below {min}"));
        }
    }
    if let (Some(max), Some(n)) = (schema["maximum"].as_f64(), v.as_f64()) {
        if n > max {
            return Err(format!("{v} is above {max}"));
        }
    }
    if let Value::Object(o) = v {
        for r in schema["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap_or_default();
            if !o.contains_key(r) {
                return Err(format!("{v} lacks required {r}"));
            }
        }
        let props = schema["properties"].as_object();
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(s) => conforms(doc, x, s).map_err(|e| format!("{k}: {e}"))?,
                None if schema["additionalProperties"] == false => return Err(format!("{v}: {k} is not documented")),
                None => {}
            }
        }
    }
    if let (Value::Array(a), Some(items)) = (v, schema.get("items")) {
        for x in a {
            conforms(doc, x, items)?;
        }
    }
    Ok(())
}
