//! The client's typed errors, and how an HTTP answer maps onto them.

use std::fmt;
use std::time::Duration;

use fenced_core::Token;
use fenced_wire::detail::{self, Detail, Value};

/// Everything a call on the lock service or a fenced resource can fail with.
///
/// Expected outcomes of a fenced operation ("rejected, the resource has seen a newer
/// token") are values ([`crate::Fenced::Rejected`]); [`Error::StaleToken`] exists for
/// callers who turn such a value into an error with [`crate::Fenced::into_result`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The service could not be reached, timed out, or said it cannot serve now.
    #[error("the lock service is unavailable: {message}")]
    Unavailable {
        /// What went wrong, for a person.
        message: String,
        /// The server's hint for when to try again, when it gave one.
        retry_after: Option<Duration>,
    },
    /// The auth token was missing or refused (401/403).
    #[error("not authorised: {0}")]
    Unauthorised(String),
    /// The lock was not granted within the wait.
    #[error("lock '{name}' is held by another lease")]
    LockHeld {
        /// The lock asked for.
        name: String,
    },
    /// The lock was lost, or can no longer be trusted, before the work finished.
    #[error("lock lost: {0}")]
    Lost(LostReason),
    /// A fenced operation was refused because the resource has seen a newer token.
    #[error("stale token {token}: the resource has already seen {highest_seen}")]
    StaleToken {
        /// The token the operation carried.
        token: Token,
        /// The resource's mark, higher than `token`.
        highest_seen: Token,
    },
    /// A gate given the service's verifying keys refused a token that carries no valid
    /// signature of the service for the lock that guards the resource (a forged
    /// number, another lock's token, another service's): the server's store for a
    /// key under `signed_key_prefix` (`bad_signature`, `signature_required`), or a
    /// [`Verified`](crate::resource::Verified) gate. Nothing was done.
    #[error("token {token} carries no valid signature for lock '{lock}'")]
    BadSignature {
        /// The token refused.
        token: Token,
        /// The lock whose signature the gate asked for.
        lock: String,
    },
    /// The request was malformed or out of limits (400, 413, 422, or a bad argument here).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The thing asked about does not exist (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The lock service refused the call for a reason of its own that none of the
    /// variants above names (`not_holder`, `token_not_issued`, ...): match on it.
    #[error("refused: {0}")]
    Refused(fenced_core::Error),
    /// A watch cannot go on without a gap: the events after its position are no longer
    /// held (`compacted`; `oldest_index` is the oldest one held), or its stream fell
    /// behind (`lagged`). Read the state again (`locks`) and start a new watch.
    #[error("the watch missed events: {message}")]
    Missed {
        /// The oldest index the server still holds, when it said.
        oldest_index: Option<u64>,
        message: String,
    },
    /// Any other answer from the server.
    #[error("server answered {code}: {message}")]
    Server {
        /// HTTP status, when the answer came over HTTP (the wire protocol carries
        /// codes only).
        status: Option<u16>,
        /// The error body's `code`.
        code: String,
        /// The error body's `message`.
        message: String,
    },
    /// The PostgreSQL adapter's database error.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The SQLite adapter's database error.
    #[cfg(feature = "sqlite")]
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The S3 adapter's store error (unreachable, denied, ...; a precondition failure
    /// is retried, and a stale token is a `Fenced::Rejected`, not this), or the
    /// DynamoDB adapter's failure to sign a request.
    #[cfg(any(feature = "s3", feature = "dynamodb"))]
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
}

impl Error {
    pub(crate) fn unavailable(message: impl Into<String>) -> Error {
        Error::Unavailable { message: message.into(), retry_after: None }
    }
}

/// An answer the client cannot take for what it asked (a token 0, another call's answer).
pub(crate) fn bad_answer(message: &str) -> Error {
    Error::Server { status: None, code: "bad_response".into(), message: message.into() }
}

/// Why a guard stopped being trustworthy.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LostReason {
    /// No keepalive succeeded before the client-side deadline (`valid_until`).
    Expired,
    /// A keepalive answered after the client-side deadline had passed.
    KeepaliveTooLate,
    /// The server no longer knows the lease: it expired there or was revoked.
    LeaseNotFound,
    /// The server refused the keepalive's credentials.
    Unauthorised,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "no keepalive succeeded before the lease's client-side deadline",
            LostReason::KeepaliveTooLate => "a keepalive came back after the client-side deadline",
            LostReason::LeaseNotFound => "the server no longer knows the lease (expired or revoked)",
            LostReason::Unauthorised => "the server refused the keepalive's credentials",
        })
    }
}

/// An error answer from the server, before it is given a meaning by the call: the same
/// code, message and typed fields whichever transport carried it.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// The HTTP status, when the answer came over HTTP.
    pub status: Option<u16>,
    pub code: String,
    pub message: String,
    /// The fields the server sent with it (tokens, limits, `retry_after_ms`, ...).
    pub details: Vec<Detail<'static>>,
    /// The lock service's own refusal, when `code` is one of its domain codes: what the
    /// client matches on, rather than a (status, code) pair.
    pub refusal: Option<fenced_core::Error>,
}

impl ApiError {
    /// An error answer of `code`, its `message` and `details`; its refusal read from them.
    pub fn new(status: Option<u16>, code: String, message: String, mut details: Vec<Detail<'static>>) -> ApiError {
        // In tag order, whichever order the transport carried them in.
        details.sort_by_key(Detail::tag);
        let refusal = fenced_core::Error::from_code(&code, |name| detail::number(&details, name));
        ApiError { status, code, message, details, refusal }
    }

    /// A wire protocol's error answer, typed as it came.
    pub fn from_wire(code: &str, message: &str, details: Vec<Detail<'_>>) -> ApiError {
        let details = details.into_iter().map(Detail::into_owned).collect();
        ApiError::new(None, code.to_string(), message.to_string(), details)
    }

    /// An HTTP error answer: `{"error":{"code","message",...}}` with `status`, each
    /// member beside code and message read as its typed field (members that are no
    /// field are left out); anything else keeps the raw text.
    pub fn from_http(status: u16, body: &[u8]) -> ApiError {
        #[derive(serde::Deserialize)]
        struct Outer {
            error: Inner,
        }
        #[derive(serde::Deserialize)]
        struct Inner {
            code: String,
            #[serde(default)]
            message: String,
            #[serde(flatten)]
            details: serde_json::Map<String, serde_json::Value>,
        }
        match serde_json::from_slice::<Outer>(body) {
            Ok(Outer { error }) => {
                let details = error.details.iter().filter_map(|(name, v)| json_detail(name, v)).collect();
                ApiError::new(Some(status), error.code, error.message, details)
            }
            Err(_) => {
                let message = String::from_utf8_lossy(body).chars().take(200).collect();
                ApiError::new(Some(status), format!("http_{status}"), message, Vec::new())
            }
        }
    }

    /// An answer this client could not read: `bad_response`, with why.
    pub fn unreadable(message: String) -> ApiError {
        ApiError::new(None, "bad_response".into(), message, Vec::new())
    }

    pub fn detail_u64(&self, name: &str) -> Option<u64> {
        detail::number(&self.details, name)
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.detail_u64("retry_after_ms").map(Duration::from_millis)
    }

    /// The lease is gone on the server (expired or revoked).
    pub fn lease_gone(&self) -> bool {
        matches!(self.refusal, Some(fenced_core::Error::LeaseNotFound))
    }

    /// The credentials were refused.
    pub fn unauthorised(&self) -> bool {
        matches!(self.code.as_str(), "unauthorized" | "forbidden") || matches!(self.status, Some(401 | 403))
    }

    /// The server cannot serve this now but nothing was done: the call may be retried.
    pub fn retryable(&self) -> bool {
        use fenced_core::Error as E;
        matches!(self.refusal, Some(E::Recovering { .. } | E::ShuttingDown | E::TooBusy { .. }))
            || self.code == "too_many_connections"
    }

    /// The generic meaning of an answer; calls refine the ones they expect (a held
    /// lock, a gone lease).
    pub fn into_error(self) -> Error {
        use fenced_core::Error as E;
        let message = if self.message.is_empty() { self.code.clone() } else { self.message.clone() };
        let unavailable = |message| Error::Unavailable { message, retry_after: self.retry_after() };
        match self.refusal {
            Some(E::StaleToken { token, highest_seen }) => return Error::StaleToken { token, highest_seen },
            Some(E::LeaseNotFound) => return Error::NotFound(message),
            Some(E::Recovering { .. } | E::ShuttingDown | E::TooBusy { .. } | E::TooManyLeases { .. })
            | Some(E::TooManyLocks { .. } | E::TooManyWaiters { .. }) => return unavailable(message),
            Some(E::TtlOutOfRange { .. } | E::WaitOutOfRange { .. } | E::LockDelayOutOfRange { .. }) => {
                return Error::BadRequest(message)
            }
            Some(other) => return Error::Refused(other),
            None => {}
        }
        if matches!(self.code.as_str(), "bad_signature" | "signature_required") {
            let token = self.detail_u64("token").and_then(Token::new);
            let lock = detail::text(&self.details, "lock");
            if let (Some(token), Some(lock)) = (token, lock) {
                return Error::BadSignature { token, lock: lock.to_string() };
            }
        }
        if self.unauthorised() {
            return Error::Unauthorised(message);
        }
        match (self.code.as_str(), self.status) {
            ("not_found", _) | (_, Some(404)) => Error::NotFound(message),
            ("too_many_connections", _) | (_, Some(429 | 502..=504)) => unavailable(message),
            ("too_large" | "unfenced_key", _) | (_, Some(400 | 413 | 422)) => Error::BadRequest(message),
            (code, _) if code.starts_with("invalid_") => Error::BadRequest(message),
            (_, status) => Error::Server { status, code: self.code, message },
        }
    }
}

/// A member of a JSON error object as its typed field, if it is one.
fn json_detail(name: &str, v: &serde_json::Value) -> Option<Detail<'static>> {
    let value = match v {
        serde_json::Value::String(s) => Value::Text(s.clone().into()),
        v => Value::Number(v.as_u64()?),
    };
    Detail::parse(name, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(status: u16, body: &str) -> Error {
        ApiError::from_http(status, body.as_bytes()).into_error()
    }

    /// A wire answer: a code, a message and typed fields, no status.
    fn wire(code: &str, details: Vec<Detail<'static>>) -> Error {
        ApiError::from_wire(code, "no", details).into_error()
    }

    fn t(n: u64) -> Token {
        Token::new(n).unwrap()
    }

    #[test]
    fn answers_map_to_typed_errors() {
        assert!(
            matches!(map(400, r#"{"error":{"code":"bad_ttl","message":"ttl too long"}}"#), Error::BadRequest(m) if m == "ttl too long")
        );
        assert!(matches!(map(401, r#"{"error":{"code":"unauthorised","message":"no"}}"#), Error::Unauthorised(_)));
        assert!(matches!(map(403, "forbidden"), Error::Unauthorised(_)));
        assert!(matches!(
            map(503, r#"{"error":{"code":"recovering","message":"grace","retry_after_ms":1500}}"#),
            Error::Unavailable { retry_after: Some(d), .. } if d == Duration::from_millis(1500)
        ));
        assert!(matches!(
            map(409, r#"{"error":{"code":"stale_token","message":"stale","token":3,"highest_seen":7}}"#),
            Error::StaleToken { token, highest_seen } if token.get() == 3 && highest_seen.get() == 7
        ));
        assert!(matches!(map(500, "boom"), Error::Server { status: Some(500), .. }));
        assert!(matches!(map(404, r#"{"error":{"code":"lease_not_found","message":"gone"}}"#), Error::NotFound(_)));
    }

    #[test]
    fn wire_answers_map_by_their_code_and_typed_fields() {
        let details = vec![Detail::Token(t(99)), Detail::HighestIssued(t(9))];
        let Error::Refused(fenced_core::Error::TokenNotIssued { token, highest_issued }) =
            wire("token_not_issued", details)
        else {
            panic!("not typed")
        };
        assert_eq!((token, highest_issued), (t(99), Some(t(9))));
        assert!(matches!(
            wire("not_holder", vec![Detail::HolderToken(t(4))]),
            Error::Refused(fenced_core::Error::NotHolder { holder: Some(h) }) if h == t(4)
        ));
        assert!(matches!(
            wire("recovering", vec![Detail::RetryAfterMs(900)]),
            Error::Unavailable { retry_after: Some(d), .. } if d == Duration::from_millis(900)
        ));
        assert!(matches!(
            wire("bad_signature", vec![Detail::Token(t(5)), Detail::Lock("acct".into())]),
            Error::BadSignature { token, lock } if token == t(5) && lock == "acct"
        ));
        assert!(matches!(wire("invalid_name", vec![Detail::LenMax(256)]), Error::BadRequest(_)));
        assert!(matches!(wire("unauthorized", vec![]), Error::Unauthorised(_)));
        assert!(matches!(wire("corrupt_record", vec![]), Error::Server { status: None, .. }));
    }

    #[test]
    fn both_transports_give_one_error_the_same_fields() {
        let http = ApiError::from_http(
            409,
            br#"{"error":{"code":"stale_token","message":"stale","token":3,"highest_seen":7,"extra":[1]}}"#,
        );
        let wire = ApiError::from_wire("stale_token", "stale", vec![Detail::Token(t(3)), Detail::HighestSeen(t(7))]);
        assert_eq!((&http.code, &http.message, &http.details), (&wire.code, &wire.message, &wire.details));
        assert_eq!(http.refusal, Some(fenced_core::Error::StaleToken { token: t(3), highest_seen: t(7) }));
        assert_eq!(http.refusal, wire.refusal);
    }
}
