//! Server configuration: every setting with its default, and the layering of a TOML
//! file, `FENCED_*` environment variables and command-line flags over the defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod layers;
mod validate;

/// The effective configuration. Field names are the TOML keys; the environment
/// variable of a field is `FENCED_` plus its name in upper case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// Address of the binary wire protocol's listener (plain TCP); none: off.
    pub wire_listen: Option<String>,
    /// Directory of the embedded database.
    pub data_dir: PathBuf,
    /// File holding the bearer token every `/v1` call must present; none: no auth.
    pub auth_token_file: Option<PathBuf>,
    /// TOML file of identities, each found by a bearer token and granted operations
    /// on name prefixes (docs/server.md, Security); reloaded on SIGHUP. None: the one
    /// identity of `auth_token_file`, or, without it, no auth.
    pub identities_file: Option<PathBuf>,
    /// The audit log: one JSON line per decision worth keeping (docs/server.md,
    /// Security); none: no audit log.
    pub audit_log: Option<PathBuf>,
    /// The audit log is rotated past this many bytes.
    pub audit_log_bytes_max: u64,
    /// Rotated audit logs kept (`PATH.1` ... `PATH.N`).
    pub audit_log_files: u64,
    /// Whether keepalives, checks and plain reads are audited too (off: only grants,
    /// releases, revokes, leases created, store writes and fenced reads, membership
    /// changes, and every refusal).
    pub audit_all: bool,
    /// PEM certificate chain; with `tls_key`, serve HTTPS.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key.
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs the clients' certificates: with it, the TLS handshake of
    /// the client listeners (HTTP and wire) asks for a client certificate and verifies
    /// the one presented; identities may then be found by `cert_subject`, and without
    /// `identities_file` a verified certificate is required on every call.
    pub client_ca: Option<PathBuf>,
    /// The Ed25519 private key (PKCS#8 PEM) every grant is signed with; none: grants
    /// carry no signature. Every member of a cluster is given the same key.
    pub grant_signing_key: Option<PathBuf>,
    /// The service's identity in every signature (a verifier checks it), so that two
    /// services sharing a key cannot pass each other's tokens.
    pub grant_service: String,
    /// A verifying key retired by a rotation (64 hex digits): published at `/v1/keys`
    /// until `grant_retired_key_until`, so tokens it signed stay verifiable meanwhile.
    pub grant_retired_key: Option<String>,
    /// Until when (Unix seconds) the retired key is published; 0 with no retired key.
    pub grant_retired_key_until: u64,
    /// Address of the peer listener, where this member serves the raft RPCs (`/raft/*`)
    /// to the other members and nothing else; none: the peer routes are on `listen`.
    /// The URLs in `peers` are where the peer routes are served.
    pub peer_listen: Option<String>,
    /// This member's certificate (PEM chain) for the peer listener and for dialling the
    /// other members; with `peer_key` and `peer_ca`, the members authenticate each other
    /// by mutual TLS and the member URLs are `https://`.
    pub peer_cert: Option<PathBuf>,
    /// The PEM private key of `peer_cert`.
    pub peer_key: Option<PathBuf>,
    /// The cluster CA (PEM): a peer is a member only with a certificate it signed.
    pub peer_ca: Option<PathBuf>,
    /// Lets a cluster of several members run without peer certificates: anyone who
    /// reaches the peer routes (and holds the client token, when one is set) can speak
    /// raft to them. For a laboratory on loopback; the server says so at start.
    pub insecure_peers: bool,
    /// At this start, make this member the only voter of its cluster, keeping its log
    /// and state: the way back for a member whose quorum is gone for good (etcd's
    /// `--force-new-cluster`). A flag for one start; the other members must be started
    /// on empty data directories and added again.
    pub force_new_cluster: bool,
    /// A member started on an empty data directory never initialises a cluster, even
    /// with the lowest id in `peers`: it waits to be added (etcd's
    /// `--initial-cluster-state existing`). For a replacement of the lowest-id member.
    pub join: bool,
    /// Longest lock name, in bytes (at most 256).
    pub lock_name_bytes_max: usize,
    /// Longest fenced-store key, in bytes.
    pub store_key_bytes_max: usize,
    /// Shortest and longest lease TTL.
    pub ttl_ms_min: u64,
    pub ttl_ms_max: u64,
    /// Longest an acquire may wait server-side.
    pub wait_ms_max: u64,
    /// Longest lock-delay an acquire may ask for.
    pub lock_delay_ms_max: u64,
    /// Largest request body (JSON or store value), in bytes.
    pub body_bytes_max: usize,
    /// Largest fenced-store value, in bytes.
    pub value_bytes_max: usize,
    /// Live leases at once.
    pub leases_max: usize,
    /// Lock entries at once (held, waited on, or in lock-delay).
    pub locks_max: usize,
    /// Queued acquires at once, over all locks.
    pub waiters_max: usize,
    /// Queued acquires on one lock.
    pub waiters_per_lock_max: usize,
    /// Open client connections at once; more are answered 503 and closed.
    pub connections_max: usize,
    /// Most locks one `GET /v1/locks` lists.
    pub list_locks_max: usize,
    /// Events each member keeps for `GET /v1/events?since=N` to resume from; a watcher
    /// further behind is answered 410 `compacted` (0: none kept, only live streams).
    pub events_retained: usize,
    /// How long a shutdown waits for in-flight requests before closing anyway.
    pub shutdown_drain_ms: u64,
    /// A connection with no request in flight that moves no byte this long is closed
    /// (0: never). Event streams send a keep-alive comment at a third of it.
    pub idle_timeout_ms: u64,
    /// A request head must arrive whole within this long of its first byte, however
    /// its bytes trickle in (0: no limit).
    pub head_timeout_ms: u64,
    /// A request body must arrive whole within this long of its handler's start
    /// (0: no limit); past it the request is answered 408 `body_timeout`.
    pub body_timeout_ms: u64,
    /// Bytes of request bodies being read at once, over all connections; a body that
    /// does not fit is refused 503 `too_busy` rather than buffered.
    pub body_bytes_in_flight_max: usize,
    /// Bytes of client commands the leader holds waiting for the log at once (queued
    /// for a batch, or in a batch not yet committed); past it, or past 65,536 commands,
    /// a command is refused 503 `too_busy` at once rather than held.
    pub proposal_bytes_max: u64,
    /// The log writer's wait for more entries to share a commit: while entries keep
    /// arriving, each within a tenth of the last commit's time, up to this fraction of
    /// it, in percent (0: no wait; at most 100).
    pub log_linger_percent: u32,
    /// Keys the fenced store may hold (a key only a fenced read marked counts too);
    /// past it a write of a new key is refused 507 `store_full`.
    pub store_keys_max: u64,
    /// Bytes of keys and records the fenced store may hold; past it a write that needs
    /// more room is refused 507 `store_full`, while overwrites no larger go on.
    pub store_bytes_max: u64,
    /// Free bytes the data directory's file system keeps for the lock service's log:
    /// below it, fenced-store writes are refused 507 `insufficient_storage` while lock
    /// calls go on (0: no guard).
    pub min_free_bytes: u64,
    /// Whether the laboratory's API (`POST /v1/sim/runs`, `/v1/sim/sweeps`) is served:
    /// it runs simulations on the lock server's own cores (bounded, but an operator of a
    /// production server may want none of it).
    pub lab_api: bool,
    /// Settings of [`RETIRED_SETTINGS`] the config file set: ignored, and logged as
    /// such when the server starts. Not a setting.
    #[serde(skip)]
    pub ignored_settings: Vec<String>,
    /// Fenced-store keys starting with this take writes without a `Fencing-Token`
    /// (last writer wins, no mark kept). Empty, the default: every key is fenced. For
    /// demonstrating what fencing prevents (`fenced demo --fencing off`), not for data
    /// that matters.
    pub unfenced_prefix: String,
    /// This member's id in a cluster (1 for a single server).
    pub node_id: u64,
    /// Every member of a new cluster, `ID=URL` separated by commas, this one included:
    /// the URL its peers reach its HTTP listener at (`1=http://10.0.0.1:7400,...`).
    /// Empty, the default: a cluster of one. The lowest id initialises an empty cluster.
    pub peers: String,
    /// Members this node dials at another URL than the one in the membership, in the
    /// form of `peers` (`2=http://127.0.0.1:9002,...`): a proxy or a NAT between two
    /// members. The membership keeps the `peers` addresses. Empty, the default: none.
    pub peer_routes: String,
    /// A snapshot of the lock table after at least this many log entries, and at least
    /// as many as the table holds objects (`Node::snapshot_interval`); the log keeps a
    /// fifth of this before it, and a member further behind catches up from the snapshot.
    pub snapshot_entries: u64,
    /// Fenced-store keys starting with this take tokens minted by another lock service
    /// (an etcd lock key's `create_revision`, a ZooKeeper lock node's `czxid`, a Redis
    /// `INCR`): the gate rule is the same, only the check that this server issued the
    /// token is off for them, since it cannot know. Empty, the default: none.
    pub foreign_token_prefix: String,
    /// Fenced-store keys starting with this take signed tokens only: a write or fenced
    /// read carries `Fencing-Signature`, the grant's signature (see `grant_signing_key`)
    /// for the lock that guards the key, `signed_lock_prefix` followed by the rest of
    /// the key; a token of any other lock, or a number nobody signed, is refused even
    /// when it is higher than the key's mark. Needs `grant_signing_key`. Empty: none.
    pub signed_key_prefix: String,
    /// What replaces `signed_key_prefix` to name a signed key's lock; empty: the lock
    /// has the key's own name.
    pub signed_lock_prefix: String,
    /// Threads of the async runtime that serves requests. 0, the default: one fewer
    /// than the cores, at least one, since the log's writer thread is the other busy
    /// thread (on two cores, one runtime thread is 12% less CPU per lock cycle than
    /// two: fewer wake-ups between threads; BENCHMARKS.md).
    pub worker_threads: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7400".into(),
            wire_listen: None,
            data_dir: PathBuf::from("./fenced-data"),
            auth_token_file: None,
            identities_file: None,
            audit_log: None,
            audit_log_bytes_max: 64 << 20,
            audit_log_files: 3,
            audit_all: false,
            tls_cert: None,
            tls_key: None,
            client_ca: None,
            grant_signing_key: None,
            grant_service: "fenced".into(),
            grant_retired_key: None,
            grant_retired_key_until: 0,
            peer_listen: None,
            peer_cert: None,
            peer_key: None,
            peer_ca: None,
            insecure_peers: false,
            force_new_cluster: false,
            join: false,
            lock_name_bytes_max: 256,
            store_key_bytes_max: 256,
            ttl_ms_min: 100,
            ttl_ms_max: 300_000,
            wait_ms_max: 300_000,
            lock_delay_ms_max: 60_000,
            body_bytes_max: 1 << 20,
            value_bytes_max: 256 << 10,
            leases_max: 1_000_000,
            locks_max: 1_000_000,
            waiters_max: 100_000,
            waiters_per_lock_max: 10_000,
            connections_max: 4096,
            list_locks_max: 1000,
            events_retained: 10_000,
            shutdown_drain_ms: 10_000,
            idle_timeout_ms: 60_000,
            head_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            body_bytes_in_flight_max: 64 << 20,
            proposal_bytes_max: fenced_raft::node::PROPOSAL_BYTES_MAX,
            log_linger_percent: 0,
            lab_api: true,
            store_keys_max: 1_000_000,
            store_bytes_max: 1 << 30,
            min_free_bytes: 64 << 20,
            ignored_settings: Vec::new(),
            unfenced_prefix: String::new(),
            node_id: 1,
            peers: String::new(),
            peer_routes: String::new(),
            snapshot_entries: 5_000,
            foreign_token_prefix: String::new(),
            signed_key_prefix: String::new(),
            signed_lock_prefix: String::new(),
            worker_threads: 0,
        }
    }
}

/// Settings a config file may still hold from earlier releases, which no longer mean
/// anything: `token_block` (the tokens the single-node format reserved per durable
/// ceiling write; tokens now live in the replicated log, and a migration continues from
/// the old ceiling without it). A file that sets one loads, and the server logs that it
/// is ignored: refusing to start over a setting that would change nothing would turn an
/// upgrade into an outage, which the refusal of unknown settings (a typo) is not for.
pub const RETIRED_SETTINGS: &[&str] = &["token_block"];

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config: {0}")]
    Invalid(String),
}

impl Config {
    /// Whether the members authenticate each other by mutual TLS.
    pub fn peer_tls(&self) -> bool {
        self.peer_cert.is_some()
    }

    /// The members of a new cluster by id, with their peer URLs: `peers` parsed, or this
    /// node alone at `self_url`.
    pub fn members(&self, self_url: &str) -> Result<std::collections::BTreeMap<u64, String>, ConfigError> {
        if self.peers.trim().is_empty() {
            return Ok(std::collections::BTreeMap::from([(self.node_id, self_url.to_string())]));
        }
        id_urls("peers", &self.peers)
    }

    /// `peer_routes` parsed: the members this node dials elsewhere than the membership says.
    pub fn routes(&self) -> Result<std::collections::BTreeMap<u64, String>, ConfigError> {
        id_urls("peer_routes", &self.peer_routes)
    }

    /// Whether `key` is under `unfenced_prefix` (never, when the prefix is empty).
    pub fn is_unfenced(&self, key: &str) -> bool {
        !self.unfenced_prefix.is_empty() && key.starts_with(&self.unfenced_prefix)
    }

    /// The lock whose signed tokens alone may fence `key`: none unless `key` is under
    /// `signed_key_prefix`.
    pub fn guarding_lock(&self, key: &str) -> Option<String> {
        let rest = key.strip_prefix(&self.signed_key_prefix).filter(|_| !self.signed_key_prefix.is_empty())?;
        if self.signed_lock_prefix.is_empty() {
            return Some(key.to_string());
        }
        Some(format!("{}{rest}", self.signed_lock_prefix))
    }

    /// Whether `key` is under `foreign_token_prefix` (never, when the prefix is empty).
    pub fn takes_foreign_tokens(&self, key: &str) -> bool {
        !self.foreign_token_prefix.is_empty() && key.starts_with(&self.foreign_token_prefix)
    }

    /// The core's limits.
    pub fn limits(&self) -> fenced_core::Limits {
        fenced_core::Limits {
            leases_max: self.leases_max,
            locks_max: self.locks_max,
            waiters_max: self.waiters_max,
            waiters_per_lock_max: self.waiters_per_lock_max,
            ttl_ms_min: self.ttl_ms_min,
            ttl_ms_max: self.ttl_ms_max,
            wait_ms_max: self.wait_ms_max,
            lock_delay_ms_max: self.lock_delay_ms_max,
        }
    }
}

/// `ID=http://HOST:PORT,...` parsed, for the setting `what`.
fn id_urls(what: &str, list: &str) -> Result<std::collections::BTreeMap<u64, String>, ConfigError> {
    let mut out = std::collections::BTreeMap::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            ConfigError::Invalid(format!(
                "{what}: '{part}' is not ID=http(s)://HOST:PORT (like 2=http://127.0.0.1:7402)"
            ))
        };
        let (id, url) = part.split_once('=').ok_or_else(bad)?;
        let id: u64 = id.trim().parse().map_err(|_| bad())?;
        let url = url.trim();
        if id == 0 || !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad());
        }
        if out.insert(id, url.trim_end_matches('/').to_string()).is_some() {
            return Err(ConfigError::Invalid(format!("{what}: member {id} is listed twice")));
        }
    }
    Ok(out)
}

/// Parses a raw string as the TOML type the default of `key` has (paths and the
/// address are strings, everything else is an integer).
fn typed(key: &str, raw: &str) -> Result<toml::Value, ConfigError> {
    let is_string = matches!(
        key,
        "listen"
            | "wire_listen"
            | "data_dir"
            | "auth_token_file"
            | "identities_file"
            | "audit_log"
            | "tls_cert"
            | "tls_key"
            | "client_ca"
            | "grant_signing_key"
            | "grant_service"
            | "grant_retired_key"
            | "peer_listen"
            | "peer_cert"
            | "peer_key"
            | "peer_ca"
            | "unfenced_prefix"
            | "peers"
            | "peer_routes"
            | "foreign_token_prefix"
            | "signed_key_prefix"
            | "signed_lock_prefix"
    );
    if is_string {
        return Ok(toml::Value::String(raw.to_string()));
    }
    if matches!(key, "lab_api" | "insecure_peers" | "audit_all" | "force_new_cluster" | "join") {
        return match raw.trim() {
            "true" | "1" | "on" => Ok(toml::Value::Boolean(true)),
            "false" | "0" | "off" => Ok(toml::Value::Boolean(false)),
            _ => Err(ConfigError::Invalid(format!("{key}: '{raw}' is not true or false"))),
        };
    }
    raw.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .map(toml::Value::Integer)
        .ok_or_else(|| ConfigError::Invalid(format!("{key}: '{raw}' is not a non-negative integer")))
}

#[cfg(test)]
mod tests;
