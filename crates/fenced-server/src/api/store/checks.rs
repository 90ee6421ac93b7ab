//! What a store call checks before it runs: the disk's room, its key, its fencing token
//! and, under `signed_key_prefix`, the grant's signature.

use super::*;

/// A write needs room on disk for its value beyond the reserve kept for the lock
/// service's log.
pub(super) fn disk_room(app: &AppInner, value_bytes: usize) -> Result<(), ApiError> {
    let Some(e) = disk_low(app, value_bytes) else { return Ok(()) };
    crate::metrics::inc(&app.metrics.store_writes_disk_low);
    Err(e)
}

/// The refusal a store request gets when taking `bytes` more would leave the disk below
/// its reserve (probed now), if it would.
pub(super) fn disk_low(app: &AppInner, bytes: usize) -> Option<ApiError> {
    let free = app.disk.room_for(bytes as u64).err()?;
    let min = app.disk.min_free_bytes;
    let e = ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        "insufficient_storage",
        format!(
            "the data directory has {free} bytes free, and min_free_bytes {min} are kept for the lock service: \
             store writes and fenced reads of new keys are refused until there is room again; locks go on"
        ),
    );
    Some(e.with(Detail::FreeBytes(free)).with(Detail::MinFreeBytes(min)))
}

/// A token sent for an unfenced key is refused rather than ignored: the caller believes
/// it is protected, and it is not.
pub(super) fn token_on_unfenced(app: &AppInner, key: &str) -> ApiError {
    ApiError::bad_request(
        "unfenced_key",
        format!(
            "key '{key}' is under the unfenced prefix '{}': it keeps no mark, so a Fencing-Token would protect \
             nothing; write it without one, or use a key outside the prefix",
            app.config.unfenced_prefix
        ),
    )
    .with(Detail::UnfencedPrefix(app.config.unfenced_prefix.clone().into()))
}

pub fn store_key(app: &AppInner, key: String) -> Result<String, ApiError> {
    let max = app.config.store_key_bytes_max;
    if key.is_empty() || key.len() > max || key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "invalid_key",
            format!("a key is 1 to {max} bytes of UTF-8 without control characters"),
        )
        .with(Detail::LenMax(max as u64)));
    }
    Ok(key)
}

/// A key under `signed_key_prefix` takes a token only with the service's signature
/// for the lock that guards it (`Config::guarding_lock`): none is 428
/// `signature_required`, one that does not verify (a forged number, another lock's
/// token, another service's) 403 `bad_signature`. Checked on the member that took the
/// request, before anything is proposed: a signature is the same on every member.
pub(super) fn check_signed(app: &AppInner, key: &str, token: Token, signature: Option<&str>) -> Result<(), ApiError> {
    let Some(lock) = app.config.guarding_lock(key) else { return Ok(()) };
    if lock.len() > app.config.lock_name_bytes_max || fenced_core::LockName::new(&lock).is_err() {
        // No grant can exist for it: say so rather than refuse every signature.
        let max = app.config.lock_name_bytes_max;
        let m = format!(
            "key '{key}' maps to lock '{lock}' by the signed-key rule, which is no lock name (1 to {max} bytes)"
        );
        return Err(ApiError::bad_request("invalid_key", m).with(Detail::Lock(lock.into())));
    }
    let Some(signer) = app.signer.as_ref() else {
        return Err(ApiError::internal("signed_key_prefix without a signing key (refused at start)"));
    };
    let with = |e: ApiError| e.with(Detail::Token(token)).with(Detail::Lock(lock.clone().into()));
    let Some(signature) = signature else {
        return Err(with(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "signature_required",
            format!(
                "key '{key}' takes signed tokens only: send the grant's signature for lock '{lock}' in a \
                 Fencing-Signature header (HTTP; the wire protocol's PUT and GET frames carry none)"
            ),
        )));
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if signer.verifies(&lock, token.get(), signature.trim(), now) {
        return Ok(());
    }
    crate::metrics::inc(&app.metrics.bad_signatures);
    Err(with(ApiError::new(
        StatusCode::FORBIDDEN,
        "bad_signature",
        format!("token {token} carries no signature of this service for lock '{lock}', which guards key '{key}'"),
    )))
}

/// The `Fencing-Signature` header, if present. Two of them are one signature that
/// verifies nothing (refused `bad_signature` whatever their order), as two tokens are
/// refused: which one would the caller mean?
pub(super) fn fencing_signature(headers: &HeaderMap) -> Option<String> {
    let mut all = headers.get_all(FENCING_SIGNATURE).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return Some(String::new());
    }
    Some(first.to_str().map_or_else(|_| String::new(), str::to_string))
}

/// The header, if present; present but not a token is 400.
pub(super) fn fencing_token(headers: &HeaderMap) -> Result<Option<Token>, ApiError> {
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
