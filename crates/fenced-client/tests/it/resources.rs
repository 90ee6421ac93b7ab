//! The fenced resources, each checked with the same three scenarios: a stale token is
//! refused and changes nothing; interleaved writers leave the newer one's value; the
//! counter workload under a lock with an injected pause loses no update.

#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "s3")]
mod s3;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

use std::sync::Arc;
use std::time::Duration;

use fenced_client::{Client, Fenced, FencedResource, Token};

use crate::support::t;

/// A refusal names the refused token and the mark, and leaves value and mark alone.
pub async fn stale_token_is_refused_and_changes_nothing(r: &impl FencedResource, key: &str) {
    assert_eq!(r.write(key, t(5), b"five").await.expect("write"), Fenced::Accepted(()));
    assert_eq!(
        r.write(key, t(3), b"three").await.expect("write"),
        Fenced::Rejected { token: t(3), highest_seen: t(5) }
    );
    assert_eq!(r.read(key, t(2)).await.expect("read"), Fenced::Rejected { token: t(2), highest_seen: t(5) });
    assert_eq!(r.read(key, t(5)).await.expect("read"), Fenced::Accepted(Some(b"five".to_vec())));
    // Equal tokens pass: a holder writes many times.
    assert_eq!(r.write(key, t(5), b"five again").await.expect("write"), Fenced::Accepted(()));
    // A fenced read by a newer holder shuts the older one out before it writes anything.
    assert_eq!(r.read(key, t(9)).await.expect("read"), Fenced::Accepted(Some(b"five again".to_vec())));
    assert_eq!(
        r.write(key, t(5), b"zombie").await.expect("write"),
        Fenced::Rejected { token: t(5), highest_seen: t(9) }
    );
    assert_eq!(r.read(key, t(9)).await.expect("read"), Fenced::Accepted(Some(b"five again".to_vec())));
}

/// Two holders with real tokens from the lock service, writes interleaved in the
/// order of the seed's zombie story: the older holder's late write must not win.
pub async fn interleaved_writers_leave_the_newer_value(
    client: &Client,
    r: &impl FencedResource,
    key: &str,
    lock: &str,
) {
    let old = client.lock(lock).ttl(Duration::from_secs(5)).try_acquire().await.expect("old holder");
    let old_token = old.token();
    assert!(r.write(key, old_token, b"old 1").await.expect("write").is_accepted());
    old.release().await.expect("release");
    let new = client.lock(lock).ttl(Duration::from_secs(5)).try_acquire().await.expect("new holder");
    assert!(new.token() > old_token);
    assert!(r.write(key, new.token(), b"new 1").await.expect("write").is_accepted());
    let late = r.write(key, old_token, b"old 2").await.expect("write");
    assert_eq!(late, Fenced::Rejected { token: old_token, highest_seen: new.token() });
    assert!(r.write(key, new.token(), b"new 2").await.expect("write").is_accepted());
    assert_eq!(r.read(key, new.token()).await.expect("read"), Fenced::Accepted(Some(b"new 2".to_vec())));
    new.release().await.expect("release");
}

/// The counter workload: a holder reads `v`, is paused past its lease, and writes
/// `v + 1` when it wakes; meanwhile the next holder increments. With fencing the late
/// write is refused, so every acknowledged increment is in the final value.
pub async fn counter_workload_loses_no_update(client: &Client, r: &impl FencedResource, key: &str, lock: &str) {
    const ROUNDS: u64 = 3;
    let (mut acked, mut refused) = (0u64, 0u64);
    for _ in 0..ROUNDS {
        let paused = client.lock(lock).ttl(Duration::from_millis(600)).wait(Duration::from_secs(10)).acquire().await;
        let paused = paused.expect("first holder");
        let seen = read_counter(r, key, paused.token()).await.expect("the holder's own read is accepted");
        paused.pause_keepalive(true); // the injected pause: no keepalive, no write, for longer than the lease
        let next = client.lock(lock).ttl(Duration::from_secs(5)).wait(Duration::from_secs(10)).acquire().await;
        let next = next.expect("granted once the paused holder's lease expired");
        assert!(next.token() > paused.token());
        let v = read_counter(r, key, next.token()).await.expect("accepted");
        assert!(r.write(key, next.token(), (v + 1).to_string().as_bytes()).await.expect("write").is_accepted());
        acked += 1;
        next.release().await.expect("release");
        // The paused holder wakes up and writes what it computed before the pause.
        match r.write(key, paused.token(), (seen + 1).to_string().as_bytes()).await.expect("write") {
            Fenced::Accepted(()) => acked += 1,
            Fenced::Rejected { .. } => refused += 1,
        }
        assert!(paused.lost_reason().is_some(), "the paused holder's guard knows it lost the lock");
    }
    // The final value, read by a last holder (a store beside the lock service takes
    // only tokens the service issued).
    let last = client.lock(lock).ttl(Duration::from_secs(5)).wait(Duration::from_secs(10)).acquire().await;
    let last = last.expect("a last holder");
    let total = read_counter(r, key, last.token()).await.expect("accepted");
    last.release().await.expect("release");
    assert_eq!(total, acked, "every acknowledged increment is in the final value");
    assert_eq!(refused, ROUNDS, "each late write was refused");
}

/// Sixteen writers, tokens 1 to 16, all at once on one key, three times, started in an
/// order that differs each round (highest first in one of them): whatever the
/// interleaving, the key ends with the value of token 16 and its mark, every refusal
/// names a newer mark, and writer 16 is never refused.
pub async fn many_writers_race_and_the_highest_token_wins<R: FencedResource + Send + Sync + 'static>(gate: Arc<R>) {
    for round in 0..3u64 {
        let key = format!("race/{round}");
        let mut writers = tokio::task::JoinSet::new();
        for i in 0..16u64 {
            let token = match round {
                0 => i + 1,
                1 => 16 - i,
                _ => (i * 7) % 16 + 1,
            };
            let (gate, key) = (gate.clone(), key.clone());
            writers.spawn(async move { (token, gate.write(&key, t(token), format!("w{token}").as_bytes()).await) });
        }
        while let Some(done) = writers.join_next().await {
            let (token, outcome) = done.expect("a writer task");
            if let Fenced::Rejected { token: refused, highest_seen } = outcome.expect("no store error") {
                assert_eq!(refused, t(token));
                assert!(highest_seen > refused, "refused under a mark that is not newer: {highest_seen}");
                assert_ne!(token, 16, "the highest token was refused");
            }
        }
        assert_eq!(gate.read(&key, t(16)).await.expect("read"), Fenced::Accepted(Some(b"w16".to_vec())));
        assert_eq!(gate.read(&key, t(15)).await.expect("read"), Fenced::Rejected { token: t(15), highest_seen: t(16) });
    }
}

async fn read_counter(r: &impl FencedResource, key: &str, token: Token) -> Option<u64> {
    match r.read(key, token).await.expect("read") {
        Fenced::Accepted(v) => {
            Some(v.map(|b| String::from_utf8(b).expect("utf8").parse().expect("number")).unwrap_or(0))
        }
        Fenced::Rejected { .. } => None,
    }
}
