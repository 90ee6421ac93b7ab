//! The built-in fenced store: the reference resource guarded by the fence gate.

use axum::body::Body;

use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fenced_core::{Command, Quotas, StoreAnswer, StoreCommand, Token};
use fenced_wire::Detail;
use serde::Serialize;
use utoipa::{IntoParams, ToSchema};

use super::error::ErrorBody;
use super::query::{ListQuery, QueryMap};
use super::responses::{InvalidQuery, NotLeaderKnown, TooLarge};
use super::{read_body, reply, ApiError, App, AppInner, Caller};
use crate::identity::Op;
use crate::locks::Unanswered;

mod checks;

pub use checks::store_key;
use checks::{check_signed, disk_low, disk_room, fencing_signature, fencing_token, token_on_unfenced};

const FENCING_TOKEN: &str = "fencing-token";
const HIGHEST_SEEN: &str = "fencing-highest-seen";
const FENCING_SIGNATURE: &str = "fencing-signature";

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
/// sizes, in key order (what the live page shows). Values are not included. A
/// ReadIndex read: never staler than the last write acknowledged anywhere.
#[utoipa::path(get, path = "/v1/store", tag = "store", operation_id = "list_store_keys",
    params(ListQuery),
    responses(
        (status = 200, description = "keys in key order, values not included", body = StoreKeys),
        InvalidQuery,
        NotLeaderKnown,
    ))]
pub async fn list(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    query: QueryMap,
) -> Result<Response, ApiError> {
    let max = app.config.list_locks_max;
    let (prefix, limit) = query.listing(max, app.config.store_key_bytes_max, "key")?;
    let keys = app.locks.read(|t, _| t.store().list(&prefix, limit)).await?;
    // An identity sees the keys it may read, and no other (the page may come out short).
    let keys = keys
        .iter()
        .filter(|k| caller.identity.allows(Op::StoreRead, &k.key))
        .map(|k| StoreKey {
            key: k.key.clone(),
            highest_seen: k.highest_seen.map(Token::get),
            value_bytes: k.value_bytes.map(|n| n as u64),
        })
        .collect();
    Ok(reply(StatusCode::OK, &StoreKeys { keys }))
}

/// The path of a key's routes, as the OpenAPI document describes it.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct StoreKeyPath {
    /// 1 to store_key_bytes_max bytes of UTF-8 without control characters
    #[param(min_length = 1)]
    key: String,
}

/// The headers of a fenced write or read, as the OpenAPI document describes them (the
/// handlers read them with `fencing_token` and `fencing_signature`).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct FencingHeaders {
    /// the writer's fencing token, a positive integer below 2^64; exactly one header line
    #[param(rename = "Fencing-Token", minimum = 1)]
    fencing_token: Option<u64>,
    /// for a key under signed_key_prefix: the grant's signature (128 hex digits) for the lock that guards the key
    #[param(rename = "Fencing-Signature")]
    fencing_signature: Option<String>,
}

/// `PUT /v1/store/{key}` with `Fencing-Token: N`; the body is the value. A key under
/// the configured `unfenced_prefix` takes the write without a token instead.
#[utoipa::path(put, path = "/v1/store/{key}", tag = "store", operation_id = "write_value", params(StoreKeyPath, FencingHeaders),
    request_body(content = Option<Vec<u8>>, content_type = "application/octet-stream", description = "the value, at most value_bytes_max bytes; none is the empty value"),
    responses(
        (status = 200, description = "written", body = StoreWrite),
        (status = 400, description = "invalid_token, invalid_key, unfenced_key", body = ErrorBody),
        (status = 409, description = "stale_token (with token and highest_seen), token_not_issued (with token and highest_issued)", body = ErrorBody),
        TooLarge,
        (status = 403, description = "forbidden; bad_signature (a key under signed_key_prefix, a token without this service's signature for its lock; with token and lock)", body = ErrorBody),
        (status = 428, description = "token_required; signature_required (a key under signed_key_prefix, with token and lock)", body = ErrorBody),
        NotLeaderKnown,
        (status = 507, description = "store_full (with what and limit); insufficient_storage (the disk is below min_free_bytes, with free_bytes and min_free_bytes)", body = ErrorBody),
    ))]
pub async fn write(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = store_key(&app, key)?;
    let token = fencing_token(&headers)?;
    if token.is_none() && app.config.is_unfenced(&key) {
        let r = write_unfenced(&app, &caller, &headers, body, &key).await;
        app.audit(&caller, "store_write_unfenced", Some(&key), None, &r);
        r?;
        return Ok(reply(StatusCode::OK, &StoreWrite::Unfenced { key, unfenced: true }));
    }
    let value = read_body(&app, &headers, body, app.config.value_bytes_max, "value").await?;
    let signature = fencing_signature(&headers);
    let highest_seen = write_value(&app, &caller, key.clone(), token, value.to_vec(), signature.as_deref()).await?;
    let t = highest_seen.get();
    Ok(reply(StatusCode::OK, &StoreWrite::Fenced { key, token: t, highest_seen: t }))
}

/// A write without a token to a key under `unfenced_prefix` (HTTP only).
async fn write_unfenced(
    app: &AppInner,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
    key: &str,
) -> Result<(), ApiError> {
    caller.require(Op::StoreWrite, key)?;
    let value = read_body(app, headers, body, app.config.value_bytes_max, "value").await?;
    disk_room(app, value.len())?;
    let cmd = StoreCommand::WriteUnfenced { key: key.to_string(), value: value.to_vec(), quotas: quotas(app) };
    run(app, cmd).await?;
    Ok(())
}

/// A fenced write (HTTP and the wire protocol) of a checked key: the new mark when
/// accepted. No token is 428 `token_required`; a stale one is 409 `stale_token`.
/// Answered once the write is committed and applied: every member holds it. A key
/// under `signed_key_prefix` needs `signature` too (see [`check_signed`]).
pub async fn write_value(
    app: &AppInner,
    caller: &Caller,
    key: String,
    token: Option<Token>,
    value: Vec<u8>,
    signature: Option<&str>,
) -> Result<Token, ApiError> {
    let audit_key = app.audit.is_on().then(|| key.clone());
    let r = write_unaudited(app, caller, key, token, value, signature).await;
    if let Some(key) = audit_key {
        app.audit(caller, "store_write", Some(&key), token.map(Token::get), &r);
    }
    r
}

async fn write_unaudited(
    app: &AppInner,
    caller: &Caller,
    key: String,
    token: Option<Token>,
    value: Vec<u8>,
    signature: Option<&str>,
) -> Result<Token, ApiError> {
    caller.require(Op::StoreWrite, &key)?;
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
    check_signed(app, &key, token, signature)?;
    disk_room(app, value.len())?;
    let foreign = app.config.takes_foreign_tokens(&key);
    let cmd = StoreCommand::Write { key: key.clone(), token, value, foreign, quotas: quotas(app) };
    match run(app, cmd).await {
        Ok(StoreAnswer::Written { mark }) => Ok(mark),
        Ok(other) => Err(ApiError::internal(format!("a fenced write answered {other:?}"))),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v1/store/{key}`, a fenced read when `Fencing-Token` is present.
#[utoipa::path(get, path = "/v1/store/{key}", tag = "store", operation_id = "read_value", params(StoreKeyPath, FencingHeaders),
    responses(
        (status = 200, description = "the value", content_type = "application/octet-stream", body = Vec<u8>,
            headers(("Fencing-Highest-Seen" = u64, description = "the key's mark, when it has one"))),
        (status = 400, description = "invalid_token, invalid_key, unfenced_key", body = ErrorBody),
        (status = 404, description = "not_found (with highest_seen when the key has a mark)", body = ErrorBody),
        (status = 403, description = "forbidden; bad_signature (a fenced read of a key under signed_key_prefix)", body = ErrorBody),
        (status = 409, description = "stale_token, token_not_issued", body = ErrorBody),
        (status = 428, description = "signature_required (a fenced read of a key under signed_key_prefix)", body = ErrorBody),
        NotLeaderKnown,
        (status = 507, description = "store_full (a fenced read that needs a new key past store_keys_max), insufficient_storage (a fenced read of a new key with the disk below min_free_bytes, with free_bytes and min_free_bytes)", body = ErrorBody),
    ))]
pub async fn read(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = store_key(&app, key)?;
    let token = fencing_token(&headers)?;
    let signature = fencing_signature(&headers);
    let (mark, value) = read_value(&app, &caller, key, token, signature.as_deref()).await?;
    let mut resp = (StatusCode::OK, [(header::CONTENT_TYPE, "application/octet-stream")], value).into_response();
    if let Some(m) = mark {
        resp.headers_mut().insert(HIGHEST_SEEN, HeaderValue::from(m.get()));
    }
    Ok(resp)
}

/// A read of a checked key (HTTP and the wire protocol), fenced when `token` is
/// given: the key's mark and its value. Absent is 404 `not_found` (with the mark). A
/// fenced read moves the mark, so it goes through the log like a write; a plain read is
/// a ReadIndex read. A fenced read of a key under `signed_key_prefix` needs `signature`.
pub async fn read_value(
    app: &AppInner,
    caller: &Caller,
    key: String,
    token: Option<Token>,
    signature: Option<&str>,
) -> Result<(Option<Token>, Vec<u8>), ApiError> {
    let audit_key = app.audit.is_on().then(|| key.clone());
    let r = read_unaudited(app, caller, key, token, signature).await;
    // A fenced read moves the key's mark: a decision like a write. A plain read that
    // found nothing is no refusal.
    let refused = r.as_ref().is_err_and(|e| e.code != "not_found");
    if let Some(key) = audit_key.filter(|_| token.is_some() || refused || app.audit.all) {
        let op = if token.is_some() { "store_read_fenced" } else { "store_read" };
        app.audit(caller, op, Some(&key), token.map(Token::get), &r);
    }
    r
}

async fn read_unaudited(
    app: &AppInner,
    caller: &Caller,
    key: String,
    token: Option<Token>,
    signature: Option<&str>,
) -> Result<(Option<Token>, Vec<u8>), ApiError> {
    caller.require(Op::StoreRead, &key)?;
    if token.is_some() && app.config.is_unfenced(&key) {
        return Err(token_on_unfenced(app, &key));
    }
    let (mark, value) = match token {
        Some(token) => {
            check_signed(app, &key, token, signature)?;
            let foreign = app.config.takes_foreign_tokens(&key);
            // A fenced read of a new key creates its mark: new room, which a disk below
            // its reserve does not give. With the disk low the read is proposed with no
            // room at all in its quotas, so every member refuses it if the key is new
            // and takes it (the mark moves in place) if not.
            let disk_low = disk_low(app, 0);
            let quotas = if disk_low.is_some() { Quotas { keys_max: 0, bytes_max: 0 } } else { quotas(app) };
            let cmd = StoreCommand::FencedRead { key: key.clone(), token, foreign, quotas };
            match run(app, cmd).await {
                Ok(StoreAnswer::Read { mark, value }) => (Some(mark), value),
                Ok(other) => return Err(ApiError::internal(format!("a fenced read answered {other:?}"))),
                Err(Unanswered::Refused(fenced_core::Error::StoreFull { .. })) if disk_low.is_some() => {
                    crate::metrics::inc(&app.metrics.store_writes_disk_low);
                    return Err(disk_low.expect("checked"));
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => {
            let record = app.locks.read(|t, _| t.store().get(&key).cloned()).await?;
            record.map_or((None, None), |r| (r.mark, r.value))
        }
    };
    let Some(value) = value else {
        let e = ApiError::new(StatusCode::NOT_FOUND, "not_found", "no value under this key");
        return Err(match mark {
            Some(m) => e.with(Detail::HighestSeen(m)),
            None => e,
        });
    };
    Ok((mark, value))
}

/// The quotas every member applies a store command with: the proposer's, carried in
/// the command, so that members configured differently still decide alike.
fn quotas(app: &AppInner) -> Quotas {
    Quotas { keys_max: app.config.store_keys_max, bytes_max: app.config.store_bytes_max }
}

/// Proposes a store command and waits for its entry to be applied.
async fn run(app: &AppInner, cmd: StoreCommand) -> Result<StoreAnswer, Unanswered> {
    app.locks.answered(Command::Store(cmd)).await
}
