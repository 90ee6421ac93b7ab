//! The console's document against the routes it describes: every bound it states is
//! the one the routes keep (at the bound taken, past it 400), and the answers carry
//! the fields their schemas require.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;

async fn call(app: &Router, path: &str, body: &Value) -> (StatusCode, Value) {
    let req = Request::post(path).body(Body::from(body.to_string())).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).expect("JSON body"))
}

/// Every numeric bound of both request schemas, on routes with non-default limits: a
/// value at the bound is taken, one past it is 400 naming the field.
#[tokio::test]
async fn every_documented_bound_is_the_routes() {
    let limits = Limits { clients_max: 7, duration_ms_max: 90_000, ..Limits::default() };
    let app: Router = crate::api_with(limits);
    let doc = openapi_with(&limits);
    let mut checked = 0;
    // Small runs, so that the values at the bounds run quickly.
    for (path, schema, base) in [
        ("/v1/sim/runs", "SimRunRequest", json!({ "duration_ms": 1, "clients": 1 })),
        (
            "/v1/sim/sweeps",
            "SimSweepRequest",
            json!({ "duration_ms": 1, "clients": 1, "seeds": [1, 1], "leases": [1] }),
        ),
    ] {
        let props = doc["components"]["schemas"][schema]["properties"].as_object().unwrap();
        for (field, s) in props {
            for (bound, step) in
                [("minimum", -1.0), ("maximum", 1.0), ("exclusiveMinimum", 0.0), ("exclusiveMaximum", 0.0)]
            {
                let Some(b) = s[bound].as_f64() else { continue };
                let integer = s["type"].as_array().is_some_and(|t| t.contains(&json!("integer")));
                // A renew fraction needs a scenario that renews.
                let mut body = base.clone();
                if field == "renew_fraction" {
                    body["scenario"] = json!("renewal");
                }
                if step != 0.0 {
                    body[field] = if integer { json!(b as u64) } else { json!(b) };
                    let (st, v) = call(&app, path, &body).await;
                    assert_eq!(st, StatusCode::OK, "{path} {field} = {bound} {b}: {v}");
                }
                let past = b + step;
                if past < 0.0 && integer {
                    continue; // an unsigned field: below 0 is not a number it has
                }
                body[field] = if integer && step != 0.0 { json!(past as u64) } else { json!(past) };
                let (st, v) = call(&app, path, &body).await;
                assert_eq!(st, StatusCode::BAD_REQUEST, "{path} {field} past its {bound} {b}: {v}");
                checked += 1;
            }
        }
    }
    // clients, duration_ms (both requests), lease_ms (both), renew_fraction (2),
    // lock_delay_ms: every bound there is.
    assert_eq!(checked, 2 * 4 + 2 * 2 + 2 + 1, "bounds checked");
    let runs = &doc["components"]["schemas"]["SimRunRequest"]["properties"];
    assert_eq!((&runs["clients"]["maximum"], &runs["duration_ms"]["maximum"]), (&json!(7), &json!(90_000)));
}

/// The lists' bounds (sweeps): lengths and items.
#[tokio::test]
async fn the_sweep_lists_bounds_are_the_routes() {
    let app: Router = crate::api();
    let doc = openapi();
    let props = &doc["components"]["schemas"]["SimSweepRequest"]["properties"];
    let base = json!({ "duration_ms": 1, "clients": 1, "seeds": [1, 1] });
    for (field, over) in [("leases", "lease"), ("values", "lock-delay")] {
        let s = &props[field];
        let (lo, hi) = (s["items"]["minimum"].as_u64().unwrap(), s["items"]["maximum"].as_u64().unwrap());
        let n = s["maxItems"].as_u64().unwrap() as usize;
        assert_eq!(s["minItems"], 1, "{field}");
        let mut body = base.clone();
        body["over"] = json!(over);
        for (list, want) in [
            (vec![lo; n], StatusCode::OK),
            (vec![hi], StatusCode::OK),
            (vec![lo; n + 1], StatusCode::BAD_REQUEST),
            (vec![], StatusCode::BAD_REQUEST),
            (vec![hi + 1], StatusCode::BAD_REQUEST),
        ] {
            body[field] = json!(list);
            let (st, v) = call(&app, "/v1/sim/sweeps", &body).await;
            assert_eq!(st, want, "{field} {list:?}: {v}");
        }
        if lo > 0 {
            body[field] = json!([lo - 1]);
            assert_eq!(call(&app, "/v1/sim/sweeps", &body).await.0, StatusCode::BAD_REQUEST, "{field} below");
        }
    }
    // A list the knob does not read is refused (schemathesis sent an empty `values`
    // with the lease knob, and it was taken).
    for body in [
        json!({ "duration_ms": 1, "clients": 1, "seeds": [1, 1], "leases": [1], "values": [] }),
        json!({ "duration_ms": 1, "clients": 1, "seeds": [1, 1], "over": "lock-delay", "values": [0], "leases": [] }),
    ] {
        let (st, v) = call(&app, "/v1/sim/sweeps", &body).await;
        assert_eq!((st, v["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("bad_parameter")), "{body}: {v}");
    }
    assert_eq!((&props["seeds"]["minItems"], &props["seeds"]["maxItems"]), (&json!(2), &json!(2)));
    for seeds in [json!([1]), json!([1, 2, 3]), json!([2, 1])] {
        let body = json!({ "duration_ms": 1, "clients": 1, "leases": [1], "seeds": seeds });
        assert_eq!(call(&app, "/v1/sim/sweeps", &body).await.0, StatusCode::BAD_REQUEST, "seeds {seeds}");
    }
}

/// Every name a field's enum lists is taken, and the enums are the simulator's lists.
#[tokio::test]
async fn every_listed_name_is_taken() {
    let app: Router = crate::api();
    let doc = openapi();
    let props = &doc["components"]["schemas"]["SimRunRequest"]["properties"];
    for field in ["scenario", "pauses", "clock", "replication"] {
        let names = props[field]["enum"].as_array().unwrap_or_else(|| panic!("{field} has no enum"));
        assert!(names.contains(&Value::Null), "{field}: null is its default");
        for name in names.iter().filter(|n| !n.is_null()) {
            // Each name with what it needs to run.
            let mut body = json!({ "duration_ms": 1, "clients": 1, field: name });
            if field == "replication" {
                body["scenario"] = json!("split-brain");
            }
            let (st, v) = call(&app, "/v1/sim/runs", &body).await;
            assert_eq!(st, StatusCode::OK, "{body}: {v}");
        }
        let (st, _) = call(&app, "/v1/sim/runs", &json!({ field: "no-such-name" })).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{field}");
    }
    let over = &doc["components"]["schemas"]["SimSweepRequest"]["properties"]["over"]["enum"];
    assert_eq!(over, &json!(["lease", "lock-delay", "clock-step", null]));
}

/// Every scenario's answer has what the answer's schema requires.
#[tokio::test]
async fn answers_carry_their_required_fields() {
    let app: Router = crate::api();
    let doc = openapi();
    let run = &doc["components"]["schemas"]["SimRun"]["properties"];
    let summary_required = run["summary"]["required"].as_array().unwrap().clone();
    let record_required = run["trace"]["items"]["required"].as_array().unwrap().clone();
    for sc in Scenario::ALL {
        let (st, v) = call(&app, "/v1/sim/runs", &json!({ "scenario": sc.name(), "duration_ms": 5_000 })).await;
        assert_eq!(st, StatusCode::OK, "{}: {v}", sc.name());
        let run = &v["runs"][0];
        for f in &summary_required {
            assert!(run["summary"].get(f.as_str().unwrap()).is_some(), "{}: the summary lacks {f}", sc.name());
        }
        let trace = run["trace"].as_array().unwrap();
        assert!(!trace.is_empty(), "{}", sc.name());
        for r in trace {
            for f in &record_required {
                assert!(r.get(f.as_str().unwrap()).is_some(), "{}: {r} lacks {f}", sc.name());
            }
        }
    }
    let (st, v) =
        call(&app, "/v1/sim/sweeps", &json!({ "seeds": [1, 2], "leases": [1, 2], "duration_ms": 5_000 })).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let required = doc["components"]["schemas"]["SimSweep"]["properties"]["rows"]["items"]["required"].clone();
    for row in v["rows"].as_array().unwrap() {
        for f in required.as_array().unwrap() {
            assert!(row.get(f.as_str().unwrap()).is_some(), "{row} lacks {f}");
        }
    }
}

/// Every number the run request's schema gives as a field's default ("(default: N)")
/// is what a run of an empty request ran with: the text is written by hand, so this
/// keeps it from drifting from the simulator's defaults.
#[tokio::test]
async fn every_documented_default_is_the_runs() {
    let app: Router = crate::api();
    let doc = openapi();
    let (st, v) = call(&app, "/v1/sim/runs", &json!({})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let summary = &v["runs"][0]["summary"];
    let props = doc["components"]["schemas"]["SimRunRequest"]["properties"].as_object().unwrap();
    let mut checked = Vec::new();
    for (field, s) in props {
        let text = s["description"].as_str().unwrap_or_default();
        let Some(rest) = text.split("(default: ").nth(1) else { continue };
        let Ok(n) = rest.split(')').next().unwrap().parse::<u64>() else { continue };
        assert_eq!(
            summary[field.as_str()].as_u64(),
            Some(n),
            "{field}: the schema says default {n}; a run of {{}}: {summary}"
        );
        checked.push(field.clone());
    }
    checked.sort();
    assert_eq!(checked, ["clients", "duration_ms", "lease_ms", "seed"]);
}
