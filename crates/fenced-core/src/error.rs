//! The lock service's one error enum: every way a request can be refused, with the
//! domain code each transport carries (`lock_held`, `not_holder`, ...). The server maps
//! it to HTTP statuses and JSON at its edge; nothing in here knows about either.

use std::fmt;

use crate::store::Quota;
use crate::Token;

/// Why the lock service refused a request. Expected outcomes ("the lock is held", "the
/// token is stale") are variants too: a caller matches on them, not on strings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Error {
    /// No live lease with this id: it expired, was revoked or never existed.
    LeaseNotFound,
    /// Not granted within the wait; `holder` is the holder's token, if any (a free lock
    /// can refuse too, during lock-delay).
    LockHeld {
        holder: Option<Token>,
    },
    /// The lease does not hold the lock; `holder` is the token of whoever does.
    NotHolder {
        holder: Option<Token>,
    },
    /// The server restarted and grants nothing until every earlier lease has expired.
    Recovering {
        retry_after_ms: u64,
    },
    TtlOutOfRange {
        ttl_ms_min: u64,
        ttl_ms_max: u64,
    },
    WaitOutOfRange {
        wait_ms_max: u64,
    },
    LockDelayOutOfRange {
        lock_delay_ms_max: u64,
    },
    TooManyLeases {
        leases_max: usize,
    },
    TooManyLocks {
        locks_max: usize,
    },
    TooManyWaiters {
        waiters_max: usize,
    },
    /// An acquire of several locks named none, or more than `names_max`.
    InvalidNames {
        names_max: usize,
    },
    /// A caller reused a live lease id. The server draws 128 random bits, so this is a
    /// bug or an attack, never a coincidence.
    LeaseExists,
    /// The gate refused a token below the key's mark.
    StaleToken {
        token: Token,
        highest_seen: Token,
    },
    /// A token above every token the service ever issued: accepting it would shut the
    /// key to every real holder.
    TokenNotIssued {
        token: Token,
        highest_issued: Option<Token>,
    },
    /// The server is shutting down and takes no new waits.
    ShuttingDown,
    /// This member of a cluster is not the leader (or lost leadership before the
    /// request committed: then it may or may not have taken effect, and a retry by the
    /// same lease is safe). `leader` is the member believed to lead, if any.
    NotLeader {
        leader: Option<u64>,
    },
    /// The leader holds its limit of proposals waiting for the log (by count or by
    /// bytes): this one was refused at once and did nothing. Retry after
    /// `retry_after_ms`.
    TooBusy {
        retry_after_ms: u64,
    },
    /// The fenced store holds its limit of keys or bytes; the write would need more.
    StoreFull {
        quota: Quota,
        limit: u64,
    },
}

impl Error {
    /// The snake_case code every transport carries.
    pub fn code(&self) -> &'static str {
        match self {
            Error::LeaseNotFound => "lease_not_found",
            Error::LockHeld { .. } => "lock_held",
            Error::NotHolder { .. } => "not_holder",
            Error::Recovering { .. } => "recovering",
            Error::TtlOutOfRange { .. } => "ttl_out_of_range",
            Error::WaitOutOfRange { .. } => "wait_out_of_range",
            Error::LockDelayOutOfRange { .. } => "lock_delay_out_of_range",
            Error::TooManyLeases { .. } => "too_many_leases",
            Error::TooManyLocks { .. } => "too_many_locks",
            Error::TooManyWaiters { .. } => "too_many_waiters",
            Error::InvalidNames { .. } => "invalid_names",
            Error::LeaseExists => "lease_exists",
            Error::StaleToken { .. } => "stale_token",
            Error::TokenNotIssued { .. } => "token_not_issued",
            Error::ShuttingDown => "shutting_down",
            Error::NotLeader { .. } => "not_leader",
            Error::StoreFull { .. } => "store_full",
            Error::TooBusy { .. } => "too_busy",
        }
    }

    /// The numbers a caller needs to act on the refusal, by name (the JSON edge puts
    /// them next to `code`).
    pub fn details(&self) -> Vec<(&'static str, u64)> {
        let opt = |name, t: &Option<Token>| t.map(|t| (name, t.get()));
        match self {
            Error::LockHeld { holder } => opt("holder_token", holder).into_iter().collect(),
            Error::NotHolder { holder } => opt("holder_token", holder).into_iter().collect(),
            Error::Recovering { retry_after_ms } | Error::TooBusy { retry_after_ms } => {
                vec![("retry_after_ms", *retry_after_ms)]
            }
            Error::TtlOutOfRange { ttl_ms_min, ttl_ms_max } => {
                vec![("ttl_ms_min", *ttl_ms_min), ("ttl_ms_max", *ttl_ms_max)]
            }
            Error::WaitOutOfRange { wait_ms_max } => vec![("wait_ms_max", *wait_ms_max)],
            Error::LockDelayOutOfRange { lock_delay_ms_max } => vec![("lock_delay_ms_max", *lock_delay_ms_max)],
            Error::TooManyLeases { leases_max: n }
            | Error::TooManyLocks { locks_max: n }
            | Error::TooManyWaiters { waiters_max: n }
            | Error::InvalidNames { names_max: n } => vec![("limit", *n as u64)],
            Error::StaleToken { token, highest_seen } => {
                vec![("token", token.get()), ("highest_seen", highest_seen.get())]
            }
            Error::TokenNotIssued { token, highest_issued } => {
                let mut d = vec![("token", token.get())];
                d.extend(opt("highest_issued", highest_issued));
                d
            }
            Error::NotLeader { leader } => leader.map(|id| ("leader_id", id)).into_iter().collect(),
            Error::StoreFull { limit, .. } => vec![("limit", *limit)],
            Error::LeaseNotFound | Error::LeaseExists | Error::ShuttingDown => Vec::new(),
        }
    }
}

impl Error {
    /// The error a code and its details name, as a transport carried them: the inverse
    /// of [`code`](Error::code) and [`details`](Error::details). `None` for a code that is
    /// not the lock service's (an edge's own, like `invalid_json` or `invalid_name`), and
    /// for details that are missing.
    pub fn from_code(code: &str, detail: impl Fn(&str) -> Option<u64>) -> Option<Error> {
        let token = |name| detail(name).and_then(Token::new);
        let n = |name| detail(name);
        Some(match code {
            "lease_not_found" => Error::LeaseNotFound,
            "lock_held" => Error::LockHeld { holder: token("holder_token") },
            "not_holder" => Error::NotHolder { holder: token("holder_token") },
            "recovering" => Error::Recovering { retry_after_ms: n("retry_after_ms").unwrap_or(0) },
            "ttl_out_of_range" => Error::TtlOutOfRange { ttl_ms_min: n("ttl_ms_min")?, ttl_ms_max: n("ttl_ms_max")? },
            "wait_out_of_range" => Error::WaitOutOfRange { wait_ms_max: n("wait_ms_max")? },
            "lock_delay_out_of_range" => Error::LockDelayOutOfRange { lock_delay_ms_max: n("lock_delay_ms_max")? },
            "too_many_leases" => Error::TooManyLeases { leases_max: n("limit")? as usize },
            "too_many_locks" => Error::TooManyLocks { locks_max: n("limit")? as usize },
            "too_many_waiters" => Error::TooManyWaiters { waiters_max: n("limit")? as usize },
            "invalid_names" => Error::InvalidNames { names_max: n("limit")? as usize },
            "lease_exists" => Error::LeaseExists,
            "stale_token" => Error::StaleToken { token: token("token")?, highest_seen: token("highest_seen")? },
            "token_not_issued" => {
                Error::TokenNotIssued { token: token("token")?, highest_issued: token("highest_issued") }
            }
            "shutting_down" => Error::ShuttingDown,
            "not_leader" => Error::NotLeader { leader: n("leader_id") },
            "too_busy" => Error::TooBusy { retry_after_ms: n("retry_after_ms").unwrap_or(0) },
            // `store_full` names its quota in a string (`what`), which the edge adds:
            // callers match on the code.
            _ => return None,
        })
    }
}

impl Error {
    /// One of each refusal, with each shape its fields take (a holder named or not, ...):
    /// what the tests of every transport that carries these errors run through.
    pub fn examples() -> Vec<Error> {
        let t = |n| Token::new(n).expect("not 0");
        vec![
            Error::LeaseNotFound,
            Error::LockHeld { holder: Some(t(3)) },
            Error::LockHeld { holder: None },
            Error::NotHolder { holder: Some(t(4)) },
            Error::NotHolder { holder: None },
            Error::Recovering { retry_after_ms: 1_500 },
            Error::TtlOutOfRange { ttl_ms_min: 100, ttl_ms_max: 300_000 },
            Error::WaitOutOfRange { wait_ms_max: 9 },
            Error::LockDelayOutOfRange { lock_delay_ms_max: 8 },
            Error::TooManyLeases { leases_max: 7 },
            Error::TooManyLocks { locks_max: 6 },
            Error::TooManyWaiters { waiters_max: 5 },
            Error::InvalidNames { names_max: 64 },
            Error::LeaseExists,
            Error::StaleToken { token: t(2), highest_seen: t(9) },
            Error::TokenNotIssued { token: t(99), highest_issued: Some(t(9)) },
            Error::TokenNotIssued { token: t(99), highest_issued: None },
            Error::ShuttingDown,
            Error::NotLeader { leader: Some(2) },
            Error::NotLeader { leader: None },
            Error::TooBusy { retry_after_ms: 50 },
            Error::StoreFull { quota: Quota::Keys, limit: 10 },
            Error::StoreFull { quota: Quota::Bytes, limit: 1 << 20 },
        ]
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LeaseNotFound => write!(f, "no live lease with this id: it expired, was revoked or never existed"),
            Error::LockHeld { holder: Some(_) } => write!(f, "the lock is held"),
            Error::LockHeld { holder: None } => {
                write!(f, "the lock is free but in lock-delay after its holder's lease expired")
            }
            Error::NotHolder { .. } => write!(f, "this lease does not hold the lock"),
            Error::Recovering { .. } => {
                write!(f, "the server restarted and grants nothing until every lease of before the restart has expired")
            }
            Error::TtlOutOfRange { ttl_ms_min, ttl_ms_max } => {
                write!(f, "ttl_ms must be between {ttl_ms_min} and {ttl_ms_max}")
            }
            Error::WaitOutOfRange { wait_ms_max } => write!(f, "wait_ms is at most {wait_ms_max}"),
            Error::LockDelayOutOfRange { lock_delay_ms_max } => {
                write!(f, "lock_delay_ms is at most {lock_delay_ms_max}")
            }
            Error::TooManyLeases { leases_max } => write!(f, "the server holds its limit of {leases_max} leases"),
            Error::TooManyLocks { locks_max } => write!(f, "the server holds its limit of {locks_max} locks"),
            Error::TooManyWaiters { waiters_max } => write!(f, "the waiter limit of {waiters_max} is reached"),
            Error::InvalidNames { names_max } => {
                write!(f, "an acquire of several locks names one to {names_max} locks")
            }
            Error::LeaseExists => write!(f, "a lease with this id is already live"),
            Error::StaleToken { token, highest_seen } => {
                write!(f, "token {token} is below the highest token this key has seen, {highest_seen}")
            }
            Error::TokenNotIssued { token, highest_issued: Some(h) } => {
                write!(f, "token {token} was never issued: the highest token issued so far is {h}")
            }
            Error::TokenNotIssued { token, highest_issued: None } => {
                write!(f, "token {token} was never issued: no token has been issued yet")
            }
            Error::ShuttingDown => write!(f, "the server is shutting down"),
            Error::NotLeader { leader: Some(id) } => {
                write!(f, "this member is not the cluster's leader (member {id} is): try another endpoint")
            }
            Error::NotLeader { leader: None } => {
                write!(f, "this member is not the cluster's leader and knows of none: try another endpoint")
            }
            Error::TooBusy { .. } => {
                write!(
                    f,
                    "the leader holds its limit of proposals waiting for the log: nothing was done; retry shortly"
                )
            }
            Error::StoreFull { quota, limit } => {
                let what = quota.as_str();
                write!(f, "the fenced store holds its limit of {limit} {what}: free some, or raise store_{what}_max")
            }
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_the_error_it_came_from() {
        // `store_full` names its quota in a string that the edge adds (below).
        let all = Error::examples().into_iter().filter(|e| !matches!(e, Error::StoreFull { .. }));
        for e in all {
            let details = e.details();
            let back = Error::from_code(e.code(), |k| details.iter().find(|(n, _)| *n == k).map(|(_, v)| *v));
            assert_eq!(back.as_ref(), Some(&e), "{}", e.code());
        }
        assert_eq!(Error::StoreFull { quota: Quota::Bytes, limit: 9 }.details(), [("limit", 9)]);
        assert_eq!(Error::from_code("invalid_json", |_| None), None);
        assert_eq!(Error::from_code("stale_token", |_| None), None, "details missing");
    }
}
