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

mod driver;
mod recipes;

use driver::Held;
pub use driver::{dynamo_gate, Driver, S3_BUCKET};
pub(crate) use driver::{REDIS_LOCK_WITH_TOKEN, REDIS_UNLOCK};

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
