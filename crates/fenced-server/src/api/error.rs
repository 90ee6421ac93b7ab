//! The one error shape of the API: `{"error":{"code","message",...details}}`, and the
//! one place the lock service's domain errors get their HTTP status.

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
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
    /// Extra fields inside `error`.
    pub details: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), details: Map::new() }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.details.insert(key.to_string(), value.into());
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn too_large(what: &str, max: usize) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", format!("the {what} is larger than {max} bytes"))
            .with("limit_bytes", max)
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
                let what = quota.as_str();
                let a = ApiError::new(StatusCode::INSUFFICIENT_STORAGE, e.code(), e.to_string());
                return e.details().into_iter().fold(a.with("what", what), |a, (k, v)| a.with(k, v));
            }
            // An implicit lease's id the caller chose names a live lease that is not
            // this request's first attempt (128 random bits drawn by the server collide
            // with nothing).
            E::LeaseExists => StatusCode::CONFLICT,
            E::InvalidNames { .. } => StatusCode::BAD_REQUEST,
        };
        e.details().into_iter().fold(ApiError::new(status, e.code(), e.to_string()), |a, (k, v)| a.with(k, v))
    }
}

impl ApiError {
    /// The body every transport sends: `{"error":{"code","message",...details}}`.
    pub fn body(&self) -> Value {
        let error = ErrorDetail {
            code: self.code.to_string(),
            message: self.message.clone(),
            details: self.details.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        serde_json::to_value(ErrorBody { error }).expect("an error body serializes")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let retry_ms = body["error"].get("retry_after_ms").and_then(Value::as_u64);
        let mut resp = super::json(self.status, &body);
        if let Some(ms) = retry_ms {
            let secs = ms.div_ceil(1000).max(1);
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
