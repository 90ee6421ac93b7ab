//! The one error of the API, whichever transport carries it: a code, a message and
//! typed details ([`Detail`], the registry both edges share). Here HTTP writes it as
//! `{"error":{"code","message",...details}}`, and the lock service's domain errors get
//! their HTTP status; the wire protocol writes the same fields in binary
//! (`wire::conn::encode_answer`).

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fenced_wire::detail::{Detail, Value as DetailValue};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Every error answer: `{"error":{"code","message",...details}}`.
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// snake_case, stable: what a client matches on.
    pub code: String,
    /// A sentence for a person.
    pub message: String,
    /// Details that fit the code: limits, tokens, `retry_after_ms`.
    #[serde(flatten)]
    pub details: BTreeMap<String, Value>,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The fields a caller acts on: members of `error` in JSON, typed fields on the wire.
    pub details: Vec<Detail<'static>>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), details: Vec::new() }
    }

    /// The error with `detail` too (in place of a field of the same name). Details are
    /// kept in tag order, so that each transport writes one error one way.
    pub fn with(mut self, detail: Detail<'static>) -> ApiError {
        self.details.retain(|d| d.tag() != detail.tag());
        self.details.push(detail);
        self.details.sort_by_key(Detail::tag);
        self
    }

    /// The error with the detail called `name`, when `value` fits such a field: the
    /// lock service's numbers (`fenced_core::Error::details`) and the members of a JSON
    /// error object from another member. Anything else is logged and left out.
    pub fn with_named(self, name: &str, value: DetailValue<'_>) -> ApiError {
        match Detail::parse(name, value) {
            Some(d) => self.with(d.into_owned()),
            None => {
                tracing::warn!(code = self.code, detail = name, "an error detail that is no field was left out");
                self
            }
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn too_large(what: &str, max: usize) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", format!("the {what} is larger than {max} bytes"))
            .with(Detail::LimitBytes(max as u64))
    }

    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %e, "internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the server could not complete the request")
    }
}

impl From<crate::locks::Unanswered> for ApiError {
    fn from(e: crate::locks::Unanswered) -> ApiError {
        match e {
            crate::locks::Unanswered::Refused(e) => e.into(),
            crate::locks::Unanswered::Mismatch(why) => ApiError::internal(why),
        }
    }
}

impl From<fenced_core::Error> for ApiError {
    fn from(e: fenced_core::Error) -> ApiError {
        use fenced_core::Error as E;
        let status = match &e {
            E::LeaseNotFound => StatusCode::NOT_FOUND,
            E::LockHeld { .. } | E::NotHolder { .. } | E::StaleToken { .. } | E::TokenNotIssued { .. } => {
                StatusCode::CONFLICT
            }
            E::TtlOutOfRange { .. } | E::WaitOutOfRange { .. } | E::LockDelayOutOfRange { .. } => {
                StatusCode::BAD_REQUEST
            }
            E::TooManyLeases { .. } | E::TooManyLocks { .. } | E::TooManyWaiters { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            E::Recovering { .. } | E::ShuttingDown | E::NotLeader { .. } | E::TooBusy { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            // The store is full; the lock service, which needs no room in it, goes on.
            E::StoreFull { quota, .. } => {
                let a = ApiError::new(StatusCode::INSUFFICIENT_STORAGE, e.code(), e.to_string());
                return with_core_details(a.with(Detail::What(quota.as_str().into())), &e);
            }
            // An implicit lease's id the caller chose names a live lease that is not
            // this request's first attempt (128 random bits drawn by the server collide
            // with nothing).
            E::LeaseExists => StatusCode::CONFLICT,
            E::InvalidNames { .. } => StatusCode::BAD_REQUEST,
        };
        with_core_details(ApiError::new(status, e.code(), e.to_string()), &e)
    }
}

/// `a` with the numbers of the lock service's refusal `e`, each as its typed field.
fn with_core_details(a: ApiError, e: &fenced_core::Error) -> ApiError {
    e.details().into_iter().fold(a, |a, (name, v)| a.with_named(name, DetailValue::Number(v)))
}

impl ApiError {
    /// The HTTP API's error body, `{"error":{"code","message",...details}}` (also what a
    /// wire connection of version 2 gets).
    pub fn body(&self) -> Value {
        error_json(self.code, &self.message, &self.details)
    }

    /// The error with the members of a JSON error object (`{"code","message",...}`)
    /// another member sent, each as its typed field.
    pub fn with_json_details(self, error: &serde_json::Map<String, Value>) -> ApiError {
        details_from_json(self.code, error).into_iter().fold(self, ApiError::with)
    }
}

/// `{"error":{"code","message",...details}}`: the one JSON form of an error.
pub fn error_json(code: &str, message: &str, details: &[Detail<'_>]) -> Value {
    let error = ErrorDetail {
        code: code.to_string(),
        message: message.to_string(),
        details: details.iter().map(|d| (d.name().to_string(), json_value(d))).collect(),
    };
    serde_json::to_value(ErrorBody { error }).expect("an error body serializes")
}

/// The typed fields among the members of a JSON error object (`{"code","message",...}`);
/// a member that is no field is logged and left out.
pub fn details_from_json(code: &str, error: &serde_json::Map<String, Value>) -> Vec<Detail<'static>> {
    let members = error.iter().filter(|(k, _)| *k != "code" && *k != "message");
    let field = |(name, v): (&String, &Value)| {
        let value = match v {
            Value::String(s) => Some(DetailValue::Text(s.as_str().into())),
            v => v.as_u64().map(DetailValue::Number),
        };
        let detail = value.and_then(|value| Detail::parse(name, value)).map(Detail::into_owned);
        if detail.is_none() {
            tracing::warn!(code, detail = %name, "an error detail that is no field was left out");
        }
        detail
    };
    let mut details: Vec<_> = members.filter_map(field).collect();
    details.sort_by_key(Detail::tag);
    details
}

/// A detail's value as JSON: a number (tokens too) or a string.
fn json_value(d: &Detail<'_>) -> Value {
    match d.value() {
        DetailValue::Number(n) => n.into(),
        DetailValue::Text(s) => s.into_owned().into(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let retry_ms = fenced_wire::detail::number(&self.details, "retry_after_ms");
        let mut resp = super::json(self.status, &body);
        if let Some(ms) = retry_ms {
            let secs = ms.div_ceil(1000).max(1);
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
