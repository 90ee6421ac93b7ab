//! The console's part of `/openapi.json`, generated (utoipa) like the server's: the
//! request schemas are the types `POST /v1/sim/runs` and `POST /v1/sim/sweeps` parse
//! (`SimRunRequest`, `SimSweepRequest`), the names a field takes are the simulator's
//! own lists (`Scenario::ALL`, ...), and the bounds that [`Limits`] sets (clients,
//! duration, body size, runs per sweep, trace size, time) are written in from the
//! limits the routes run with. The fenced-server crate merges it into its document.
//!
//! What is not derived: the answers' bodies are the simulator's own JSON (`fenced sim
//! --json`, `--trace` lines, sweep rows), written by `fenced-sim` without a schema type,
//! so their schemas here name the fields the design promises (the tests check every
//! scenario's answer against them).

use fenced_sim::sweep::Axis;
use fenced_sim::{PauseModel, Replication, Scenario, ServiceClock, SUMMARY_FIELDS};
use serde_json::{json, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{OpenApi, ToSchema};

use crate::sim_api::Limits;

/// The console's paths and schemas for routes run with `limits`, as OpenAPI 3.1 JSON
/// (`paths` and `components.schemas`, to merge into the server's document). Error
/// answers refer to `#/components/schemas/Error`, which the server's document defines.
pub fn openapi_with(limits: &Limits) -> Value {
    let mut doc = serde_json::to_value(ConsoleDoc::openapi()).expect("the document serializes");
    let schemas = "/components/schemas";
    for request in ["SimRunRequest", "SimSweepRequest"] {
        let props = format!("{schemas}/{request}/properties");
        set(&mut doc, &format!("{props}/clients"), json!({ "minimum": 1, "maximum": limits.clients_max }));
        set(&mut doc, &format!("{props}/duration_ms"), json!({ "minimum": 1, "maximum": limits.duration_ms_max }));
    }
    let body = format!(
        "A JSON object, at most {} bytes (413 body_too_large past it); an empty body is {{}}.",
        limits.body_bytes_max
    );
    for path in ["/v1/sim/runs", "/v1/sim/sweeps"] {
        let op = format!("/paths/{}/post", path.replace('/', "~1"));
        // An empty body is taken as {}: every field has a default.
        set(&mut doc, &format!("{op}/requestBody"), json!({ "description": body, "required": false }));
        let busy = format!(
            "sim_busy (already {} requests simulating), sim_timeout (not done within {} s)",
            limits.runs_in_flight_max,
            limits.timeout.as_secs()
        );
        set(&mut doc, &format!("{op}/responses/503"), json!({ "description": busy }));
    }
    let too_large = format!(
        "body_too_large (over {} bytes), trace_too_large (a run of more than {} trace records)",
        limits.body_bytes_max, limits.trace_records_max
    );
    set(&mut doc, "/paths/~1v1~1sim~1runs/post/responses/413", json!({ "description": too_large }));
    let runs = format!(
        "invalid_json (malformed, a wrong type, an unknown field), bad_parameter (out of range, or more than {} \
         runs: values x 2 x seeds)",
        limits.sweep_runs_max
    );
    set(&mut doc, "/paths/~1v1~1sim~1sweeps/post/responses/400", json!({ "description": runs }));
    doc
}

/// The same, for the routes [`crate::api`] serves (the default limits).
pub fn openapi() -> Value {
    openapi_with(&Limits::default())
}

#[derive(OpenApi)]
#[openapi(
    paths(runs, sweeps, lab_page, live_page, asset),
    components(schemas(crate::sim_api::RunRequest, crate::sim_api::SweepRequest, SimRuns, SimSweep))
)]
struct ConsoleDoc;

/// What `POST /v1/sim/runs` answers: one run, or two with `compare` (fencing off, on).
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only: the body is the simulator's JSON, written as it is
struct SimRuns {
    runs: Vec<SimRun>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct SimRun {
    /// What `fenced sim --json` prints for the run.
    #[schema(schema_with = summary)]
    summary: (),
    /// The run's trace, each element a line of `fenced sim --trace`.
    #[schema(schema_with = trace)]
    trace: (),
}

/// What `POST /v1/sim/sweeps` answers: `fenced sim sweep --json`'s rows and its chart.
#[derive(ToSchema)]
#[allow(dead_code)]
struct SimSweep {
    /// One row per value of the knob and fencing off/on, with the runs' totals.
    #[schema(schema_with = rows)]
    rows: (),
    /// The chart, an SVG document.
    svg: String,
}

/// Run the laboratory: the same summary as `fenced sim --json` and the same trace lines
/// as `fenced sim --trace`.
#[utoipa::path(post, path = "/v1/sim/runs", tag = "laboratory", operation_id = "sim_run",
    request_body(content = crate::sim_api::RunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "the run (two with compare)", body = SimRuns),
        (status = 400, description = "invalid_json (malformed, a wrong type, an unknown field), bad_parameter (out of range, or a combination the simulator refuses)", body = ref("#/components/schemas/Error")),
        (status = 413, body = ref("#/components/schemas/Error")),
        (status = 503, body = ref("#/components/schemas/Error")),
    ))]
#[allow(dead_code)]
fn runs() {}

/// Sweep a knob (lease multiples, lock-delay, clock step) x fencing off/on over seeds:
/// rows and an SVG chart.
#[utoipa::path(post, path = "/v1/sim/sweeps", tag = "laboratory", operation_id = "sim_sweep",
    request_body(content = crate::sim_api::SweepRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "the rows and the chart", body = SimSweep),
        (status = 400, body = ref("#/components/schemas/Error")),
        (status = 413, description = "body_too_large", body = ref("#/components/schemas/Error")),
        (status = 503, body = ref("#/components/schemas/Error")),
    ))]
#[allow(dead_code)]
fn sweeps() {}

/// Web console: the laboratory (simulator with the sequence panel, sweep, guided tour).
#[utoipa::path(get, path = "/", tag = "console", operation_id = "console_lab",
    responses((status = 200, description = "HTML", content_type = "text/html; charset=utf-8", body = String)))]
#[allow(dead_code)]
fn lab_page() {}

/// Web console: the live page (locks, fenced store marks, event feed).
#[utoipa::path(get, path = "/live", tag = "console", operation_id = "console_live",
    responses((status = 200, description = "HTML", content_type = "text/html; charset=utf-8", body = String)))]
#[allow(dead_code)]
fn live_page() {}

/// The console's CSS and JavaScript, embedded in the binary.
#[utoipa::path(get, path = "/assets/{name}", tag = "console", operation_id = "console_asset",
    params(("name" = String, Path, description = "a file of the console")),
    responses(
        (status = 200, description = "the file", content(
            (String = "text/css; charset=utf-8"),
            (String = "text/javascript; charset=utf-8"),
            (String = "text/html; charset=utf-8"),
        )),
        (status = 404, description = "not_found", body = ref("#/components/schemas/Error")),
    ))]
#[allow(dead_code)]
fn asset() {}

// The schemas of single fields, from the simulator's own lists.

/// A string out of `names`, or null (the default).
fn names<'a>(names: impl IntoIterator<Item = &'a str>) -> RefOr<Schema> {
    let mut values: Vec<Value> = names.into_iter().map(Value::from).collect();
    values.push(Value::Null);
    schema(json!({ "type": ["string", "null"], "enum": values }))
}

pub(crate) fn scenario() -> RefOr<Schema> {
    names(Scenario::ALL.map(Scenario::name))
}

pub(crate) fn pauses() -> RefOr<Schema> {
    names(PauseModel::ALL.map(PauseModel::name))
}

pub(crate) fn replication() -> RefOr<Schema> {
    names(Replication::ALL.map(Replication::name))
}

pub(crate) fn clock() -> RefOr<Schema> {
    names(ServiceClock::ALL.map(ServiceClock::name))
}

pub(crate) fn axis() -> RefOr<Schema> {
    names(Axis::ALL.map(Axis::name))
}

/// The bounds the sweep handler puts on its lists (`sweeps` in sim_api.rs).
pub(crate) fn leases() -> RefOr<Schema> {
    let item = json!({ "type": "integer", "format": "uint64", "minimum": 1, "maximum": 1_000 });
    schema(json!({ "type": ["array", "null"], "items": item, "minItems": 1, "maxItems": 12 }))
}

pub(crate) fn values() -> RefOr<Schema> {
    let item = json!({ "type": "integer", "format": "uint64", "minimum": 0, "maximum": 3_600_000 });
    schema(json!({ "type": ["array", "null"], "items": item, "minItems": 1, "maxItems": 12 }))
}

pub(crate) fn seeds() -> RefOr<Schema> {
    let item = json!({ "type": "integer", "format": "uint64", "minimum": 0, "maximum": u64::MAX });
    schema(json!({ "type": ["array", "null"], "items": item, "minItems": 2, "maxItems": 2 }))
}

fn summary() -> RefOr<Schema> {
    let props = json!({
        "scenario": { "type": "string", "enum": Scenario::ALL.map(Scenario::name) },
        "fencing": { "type": "boolean" },
        "safe": { "type": "boolean" },
        "renew_fraction": { "type": ["number", "null"] },
    });
    schema(json!({ "type": "object", "required": SUMMARY_FIELDS, "properties": props }))
}

fn trace() -> RefOr<Schema> {
    let record = json!({
        "type": "object",
        "required": ["t_ms", "seq", "actor", "kind"],
        "properties": {
            "t_ms": { "type": "integer", "minimum": 0 },
            "seq": { "type": "integer", "minimum": 0 },
            "actor": { "type": "string", "description": "c<N> (a client), lock or resource" },
            "kind": { "type": "string" },
        },
    });
    schema(json!({ "type": "array", "items": record }))
}

fn rows() -> RefOr<Schema> {
    let row = json!({
        "type": "object",
        "required": ["lease_ms", "fencing", "seeds", "grants", "late_writes", "zombie_writes", "stale_writes_rejected", "lost_updates", "unsafe_runs"],
        "properties": { "fencing": { "type": "string", "enum": ["off", "on"] } },
    });
    schema(json!({ "type": "array", "items": row }))
}

fn schema(v: Value) -> RefOr<Schema> {
    RefOr::T(serde_json::from_value(v).expect("a schema"))
}

/// Merges `with` into the object at `pointer`, which the generated document must have.
fn set(doc: &mut Value, pointer: &str, with: Value) {
    let target = doc.pointer_mut(pointer).unwrap_or_else(|| panic!("the console's document has no {pointer}"));
    if let (Some(t), Value::Object(w)) = (target.as_object_mut(), with) {
        t.extend(w);
    }
}

#[cfg(test)]
mod tests;
