//! The built-in fenced store: the reference resource guarded by the fence gate.

use axum::body::Body;
use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fenced_core::{Admission, Error, Token};
use fenced_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ErrorBody;
use super::{read_body, reply, ApiError, App, AppInner};
use crate::events::Event;
use crate::metrics::inc;

const FENCING_TOKEN: &str = "fencing-token";
const HIGHEST_SEEN: &str = "fencing-highest-seen";

/// A key of the store with its mark (null: none) and its value's size (null: only a
/// fenced read touched the key).
#[derive(Serialize, ToSchema)]
pub struct StoreKey {
    key: String,
    #[schema(required = true)]
    highest_seen: Option<u64>,
    #[schema(required = true)]
    value_bytes: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct StoreKeys {
    keys: Vec<StoreKey>,
}

/// An accepted write: fenced (the key's new mark), or under `unfenced_prefix`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum StoreWrite {
    Fenced { key: String, token: u64, highest_seen: u64 },
    Unfenced { key: String, unfenced: bool },
}

/// `GET /v1/store?prefix=P&limit=N`: keys with their `highest_seen` marks and value
/// sizes, in key order (what the live page shows). Values are not included.
#[utoipa::path(get, path = "/v1/store", tag = "store", operation_id = "list_store_keys",
    params(
        ("prefix" = Option<String>, Query, description = "only keys that start with it"),
        ("limit" = Option<u64>, Query, description = "at most this many (default and bound: list_locks_max)", minimum = 1),
    ),
    responses(
        (status = 200, description = "keys in key order, values not included", body = StoreKeys),
        (status = 400, description = "invalid_query", body = ErrorBody),
        (status = 501, description = "store_not_replicated (a cluster of several members)", body = ErrorBody),
    ))]
pub async fn list(
    State(app): State<App>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let max = app.config.list_locks_max;
    let (prefix, limit) = super::locks::list_params(query, max, app.config.store_key_bytes_max, "key")?;
    single_member(&app)?;
    let keys = app.store.list(prefix, limit).await.map_err(store_error)?;
    let keys = keys
        .iter()
        .map(|k| StoreKey {
            key: k.key.clone(),
            highest_seen: k.highest_seen.map(Token::get),
            value_bytes: k.value_bytes.map(|n| n as u64),
        })
        .collect();
    Ok(reply(StatusCode::OK, &StoreKeys { keys }))
}

/// `PUT /v1/store/{key}` with `Fencing-Token: N`; the body is the value. A key under
/// the configured `unfenced_prefix` takes the write without a token instead.
#[utoipa::path(put, path = "/v1/store/{key}", tag = "store", operation_id = "write_value", params(("key" = String, Path, description = "1 to store_key_bytes_max bytes of UTF-8 without control characters", min_length = 1), ("Fencing-Token" = Option<u64>, Header, description = "the writer's fencing token, a positive integer below 2^64; exactly one header line", minimum = 1)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the value, at most value_bytes_max bytes"),
    responses(
        (status = 200, description = "written", body = StoreWrite),
        (status = 400, description = "invalid_token, invalid_key, unfenced_key", body = ErrorBody),
        (status = 409, description = "stale_token (with token and highest_seen), token_not_issued (with token and highest_issued)", body = ErrorBody),
        (status = 413, description = "too_large", body = ErrorBody),
        (status = 428, description = "token_required", body = ErrorBody),
        (status = 500, description = "corrupt_record", body = ErrorBody),
        (status = 501, description = "store_not_replicated", body = ErrorBody),
        (status = 507, description = "store_full (with what and limit); insufficient_storage (the disk is below min_free_bytes, with free_bytes and min_free_bytes)", body = ErrorBody),
    ))]
pub async fn write(
    State(app): State<App>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = store_key(&app, key)?;
    let token = fencing_token(&headers)?;
    let value = read_body(&app, &headers, body, app.config.value_bytes_max, "value").await?;
    if token.is_none() && app.config.is_unfenced(&key) {
        disk_room(&app)?;
        app.store.put_unfenced(key.clone(), value.to_vec()).await.map_err(ApiError::internal)?;
        return Ok(reply(StatusCode::OK, &StoreWrite::Unfenced { key, unfenced: true }));
    }
    let highest_seen = write_value(&app, key.clone(), token, value.to_vec()).await?;
    let t = highest_seen.get();
    Ok(reply(StatusCode::OK, &StoreWrite::Fenced { key, token: t, highest_seen: t }))
}

/// A fenced write (HTTP and the wire protocol) of a checked key: the new mark when
/// accepted. No token is 428 `token_required`; a stale one is 409 `stale_token`.
pub async fn write_value(app: &AppInner, key: String, token: Option<Token>, value: Vec<u8>) -> Result<Token, ApiError> {
    single_member(app)?;
    if value.len() > app.config.value_bytes_max {
        return Err(ApiError::too_large("value", app.config.value_bytes_max));
    }
    if token.is_some() && app.config.is_unfenced(&key) {
        return Err(token_on_unfenced(app, &key));
    }
    let Some(token) = token else {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "token_required",
            "a write to the fenced store needs a Fencing-Token header",
        ));
    };
    check_issued(app, &key, token)?;
    disk_room(app)?;
    let answer = app.store.put(key.clone(), Some(token), value).await.map_err(store_error)?;
    match answer.admission {
        Admission::Accepted { token, .. } => {
            inc(&app.metrics.store_writes_accepted);
            let t = token.get();
            app.locks.publish(|| Event::StoreAccepted { at_ms: app.locks.now_ms(), key, token: t, op: "write" });
            Ok(token)
        }
        Admission::Rejected { token, highest_seen } => {
            inc(&app.metrics.stale_writes_rejected);
            Err(stale(app, key, token, highest_seen, "write"))
        }
        other => Err(ApiError::internal(format!("unexpected admission {other:?}"))),
    }
}

/// `GET /v1/store/{key}`, a fenced read when `Fencing-Token` is present.
#[utoipa::path(get, path = "/v1/store/{key}", tag = "store", operation_id = "read_value", params(("key" = String, Path, description = "1 to store_key_bytes_max bytes of UTF-8 without control characters", min_length = 1), ("Fencing-Token" = Option<u64>, Header, description = "the writer's fencing token, a positive integer below 2^64; exactly one header line", minimum = 1)),
    responses(
        (status = 200, description = "the value", content_type = "application/octet-stream", body = Vec<u8>,
            headers(("Fencing-Highest-Seen" = u64, description = "the key's mark, when it has one"))),
        (status = 400, description = "invalid_token, invalid_key, unfenced_key", body = ErrorBody),
        (status = 404, description = "not_found (with highest_seen when the key has a mark)", body = ErrorBody),
        (status = 409, description = "stale_token, token_not_issued", body = ErrorBody),
        (status = 500, description = "corrupt_record", body = ErrorBody),
        (status = 501, description = "store_not_replicated", body = ErrorBody),
        (status = 507, description = "store_full (a fenced read that needs a new key past store_keys_max)", body = ErrorBody),
    ))]
pub async fn read(State(app): State<App>, Path(key): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let key = store_key(&app, key)?;
    let token = fencing_token(&headers)?;
    let (mark, value) = read_value(&app, key, token).await?;
    let mut resp = (StatusCode::OK, [(header::CONTENT_TYPE, "application/octet-stream")], value).into_response();
    if let Some(m) = mark {
        resp.headers_mut().insert(HIGHEST_SEEN, HeaderValue::from(m.get()));
    }
    Ok(resp)
}

/// A read of a checked key (HTTP and the wire protocol), fenced when `token` is
/// given: the key's mark and its value. Absent is 404 `not_found` (with the mark).
pub async fn read_value(
    app: &AppInner,
    key: String,
    token: Option<Token>,
) -> Result<(Option<Token>, Vec<u8>), ApiError> {
    single_member(app)?;
    if token.is_some() && app.config.is_unfenced(&key) {
        return Err(token_on_unfenced(app, &key));
    }
    if let Some(token) = token {
        check_issued(app, &key, token)?;
    }
    let answer = match token {
        Some(token) => app.store.fenced_read(key.clone(), token).await,
        None => app.store.read(key.clone()).await,
    }
    .map_err(store_error)?;
    if let Admission::Rejected { token, highest_seen } = answer.admission {
        inc(&app.metrics.stale_reads_rejected);
        return Err(stale(app, key, token, highest_seen, "read"));
    }
    if let Admission::Accepted { token, .. } = answer.admission {
        let t = token.get();
        app.locks.publish(|| Event::StoreAccepted {
            at_ms: app.locks.now_ms(),
            key: key.clone(),
            token: t,
            op: "read",
        });
    }
    let mark = answer.admission.highest_seen();
    let Some(value) = answer.value else {
        let e = ApiError::new(StatusCode::NOT_FOUND, "not_found", "no value under this key");
        return Err(match mark {
            Some(m) => e.with("highest_seen", m.get()),
            None => e,
        });
    };
    Ok((mark, value))
}

/// The fenced store is not in the replicated log yet: it is each server's own. A
/// cluster of one keeps every acknowledged write (fsynced before the answer); a cluster
/// of several would lose writes at a failover, so it refuses the store rather than
/// pretend (501 `store_not_replicated`).
fn single_member(app: &AppInner) -> Result<(), ApiError> {
    if app.locks.node.is_single() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "store_not_replicated",
        "the fenced store is not replicated yet: a cluster of several members does not serve it",
    ))
}

/// A write needs room on disk beyond the reserve kept for the lock service's log.
fn disk_room(app: &AppInner) -> Result<(), ApiError> {
    let Some(free) = app.disk.low() else { return Ok(()) };
    crate::metrics::inc(&app.metrics.store_writes_disk_low);
    let min = app.disk.min_free_bytes;
    Err(ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        "insufficient_storage",
        format!(
            "the data directory has {free} bytes free, below min_free_bytes {min} kept for the lock service: \
             store writes are refused until there is room again; locks go on"
        ),
    )
    .with("free_bytes", free)
    .with("min_free_bytes", min))
}

/// The store lives beside the lock service, so it refuses a token the service never
/// issued: one buggy client must not shut a key to every real holder for good. Keys
/// under `foreign_token_prefix` guard resources locked by another lock service, whose
/// tokens this one cannot know: there the gate rule alone applies.
fn check_issued(app: &AppInner, key: &str, token: Token) -> Result<(), ApiError> {
    if app.config.takes_foreign_tokens(key) {
        return Ok(());
    }
    let highest_issued = app.locks.view(|t, _| t.highest_issued());
    if highest_issued.is_none_or(|h| token > h) {
        inc(&app.metrics.tokens_not_issued);
        return Err(Error::TokenNotIssued { token, highest_issued }.into());
    }
    Ok(())
}

/// A record that cannot be read back intact refuses the operation: it is never taken
/// for "no mark", which would admit any token.
fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Corrupt { ref key, .. } => {
            tracing::error!(error = %e, "corrupt fenced-store record");
            let key = key.clone();
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "corrupt_record",
                "the record of this key cannot be read back intact; the operation is refused",
            )
            .with("key", key)
        }
        // The store is full; the lock service, which needs no new room, goes on.
        StoreError::Full { what, limit } => ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "store_full",
            format!("the fenced store holds its limit of {limit} {what}: free some, or raise store_{what}_max"),
        )
        .with("what", what)
        .with("limit", limit),
        e => ApiError::internal(e),
    }
}

fn stale(app: &AppInner, key: String, token: Token, highest_seen: Token, op: &'static str) -> ApiError {
    let (t, h) = (token.get(), highest_seen.get());
    app.locks.publish(|| Event::StoreRejected { at_ms: app.locks.now_ms(), key, token: t, highest_seen: h, op });
    ApiError::new(
        StatusCode::CONFLICT,
        "stale_token",
        format!("token {t} is below the highest token this key has seen, {h}"),
    )
    .with("token", t)
    .with("highest_seen", h)
}

/// A token sent for an unfenced key is refused rather than ignored: the caller believes
/// it is protected, and it is not.
fn token_on_unfenced(app: &AppInner, key: &str) -> ApiError {
    ApiError::bad_request(
        "unfenced_key",
        format!(
            "key '{key}' is under the unfenced prefix '{}': it keeps no mark, so a Fencing-Token would protect \
             nothing; write it without one, or use a key outside the prefix",
            app.config.unfenced_prefix
        ),
    )
    .with("unfenced_prefix", app.config.unfenced_prefix.clone())
}

pub fn store_key(app: &AppInner, key: String) -> Result<String, ApiError> {
    let max = app.config.store_key_bytes_max;
    if key.is_empty() || key.len() > max || key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "invalid_key",
            format!("a key is 1 to {max} bytes of UTF-8 without control characters"),
        )
        .with("len_max", max));
    }
    Ok(key)
}

/// The header, if present; present but not a token is 400.
fn fencing_token(headers: &HeaderMap) -> Result<Option<Token>, ApiError> {
    if headers.get_all(FENCING_TOKEN).iter().nth(1).is_some() {
        // Which one would the caller mean? Neither is taken silently.
        return Err(ApiError::bad_request("invalid_token", "send exactly one Fencing-Token header"));
    }
    let Some(raw) = headers.get(FENCING_TOKEN) else { return Ok(None) };
    raw.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .and_then(Token::new)
        .map(Some)
        .ok_or_else(|| ApiError::bad_request("invalid_token", "Fencing-Token is a positive integer below 2^64"))
}
