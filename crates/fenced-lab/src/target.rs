//! The systems under test, each driven the way its users drive it: a lock, and a
//! counter behind it that a holder reads and writes.
//!
//! | target | lock | counter | token |
//! |---|---|---|---|
//! | `fenced` | Fenced lock (guard, keepalive) | Fenced store, fenced read and write | checked by the store |
//! | `fenced-cluster` | as `fenced`, on three or five members (`--nodes`), the client failing over | the cluster's own store, fenced read and write | checked by the store |
//! | `fenced-unfenced` | Fenced lock | Fenced store, unfenced key | not sent |
//! | `redis` | `SET NX PX` + compare-and-delete | a Redis key | none exists |
//! | `etcd` | etcd lock API on a lease kept alive from its grant | an etcd key, plain put | the lock key's `create_revision`, not sent |
//! | `postgres` | Fenced lock | PostgreSQL row, the adapter's fenced update | checked in SQL |
//! | `etcd-gated` | as `etcd` | a Fenced store key under the foreign-token prefix | the lock key's `create_revision`, checked by the store |
//! | `zookeeper-gated` | Curator's `InterProcessMutex` recipe, session timeout = TTL | as `etcd-gated` | the lock node's `czxid`, checked by the store |
//! | `redis-token` | `SET NX PX` and `INCR` of a token key in one script (Redisson's fenced lock) | as `etcd-gated` | the `INCR`, checked by the store |
//! | `redlock` | Redlock over five Redis instances, the published algorithm | a Fenced store key under the unfenced prefix | none exists |
//! | `s3` | Fenced lock | an S3 object (moto's server) through the client's `S3Gate`: a conditional put on the ETag | checked by the gate |
//! | `dynamodb` | Fenced lock | a DynamoDB item (DynamoDB Local) through the client's `DynamoGate`: a conditional `UpdateItem` | checked by the gate |
//! | `etcd-cluster` | as `etcd`, on three etcd members; a worker that fails moves to the next member | as `etcd-gated` | as `etcd-gated` |
//! | `zookeeper-ensemble` | as `zookeeper-gated`, on a three-server ensemble (the session's connect string names all three; the client moves on by itself) | as `etcd-gated` | as `zookeeper-gated` |
//!
//! The four rows after `postgres` and the two clusters keep their counter in a second
//! Fenced server (the gate), reached directly: the nemesis crashes and delays only
//! their lock service (for a cluster, the cluster nemesis of [`crate::nemesis`]
//! strikes its members and the links between them).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fenced_client::resource::dynamodb::{AwsCredential, DynamoGate};
use fenced_client::resource::postgres::PgKv;
use fenced_client::resource::s3::{AmazonS3Builder, S3Gate};
use fenced_client::{Client, Fenced, FencedResource, LockGuard, Token};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::time::{sleep, timeout, Instant};
use zookeeper_client as zk;

use crate::bench::driver::{zk_connect, zk_lock, ConnOptions};
use crate::peers::{FOREIGN_PREFIX, UNFENCED_PREFIX};
use fenced_client::etcd::{spawn_keepalive, Etcd, Keeper};

/// The lock's name (or key) on every target.
pub const LOCK: &str = "torture";

/// How many Redis instances Redlock runs on (the algorithm's own example).
pub const REDLOCK_INSTANCES: usize = 5;

/// One system under test.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    Fenced,
    FencedCluster,
    FencedUnfenced,
    Redis,
    Etcd,
    Postgres,
    EtcdGated,
    ZookeeperGated,
    RedisToken,
    Redlock,
    S3,
    Dynamodb,
    EtcdCluster,
    ZookeeperEnsemble,
    /// Fenced's lock and store, the workers written with the Python client.
    Python,
    /// The same without the token on the counter's writes: the control.
    PythonUnfenced,
    /// Fenced's lock and store, the workers written with the TypeScript client on Node.
    Node,
    /// The same without the token on the counter's writes: the control.
    NodeUnfenced,
}

impl Target {
    pub const ALL: [Target; 18] = [
        Target::Fenced,
        Target::FencedCluster,
        Target::FencedUnfenced,
        Target::Redis,
        Target::Etcd,
        Target::Postgres,
        Target::EtcdGated,
        Target::ZookeeperGated,
        Target::RedisToken,
        Target::Redlock,
        Target::S3,
        Target::Dynamodb,
        Target::EtcdCluster,
        Target::ZookeeperEnsemble,
        Target::Python,
        Target::PythonUnfenced,
        Target::Node,
        Target::NodeUnfenced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Fenced => "fenced",
            Target::FencedCluster => "fenced-cluster",
            Target::FencedUnfenced => "fenced-unfenced",
            Target::Redis => "redis",
            Target::Etcd => "etcd",
            Target::Postgres => "postgres",
            Target::EtcdGated => "etcd-gated",
            Target::ZookeeperGated => "zookeeper-gated",
            Target::RedisToken => "redis-token",
            Target::Redlock => "redlock",
            Target::S3 => "s3",
            Target::Dynamodb => "dynamodb",
            Target::EtcdCluster => "etcd-cluster",
            Target::ZookeeperEnsemble => "zookeeper-ensemble",
            Target::Python => "python",
            Target::PythonUnfenced => "python-unfenced",
            Target::Node => "node",
            Target::NodeUnfenced => "node-unfenced",
        }
    }

    /// Whether the resource checks the holder's token.
    pub fn fenced(self) -> bool {
        matches!(
            self,
            Target::Fenced
                | Target::FencedCluster
                | Target::Postgres
                | Target::EtcdGated
                | Target::ZookeeperGated
                | Target::RedisToken
                | Target::S3
                | Target::Dynamodb
                | Target::EtcdCluster
                | Target::ZookeeperEnsemble
                | Target::Python
                | Target::Node
        )
    }

    /// Whether grants carry a token the lock service minted (plain Redis locks do not).
    pub fn has_tokens(self) -> bool {
        !matches!(self, Target::Redis | Target::Redlock)
    }

    /// The service that grants this target's locks.
    pub fn lock_service(self) -> LockService {
        match self {
            Target::Fenced
            | Target::FencedCluster
            | Target::FencedUnfenced
            | Target::Postgres
            | Target::S3
            | Target::Dynamodb
            | Target::Python
            | Target::PythonUnfenced
            | Target::Node
            | Target::NodeUnfenced => LockService::Fenced,
            Target::Redis | Target::RedisToken => LockService::Redis,
            Target::Redlock => LockService::Redlock,
            Target::Etcd | Target::EtcdGated | Target::EtcdCluster => LockService::Etcd,
            Target::ZookeeperGated | Target::ZookeeperEnsemble => LockService::Zookeeper,
        }
    }

    /// Whether the lock service is Fenced.
    pub fn fenced_locks(self) -> bool {
        self.lock_service() == LockService::Fenced
    }

    /// The language of the client library the workers are written with, for the
    /// targets whose workers are not this binary: the proof that that client is as
    /// honest as the Rust one.
    pub fn client_language(self) -> Option<ClientLanguage> {
        match self {
            Target::Python | Target::PythonUnfenced => Some(ClientLanguage::Python),
            Target::Node | Target::NodeUnfenced => Some(ClientLanguage::Node),
            _ => None,
        }
    }

    /// Whether the counter lives in a second Fenced server (the gate), apart from the
    /// lock service.
    pub fn gated_elsewhere(self) -> bool {
        matches!(
            self,
            Target::EtcdGated
                | Target::ZookeeperGated
                | Target::RedisToken
                | Target::Redlock
                | Target::EtcdCluster
                | Target::ZookeeperEnsemble
        )
    }

    /// Whether the lock service is a three-member cluster (an [`crate::ensemble`]).
    pub fn cluster(self) -> bool {
        matches!(self, Target::EtcdCluster | Target::ZookeeperEnsemble)
    }

    /// Whether the target is a Fenced cluster of three or five members (`--nodes`),
    /// under the cluster nemesis (`--nemesis`, [`crate::nemesis`]).
    pub fn fenced_cluster(self) -> bool {
        self == Target::FencedCluster
    }

    /// Whether the lock service is etcd (whose leases are whole seconds).
    pub fn etcd_locks(self) -> bool {
        self.lock_service() == LockService::Etcd
    }

    /// The key of the workload's counter on this target.
    pub fn counter_key(self) -> String {
        match self {
            Target::FencedUnfenced | Target::Redlock | Target::PythonUnfenced | Target::NodeUnfenced => {
                format!("{UNFENCED_PREFIX}{LOCK}/counter")
            }
            Target::Redis => format!("{LOCK}:counter"),
            // Not under the lock's prefix: etcd's lock waits for every older key there.
            Target::Etcd => format!("counter/{LOCK}"),
            Target::EtcdGated
            | Target::ZookeeperGated
            | Target::RedisToken
            | Target::EtcdCluster
            | Target::ZookeeperEnsemble => {
                format!("{FOREIGN_PREFIX}{LOCK}/counter")
            }
            Target::Fenced
            | Target::FencedCluster
            | Target::Postgres
            | Target::S3
            | Target::Dynamodb
            | Target::Python
            | Target::Node => {
                format!("{LOCK}/counter")
            }
        }
    }

    /// The programs besides Fenced this target's run starts.
    pub fn peers(self) -> &'static [crate::peers::Peer] {
        use crate::peers::Peer;
        match self {
            Target::Redis | Target::RedisToken | Target::Redlock => &[Peer::Redis],
            Target::Etcd | Target::EtcdGated | Target::EtcdCluster => &[Peer::Etcd],
            Target::ZookeeperGated | Target::ZookeeperEnsemble => &[Peer::Zookeeper],
            Target::Postgres => &[Peer::Postgres],
            Target::S3 => &[Peer::Moto],
            Target::Dynamodb => &[Peer::DynamodbLocal],
            _ => &[],
        }
    }

    /// Why this target cannot run here (a peer not installed), or None.
    pub fn missing(self) -> Option<String> {
        self.peers().iter().find_map(|p| p.missing())
    }

    /// The shortest lease the target can keep (etcd grants whole seconds, at least 2 s
    /// with its default election timeout; ZooKeeper's sessions expire on its 2 s tick,
    /// so shorter ones would be rounded up anyway).
    pub fn min_ttl(self) -> Duration {
        match self.lock_service() {
            LockService::Etcd | LockService::Zookeeper => Duration::from_secs(2),
            LockService::Fenced | LockService::Redis | LockService::Redlock => Duration::from_millis(100),
        }
    }
}

/// The services that grant the targets' locks: what a [`Driver`] connects to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LockService {
    Fenced,
    /// One Redis instance (`SET NX PX`, or the script with a token).
    Redis,
    /// Five Redis instances.
    Redlock,
    Etcd,
    Zookeeper,
}

/// The other languages Fenced has a client in (`clients/`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClientLanguage {
    /// `clients/python`, run as `python -m fenced._torture_worker`.
    Python,
    /// `clients/typescript`, run as `node dist/src/torture-worker.js`.
    Node,
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
/// workers), the database for `postgres`, the gate for the rows that have one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Endpoints {
    /// `host:port` of the lock service (Fenced's HTTP, Redis, etcd's client port,
    /// ZooKeeper); for `redlock` and the clusters, every instance's or member's,
    /// separated by commas.
    pub lock: String,
    /// A `tokio-postgres` connection string, for `postgres`.
    pub pg: Option<String>,
    /// The S3 endpoint (`http://host:port`) of the `s3` target's bucket.
    #[serde(default)]
    pub s3: Option<String>,
    /// The DynamoDB endpoint (`http://host:port`) of the `dynamodb` target's table.
    #[serde(default)]
    pub dynamodb: Option<String>,
    /// `host:port` of the Fenced server that holds the counter, for the rows whose
    /// lock service is another ([`Target::gated_elsewhere`]).
    #[serde(default)]
    pub gate: Option<String>,
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

impl Grant {
    /// Until when the client library promises the lock right now (its deadline from the
    /// send time of the last acknowledged keepalive), Unix microseconds; `None` for the
    /// targets whose recipe keeps no such deadline here.
    pub fn promised_until_us(&self) -> Option<u64> {
        let Held::Fenced(guard) = &self.held else { return None };
        let (now, until) = (tokio::time::Instant::now(), guard.valid_until());
        let now_us = crate::worker::now_us();
        Some(match until.checked_duration_since(now) {
            Some(ahead) => now_us + ahead.as_micros() as u64,
            None => now_us.saturating_sub(now.duration_since(until).as_micros() as u64),
        })
    }

    /// Whether the client library signals the lock lost right now (its deadline passed,
    /// or the server said the lease is gone); `None` for the recipes without the signal.
    pub fn lost_signalled(&self) -> Option<bool> {
        let Held::Fenced(guard) = &self.held else { return None };
        Some(!guard.is_valid())
    }
}

enum Held {
    Fenced(LockGuard),
    Redis {
        value: String,
    },
    Etcd {
        key: Vec<u8>,
        lease: i64,
        _keeper: Keeper,
    },
    /// The lock node's path.
    Zookeeper(String),
}

enum Conn {
    /// Fenced locks; the counter in the Fenced store (fenced or not), PostgreSQL or S3.
    Fenced {
        client: Client,
        counter: Counter,
    },
    Redis(redis::aio::MultiplexedConnection),
    Etcd(Etcd),
    /// A session whose timeout is the lease (a holder's lock node lives as long as its
    /// session), opened at the first acquire.
    Zookeeper {
        addr: String,
        session: Option<zk::Client>,
    },
    /// One connection per instance, opened again after a failure.
    Redlock(Vec<RedisInstance>),
}

/// Where a Fenced-locked target keeps its counter.
enum Counter {
    Store,
    Unfenced,
    Pg(PgKv),
    S3(S3Gate),
    Dynamo(DynamoGate),
}

/// The bucket of the `s3` target (moto's server creates it at start), and the table of
/// the `dynamodb` target.
pub const S3_BUCKET: &str = "fenced-torture";

/// The `dynamodb` target's gate on DynamoDB Local at `endpoint` (any credentials do).
pub fn dynamo_gate(endpoint: &str) -> Result<DynamoGate> {
    let credential = AwsCredential { key_id: "torture".into(), secret_key: "torture".into(), token: None };
    Ok(DynamoGate::new(endpoint, "us-east-1", credential, S3_BUCKET)?)
}

/// One Redlock instance and its connection, while it has one.
struct RedisInstance {
    addr: String,
    conn: Option<redis::aio::MultiplexedConnection>,
}

/// A connection to one target, as one worker uses it.
pub struct Driver {
    pub target: Target,
    conn: Conn,
    /// The Fenced server holding the counter, for the rows that have one.
    gate: Option<Client>,
    /// The longest any one request may take before its outcome counts as unknown.
    op_timeout: Duration,
    /// Distinguishes this driver's Redis lock values.
    nonce: u64,
    /// Redlock's retry jitter.
    rng: ChaCha8Rng,
}

/// Compare-and-delete: release the Redis lock only if it still holds our value.
pub(crate) const REDIS_UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// Redisson's fenced lock in one script: take the lock (`SET NX PX`) and, only if it
/// was free, `INCR` the lock's token key, both atomically; 0 when the lock is held.
pub(crate) const REDIS_LOCK_WITH_TOKEN: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return redis.call('incr', KEYS[2]) else return 0 end";

/// A client of the Fenced server at `addrs` (`host:port`, or a cluster's members
/// separated by commas: the client fails over between them).
fn fenced_client(addrs: &str, op_timeout: Duration) -> Result<Client> {
    let endpoints: Vec<String> = addrs.split(',').map(|a| format!("http://{}", a.trim())).collect();
    Ok(Client::builder()
        .endpoint(endpoints.join(","))
        .request_timeout(op_timeout)
        .connect_timeout(Duration::from_secs(1))
        .build()?)
}

async fn redis_connect(addr: &str, op_timeout: Duration) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    timeout(op_timeout, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| anyhow!("connecting to Redis at {addr} timed out"))?
        .map_err(Into::into)
}

impl Driver {
    pub async fn connect(target: Target, ep: &Endpoints, op_timeout: Duration, nonce: u64) -> Result<Driver> {
        let conn = match target.lock_service() {
            LockService::Fenced => {
                let client = fenced_client(&ep.lock, op_timeout)?;
                let counter = match target {
                    Target::Postgres => {
                        let conf = ep.pg.as_deref().context("the postgres target needs a database")?;
                        let (db, connection) = tokio_postgres::connect(conf, tokio_postgres::NoTls)
                            .await
                            .context("connect to PostgreSQL")?;
                        tokio::spawn(connection);
                        Counter::Pg(PgKv::open(db, "fenced_torture").await?)
                    }
                    Target::S3 => {
                        let endpoint = ep.s3.as_deref().context("the s3 target needs an S3 endpoint")?;
                        // moto takes any credentials; a real bucket takes AmazonS3Builder::from_env().
                        let bucket = AmazonS3Builder::new()
                            .with_endpoint(endpoint)
                            .with_allow_http(true)
                            .with_bucket_name(S3_BUCKET)
                            .with_region("us-east-1")
                            .with_access_key_id("torture")
                            .with_secret_access_key("torture");
                        Counter::S3(S3Gate::new(bucket)?)
                    }
                    Target::Dynamodb => {
                        let endpoint = ep.dynamodb.as_deref().context("the dynamodb target needs an endpoint")?;
                        Counter::Dynamo(dynamo_gate(endpoint)?)
                    }
                    Target::FencedUnfenced | Target::PythonUnfenced | Target::NodeUnfenced => Counter::Unfenced,
                    _ => Counter::Store,
                };
                Conn::Fenced { client, counter }
            }
            LockService::Redis => Conn::Redis(redis_connect(&ep.lock, op_timeout).await?),
            LockService::Etcd => {
                let member = if target.cluster() { next_member(&ep.lock, nonce) } else { &ep.lock };
                Conn::Etcd(Etcd::new(&format!("http://{member}"), Duration::from_secs(1), op_timeout)?)
            }
            // The session opens at the first acquire, whose TTL is its timeout. For the
            // ensemble, `lock` is ZooKeeper's own connect string (every server's
            // address): the client picks one and moves to another when it fails, and
            // the session moves with it while it lives.
            LockService::Zookeeper => Conn::Zookeeper { addr: ep.lock.clone(), session: None },
            LockService::Redlock => {
                Conn::Redlock(ep.lock.split(',').map(|a| RedisInstance { addr: a.to_owned(), conn: None }).collect())
            }
        };
        let gate = match (target.gated_elsewhere(), &ep.gate) {
            (true, Some(addr)) => Some(fenced_client(addr, op_timeout)?),
            (true, None) => bail!("the {target} target needs a gate"),
            (false, _) => None,
        };
        Ok(Driver { target, conn, gate, op_timeout, nonce, rng: ChaCha8Rng::seed_from_u64(nonce) })
    }

    /// The counter's key on this target.
    fn counter_key(&self) -> String {
        self.target.counter_key()
    }

    /// Campaigns for the lock as `holder` (leader election): waits one `round` after
    /// another until it is granted (the caller bounds the whole). Fenced's locks only.
    pub async fn campaign(&mut self, ttl: Duration, round: Duration, holder: &str) -> Result<Grant> {
        let Conn::Fenced { client, .. } = &mut self.conn else {
            bail!("the elect workload runs on Fenced's locks, not on {}", self.target)
        };
        let guard = client.lock(LOCK).holder(holder).ttl(ttl).wait(round).campaign().await?;
        Ok(Grant { token: Some(guard.token().get()), held: Held::Fenced(guard) })
    }

    /// Takes the lock, waiting at most `wait`; the lease lives `ttl` without renewal.
    pub async fn acquire(&mut self, ttl: Duration, wait: Duration, cycle: u64) -> Result<Grant> {
        let op = self.op_timeout;
        let value = format!("{:x}-{cycle}", self.nonce);
        match &mut self.conn {
            Conn::Fenced { client, .. } => {
                let guard = client.lock(LOCK).ttl(ttl).wait(wait).acquire().await?;
                Ok(Grant { token: Some(guard.token().get()), held: Held::Fenced(guard) })
            }
            Conn::Redis(conn) => {
                let with_token = self.target == Target::RedisToken;
                redis_acquire(conn, with_token, value, ttl, wait, op).await
            }
            Conn::Etcd(etcd) => etcd_acquire(etcd, ttl, wait).await,
            Conn::Zookeeper { addr, session } => {
                let o = ConnOptions { ttl, op_timeout: op };
                if session.is_none() {
                    *session = Some(zk_connect(addr, o).await?);
                }
                let client = session.as_ref().expect("opened above");
                // The token is the lock node's czxid: the zxid of the transaction that
                // created it, which grows across the whole service (its sequence number
                // grows only under one parent node).
                let (node, czxid) = zk_lock(client, LOCK, o, Instant::now() + wait).await?;
                Ok(Grant { token: Some(czxid as u64), held: Held::Zookeeper(node) })
            }
            Conn::Redlock(instances) => {
                let deadline = Instant::now() + wait;
                loop {
                    if redlock_acquire(instances, &value, ttl, op).await {
                        return Ok(Grant { token: None, held: Held::Redis { value } });
                    }
                    if Instant::now() >= deadline {
                        bail!("lock held (no majority within {wait:?})");
                    }
                    // The algorithm's advice: retry after a random delay, so that
                    // clients trying at once do not split the votes again and again.
                    sleep(Duration::from_millis(2 + self.rng.next_u64() % 20)).await;
                }
            }
        }
    }

    /// Reads the counter as the holder of `grant` (a fenced read where the resource
    /// takes tokens).
    pub async fn read(&mut self, grant: &Grant) -> Result<Outcome<u64>> {
        let key = self.counter_key();
        let op = self.op_timeout;
        let raw: Fenced<Option<Vec<u8>>> = match (&self.gate, &mut self.conn) {
            (Some(gate), _) if self.target.fenced() => gate.store().read(&key, grant_token(grant)?).await?,
            (Some(gate), _) => gate.store().get(&key, None).await?.map(|r| r.value),
            (None, Conn::Fenced { client, counter }) => {
                let token = grant_token(grant)?;
                match counter {
                    Counter::Pg(pg) => pg.read(&key, token).await?,
                    Counter::S3(s3) => s3.read(&key, token).await?,
                    Counter::Dynamo(d) => d.read(&key, token).await?,
                    Counter::Unfenced => client.store().get(&key, None).await?.map(|r| r.value),
                    Counter::Store => client.store().read(&key, token).await?,
                }
            }
            (None, Conn::Redis(conn)) => Fenced::Accepted(
                timeout(op, redis::cmd("GET").arg(&key).query_async::<Option<Vec<u8>>>(conn))
                    .await
                    .map_err(|_| anyhow!("GET timed out"))??,
            ),
            (None, Conn::Etcd(etcd)) => Fenced::Accepted(etcd.get(key.as_bytes()).await?),
            (None, _) => bail!("{} keeps its counter at the gate", self.target),
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
        let raw = match (&self.gate, &mut self.conn) {
            (Some(gate), _) if self.target.fenced() => gate.store().write(&key, grant_token(grant)?, &bytes).await?,
            (Some(gate), _) => {
                gate.store().put_unfenced(&key, &bytes).await?;
                Fenced::Accepted(())
            }
            (None, Conn::Fenced { client, counter }) => {
                let token = grant_token(grant)?;
                match counter {
                    Counter::Pg(pg) => pg.write(&key, token, &bytes).await?,
                    Counter::S3(s3) => s3.write(&key, token, &bytes).await?,
                    Counter::Dynamo(d) => d.write(&key, token, &bytes).await?,
                    Counter::Unfenced => {
                        client.store().put_unfenced(&key, &bytes).await?;
                        Fenced::Accepted(())
                    }
                    Counter::Store => client.store().write(&key, token, &bytes).await?,
                }
            }
            (None, Conn::Redis(conn)) => {
                timeout(op, redis::cmd("SET").arg(&key).arg(bytes).query_async::<()>(conn))
                    .await
                    .map_err(|_| anyhow!("SET timed out"))??;
                Fenced::Accepted(())
            }
            (None, Conn::Etcd(etcd)) => {
                etcd.put(key.as_bytes(), &bytes).await?;
                Fenced::Accepted(())
            }
            (None, _) => bail!("{} keeps its counter at the gate", self.target),
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
            (Conn::Zookeeper { session: Some(client), .. }, Held::Zookeeper(node)) => {
                timeout(op, client.delete(&node, None)).await.map_err(|_| anyhow!("delete timed out"))??;
                Ok(())
            }
            (Conn::Redlock(instances), Held::Redis { value }) => {
                redlock_release(instances, &value, op).await;
                Ok(())
            }
            _ => bail!("a grant from another target"),
        }
    }

    /// The counter as it stands, read without a lock or token (after the run).
    pub async fn counter(&mut self) -> Result<u64> {
        let key = self.counter_key();
        let op = self.op_timeout;
        let raw = match (&self.gate, &mut self.conn) {
            (Some(gate), _) => gate.store().get(&key, None).await?.into_result()?.value,
            (None, Conn::Fenced { counter: Counter::Pg(pg), .. }) => {
                let sql = "SELECT value FROM fenced_torture WHERE key = $1";
                let row = pg.db().query_opt(sql, &[&key]).await?;
                row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0))
            }
            (None, Conn::Fenced { counter: Counter::S3(s3), .. }) => s3.value(&key).await?,
            (None, Conn::Fenced { counter: Counter::Dynamo(d), .. }) => d.value(&key).await?,
            (None, Conn::Fenced { client, .. }) => client.store().get(&key, None).await?.into_result()?.value,
            (None, Conn::Redis(conn)) => timeout(op, redis::cmd("GET").arg(&key).query_async::<Option<Vec<u8>>>(conn))
                .await
                .map_err(|_| anyhow!("GET timed out"))??,
            (None, Conn::Etcd(etcd)) => etcd.get(key.as_bytes()).await?,
            (None, _) => bail!("{} keeps its counter at the gate", self.target),
        };
        parse_counter(raw.as_deref())
    }
}

/// Redis's lock: SET NX PX under `value`, or with a token the script that also
/// increments one; polled until `wait` passes (Redis has no queue).
async fn redis_acquire(
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
async fn etcd_acquire(etcd: &Etcd, ttl: Duration, wait: Duration) -> Result<Grant> {
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
async fn redlock_acquire(instances: &mut [RedisInstance], value: &str, ttl: Duration, op: Duration) -> bool {
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
async fn redlock_release(instances: &mut [RedisInstance], value: &str, op: Duration) {
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
fn next_member(members: &str, nonce: u64) -> &str {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;
    static FIRST: OnceLock<usize> = OnceLock::new();
    static CONNECTS: AtomicUsize = AtomicUsize::new(0);
    let all: Vec<&str> = members.split(',').collect();
    let first = *FIRST.get_or_init(|| nonce as usize % all.len());
    all[(first + CONNECTS.fetch_add(1, Ordering::Relaxed)) % all.len()]
}

fn grant_token(grant: &Grant) -> Result<Token> {
    grant.token.and_then(Token::new).context("a grant without a token")
}

fn parse_counter(raw: Option<&[u8]>) -> Result<u64> {
    let Some(raw) = raw else { return Ok(0) };
    std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("the counter holds {:?}, not a number", String::from_utf8_lossy(raw)))
}
