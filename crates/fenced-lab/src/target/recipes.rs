//! The lock recipes of the other systems (Redis, etcd, Redlock) and the small readings a driver shares.

use super::driver::redis_connect;
use super::*;

/// One Redlock instance and its connection, while it has one.
pub(super) struct RedisInstance {
    pub(super) addr: String,
    pub(super) conn: Option<redis::aio::MultiplexedConnection>,
}

/// Redis's lock: SET NX PX under `value`, or with a token the script that also
/// increments one; polled until `wait` passes (Redis has no queue).
pub(super) async fn redis_acquire(
    conn: &mut redis::aio::MultiplexedConnection,
    with_token: bool,
    value: String,
    ttl: Duration,
    wait: Duration,
    op: Duration,
) -> Result<Grant> {
    let deadline = Instant::now() + wait;
    loop {
        let token = if with_token {
            let mut script = redis::cmd("EVAL");
            script
                .arg(REDIS_LOCK_WITH_TOKEN)
                .arg(2)
                .arg(LOCK)
                .arg(format!("{LOCK}:token"))
                .arg(&value)
                .arg(ttl.as_millis() as u64);
            let t =
                timeout(op, script.query_async::<u64>(conn)).await.map_err(|_| anyhow!("lock script timed out"))??;
            (t > 0).then_some(Some(t))
        } else {
            let mut set = redis::cmd("SET");
            set.arg(LOCK).arg(&value).arg("NX").arg("PX").arg(ttl.as_millis() as u64);
            let got = timeout(op, set.query_async::<Option<String>>(conn))
                .await
                .map_err(|_| anyhow!("SET NX timed out"))??;
            got.map(|_| None)
        };
        if let Some(token) = token {
            return Ok(Grant { token, held: Held::Redis { value } });
        }
        if Instant::now() >= deadline {
            bail!("lock held (no grant within {wait:?})");
        }
        // Redis has no queue: a waiter polls.
        sleep(Duration::from_millis(2)).await;
    }
}

/// etcd's lock under a lease of `ttl` (whole seconds), kept alive from its grant;
/// the token is the lock key's create_revision.
pub(super) async fn etcd_acquire(etcd: &Etcd, ttl: Duration, wait: Duration) -> Result<Grant> {
    let secs = ttl.as_secs().max(1) as i64;
    let lease = etcd.lease_grant(secs).await.context("lease grant")?;
    // Kept alive from its grant, while it waits in line too, as etcd's own
    // clients do (a concurrency.Session): a queued key whose lease ran out
    // would be deleted, and etcd 3.4's Lock would then answer success anyway.
    let keeper = spawn_keepalive(etcd.clone(), lease, ttl);
    let locked = match etcd.lock(LOCK.as_bytes(), lease, wait).await {
        Ok(Some(r)) => r,
        failed => {
            drop(keeper);
            // The queued lock key dies with its lease.
            let _ = etcd.lease_revoke(lease).await;
            return Err(match failed {
                Err(e) => anyhow::Error::from(e).context("lock"),
                _ => anyhow!("lock held (no grant within {wait:?})"),
            });
        }
    };
    // The token is the lock key's create_revision, as etcd advises: the
    // revision that created this waiter's key, which orders the holders of
    // the lock. The Lock answer's header revision is the store's revision
    // when it answered, tied to nothing. A key that is gone was never held
    // (etcd 3.5's Lock checks this itself; 3.4's does not).
    let Some(revision) = etcd.create_revision(&locked.key).await.context("the lock key's revision")? else {
        drop(keeper);
        let _ = etcd.lease_revoke(lease).await;
        bail!("lock answered, but its key is gone (the lease expired while it waited)");
    };
    let token = Some(revision as u64);
    Ok(Grant { token, held: Held::Etcd { key: locked.key, lease, _keeper: keeper } })
}

/// One Redlock attempt, as published: `SET NX PX` on every instance in turn, each
/// bounded by a time-out small against the TTL; the lock is taken when a majority said
/// yes and time is left of the TTL after the elapsed time and the clock-drift
/// allowance. Otherwise every instance is unlocked, those that said no too (their
/// answer may have been lost).
pub(super) async fn redlock_acquire(instances: &mut [RedisInstance], value: &str, ttl: Duration, op: Duration) -> bool {
    let start = Instant::now();
    let per_instance = (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(50));
    let mut votes = 0;
    for inst in instances.iter_mut() {
        let mut set = redis::cmd("SET");
        set.arg(LOCK).arg(value).arg("NX").arg("PX").arg(ttl.as_millis() as u64);
        if let Ok(Some(_)) = inst.query::<Option<String>>(&set, per_instance, op).await {
            votes += 1;
        }
    }
    // The algorithm's drift allowance: 1% of the TTL plus 2 ms.
    let drift = ttl / 100 + Duration::from_millis(2);
    let valid = ttl.checked_sub(start.elapsed() + drift).is_some_and(|left| !left.is_zero());
    if votes > instances.len() / 2 && valid {
        return true;
    }
    redlock_release(instances, value, op).await;
    false
}

/// Compare-and-delete on every instance.
pub(super) async fn redlock_release(instances: &mut [RedisInstance], value: &str, op: Duration) {
    for inst in instances.iter_mut() {
        let mut del = redis::cmd("EVAL");
        del.arg(REDIS_UNLOCK).arg(1).arg(LOCK).arg(value);
        let _ = inst.query::<i64>(&del, op, op).await;
    }
}

impl RedisInstance {
    /// Runs `cmd` within `bound`, connecting first if needed (within `op`); a failure
    /// drops the connection, to be opened again next time.
    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd, bound: Duration, op: Duration) -> Result<T> {
        if self.conn.is_none() {
            self.conn = Some(redis_connect(&self.addr, op).await?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        match timeout(bound, cmd.query_async::<T>(conn)).await {
            Ok(Ok(v)) => Ok(v),
            failed => {
                self.conn = None;
                match failed {
                    Ok(Err(e)) => Err(e.into()),
                    _ => bail!("{}: no answer within {bound:?}", self.addr),
                }
            }
        }
    }
}

/// The etcd member a new driver talks to, of the comma-separated `members`: the first
/// connection in this process takes the one the nonce picks, each later one the next,
/// so a worker whose member failed (its driver is rebuilt after a failed acquire)
/// moves to another, as etcd's own client moves to another endpoint.
pub(super) fn next_member(members: &str, nonce: u64) -> &str {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;
    static FIRST: OnceLock<usize> = OnceLock::new();
    static CONNECTS: AtomicUsize = AtomicUsize::new(0);
    let all: Vec<&str> = members.split(',').collect();
    let first = *FIRST.get_or_init(|| nonce as usize % all.len());
    all[(first + CONNECTS.fetch_add(1, Ordering::Relaxed)) % all.len()]
}

pub(super) fn grant_token(grant: &Grant) -> Result<Token> {
    grant.token.and_then(Token::new).context("a grant without a token")
}

pub(super) fn parse_counter(raw: Option<&[u8]>) -> Result<u64> {
    let Some(raw) = raw else { return Ok(0) };
    std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("the counter holds {:?}, not a number", String::from_utf8_lossy(raw)))
}
