//! The client's typed errors, and how an HTTP answer maps onto them.

use std::fmt;
use std::time::Duration;

use fenced_core::Token;

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
    /// The request was malformed or out of limits (400, 413, 422, or a bad argument here).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The thing asked about does not exist (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// Any other answer from the server.
    #[error("server answered {status} {code}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
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
}

impl Error {
    pub(crate) fn unavailable(message: impl Into<String>) -> Error {
        Error::Unavailable { message: message.into(), retry_after: None }
    }
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

/// An error answer from the server, before it is given a meaning by the call.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub details: serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    /// Parses `{"error":{"code","message",...}}`; anything else keeps the status and the raw text.
    pub fn parse(status: u16, body: &[u8]) -> ApiError {
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
                ApiError { status, code: error.code, message: error.message, details: error.details }
            }
            Err(_) => ApiError {
                status,
                code: format!("http_{status}"),
                message: String::from_utf8_lossy(body).chars().take(200).collect(),
                details: serde_json::Map::new(),
            },
        }
    }

    pub fn detail_u64(&self, key: &str) -> Option<u64> {
        self.details.get(key).and_then(serde_json::Value::as_u64)
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.detail_u64("retry_after_ms").map(Duration::from_millis)
    }

    /// The generic meaning of an answer; calls refine the ones they expect (409, 404).
    pub fn into_error(self) -> Error {
        let message = if self.message.is_empty() { self.code.clone() } else { self.message.clone() };
        match self.status {
            400 | 413 | 422 => Error::BadRequest(message),
            401 | 403 => Error::Unauthorised(message),
            404 => Error::NotFound(message),
            429 | 502..=504 => Error::Unavailable { message, retry_after: self.retry_after() },
            409 if self.code == "stale_token" => {
                match (
                    self.detail_u64("token").and_then(Token::new),
                    self.detail_u64("highest_seen").and_then(Token::new),
                ) {
                    (Some(token), Some(highest_seen)) => Error::StaleToken { token, highest_seen },
                    _ => Error::Server { status: self.status, code: self.code, message },
                }
            }
            status => Error::Server { status, code: self.code, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(status: u16, body: &str) -> Error {
        ApiError::parse(status, body.as_bytes()).into_error()
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
        assert!(matches!(map(500, "boom"), Error::Server { status: 500, .. }));
        assert!(matches!(map(404, r#"{"error":{"code":"lease_not_found","message":"gone"}}"#), Error::NotFound(_)));
    }
}
