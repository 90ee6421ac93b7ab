//! A connection to one target, as one worker uses it: lock, read and write the counter, release.

use super::recipes::*;
use super::*;

pub(super) enum Held {
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

pub(super) enum Conn {
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
pub(super) enum Counter {
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
pub(super) fn fenced_client(addrs: &str, op_timeout: Duration) -> Result<Client> {
    let endpoints: Vec<String> = addrs.split(',').map(|a| format!("http://{}", a.trim())).collect();
    Ok(Client::builder()
        .endpoint(endpoints.join(","))
        .request_timeout(op_timeout)
        .connect_timeout(Duration::from_secs(1))
        .build()?)
}

pub(super) async fn redis_connect(addr: &str, op_timeout: Duration) -> Result<redis::aio::MultiplexedConnection> {
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
