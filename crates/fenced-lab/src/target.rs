//! The systems under test, each driven the way its users drive it: a lock, and a
//! counter behind it that a holder reads and writes.
//!
//! | target | lock | counter | token |
//! |---|---|---|---|
//! | `fenced` | Fenced lock (guard, keepalive) | Fenced store, fenced read and write | checked by the store |
//! | `fenced-unfenced` | Fenced lock | Fenced store, unfenced key | not sent |
//! | `redis` | `SET NX PX` + compare-and-delete | a Redis key | none exists |
//! | `etcd` | etcd lock API on a kept-alive lease | an etcd key, plain put | the lock's revision, not sent |
//! | `postgres` | Fenced lock | PostgreSQL row, the adapter's fenced update | checked in SQL |

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fenced_client::resource::postgres::PgKv;
use fenced_client::{Client, Fenced, FencedResource, LockGuard, Token};
use serde::{Deserialize, Serialize};
use tokio::time::timeout;

use crate::etcd::{spawn_keepalive, Etcd, Keeper};
use crate::peers::UNFENCED_PREFIX;

/// The lock's name (or key) on every target.
pub const LOCK: &str = "torture";

/// One system under test.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    Fenced,
    FencedUnfenced,
    Redis,
    Etcd,
    Postgres,
}

impl Target {
    pub const ALL: [Target; 5] =
        [Target::Fenced, Target::FencedUnfenced, Target::Redis, Target::Etcd, Target::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            Target::Fenced => "fenced",
            Target::FencedUnfenced => "fenced-unfenced",
            Target::Redis => "redis",
            Target::Etcd => "etcd",
            Target::Postgres => "postgres",
        }
    }

    /// Whether the resource checks the holder's token.
    pub fn fenced(self) -> bool {
        matches!(self, Target::Fenced | Target::Postgres)
    }

    /// Whether grants carry a token the lock service minted (Redis's do not).
    pub fn has_tokens(self) -> bool {
        !matches!(self, Target::Redis)
    }

    /// Whether the lock service is Fenced.
    pub fn fenced_locks(self) -> bool {
        matches!(self, Target::Fenced | Target::FencedUnfenced | Target::Postgres)
    }

    /// The shortest lease the target can keep (etcd grants whole seconds, at least 2 s
    /// with its default election timeout).
    pub fn min_ttl(self) -> Duration {
        match self {
            Target::Etcd => Duration::from_secs(2),
            _ => Duration::from_millis(100),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Target, String> {
        Target::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
            format!("unknown target '{s}' (one of: {})", names.join(", "))
        })
    }
}

/// Where a driver connects: the lock service (through the nemesis's proxy, for
/// workers) and, for `postgres`, the database.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Endpoints {
    /// `host:port` of the lock service (Fenced's HTTP, Redis, or etcd's client port).
    pub lock: String,
    /// A `tokio-postgres` connection string, for `postgres`.
    pub pg: Option<String>,
}

/// What one operation on the resource came to.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome<T> {
    Ok(T),
    /// The resource refused it: it had seen a newer token.
    Rejected,
}

/// A lock held on some target.
pub struct Grant {
    /// The lock service's token, when it mints one.
    pub token: Option<u64>,
    held: Held,
}

enum Held {
    Fenced(LockGuard),
    Redis { value: String },
    Etcd { key: Vec<u8>, lease: i64, _keeper: Keeper },
}

enum Conn {
    /// Fenced locks; the counter in the Fenced store (fenced or not) or in PostgreSQL.
    Fenced {
        client: Client,
        pg: Option<PgKv>,
        unfenced: bool,
    },
    Redis(redis::aio::MultiplexedConnection),
    Etcd(Etcd),
}

/// A connection to one target, as one worker uses it.
pub struct Driver {
    pub target: Target,
    conn: Conn,
    /// The longest any one request may take before its outcome counts as unknown.
    op_timeout: Duration,
    /// Distinguishes this driver's Redis lock values.
    nonce: u64,
}

/// Compare-and-delete: release the Redis lock only if it still holds our value.
pub(crate) const REDIS_UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

impl Driver {
    pub async fn connect(target: Target, ep: &Endpoints, op_timeout: Duration, nonce: u64) -> Result<Driver> {
        let conn = match target {
            Target::Fenced | Target::FencedUnfenced | Target::Postgres => {
                let client = Client::builder()
                    .endpoint(format!("http://{}", ep.lock))
                    .request_timeout(op_timeout)
                    .connect_timeout(Duration::from_secs(1))
                    .build()?;
                let pg = match target {
                    Target::Postgres => {
                        let conf = ep.pg.as_deref().context("the postgres target needs a database")?;
                        let (db, connection) = tokio_postgres::connect(conf, tokio_postgres::NoTls)
                            .await
                            .context("connect to PostgreSQL")?;
                        tokio::spawn(connection);
                        Some(PgKv::open(db, "fenced_torture").await?)
                    }
                    _ => None,
                };
                Conn::Fenced { client, pg, unfenced: target == Target::FencedUnfenced }
            }
            Target::Redis => {
                let client = redis::Client::open(format!("redis://{}/", ep.lock))?;
                let conn = timeout(op_timeout, client.get_multiplexed_async_connection())
                    .await
                    .map_err(|_| anyhow!("connecting to Redis timed out"))??;
                Conn::Redis(conn)
            }
            Target::Etcd => Conn::Etcd(Etcd::new(&format!("http://{}", ep.lock), Duration::from_secs(1), op_timeout)?),
        };
        Ok(Driver { target, conn, op_timeout, nonce })
    }

    /// The counter's key on this target.
    fn counter_key(&self) -> String {
        match self.target {
            Target::FencedUnfenced => format!("{UNFENCED_PREFIX}{LOCK}/counter"),
            Target::Redis => format!("{LOCK}:counter"),
            // Not under the lock's prefix: etcd's lock waits for every older key there.
            Target::Etcd => format!("counter/{LOCK}"),
            _ => format!("{LOCK}/counter"),
        }
    }

    /// Takes the lock, waiting at most `wait`; the lease lives `ttl` without renewal.
    pub async fn acquire(&mut self, ttl: Duration, wait: Duration, cycle: u64) -> Result<Grant> {
        match &mut self.conn {
            Conn::Fenced { client, .. } => {
                let guard = client.lock(LOCK).ttl(ttl).wait(wait).acquire().await?;
                Ok(Grant { token: Some(guard.token().get()), held: Held::Fenced(guard) })
            }
            Conn::Redis(conn) => {
                let value = format!("{:x}-{cycle}", self.nonce);
                let deadline = tokio::time::Instant::now() + wait;
                loop {
                    let mut set = redis::cmd("SET");
                    set.arg(LOCK).arg(&value).arg("NX").arg("PX").arg(ttl.as_millis() as u64);
                    let got = timeout(self.op_timeout, set.query_async::<Option<String>>(conn))
                        .await
                        .map_err(|_| anyhow!("SET NX timed out"))??;
                    if got.is_some() {
                        return Ok(Grant { token: None, held: Held::Redis { value } });
                    }
                    if tokio::time::Instant::now() >= deadline {
                        bail!("lock held (no grant within {wait:?})");
                    }
                    // Redis has no queue: a waiter polls.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            Conn::Etcd(etcd) => {
                let secs = ttl.as_secs().max(1) as i64;
                let lease = etcd.lease_grant(secs).await.context("lease grant")?;
                let locked = match etcd.lock(LOCK.as_bytes(), lease, wait).await {
                    Ok(Some(r)) => r,
                    failed => {
                        // The queued lock key dies with its lease.
                        let _ = etcd.lease_revoke(lease).await;
                        return Err(match failed {
                            Err(e) => e.context("lock"),
                            _ => anyhow!("lock held (no grant within {wait:?})"),
                        });
                    }
                };
                let token = Some(locked.revision as u64);
                let keeper = spawn_keepalive(etcd.clone(), lease, ttl);
                Ok(Grant { token, held: Held::Etcd { key: locked.key, lease, _keeper: keeper } })
            }
        }
    }

    /// Reads the counter as the holder of `grant` (a fenced read where the resource
    /// takes tokens).
    pub async fn read(&mut self, grant: &Grant) -> Result<Outcome<u64>> {
        let key = self.counter_key();
        let op = self.op_timeout;
        let raw: Fenced<Option<Vec<u8>>> = match &mut self.conn {
            Conn::Fenced { client, pg, unfenced } => {
                let token = grant_token(grant)?;
                match (pg, *unfenced) {
                    (Some(pg), _) => pg.read(&key, token).await?,
                    (None, true) => client.store().get(&key, None).await?.map(|r| r.value),
                    (None, false) => client.store().read(&key, token).await?,
                }
            }
            Conn::Redis(conn) => Fenced::Accepted(
                timeout(op, redis::cmd("GET").arg(&key).query_async::<Option<Vec<u8>>>(conn))
                    .await
                    .map_err(|_| anyhow!("GET timed out"))??,
            ),
            Conn::Etcd(etcd) => Fenced::Accepted(etcd.get(key.as_bytes()).await?),
        };
        match raw {
            Fenced::Accepted(v) => Ok(Outcome::Ok(parse_counter(v.as_deref())?)),
            Fenced::Rejected { .. } => Ok(Outcome::Rejected),
        }
    }

    /// Writes `value` to the counter as the holder of `grant`: with the token where the
    /// resource checks it, blind otherwise.
    pub async fn write(&mut self, grant: &Grant, value: u64) -> Result<Outcome<()>> {
        let key = self.counter_key();
        let bytes = value.to_string().into_bytes();
        let op = self.op_timeout;
        let raw = match &mut self.conn {
            Conn::Fenced { client, pg, unfenced } => {
                let token = grant_token(grant)?;
                match (pg, *unfenced) {
                    (Some(pg), _) => pg.write(&key, token, &bytes).await?,
                    (None, true) => {
                        client.store().put_unfenced(&key, &bytes).await?;
                        Fenced::Accepted(())
                    }
                    (None, false) => client.store().write(&key, token, &bytes).await?,
                }
            }
            Conn::Redis(conn) => {
                timeout(op, redis::cmd("SET").arg(&key).arg(bytes).query_async::<()>(conn))
                    .await
                    .map_err(|_| anyhow!("SET timed out"))??;
                Fenced::Accepted(())
            }
            Conn::Etcd(etcd) => {
                etcd.put(key.as_bytes(), &bytes).await?;
                Fenced::Accepted(())
            }
        };
        Ok(match raw {
            Fenced::Accepted(()) => Outcome::Ok(()),
            Fenced::Rejected { .. } => Outcome::Rejected,
        })
    }

    /// Gives the lock back.
    pub async fn release(&mut self, grant: Grant) -> Result<()> {
        let op = self.op_timeout;
        let Grant { held, .. } = grant;
        match (&mut self.conn, held) {
            (Conn::Fenced { .. }, Held::Fenced(guard)) => Ok(guard.release().await?),
            (Conn::Redis(conn), Held::Redis { value }) => {
                let mut del = redis::cmd("EVAL");
                del.arg(REDIS_UNLOCK).arg(1).arg(LOCK).arg(value);
                timeout(op, del.query_async::<i64>(conn)).await.map_err(|_| anyhow!("unlock timed out"))??;
                Ok(())
            }
            (Conn::Etcd(etcd), Held::Etcd { key, lease, _keeper }) => {
                drop(_keeper);
                etcd.unlock(&key).await?;
                etcd.lease_revoke(lease).await?;
                Ok(())
            }
            _ => bail!("a grant from another target"),
        }
    }

    /// The counter as it stands, read without a lock or token (after the run).
    pub async fn counter(&mut self) -> Result<u64> {
        let key = self.counter_key();
        let op = self.op_timeout;
        let raw = match &mut self.conn {
            Conn::Fenced { client, pg: Some(pg), .. } => {
                let _ = client;
                let sql = "SELECT value FROM fenced_torture WHERE key = $1";
                let row = pg.db().query_opt(sql, &[&key]).await?;
                row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0))
            }
            Conn::Fenced { client, .. } => client.store().get(&key, None).await?.into_result()?.value,
            Conn::Redis(conn) => timeout(op, redis::cmd("GET").arg(&key).query_async::<Option<Vec<u8>>>(conn))
                .await
                .map_err(|_| anyhow!("GET timed out"))??,
            Conn::Etcd(etcd) => etcd.get(key.as_bytes()).await?,
        };
        parse_counter(raw.as_deref())
    }
}

fn grant_token(grant: &Grant) -> Result<Token> {
    grant.token.and_then(Token::new).context("a Fenced grant without a token")
}

fn parse_counter(raw: Option<&[u8]>) -> Result<u64> {
    let Some(raw) = raw else { return Ok(0) };
    std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("the counter holds {:?}, not a number", String::from_utf8_lossy(raw)))
}
