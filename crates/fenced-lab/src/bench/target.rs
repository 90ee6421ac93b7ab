//! What `fenced bench` can drive, and the workloads it drives them with.

use super::*;

/// A system `fenced bench` can drive.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchTarget {
    Fenced,
    Etcd,
    /// ZooKeeper with the recipe of Curator's `InterProcessMutex`.
    Zookeeper,
    /// Redis as it is usually run for locks: no persistence when spawned.
    Redis,
    /// Redis with the append-only file fsynced on every write, when spawned.
    RedisAof,
    Postgres,
    /// Three Fenced members (one raft group); the clients know all three and follow
    /// the leader.
    #[serde(rename = "fenced-3")]
    Fenced3,
    /// Three etcd members; client i talks to member i mod 3.
    #[serde(rename = "etcd-3")]
    Etcd3,
    /// A three-server ZooKeeper ensemble; client i talks to server i mod 3.
    #[serde(rename = "zookeeper-3")]
    Zookeeper3,
}

impl BenchTarget {
    pub const ALL: [BenchTarget; 9] = [
        BenchTarget::Fenced,
        BenchTarget::Etcd,
        BenchTarget::Zookeeper,
        BenchTarget::Redis,
        BenchTarget::RedisAof,
        BenchTarget::Postgres,
        BenchTarget::Fenced3,
        BenchTarget::Etcd3,
        BenchTarget::Zookeeper3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BenchTarget::Fenced => "fenced",
            BenchTarget::Etcd => "etcd",
            BenchTarget::Zookeeper => "zookeeper",
            BenchTarget::Redis => "redis",
            BenchTarget::RedisAof => "redis-aof",
            BenchTarget::Postgres => "postgres",
            BenchTarget::Fenced3 => "fenced-3",
            BenchTarget::Etcd3 => "etcd-3",
            BenchTarget::Zookeeper3 => "zookeeper-3",
        }
    }

    /// Why this target cannot be spawned here (its program not installed), or None.
    pub fn missing(self) -> Option<String> {
        use crate::peers::Peer;
        let peer = match self.base() {
            BenchTarget::Etcd => Peer::Etcd,
            BenchTarget::Zookeeper => Peer::Zookeeper,
            BenchTarget::Redis | BenchTarget::RedisAof => Peer::Redis,
            BenchTarget::Postgres => Peer::Postgres,
            _ => return None,
        };
        peer.missing()
    }

    /// The service, whatever its size: a three-member target is driven with the
    /// one-node target's recipe.
    pub fn base(self) -> BenchTarget {
        match self {
            BenchTarget::Fenced3 => BenchTarget::Fenced,
            BenchTarget::Etcd3 => BenchTarget::Etcd,
            BenchTarget::Zookeeper3 => BenchTarget::Zookeeper,
            t => t,
        }
    }

    /// How many members the target runs as.
    pub fn members(self) -> usize {
        if self.base() == self {
            1
        } else {
            3
        }
    }

    /// The Fenced target of the same size, which a comparison's ratios are against.
    pub fn fenced_peer(self) -> BenchTarget {
        if self.members() == 1 {
            BenchTarget::Fenced
        } else {
            BenchTarget::Fenced3
        }
    }

    /// Where the target usually listens, for `--endpoint` left at Fenced's default
    /// (a three-member target: its first member; give every member's, separated by
    /// commas).
    pub fn default_endpoint(self) -> &'static str {
        match self.base() {
            BenchTarget::Fenced => "http://127.0.0.1:7400",
            BenchTarget::Etcd => "http://127.0.0.1:2379",
            BenchTarget::Zookeeper => "127.0.0.1:2181",
            BenchTarget::Redis | BenchTarget::RedisAof => "redis://127.0.0.1:6379/",
            BenchTarget::Postgres => "host=127.0.0.1 port=5432 user=postgres dbname=postgres",
            _ => unreachable!("a base target"),
        }
    }

    /// `endpoint` in the form the target's client takes (`host:port` gets a scheme);
    /// for etcd and Fenced, each of a comma-separated list.
    pub fn normalise_endpoint(self, endpoint: &str) -> String {
        match self.base() {
            BenchTarget::Etcd | BenchTarget::Fenced => endpoint
                .split(',')
                .map(|e| if e.contains("://") { e.to_owned() } else { format!("http://{e}") })
                .collect::<Vec<_>>()
                .join(","),
            BenchTarget::Redis | BenchTarget::RedisAof if !endpoint.contains("://") => format!("redis://{endpoint}/"),
            _ => endpoint.to_owned(),
        }
    }

    /// Whether it can run `w`.
    pub fn supports(self, w: Workload) -> bool {
        match self.members() {
            1 => {
                w != Workload::Keepalive
                    || matches!(self, BenchTarget::Fenced | BenchTarget::Redis | BenchTarget::RedisAof)
            }
            // The fenced store is in the replicated log too; keepalives are one node's.
            _ => w != Workload::Keepalive,
        }
    }
}

impl fmt::Display for BenchTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BenchTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<BenchTarget, String> {
        BenchTarget::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<_> = BenchTarget::ALL.iter().map(|t| t.name()).collect();
            format!("unknown target '{s}' (one of: {})", names.join(", "))
        })
    }
}

/// What the clients do.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Uncontended,
    Contended,
    Keepalive,
    Store,
}

impl Workload {
    pub const ALL: [Workload; 4] = [Workload::Uncontended, Workload::Contended, Workload::Keepalive, Workload::Store];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Keepalive => "keepalive",
            Workload::Store => "store",
        }
    }

    pub(super) fn locks(self) -> bool {
        matches!(self, Workload::Uncontended | Workload::Contended)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown workload '{s}' (one of: uncontended, contended, keepalive, store)"))
    }
}
