//! `POST /v1/sim/runs` and `POST /v1/sim/sweeps`: the laboratory over HTTP.
//!
//! A run answers `{"runs":[{"summary":{..},"trace":[..]}]}` where each trace element is
//! exactly a line of `fenced sim --trace`, and the summary is `fenced sim --json`.
//! With `"compare":true` the same seed runs fencing off, then on. Every scenario of
//! `fenced sim` runs, with `replication`, `clock` and `lock_delay_ms` as its flags; a
//! sweep turns the knob `over` names (`lease`, `lock-delay` or `clock-step`). Sizes and
//! times are bounded; parameters out of range answer 400 with the flag-style name of
//! the field.
//!
//! The laboratory runs inside the lock server, so it is contained: at most
//! `runs_in_flight_max` requests simulate at once (503 `sim_busy` past it), a trace
//! stops growing, and its run stops, as soon as it passes `trace_records_max`, and a
//! request answered `sim_timeout` stops its simulation too instead of burning the cores
//! for nobody. An operator can leave the API out altogether (the server's `lab_api`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use fenced_sim::sweep::{self, Axis, Spec};
use fenced_sim::trace::{write_json, TraceSink};
use fenced_sim::{Config, PauseModel, Record, Replication, Scenario, ServiceClock};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::doc;

mod request;

use request::{bad, base_config, error, parse, scenario, Refusal};
pub(crate) use request::{RunRequest, SweepRequest};

/// Bounds on what one request may ask of the simulator.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub body_bytes_max: usize,
    pub clients_max: u32,
    pub duration_ms_max: u64,
    /// Trace records one run may return (the page draws every one).
    pub trace_records_max: usize,
    pub sweep_runs_max: u64,
    /// Wall-clock bound on one request's simulation work.
    pub timeout: Duration,
    /// Requests simulating at once, over the whole server.
    pub runs_in_flight_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes_max: 16 * 1024,
            clients_max: 32,
            duration_ms_max: 600_000,
            trace_records_max: 300_000,
            sweep_runs_max: 1_000,
            timeout: Duration::from_secs(20),
            runs_in_flight_max: 2,
        }
    }
}

/// The simulation routes, with the default limits.
pub fn api<S: Clone + Send + Sync + 'static>() -> Router<S> {
    api_with(Limits::default())
}

pub fn api_with<S: Clone + Send + Sync + 'static>(limits: Limits) -> Router<S> {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.runs_in_flight_max));
    let sweep_slots = slots.clone();
    Router::new()
        .route(
            "/v1/sim/runs",
            post(move |body: Bytes| async move {
                runs(limits, &slots, body).await.unwrap_or_else(IntoResponse::into_response)
            }),
        )
        .route(
            "/v1/sim/sweeps",
            post(move |body: Bytes| async move {
                sweeps(limits, &sweep_slots, body).await.unwrap_or_else(IntoResponse::into_response)
            }),
        )
}

/// A trace that stops its run once it holds more than `max` records.
struct CappedTrace<'a> {
    records: Vec<Record>,
    max: usize,
    stop: &'a AtomicBool,
}

impl TraceSink for CappedTrace<'_> {
    fn record(&mut self, r: &Record) {
        if self.records.len() <= self.max {
            self.records.push(*r);
        }
    }
    fn stopped(&self) -> bool {
        self.records.len() > self.max || self.stop.load(Ordering::Relaxed)
    }
}

/// Runs `f` on a blocking thread within the request's slot and time. `f` gets a stop
/// flag that is set when the request gives up (its time ran out, or its client left),
/// and must end soon after.
async fn blocking<T: Send + 'static>(
    limits: Limits,
    slots: &Arc<tokio::sync::Semaphore>,
    f: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> Result<T, Refusal> {
    let Ok(slot) = slots.clone().try_acquire_owned() else {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "sim_busy",
            format!("{} simulations are running already: retry shortly", limits.runs_in_flight_max),
        ));
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Dropped with the request (answered, timed out, or its client gone): stops the work.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop_on_drop = StopOnDrop(stop.clone());
    // The slot is the work's, not the request's: it is free only when the work ended.
    let task = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        f(&stop)
    });
    match tokio::time::timeout(limits.timeout, task).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => {
            Err(error(StatusCode::INTERNAL_SERVER_ERROR, "sim_failed", "the simulation stopped unexpectedly"))
        }
        Err(_) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "sim_timeout",
            format!("the simulation did not finish within {} s: ask for less", limits.timeout.as_secs()),
        )),
    }
}

async fn runs(limits: Limits, slots: &Arc<tokio::sync::Semaphore>, body: Bytes) -> Result<Response, Refusal> {
    let req: RunRequest = parse(&limits, &body)?;
    let sc = scenario(req.scenario.as_deref())?;
    let mut c = base_config(&limits, sc, req.clients, req.lease_ms, req.duration_ms)?;
    c.seed = req.seed.unwrap_or(1);
    if let Some(f) = req.renew_fraction {
        c.renew_fraction = Some(f);
    }
    if let Some(f) = req.fencing {
        c.fencing = f;
    }
    if let Some(p) = req.pauses.as_deref() {
        c.pauses = PauseModel::parse(p).ok_or_else(|| bad("pauses", format!("unknown pause model '{p}'")))?;
    }
    if let Some(r) = req.replication.as_deref() {
        let r = Replication::parse(r).ok_or_else(|| bad("replication", format!("unknown replication '{r}'")))?;
        c.replication = Some(r);
    }
    if let Some(k) = req.clock.as_deref() {
        c.clock = ServiceClock::parse(k).ok_or_else(|| bad("clock", format!("unknown clock '{k}'")))?;
    }
    if let Some(d) = req.lock_delay_ms {
        c.lock_delay_ms = d;
    }
    let configs: Vec<Config> = if req.compare.unwrap_or(false) {
        if sc.lockless() {
            let name = sc.name();
            return Err(bad("compare", format!("{name} takes no lock: there is no fencing to compare")));
        }
        [false, true].into_iter().map(|fencing| Config { fencing, ..c.clone() }).collect()
    } else {
        vec![c]
    };
    for cfg in &configs {
        cfg.validate().map_err(|e| bad(e.field.trim_start_matches("--"), e.message))?;
    }
    let max = limits.trace_records_max;
    let out = blocking(limits, slots, move |stop| {
        let mut body = String::from(r#"{"runs":["#);
        for (i, cfg) in configs.iter().enumerate() {
            let mut trace = CappedTrace { records: Vec::new(), max, stop };
            let summary = fenced_sim::run(cfg, &mut trace).expect("validated");
            let records = trace.records;
            if records.len() > max {
                return Err(());
            }
            if i > 0 {
                body.push(',');
            }
            body.push_str(r#"{"summary":"#);
            body.push_str(&summary.to_json());
            body.push_str(r#","trace":["#);
            for (j, r) in records.iter().enumerate() {
                if j > 0 {
                    body.push(',');
                }
                write_json(&mut body, r);
            }
            body.push_str("]}");
        }
        body.push_str("]}");
        Ok(body)
    })
    .await?;
    match out {
        Ok(body) => Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response()),
        Err(()) => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "trace_too_large",
            format!(
                "this run has more than {max} events, the most the console draws: use fewer clients or a shorter \
                 duration"
            ),
        )),
    }
}

async fn sweeps(limits: Limits, slots: &Arc<tokio::sync::Semaphore>, body: Bytes) -> Result<Response, Refusal> {
    let req: SweepRequest = parse(&limits, &body)?;
    let over = req.over.as_deref().unwrap_or("lease");
    let axis = Axis::parse(over).ok_or_else(|| bad("over", format!("unknown knob '{over}'")))?;
    let sc = match req.scenario.as_deref() {
        None => axis.scenario(),
        name => scenario(name)?,
    };
    let mut base = base_config(&limits, sc, req.clients, None, req.duration_ms)?;
    base.lease_ms = req.lease_ms.unwrap_or(fenced_sim::LEASE_MS_DEFAULT);
    let [first, last] = req.seeds.unwrap_or([1, 20]);
    if first > last {
        return Err(bad("seeds", format!("[{first}, {last}] is an empty range")));
    }
    // A list the knob does not read is refused, not ignored: the caller meant something.
    if axis == Axis::Lease && req.values.is_some() {
        return Err(bad("values", "the lease knob takes leases (multiples), not values"));
    }
    if axis != Axis::Lease && req.leases.is_some() {
        return Err(bad("leases", format!("the {over} knob takes values (ms), not leases")));
    }
    let values = if axis == Axis::Lease {
        let multiples = req.leases.unwrap_or_else(|| axis.values());
        if multiples.len() > 12 || multiples.iter().any(|m| *m == 0 || *m > 1_000) {
            return Err(bad("leases", "give 1 to 12 lease multiples, each 1 to 1000"));
        }
        multiples
    } else {
        let values = req.values.unwrap_or_else(|| axis.values());
        if values.is_empty() || values.len() > 12 || values.iter().any(|v| *v > 3_600_000) {
            return Err(bad("values", "give 1 to 12 durations in ms, each at most an hour"));
        }
        values
    };
    let spec = Spec { base, axis, values, seeds: first..=last };
    spec.validate().map_err(|e| bad(e.field.trim_start_matches("--"), e.message))?;
    if spec.runs() > limits.sweep_runs_max {
        let m = format!("{} runs asked, at most {} per request", spec.runs(), limits.sweep_runs_max);
        return Err(bad("seeds", m));
    }
    let body = blocking(limits, slots, move |stop| {
        let rows = sweep::run_until(&spec, 2, &|| {}, stop).expect("validated");
        let knob = match spec.axis {
            Axis::Lease => "lease length",
            Axis::LockDelay => "lock-delay",
            Axis::ClockStep => "wall-clock step",
        };
        let title = format!("Zombie writes vs {knob}: {}, seeds {first}..{last}", spec.base.scenario.name());
        let svg = sweep::to_svg(&rows, &title);
        format!(
            r#"{{"rows":{},"svg":{}}}"#,
            sweep::to_json(&rows).trim_end(),
            serde_json::to_string(&svg).expect("a string")
        )
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[cfg(test)]
mod tests;
