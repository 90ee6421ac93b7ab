//! Each target driven as its users drive it, one connection per bench client.
//!
//! | target | a lock cycle | a store write |
//! |---|---|---|
//! | `fenced` | fenced-client: acquire with its own lease (1 request), release and end the lease (2) | the fenced store's `PUT` with the client's token |
//! | `etcd` | a session lease per client, kept alive; `Lock` with it, `Unlock` | `Put` |
//! | `zookeeper` | a session per client; Curator's `InterProcessMutex`: create an ephemeral sequential node under the lock's node, `getChildren`, first wins, else watch the node just before; `delete` | `setData` |
//! | `redis`, `redis-aof` | `SET NX PX`, compare-and-delete by `EVALSHA`; waiters poll every 1 ms | `SET` |
//! | `postgres` | a lease row: `INSERT .. ON CONFLICT DO UPDATE .. WHERE expires_at < now()` with a token from a sequence; `DELETE` by token; waiters poll every 1 ms with a `SELECT` first | fenced-client's `PgKv` conditional upsert |
//!
//! PostgreSQL's waiters look before they try: a refused upsert still locks the row and
//! commits (an fsync), so sixteen clients trying blindly every millisecond measure the
//! disk, not the recipe.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fenced_client::resource::postgres::PgKv;
use fenced_client::zookeeper;
use fenced_client::{Client, FencedResource, LockGuard, Token};
use tokio::time::{sleep, timeout, Instant};

use zookeeper_client as zk;

use super::BenchTarget;
use crate::target::REDIS_UNLOCK;
use fenced_client::etcd::{spawn_keepalive, Etcd, Keeper};

/// How long a waiter that polls (Redis, PostgreSQL) sleeps between tries.
pub const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// The value every store write sends.
const VALUE: &[u8] = b"0123456789abcdef";

const PG_SCHEMA: &str = "CREATE SEQUENCE IF NOT EXISTS bench_tokens;
CREATE TABLE IF NOT EXISTS bench_locks (name text PRIMARY KEY, token bigint NOT NULL, expires_at timestamptz NOT NULL)";

/// The lease-row recipe: take a free or expired row, with a fresh token.
const PG_ACQUIRE: &str = "INSERT INTO bench_locks (name, token, expires_at)
VALUES ($1, nextval('bench_tokens'), now() + make_interval(secs => $2))
ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE bench_locks.expires_at < now() RETURNING token";

/// Whether someone holds the lease row: a read, no WAL.
const PG_HELD: &str = "SELECT 1 FROM bench_locks WHERE name = $1 AND expires_at >= now()";

const PG_RELEASE: &str = "DELETE FROM bench_locks WHERE name = $1 AND token = $2";

/// One bench client's connection to its target.
pub enum Conn {
    Fenced(Client),
    Etcd { client: Etcd, lease: i64, _keeper: Keeper },
    Zookeeper(zk::Client),
    Redis { conn: redis::aio::MultiplexedConnection, unlock_sha: String, nonce: String },
    Postgres { db: tokio_postgres::Client, statements: [tokio_postgres::Statement; 3] },
}

/// A held lock, as each target represents it.
pub enum Held {
    Fenced(LockGuard),
    Etcd(Vec<u8>),
    /// The lock node's path.
    Zookeeper(String),
    Redis {
        name: String,
        value: String,
    },
    Postgres {
        name: String,
        token: i64,
    },
}

/// Settings every connection shares.
#[derive(Clone, Copy, Debug)]
pub struct ConnOptions {
    /// A lease's TTL (etcd rounds it to whole seconds).
    pub ttl: Duration,
    /// The bound on any one request.
    pub op_timeout: Duration,
}

impl Conn {
    /// Connects client `id` to `target` at `endpoint`.
    /// For etcd and ZooKeeper, `endpoint` may name several members separated by commas:
    /// client `id` then talks to member `id` mod their number. Fenced's client takes
    /// them all and follows the leader.
    pub async fn connect(target: BenchTarget, endpoint: &str, id: u32, o: ConnOptions) -> Result<Conn> {
        let unreachable = || format!("cannot reach {target} at {endpoint}");
        let target = target.base();
        let endpoint = match target {
            BenchTarget::Etcd | BenchTarget::Zookeeper => {
                let members: Vec<&str> = endpoint.split(',').collect();
                members[id as usize % members.len()]
            }
            _ => endpoint,
        };
        Ok(match target {
            BenchTarget::Fenced => Conn::Fenced(
                Client::builder()
                    .endpoint(endpoint)
                    .request_timeout(o.op_timeout)
                    .connect_timeout(Duration::from_secs(2))
                    .build()?,
            ),
            BenchTarget::Etcd => {
                let client = Etcd::new(endpoint, Duration::from_secs(2), o.op_timeout)?;
                let secs = o.ttl.as_secs().max(2) as i64;
                let lease = client.lease_grant(secs).await.with_context(unreachable)?;
                let keeper = spawn_keepalive(client.clone(), lease, Duration::from_secs(secs as u64));
                Conn::Etcd { client, lease, _keeper: keeper }
            }
            BenchTarget::Zookeeper => Conn::Zookeeper(zk_connect(endpoint, o).await.with_context(unreachable)?),
            BenchTarget::Redis | BenchTarget::RedisAof => {
                let mut conn = redis_connect(endpoint, o.op_timeout).await.with_context(unreachable)?;
                let unlock_sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(REDIS_UNLOCK)
                    .query_async(&mut conn)
                    .await
                    .context("load the unlock script")?;
                Conn::Redis { conn, unlock_sha, nonce: format!("{}-{id}", std::process::id()) }
            }
            BenchTarget::Postgres => {
                let db = pg_connect(endpoint, o.op_timeout).await.with_context(unreachable)?;
                let statements =
                    [db.prepare(PG_HELD).await?, db.prepare(PG_ACQUIRE).await?, db.prepare(PG_RELEASE).await?];
                Conn::Postgres { db, statements }
            }
            other => bail!("{other} is driven as {}", other.base()),
        })
    }

    /// Takes `name`, waiting up to `wait` (in the target's queue, or by polling).
    pub async fn acquire(&mut self, name: &str, o: ConnOptions, wait: Duration) -> Result<Held> {
        let give_up = Instant::now() + wait;
        match self {
            Conn::Fenced(client) => Ok(Held::Fenced(client.lock(name).ttl(o.ttl).wait(wait).acquire().await?)),
            Conn::Etcd { client, lease, .. } => {
                let bound = wait + o.op_timeout;
                let r = client.lock(name.as_bytes(), *lease, bound).await?;
                Ok(Held::Etcd(r.with_context(|| format!("lock held (no grant within {bound:?})"))?.key))
            }
            Conn::Zookeeper(client) => zk_lock(client, name, o, give_up).await.map(|(node, _)| Held::Zookeeper(node)),
            Conn::Redis { conn, nonce, .. } => {
                let value = format!("{nonce}-{}", next_nonce());
                loop {
                    let mut set = redis::cmd("SET");
                    set.arg(name).arg(&value).arg("NX").arg("PX").arg(o.ttl.as_millis() as u64);
                    if set.query_async::<Option<String>>(conn).await?.is_some() {
                        return Ok(Held::Redis { name: name.to_owned(), value });
                    }
                    poll_or_give_up(give_up, wait).await?;
                }
            }
            Conn::Postgres { db, statements: [held, acquire, _] } => {
                let secs = o.ttl.as_secs_f64();
                let mut first = true;
                loop {
                    let free = first || bounded(o.op_timeout, db.query_opt(&*held, &[&name])).await?.is_none();
                    first = false;
                    if free {
                        if let Some(row) = bounded(o.op_timeout, db.query_opt(&*acquire, &[&name, &secs])).await? {
                            return Ok(Held::Postgres { name: name.to_owned(), token: row.get(0) });
                        }
                    }
                    poll_or_give_up(give_up, wait).await?;
                }
            }
        }
    }

    /// Gives `held` back.
    pub async fn release(&mut self, held: Held, o: ConnOptions) -> Result<()> {
        match (self, held) {
            (Conn::Fenced(_), Held::Fenced(guard)) => Ok(guard.release().await?),
            (Conn::Etcd { client, .. }, Held::Etcd(key)) => Ok(client.unlock(&key).await?),
            (Conn::Zookeeper(client), Held::Zookeeper(node)) => {
                bounded(o.op_timeout, client.delete(&node, None)).await?;
                Ok(())
            }
            (Conn::Redis { conn, unlock_sha, .. }, Held::Redis { name, value }) => {
                let mut del = redis::cmd("EVALSHA");
                del.arg(&*unlock_sha).arg(1).arg(name).arg(value);
                if del.query_async::<i64>(conn).await? != 1 {
                    bail!("the Redis lock had expired before its release");
                }
                Ok(())
            }
            (Conn::Postgres { db, statements: [.., release] }, Held::Postgres { name, token }) => {
                if bounded(o.op_timeout, db.execute(&*release, &[&name, &token])).await? != 1 {
                    bail!("the PostgreSQL lease row had been taken over before its release");
                }
                Ok(())
            }
            _ => bail!("a lock held on another target"),
        }
    }
}

/// One bench client's way to write to the target's store (a durable write where the
/// target is durable).
pub enum Writer {
    /// Holds its own lock for the run and writes with its token.
    Fenced {
        client: Client,
        guard: Option<LockGuard>,
    },
    Etcd(Etcd),
    Zookeeper(zk::Client),
    Redis(redis::aio::MultiplexedConnection),
    Postgres(PgKv),
}

impl Writer {
    pub async fn connect(target: BenchTarget, endpoint: &str, id: u32, o: ConnOptions) -> Result<Writer> {
        let unreachable = || format!("cannot reach {target} at {endpoint}");
        Ok(match Conn::connect(target, endpoint, id, o).await? {
            Conn::Fenced(client) => {
                let guard = client
                    .lock(format!("bench/writer/{id}"))
                    .ttl(o.ttl.max(Duration::from_secs(10)))
                    .acquire()
                    .await
                    .with_context(unreachable)?;
                Writer::Fenced { client, guard: Some(guard) }
            }
            Conn::Etcd { client, .. } => Writer::Etcd(client),
            Conn::Zookeeper(client) => Writer::Zookeeper(client),
            Conn::Redis { conn, .. } => Writer::Redis(conn),
            Conn::Postgres { db, .. } => Writer::Postgres(PgKv::open(db, "bench_store").await?),
        })
    }

    /// Writes 16 bytes to `key`.
    pub async fn write(&mut self, key: &str, o: ConnOptions) -> Result<()> {
        match self {
            Writer::Fenced { client, guard } => {
                let token = guard.as_ref().context("the writer's lock was given back")?.token();
                client.store().put(key, token, VALUE).await?.into_result()?;
            }
            Writer::Etcd(client) => client.put(key.as_bytes(), VALUE).await?,
            Writer::Zookeeper(client) => {
                let path = zk_path(key);
                match bounded(o.op_timeout, client.set_data(&path, VALUE, None)).await {
                    Err(e) if zk_is(&e, zk::Error::NoNode) => {
                        // The first write of a run creates the node (with its parents).
                        zk_mkdirs(client, &path, o).await?;
                        bounded(o.op_timeout, client.set_data(&path, VALUE, None)).await?;
                    }
                    r => drop(r?),
                }
            }
            Writer::Redis(conn) => redis::cmd("SET").arg(key).arg(VALUE).query_async::<()>(conn).await?,
            Writer::Postgres(kv) => {
                let token = Token::new(1).expect("1 is a token");
                bounded(o.op_timeout, kv.write(key, token, VALUE)).await?.into_result()?;
            }
        }
        Ok(())
    }

    /// Gives back what the writer held.
    pub async fn close(mut self) {
        if let Writer::Fenced { guard, .. } = &mut self {
            if let Some(g) = guard.take() {
                let _ = g.release().await;
            }
        }
    }
}

/// Creates what the clients need on the target before they connect (PostgreSQL's
/// tables and sequence), once, so that they do not race to create it.
pub async fn prepare(target: BenchTarget, endpoint: &str, o: ConnOptions) -> Result<()> {
    if target.base() == BenchTarget::Postgres {
        let db =
            pg_connect(endpoint, o.op_timeout).await.with_context(|| format!("cannot reach postgres at {endpoint}"))?;
        db.batch_execute(PG_SCHEMA).await.context("create the lease table")?;
        PgKv::open(db, "bench_store").await.context("create the store table")?;
    }
    Ok(())
}

/// Where the bench keeps its ZooKeeper nodes.
const ZK_ROOT: &str = "/fenced-bench";

/// The node of lock or key `name` (`bench/own/3` → `/fenced-bench/bench/own/3`).
fn zk_path(name: &str) -> String {
    format!("{ZK_ROOT}/{name}")
}

/// Opens a ZooKeeper session (`host:port`) whose timeout is the bench's TTL.
pub(crate) async fn zk_connect(endpoint: &str, o: ConnOptions) -> Result<zk::Client> {
    let connect = zk::Client::connector()
        .with_session_timeout(o.ttl)
        .with_connection_timeout(Duration::from_secs(2))
        .with_fail_eagerly()
        .connect(endpoint);
    bounded(o.op_timeout, connect).await
}

/// Whether `e` is ZooKeeper's `what` (no node, node exists: answers, not failures).
fn zk_is(e: &anyhow::Error, what: zk::Error) -> bool {
    e.downcast_ref::<zk::Error>() == Some(&what)
}

/// Creates `path` and the persistent nodes above it, those that are missing.
async fn zk_mkdirs(client: &zk::Client, path: &str, o: ConnOptions) -> Result<()> {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match bounded(o.op_timeout, client.mkdir(path, &persistent)).await {
        Err(e) if zk_is(&e, zk::Error::NodeExists) => Ok(()),
        r => r,
    }
}

/// Curator's `InterProcessMutex` recipe (the workspace's one,
/// `fenced_client::zookeeper::take`) on lock `name`'s node under [`ZK_ROOT`]: the lock
/// node's path and its `czxid` (the zxid that created it: a fencing token that grows
/// across the service).
pub(crate) async fn zk_lock(
    client: &zk::Client,
    name: &str,
    o: ConnOptions,
    give_up: Instant,
) -> Result<(String, i64)> {
    Ok(zookeeper::take(client, &zk_path(name), o.op_timeout, give_up).await?)
}

/// Connects to Redis (`redis://host:port/`) with bounded connect and response times.
pub async fn redis_connect(endpoint: &str, op_timeout: Duration) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(endpoint)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Duration::from_secs(2))
        .set_response_timeout(op_timeout);
    Ok(client.get_multiplexed_async_connection_with_config(&config).await?)
}

/// Connects to PostgreSQL, within `op_timeout`.
pub async fn pg_connect(config: &str, op_timeout: Duration) -> Result<tokio_postgres::Client> {
    let (db, connection) = bounded(op_timeout, tokio_postgres::connect(config, tokio_postgres::NoTls)).await?;
    tokio::spawn(connection);
    Ok(db)
}

/// What the Redis server says about its persistence: `none`, or the AOF's fsync policy.
pub async fn redis_durability(endpoint: &str) -> Result<String> {
    let mut conn = redis_connect(endpoint, Duration::from_secs(5)).await?;
    let get = |name: &'static str| {
        let mut c = redis::cmd("CONFIG");
        c.arg("GET").arg(name);
        c
    };
    let aof: Vec<String> = get("appendonly").query_async(&mut conn).await?;
    let fsync: Vec<String> = get("appendfsync").query_async(&mut conn).await?;
    let save: Vec<String> = get("save").query_async(&mut conn).await?;
    let aof_on = aof.get(1).is_some_and(|v| v == "yes");
    let snapshots = save.get(1).is_some_and(|v| !v.is_empty());
    Ok(match (aof_on, snapshots) {
        (true, _) => format!("AOF, appendfsync {}", fsync.get(1).map_or("?", String::as_str)),
        (false, true) => "RDB snapshots only (no fsync per write)".into(),
        (false, false) => "none (no AOF, no RDB)".into(),
    })
}

/// Runs `f` for at most `d`.
pub async fn bounded<T, E>(d: Duration, f: impl std::future::Future<Output = Result<T, E>>) -> Result<T>
where
    anyhow::Error: From<E>,
{
    match timeout(d, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(anyhow!("no answer within {d:?}")),
    }
}

async fn poll_or_give_up(give_up: Instant, wait: Duration) -> Result<()> {
    if Instant::now() >= give_up {
        bail!("lock held (no grant within {wait:?})");
    }
    sleep(POLL_INTERVAL).await;
    Ok(())
}

/// A distinct value per Redis acquire (compare-and-delete needs one); not a secret.
/// A value distinct within this process, for lock values (a counter, not randomness).
fn next_nonce() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}
