//! What the harness reads of a Fenced cluster's members (started by
//! [`crate::ensemble`]): each member's `GET /v1/cluster?digest=true`, asked directly
//! (never through a link proxy), who leads by the members' own word, and whether the
//! replicas agree once the run is over.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::time::{sleep, Instant};

/// A member's status, with the digest the replica check compares.
const STATUS: &str = "/v1/cluster?digest=true";

/// Every member's status (`None` where it does not answer within 500 ms), asked at
/// once.
pub async fn statuses(addrs: &[SocketAddr]) -> Vec<Option<Value>> {
    // Each is bounded by its own time-out; together, so they do not add up.
    let mut asks = tokio::task::JoinSet::new();
    for (i, addr) in addrs.iter().copied().enumerate() {
        asks.spawn(async move { (i, get_json(addr, STATUS, Duration::from_millis(500)).await) });
    }
    let mut out = vec![None; addrs.len()];
    while let Some(Ok((i, v))) = asks.join_next().await {
        out[i] = v;
    }
    out
}

/// The index of the member that says it leads in the highest term.
pub fn leader_of(statuses: &[Option<Value>]) -> Option<usize> {
    statuses
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let s = s.as_ref()?;
            (s["state"] == "leader" && s["leader_id"].as_u64() == s["id"].as_u64()).then(|| (s["term"].as_u64(), i))
        })
        .max()
        .map(|(_, i)| i)
}

/// What the replicas-agree check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Every member reported the same applied index with the same state hash.
    Agree { applied_index: u64 },
    /// Same applied index, different hashes: the replicas diverged.
    Differ { applied_index: u64, hashes: Vec<(u64, String)> },
    /// The members never reported one applied index together within the time given.
    Unsettled { indexes: Vec<(u64, Option<u64>)> },
    /// The members do not report `state_hash`: nothing to compare.
    NoHash,
}

/// Compares one round of statuses: `None` while they do not all stand at one applied
/// index (or one does not answer).
pub fn compare_replicas(statuses: &[Option<Value>]) -> Option<Agreement> {
    let mut at = Vec::new();
    for s in statuses {
        let s = s.as_ref()?;
        let index = s["applied_index"].as_u64().or_else(|| s["last_applied_index"].as_u64())?;
        let hash = s.get("state_hash").filter(|h| !h.is_null()).map(|h| h.to_string());
        at.push((s["id"].as_u64().unwrap_or(0), index, hash));
    }
    let applied_index = at.first()?.1;
    if at.iter().any(|(_, i, _)| *i != applied_index) {
        return None;
    }
    if at.iter().any(|(_, _, h)| h.is_none()) {
        return Some(Agreement::NoHash);
    }
    let first = &at[0].2;
    if at.iter().all(|(_, _, h)| h == first) {
        Some(Agreement::Agree { applied_index })
    } else {
        let hashes = at.into_iter().map(|(id, _, h)| (id, h.unwrap_or_default())).collect();
        Some(Agreement::Differ { applied_index, hashes })
    }
}

/// Waits (up to `within`) until every member reports the same applied index, then
/// compares their state hashes.
pub async fn replicas_agree(addrs: &[SocketAddr], within: Duration) -> Agreement {
    let deadline = Instant::now() + within;
    loop {
        let statuses = statuses(addrs).await;
        if let Some(a) = compare_replicas(&statuses) {
            return a;
        }
        if Instant::now() >= deadline {
            let indexes = statuses
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let index = s
                        .as_ref()
                        .and_then(|s| s["applied_index"].as_u64().or_else(|| s["last_applied_index"].as_u64()));
                    (i as u64 + 1, index)
                })
                .collect();
            return Agreement::Unsettled { indexes };
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` of the Fenced server at `addr` as JSON, within `bound`.
async fn get_json(addr: SocketAddr, path: &str, bound: Duration) -> Option<Value> {
    crate::http::get(addr, path, bound).await.ok()?.json_if_ok()
}

#[cfg(test)]
mod tests;
