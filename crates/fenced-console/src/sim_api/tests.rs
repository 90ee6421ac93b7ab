//! The simulation API through its router: shapes, bounds, and errors that change nothing.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;

async fn call(path: &str, body: &str) -> (StatusCode, serde_json::Value) {
    let app: Router = api();
    let req =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).expect("JSON body"))
}

#[tokio::test]
async fn a_run_returns_the_cli_summary_and_trace() {
    let (s, v) = call("/v1/sim/runs", r#"{"scenario":"default","seed":1}"#).await;
    assert_eq!(s, StatusCode::OK);
    let run = &v["runs"][0];
    let cli = fenced_sim::run(&Config::new(Scenario::Default, 1), &mut ()).unwrap();
    let cli: serde_json::Value = serde_json::from_str(&cli.to_json()).unwrap();
    assert_eq!(run["summary"], cli, "the API and `fenced sim --json` agree");
    let trace = run["trace"].as_array().unwrap();
    assert!(trace.len() > 1_000);
    assert_eq!(trace[0]["seq"], 0);
    assert!(trace.iter().any(|r| r["zombie"] == true));
}

#[tokio::test]
async fn every_scenario_answers_what_the_cli_prints() {
    for sc in Scenario::ALL {
        let body = format!(r#"{{"scenario":"{}","seed":2}}"#, sc.name());
        let (s, v) = call("/v1/sim/runs", &body).await;
        assert_eq!(s, StatusCode::OK, "{body}: {v}");
        let cli = fenced_sim::run(&Config::new(sc, 2), &mut ()).unwrap();
        let cli: serde_json::Value = serde_json::from_str(&cli.to_json()).unwrap();
        assert_eq!(v["runs"][0]["summary"], cli, "{}", sc.name());
    }
    let (s, v) = call("/v1/sim/runs", r#"{"scenario":"split-brain","seed":2,"replication":"majority"}"#).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["runs"][0]["summary"]["replication"], "majority");
    assert_eq!(v["runs"][0]["summary"]["duplicate_tokens"], 0);
    let (s, v) = call("/v1/sim/runs", r#"{"scenario":"partitioned","clients":6}"#).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["runs"][0]["summary"]["locks"], 6, "one key per worker");
}

#[tokio::test]
async fn a_sweep_turns_the_lock_delay_or_the_clock_step() {
    let body = r#"{"over":"lock-delay","values":[0,2000],"seeds":[1,4],"duration_ms":30000}"#;
    let (s, v) = call("/v1/sim/sweeps", body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[2]["lock_delay_ms"], 2000);
    assert!(v["svg"].as_str().unwrap().contains("lock-delay"));
    let (s, v) = call("/v1/sim/sweeps", r#"{"over":"clock-step","values":[0]}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _) = call("/v1/sim/sweeps", r#"{"over":"moon"}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn compare_runs_the_same_seed_off_and_on() {
    let (s, v) = call("/v1/sim/runs", r#"{"seed":3,"compare":true,"duration_ms":30000}"#).await;
    assert_eq!(s, StatusCode::OK);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["summary"]["fencing"], false);
    assert_eq!(runs[1]["summary"]["fencing"], true);
    assert_eq!(runs[1]["summary"]["zombie_writes"], 0);
    assert_eq!(runs[0]["summary"]["grants"], runs[1]["summary"]["grants"]);
}

#[tokio::test]
async fn bad_parameters_get_a_named_400() {
    for (body, code, needle) in [
        (r#"{"clients":5000}"#, "bad_parameter", "clients"),
        (r#"{"duration_ms":0}"#, "bad_parameter", "duration_ms"),
        (r#"{"scenario":"nope"}"#, "bad_parameter", "scenario"),
        (r#"{"pauses":"solar"}"#, "bad_parameter", "pauses"),
        (r#"{"lease_ms":1}"#, "bad_parameter", "lease"),
        (r#"{"renew_fraction":2}"#, "bad_parameter", "renew-at"),
        (r#"{"seed":-1}"#, "invalid_json", "seed"),
        (r#"{"seed":"one"}"#, "invalid_json", "seed"),
        (r#"{"colour":"red"}"#, "invalid_json", "colour"),
        (r#"{"seed":"#, "invalid_json", ""),
        (r#"{"scenario":"occ","compare":true}"#, "bad_parameter", "compare"),
        (r#"{"scenario":"partitioned","compare":true}"#, "bad_parameter", "compare"),
        (r#"{"replication":"majority"}"#, "bad_parameter", "replication"),
        (r#"{"scenario":"split-brain","replication":"raft"}"#, "bad_parameter", "replication"),
        (r#"{"clock":"sundial"}"#, "bad_parameter", "clock"),
    ] {
        let (s, v) = call("/v1/sim/runs", body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
}

#[tokio::test]
async fn oversize_bodies_and_traces_are_refused() {
    let (s, v) = call("/v1/sim/runs", &format!(r#"{{"scenario":"{}"}}"#, "x".repeat(20_000))).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(v["error"]["code"], "body_too_large");
    let small: Router = api_with(Limits { trace_records_max: 100, ..Limits::default() });
    let req = Request::post("/v1/sim/runs").body(Body::from("{}")).unwrap();
    let resp = small.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_sweep_returns_rows_and_a_chart() {
    let (s, v) = call("/v1/sim/sweeps", r#"{"leases":[1,4],"seeds":[1,3],"duration_ms":30000}"#).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().filter(|r| r["fencing"] == "on").all(|r| r["zombie_writes"] == 0));
    assert!(v["svg"].as_str().unwrap().starts_with("<svg"));
    let (s, v) = call("/v1/sim/sweeps", r#"{"seeds":[1,100000]}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn a_request_that_gives_up_stops_its_simulation_and_frees_its_slot() {
    // A sweep far too long for its time: answered sim_timeout, and its work stops, so
    // the one slot is free again soon (before: the sweep ran on for a minute).
    let limits = Limits { timeout: Duration::from_millis(200), runs_in_flight_max: 1, ..Limits::default() };
    let app: Router = api_with(limits);
    let sweep = r#"{"seeds":[1,40],"leases":[1,2,4,8,16],"clients":32,"duration_ms":600000}"#;
    let post = |path: &str, body: &str| {
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap()
    };
    let resp = app.clone().oneshot(post("/v1/sim/sweeps", sweep)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("sim_timeout"));
    // The slot comes back once the stopped work has ended; a short run then fits.
    let mut answered = None;
    for _ in 0..100 {
        let resp = app.clone().oneshot(post("/v1/sim/runs", r#"{"duration_ms":1000}"#)).await.unwrap();
        if resp.status() == StatusCode::OK {
            answered = Some(resp.status());
            break;
        }
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "only sim_busy while the slot is taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answered, Some(StatusCode::OK), "the given-up sweep still held its slot after 5 s");
}

#[tokio::test]
async fn runs_in_flight_are_bounded() {
    let limits = Limits { runs_in_flight_max: 1, ..Limits::default() };
    let app: Router = api_with(limits);
    let post = |body: &str| {
        Request::post("/v1/sim/sweeps")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let long = tokio::spawn(app.clone().oneshot(post(r#"{"seeds":[1,40],"clients":32,"duration_ms":600000}"#)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resp = app.clone().oneshot(post(r#"{"seeds":[1,1],"duration_ms":1000}"#)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("sim_busy"), "{}", String::from_utf8_lossy(&body));
    long.abort();
}
