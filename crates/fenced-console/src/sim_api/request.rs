//! What a simulation call asks, read and checked: its parameters, their defaults and
//! bounds, and the refusal when they do not hold.

use super::*;

/// A run's parameters, each as `fenced sim` takes it; null or absent is the default.
/// A bound that ties two fields (`compare`, `renew_fraction` or `lock_delay_ms` need a
/// scenario that takes a lock; `long-lease` runs four times `lease_ms`) is checked by
/// the simulator's own validation: 400 `bad_parameter`. (`/openapi.json` is generated
/// from this type.)
#[derive(Deserialize, Debug, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SimRunRequest)]
pub(crate) struct RunRequest {
    /// A scenario of `fenced sim` (default: `default`).
    #[schema(schema_with = doc::scenario)]
    pub(super) scenario: Option<String>,
    /// The run's seed (default: 1); the same seed gives the same run.
    pub(super) seed: Option<u64>,
    /// Simulated clients (default: 4).
    pub(super) clients: Option<u32>,
    /// The base lease in ms (default: 1000); long-lease runs with four times it, and
    /// the lease it runs with must be 10 ms to 1 h.
    #[schema(minimum = 10, maximum = 3_600_000)]
    pub(super) lease_ms: Option<u64>,
    /// Renew at this fraction of the lease (the `renewal` scenario's knob).
    #[schema(exclusive_minimum = 0, exclusive_maximum = 1)]
    pub(super) renew_fraction: Option<f64>,
    /// Whether the resource checks tokens (each scenario has its default).
    pub(super) fencing: Option<bool>,
    /// A pause model of `fenced sim` (default: the scenario's).
    #[schema(schema_with = doc::pauses)]
    pub(super) pauses: Option<String>,
    /// Simulated time in ms (default: 60000).
    pub(super) duration_ms: Option<u64>,
    /// Run the same seed with fencing off, then on (not for a scenario without a lock).
    pub(super) compare: Option<bool>,
    /// `split-brain` only: how the replicated lock service decides who serves.
    #[schema(schema_with = doc::replication)]
    pub(super) replication: Option<String>,
    /// The lock service's clock.
    #[schema(schema_with = doc::clock)]
    pub(super) clock: Option<String>,
    /// Chubby's lock-delay after an expiry, in ms (not for a scenario without a lock).
    #[schema(minimum = 0, maximum = 3_600_000)]
    pub(super) lock_delay_ms: Option<u64>,
}

/// A sweep's parameters: one knob over values, fencing off and on, over a range of
/// seeds; null or absent is the default. The runs it asks for (values x 2 x seeds) are
/// bounded, and each run's configuration must pass the simulator's validation (400
/// `bad_parameter`). (`/openapi.json` is generated from this type.)
#[derive(Deserialize, Debug, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SimSweepRequest)]
pub(crate) struct SweepRequest {
    /// The scenario whose settings the sweep keeps (default: the knob's own; not one
    /// without a lock).
    #[schema(schema_with = doc::scenario)]
    pub(super) scenario: Option<String>,
    /// The knob (default: `lease`).
    #[schema(schema_with = doc::axis)]
    pub(super) over: Option<String>,
    /// Lease multiples, with `over` `lease` only (default: 1, 2, 4, 8, 16).
    #[schema(schema_with = doc::leases)]
    pub(super) leases: Option<Vec<u64>>,
    /// Milliseconds, with `over` `lock-delay` or `clock-step` only (a clock step above
    /// 0).
    #[schema(schema_with = doc::values)]
    pub(super) values: Option<Vec<u64>>,
    /// Inclusive seed range `[first, last]`, first <= last (default: [1, 20]).
    #[schema(schema_with = doc::seeds)]
    pub(super) seeds: Option<[u64; 2]>,
    /// The base lease in ms (default: 1000); times each multiple, 10 ms to 1 h.
    #[schema(minimum = 10, maximum = 3_600_000)]
    pub(super) lease_ms: Option<u64>,
    /// Simulated clients per run.
    pub(super) clients: Option<u32>,
    /// Simulated time per run, in ms.
    pub(super) duration_ms: Option<u64>,
}

/// A request the API will not run, as the design's error body.
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

pub(super) fn error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { status, code, message: message.into() }
}

pub(super) fn bad(field: &str, message: impl std::fmt::Display) -> Refusal {
    error(StatusCode::BAD_REQUEST, "bad_parameter", format!("{field}: {message}"))
}

pub(super) fn parse<T: for<'de> Deserialize<'de>>(limits: &Limits, body: &Bytes) -> Result<T, Refusal> {
    if body.len() > limits.body_bytes_max {
        let m = format!("the request body is {} bytes; at most {} are accepted", body.len(), limits.body_bytes_max);
        return Err(error(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", m));
    }
    let body: &[u8] = if body.is_empty() { b"{}" } else { body };
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let at = if at == "." { String::new() } else { format!("{at}: ") };
        error(StatusCode::BAD_REQUEST, "invalid_json", format!("{at}{}", e.inner()))
    })
}

pub(super) fn scenario(name: Option<&str>) -> Result<Scenario, Refusal> {
    let name = name.unwrap_or("default");
    Scenario::parse(name).ok_or_else(|| bad("scenario", format!("unknown scenario '{name}'")))
}

pub(super) fn base_config(
    limits: &Limits,
    scenario: Scenario,
    clients: Option<u32>,
    lease_ms: Option<u64>,
    duration_ms: Option<u64>,
) -> Result<Config, Refusal> {
    let mut c = Config::new(scenario, 1);
    if let Some(l) = lease_ms {
        c = c.with_base_lease(l);
    }
    if let Some(n) = clients {
        if n == 0 || n > limits.clients_max {
            return Err(bad("clients", format!("the console runs 1 to {} clients, not {n}", limits.clients_max)));
        }
        c.clients = n;
        if scenario == Scenario::Partitioned {
            c.locks = n; // one key per worker
        }
    }
    if let Some(d) = duration_ms {
        if d == 0 || d > limits.duration_ms_max {
            return Err(bad("duration_ms", format!("the console runs 1 to {} ms, not {d}", limits.duration_ms_max)));
        }
        c.duration_ms = d;
    }
    Ok(c)
}
