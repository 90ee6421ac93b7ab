//! A request's query string as the handlers read it: its parameters as text, a
//! malformed query refused 400 `invalid_query`. Each handler checks its own names and
//! values, with messages of its own.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use utoipa::IntoParams;

use super::ApiError;

/// The query's parameters by name.
pub struct QueryMap(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for QueryMap {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(q) = Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
        Ok(QueryMap(q))
    }
}

/// The query of a list (`?prefix=P&limit=N`), as the OpenAPI document describes it;
/// read by [`QueryMap::listing`].
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ListQuery {
    /// only the names (or keys) that start with it
    prefix: Option<String>,
    /// at most this many (default and bound: list_locks_max)
    #[param(minimum = 1)]
    limit: Option<u64>,
}

impl QueryMap {
    /// A list's prefix and limit: `limit` from 1 to `max` (by default `max`), a prefix
    /// no longer than any `what` can be (`prefix_bytes_max`). Other parameters are
    /// ignored.
    pub(super) fn listing(
        mut self,
        max: usize,
        prefix_bytes_max: usize,
        what: &str,
    ) -> Result<(String, usize), ApiError> {
        let limit = match self.0.get("limit") {
            None => max,
            Some(s) => s
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| ApiError::bad_request("invalid_query", format!("limit is between 1 and {max}")))?,
        };
        let prefix = self.0.remove("prefix").unwrap_or_default();
        if prefix.len() > prefix_bytes_max {
            return Err(ApiError::bad_request("invalid_query", format!("the prefix is longer than any {what}")));
        }
        Ok((prefix, limit))
    }
}
