//! One member of the group: openraft, the log, the state machine, and the leader's side
//! of time.
//!
//! **Time.** Only the leader reads a clock, and only to stamp the batches it proposes.
//! When it takes office it waits until its term's first (blank) entry is applied, then
//! anchors: its clock continues from the last applied entry's time, so the replicated
//! timeline never goes back and stands still through an election (every lease is
//! extended by the gap, never shortened). A stall of the process (a gap over
//! `STALL_MS` between two reads, where the timer reads every `HEARTBEAT_MS`) is taken
//! out of the clock, as the single node always did. Expiry is the leader's `Tick`,
//! proposed when the table's next deadline is due and applied like any command.
//!
//! **Proposals.** Commands queue to one proposer task, which stamps the run queued
//! meanwhile into one batch and hands it to openraft bound to the term it anchored in
//! (`with_leader`): a batch stamped by a deposed leader is never appended. Answers come
//! out of the state machine (the [`Applied`] sink), never from here; a batch that cannot
//! commit is refused with `NotLeader` for every request in it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fenced_core::{Command, Error, LeaseId, LeaseInfo, Limits, LockTable, RequestId};
use openraft::async_runtime::WatchReceiver;
use openraft::impls::ProgressResponder;
use openraft::{BasicNode, Instant as _, ReadPolicy, ServerState, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot, Notify};

// Test-only faults (the `fault-injection` feature; see the file).
#[cfg(feature = "fault-injection")]
use crate::fault;

use crate::log_store::{Db, Linger, LogStore};
use crate::network::{Hello, Network};
use crate::state_machine::{Applied, StateMachine, NO_REQUEST};
use crate::{Batch, NodeId, Raft};

/// The timer reads the clock at least this often.
const HEARTBEAT_MS: u64 = 100;
/// A longer gap between two clock reads is a stall of the process: time stands still.
const STALL_MS: u64 = 1_000;
/// How long a member being added may take to catch up as a learner.
const LEARNER_CATCH_UP: Duration = Duration::from_secs(10);
/// How long a member being added may take to answer the handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);
/// A voter the leader has heard from within this long counts as reachable when a
/// membership change asks whether the voters left could still elect a leader.
const REACHABLE_WITHIN: Duration = Duration::from_secs(2);
/// The most commands one batch carries.
const BATCH_MAX: usize = 4_096;
/// The most bytes of commands one batch carries (`Command::size_hint`; a larger
/// command goes in a batch of its own): what one log entry, and one replication
/// message of `PAYLOAD_ENTRIES_MAX` entries, can weigh.
const BATCH_BYTES_MAX: usize = 256 << 10;
/// The most entries one replication message carries (openraft's default is 300): with
/// `BATCH_BYTES_MAX`, a message carries at most about 16 MiB of commands (and a
/// command of up to 256 KiB alone is one entry), far from the peer body limit.
const PAYLOAD_ENTRIES_MAX: u64 = 64;
/// The most client commands waiting for the log at once (queued for a batch, or in a
/// batch not yet committed); past it, and past `proposal_bytes_max`, a client's command
/// is refused `too_busy` at once. Internal commands (`Cancel`, `Tick`, `Promote`) are
/// never refused: each follows a request already admitted, or the leader's own timer.
const PROPOSALS_MAX: u64 = 65_536;
/// The default of [`NodeOptions::proposal_bytes_max`].
pub const PROPOSAL_BYTES_MAX: u64 = 8 << 20;
/// A client command of this many bytes or more is large: large commands together may
/// take only half of `proposal_bytes_max`, so that a flood of large writes leaves room
/// for everyone's small ones (acquires, releases, keepalives).
pub const LARGE_COMMAND_BYTES: u64 = 64 << 10;
/// What the log may weigh (encoded entries, held in memory and on disk) before it is
/// snapshotted and purged whatever `snapshot_every` says: a log of large entries
/// (store writes) reaches it long before its count. Checked every `LOG_CHECK_MS`.
/// The bound grows with the state: it is the larger of this and the last snapshot's
/// size ([`Node::log_bound`]).
const LOG_BYTES_MAX: u64 = 128 << 20;
const LOG_CHECK_MS: u64 = 200;
/// How long a keepalive answered from memory waits at most for a batch to carry it
/// into the log ([`Node::keepalive_here`]).
const RENEWALS_FLUSH_MS: u64 = 100;
/// Keepalives of a cluster's leader waiting for the quorum round that confirms it
/// still leads ([`Node::keepalive_here`]); past it a keepalive goes through the log.
const CONFIRMATIONS_MAX: usize = 65_536;
/// How often [`Node::snapshot_count_loop`] looks at the count of entries.
const SNAPSHOT_COUNT_CHECK_MS: u64 = 20;
/// How long after asking for a snapshot the log loop waits before asking again.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(2);
/// How long a refused caller is told to wait before retrying.
const TOO_BUSY_RETRY_MS: u64 = 50;
/// How often a leader checks whether the cluster's limits should be agreed again.
const AGREE_LIMITS_EVERY: Duration = Duration::from_secs(1);

/// How soon a leader whose taking of office did not complete (its read round or its
/// `Promote` failed) tries again, if the leadership has not changed meanwhile.
const OFFICE_RETRY: Duration = Duration::from_millis(20);

/// How to start a member.
#[derive(Debug)]
pub struct NodeOptions {
    pub id: NodeId,
    pub dir: PathBuf,
    /// Every voter of a new cluster, by id, with the base URL of its peer listener (this
    /// node included). The lowest id initialises an empty cluster; the others wait to be
    /// contacted. One entry: a cluster of one.
    pub members: BTreeMap<NodeId, String>,
    pub limits: Limits,
    /// For a log never written: the table it starts from (migrated from the single-node
    /// format), instead of a fresh one.
    pub base: Option<LockTable>,
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// A snapshot after at least this many entries, and at least as many entries as the
    /// table holds objects ([`Node::snapshot_interval`]); the log keeps `snapshot_keep`
    /// entries before it.
    pub snapshot_every: u64,
    pub snapshot_keep: u64,
    /// The bearer token peers present to each other (the server's own), if any: only
    /// for members without certificates (`insecure_peers`).
    pub peer_token: Option<String>,
    /// This member's side of mutual TLS to `https://` members: its certificate and the
    /// cluster CA as the only root. None: the members are `http://`.
    pub peer_tls: Option<rustls::ClientConfig>,
    /// `--force-new-cluster`: before starting, make this member the only voter (see
    /// [`Db::force_single_member`]), at the URL `members` gives it.
    pub force_new_cluster: bool,
    /// Never initialise a cluster from `members`, even with the lowest id: wait to be
    /// added (a replacement of the lowest-id member, on an empty data directory).
    pub join: bool,
    /// Members this node dials at another URL than the membership's (see
    /// [`Network::new`]); empty: the membership's addresses.
    pub peer_routes: BTreeMap<NodeId, String>,
    /// The most bytes of client commands waiting for the log at once (see
    /// `PROPOSALS_MAX`): past it a client's command is refused `too_busy`.
    pub proposal_bytes_max: u64,
    /// How the log writer gathers a group of entries into one commit.
    pub log_linger: Linger,
}

impl NodeOptions {
    pub fn single(dir: PathBuf, limits: Limits, url: String) -> NodeOptions {
        NodeOptions {
            id: 1,
            dir,
            members: BTreeMap::from([(1, url)]),
            limits,
            base: None,
            heartbeat_ms: 100,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            snapshot_every: 5_000,
            snapshot_keep: 1_000,
            peer_token: None,
            peer_tls: None,
            force_new_cluster: false,
            join: false,
            peer_routes: BTreeMap::new(),
            proposal_bytes_max: PROPOSAL_BYTES_MAX,
            log_linger: Linger::DEFAULT,
        }
    }
}

/// This member cannot take the request: another leads, or none is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    pub leader: Option<NodeId>,
    pub leader_url: Option<String>,
}

impl From<NotLeader> for Error {
    fn from(n: NotLeader) -> Error {
        Error::NotLeader { leader: n.leader }
    }
}

/// A member as `GET /v1/cluster` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Member {
    pub id: NodeId,
    pub url: String,
    /// `leader`, `follower` or `learner`.
    pub role: &'static str,
    /// The last log index known to be on that member: its own log for this member, the
    /// replicated index for the others as the leader sees them (unknown elsewhere).
    pub last_log_index: Option<u64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ClusterStatus {
    pub id: NodeId,
    pub state: String,
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub commit_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    /// The log is purged up to here: a member that needs an entry at or below it
    /// catches up from a snapshot.
    pub purged_index: Option<u64>,
    pub members: Vec<Member>,
    /// Whether the table decides with limits the cluster agreed on through the log
    /// (`Command::SetLimits`), rather than this member's configuration.
    pub limits_agreed: bool,
}

struct Anchor {
    term: u64,
    leader: openraft::alias::CommittedLeaderIdOf<crate::TypeConfig>,
    table_ms: u64,
    local_ms: u64,
}

/// The local monotonic clock with stalls taken out, and the anchor of the term this
/// node leads, if any.
struct Clock {
    start: Instant,
    last_raw_ms: u64,
    stalled_ms: u64,
    anchor: Option<Anchor>,
    #[cfg(feature = "fault-injection")]
    rate: fault::Rate,
}

impl Clock {
    fn local(&mut self) -> u64 {
        let raw = self.start.elapsed().as_millis() as u64;
        #[cfg(feature = "fault-injection")]
        let raw = self.rate.scale(raw);
        let gap = raw.saturating_sub(self.last_raw_ms);
        if gap > STALL_MS {
            self.stalled_ms += gap - HEARTBEAT_MS;
            tracing::warn!(stall_ms = gap, "the process did not run for {gap} ms: lock time stood still");
        }
        self.last_raw_ms = self.last_raw_ms.max(raw);
        self.last_raw_ms - self.stalled_ms
    }

    /// The replicated timeline's now, when this node leads an anchored term.
    fn stamp(&mut self) -> Option<(u64, openraft::alias::CommittedLeaderIdOf<crate::TypeConfig>)> {
        let local = self.local();
        let a = self.anchor.as_ref()?;
        Some((a.table_ms + local.saturating_sub(a.local_ms), a.leader))
    }
}

/// What the server sees of failures the state machine cannot report.
pub trait Refusals: Send + Sync + 'static {
    /// These requests will get no answer from the log: their batch was not appended or
    /// did not commit under this leader (it may still commit under the next one).
    fn refused(&self, requests: &[RequestId], error: Error);
    /// This node stopped leading: every caller still waiting here is told to go
    /// elsewhere.
    fn leadership_lost(&self, leader: Option<NodeId>);
}

pub struct Node {
    pub raft: Raft,
    sm: StateMachine,
    log: LogStore,
    id: NodeId,
    /// Taken at shutdown, which ends the proposer.
    proposals: Mutex<Option<mpsc::UnboundedSender<(RequestId, Command)>>>,
    clock: Mutex<Clock>,
    /// True while this node leads an anchored term: proposals are taken.
    leading: AtomicBool,
    anchored: Notify,
    refusals: Arc<dyn Refusals>,
    stopped: AtomicBool,
    stop: Notify,
    /// Set once the log's file is closed.
    db_closed: Arc<AtomicBool>,
    /// The peer network, for the handshake with a member about to be added.
    network: Network,
    /// Drawn at start: the handshake's answer carries it, so a leader told to add a
    /// URL that reaches itself finds out.
    instance: u64,
    /// The log's file, whose size `figures` reports.
    db_file: PathBuf,
    /// See [`NodeOptions::proposal_bytes_max`].
    proposal_bytes_max: u64,
    /// When an append from a leader was last taken here (a follower's contact).
    leader_contact: Mutex<Option<Instant>>,
    /// How long without contact a leader still counts as alive ([`Node::leader_alive`]).
    contact_window: Duration,
    /// The data directory.
    dir: PathBuf,
    /// A restore's `--tokens-above` not yet applied ([`crate::backup::TOKENS_ABOVE_FILE`]).
    tokens_above: Mutex<Option<fenced_core::Token>>,
    /// Keepalives answered from memory and not yet in the log: each lease and the table
    /// time of its last one ([`Node::keepalive_here`]). At most one a lease; the next
    /// batch carries them all, first (`Command::Renewed`).
    renewals: Mutex<HashMap<LeaseId, u64>>,
    /// [`NodeOptions::snapshot_every`].
    snapshot_every: u64,
    /// Keepalives answered from memory by a cluster's leader, each waiting for a quorum
    /// round begun after it arrived ([`Node::confirm_loop`]).
    confirmations: mpsc::Sender<oneshot::Sender<bool>>,
}

/// Three of the longest election timeouts, at least a second: a follower that heard
/// nothing from its leader for that long, or a leader no quorum acknowledged for that
/// long, does not count the leader as alive (the members would have elected another
/// if they could).
fn contact_window(election_timeout_max_ms: u64) -> Duration {
    Duration::from_millis(election_timeout_max_ms.saturating_mul(3).max(1_000))
}

fn raft_io(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Opens the log and the state machine in `opts.dir` (`--force-new-cluster` and a
/// base state applied first): the log, the state machine, whether the base state still
/// wants its first snapshot, and the flag set once the database is closed.
fn open_storage(
    opts: &NodeOptions,
    applied: Arc<dyn Applied>,
) -> io::Result<(LogStore, StateMachine, bool, Arc<AtomicBool>)> {
    let db = Db::open(&opts.dir)?;
    if opts.force_new_cluster {
        if db.is_empty()? {
            return Err(io::Error::other(format!(
                "force_new_cluster: {} holds no log to keep (start a new member without it)",
                opts.dir.display()
            )));
        }
        let url = opts.members.get(&opts.id).cloned().unwrap_or_default();
        let index = db.force_single_member(opts.id, url)?;
        tracing::warn!(index, id = opts.id, "force_new_cluster: this member is now the only voter");
    }
    if let Some(base) = &opts.base {
        if db.is_empty()? && db.base()?.is_none() {
            StateMachine::write_base(&db, base)?;
        }
    }
    // A base state is not in the log: until a snapshot holds it, a member that
    // replays the log from the start would miss it.
    let base_unsnapshotted = db.base()?.is_some() && !db.has_snapshot();
    let db_closed = db.closed_flag();
    let log = LogStore::open(db.clone(), opts.log_linger)?;
    let sm = StateMachine::open(db, opts.limits.clone(), applied)?.counting_into(log.metrics.clone());
    Ok((log, sm, base_unsnapshotted, db_closed))
}

/// Whether this member may take office again in its old term without an election
/// (openraft's leader restore): only a member alone. A follower can hold entries of
/// that term the leader sent before they were on its own disk, and a leader that lost
/// them would write other entries under the same index and term, which the follower
/// takes for the ones it has (found by the kill nemesis: replicas diverged, tokens were
/// issued twice). The members are the last membership in the log, else the snapshot's,
/// else the configured ones.
fn restores_alone(opts: &NodeOptions, log: &LogStore, sm: &StateMachine) -> bool {
    let members: BTreeSet<NodeId> = log.last_membership().unwrap_or_else(|| {
        let st = sm.state();
        let stored: BTreeSet<NodeId> = st.membership.membership().nodes().map(|(id, _)| *id).collect();
        if stored.is_empty() {
            opts.members.keys().copied().collect()
        } else {
            stored
        }
    });
    let alone = members.len() <= 1 && members.iter().all(|id| *id == opts.id);
    // The negative control of the test that found it: restore whatever the members.
    #[cfg(feature = "fault-injection")]
    let alone = alone || fault::broken("leader-restore");
    alone
}

/// openraft's configuration for this member (`alone`: [`restores_alone`]).
fn raft_config(opts: &NodeOptions, alone: bool) -> io::Result<openraft::Config> {
    openraft::Config {
        cluster_name: "fenced".into(),
        heartbeat_interval: opts.heartbeat_ms,
        election_timeout_min: opts.election_timeout_min_ms,
        election_timeout_max: opts.election_timeout_max_ms,
        enable_pre_vote: Some(true),
        enable_leader_restore: Some(alone),
        // Snapshots by count are asked for by `snapshot_count_loop`, scaled to the
        // state; by weight, by `log_bound_loop`.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: opts.snapshot_keep,
        // Purge in steps of a tenth of the snapshot interval (openraft's default, 256,
        // would keep a small interval's log forever).
        purge_batch_size: (opts.snapshot_every / 10).max(1),
        max_payload_entries: PAYLOAD_ENTRIES_MAX,
        ..Default::default()
    }
    .validate()
    .map_err(raft_io)
}

/// Initialises a new cluster when this member is the lowest configured id, not
/// joining, and the log is new.
async fn initialize_if_lowest(raft: &Raft, opts: &NodeOptions) -> io::Result<()> {
    let lowest = opts.members.keys().next().copied();
    if !raft.is_initialized().await.map_err(raft_io)? && lowest == Some(opts.id) && !opts.join {
        let members: BTreeMap<NodeId, BasicNode> =
            opts.members.iter().map(|(id, url)| (*id, BasicNode { addr: url.clone() })).collect();
        tracing::info!(members = ?opts.members, "initialising a new cluster");
        raft.initialize(members).await.map_err(raft_io)?;
    }
    Ok(())
}

impl Node {
    /// Opens the log and the state machine in `opts.dir`, starts openraft and this
    /// node's tasks, and initialises a new cluster when this node is its lowest id.
    pub async fn start(
        opts: NodeOptions,
        applied: Arc<dyn Applied>,
        refusals: Arc<dyn Refusals>,
    ) -> io::Result<Arc<Node>> {
        // Read before anything is opened: a damaged file is refused with nothing changed.
        let tokens_above = crate::backup::pending_tokens_above(&opts.dir)?;
        let (log, sm, base_unsnapshotted, db_closed) = open_storage(&opts, applied)?;
        let config = raft_config(&opts, restores_alone(&opts, &log, &sm))?;
        let network = Network::new(opts.peer_token.clone(), opts.peer_routes.clone(), opts.peer_tls.clone())
            .counting_into(log.metrics.clone());
        let raft =
            Raft::new(opts.id, Arc::new(config), network.clone(), log.clone(), sm.clone()).await.map_err(raft_io)?;
        initialize_if_lowest(&raft, &opts).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (confirmations, confirm_rx) = mpsc::channel(CONFIRMATIONS_MAX);
        let node = Arc::new(Node {
            raft,
            sm,
            log,
            id: opts.id,
            proposals: Mutex::new(Some(tx)),
            clock: Mutex::new(Clock {
                start: Instant::now(),
                last_raw_ms: 0,
                stalled_ms: 0,
                anchor: None,
                #[cfg(feature = "fault-injection")]
                rate: fault::Rate::new(&opts.dir),
            }),
            leading: AtomicBool::new(false),
            anchored: Notify::new(),
            refusals,
            stopped: AtomicBool::new(false),
            stop: Notify::new(),
            db_closed,
            network,
            instance: random_u64(),
            db_file: opts.dir.join("raft.redb"),
            proposal_bytes_max: opts.proposal_bytes_max,
            snapshot_every: opts.snapshot_every,
            leader_contact: Mutex::new(None),
            contact_window: contact_window(opts.election_timeout_max_ms),
            tokens_above: Mutex::new(tokens_above),
            renewals: Mutex::new(HashMap::new()),
            confirmations,
            dir: opts.dir.clone(),
        });
        node.tokens_above_applied();
        tokio::spawn(node.clone().confirm_loop(confirm_rx));
        node.clone().spawn_tasks(rx, base_unsnapshotted);
        Ok(node)
    }

    /// This member's tasks: the proposer, the counters, leadership, the timer, the
    /// log's bound and snapshots by count (and the base state's first snapshot).
    fn spawn_tasks(self: Arc<Self>, rx: mpsc::UnboundedReceiver<(RequestId, Command)>, base_unsnapshotted: bool) {
        tokio::spawn(self.clone().propose_loop(rx));
        tokio::spawn(self.clone().count_changes());
        tokio::spawn(self.clone().leadership_loop());
        tokio::spawn(self.clone().timer_loop());
        tokio::spawn(self.clone().log_bound_loop());
        tokio::spawn(self.clone().snapshot_count_loop());
        tokio::spawn(self.clone().renewals_loop());
        if base_unsnapshotted {
            tokio::spawn(self.snapshot_base());
        }
    }
    /// Puts a migrated base state into a snapshot and purges the log it covers, so that
    /// every member added later starts from the snapshot, never from an empty table.
    async fn snapshot_base(self: Arc<Self>) {
        if !self.wait_leading(Duration::from_secs(60)).await {
            return;
        }
        if let Err(e) = self.raft.trigger().snapshot().await {
            tracing::error!(error = %e, "cannot snapshot the base state");
            return;
        }
        let mut metrics = self.raft.metrics();
        loop {
            let snapshot = metrics.borrow_watched().snapshot.as_ref().map(|l| l.index);
            if let Some(index) = snapshot {
                let _ = self.raft.trigger().purge_log(index).await;
                tracing::info!(index, "the base state (migrated or restored) is in a snapshot");
                return;
            }
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = self.stopping() => return,
            }
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Whether a shutdown was asked for (openraft stopping then is no failure).
    pub fn is_shutting_down(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Counts each new leader seen, from openraft's server metrics: those change with
    /// the leadership, not with every commit as the whole metrics do (each change wakes
    /// every watcher). Snapshots are counted by the state machine.
    async fn count_changes(self: Arc<Self>) {
        let mut metrics = self.raft.server_metrics();
        let mut leader = None;
        loop {
            {
                let m = metrics.borrow_watched();
                if m.current_leader.is_some() && m.current_leader != leader {
                    leader = m.current_leader;
                    self.log.metrics.leader_changes.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(leader = ?leader, vote = %m.vote, "leader elected");
                }
            }
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = self.stopping() => return,
            }
        }
    }

    /// Passes a client's request to the leader this member knows and heard from lately
    /// ([`Network::forward`]). Err: no such leader (this member leads, or none is live),
    /// or it could not be asked; the `NotLeader` names it and its URL.
    pub async fn forward_to_leader(
        &self,
        req: crate::network::Outgoing,
        timeout: Duration,
    ) -> Result<crate::network::Forwarded, NotLeader> {
        let to = self.not_leader();
        let (Some(leader), Some(url)) = (to.leader, to.leader_url.as_deref()) else { return Err(to) };
        if leader == self.id || !self.leader_alive() {
            return Err(to);
        }
        let forward = self.network.forward(leader, url, req, timeout);
        // A leader that falls silent (frozen, cut off) or is replaced while the call is
        // out: the call is dropped (the leader withdraws a queued acquire whose caller
        // went away) and the caller told to go elsewhere, as it would be by the leader.
        let deposed = async {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if self.not_leader().leader != Some(leader) || !self.leader_alive() || self.is_leading() {
                    return;
                }
            }
        };
        tokio::select! {
            r = forward => r.map_err(|e| {
                tracing::debug!(leader, error = %e, "a request could not be forwarded to the leader");
                to
            }),
            () = deposed => Err(self.not_leader()),
        }
    }

    /// Before a clean stop: a leader of several voters asks the most caught-up other
    /// voter to take over, and waits (up to `within`) until one leads, so that clients
    /// wait one round trip rather than an election. Returns whether leadership moved.
    pub async fn hand_over(&self, within: Duration) -> bool {
        let to = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            if m.current_leader != Some(self.id) || m.state != ServerState::Leader {
                return false;
            }
            let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
            m.replication.as_ref().and_then(|r| {
                r.iter()
                    .filter(|(id, _)| **id != self.id && voters.contains(id))
                    .max_by_key(|(_, matched)| matched.as_ref().map(|l| l.index))
                    .map(|(id, _)| *id)
            })
        };
        let Some(to) = to else { return false };
        if let Err(e) = self.raft.trigger().transfer_leader(to).await {
            tracing::warn!(error = %e, "cannot hand leadership over");
            return false;
        }
        let mut metrics = self.raft.metrics();
        let moved = tokio::time::timeout(within, async {
            loop {
                if metrics.borrow_watched().current_leader.is_some_and(|l| l != self.id) {
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok();
        if moved {
            tracing::info!(to, "leadership handed over before stopping");
        } else {
            tracing::warn!(to, "leadership was not taken over in time; the members will elect a leader");
        }
        moved
    }

    /// Hands a leader's append to openraft, and notes the contact unless the sender's
    /// vote was lower than this member's (a deposed leader's).
    pub async fn append_entries(
        &self,
        req: openraft::raft::AppendEntriesRequest<crate::TypeConfig>,
    ) -> Result<openraft::raft::AppendEntriesResponse<crate::TypeConfig>, openraft::errors::RaftError<crate::TypeConfig>>
    {
        let r = self.raft.append_entries(req).await;
        if r.as_ref().is_ok_and(|a| !matches!(a, openraft::raft::AppendEntriesResponse::HigherVote(_))) {
            *self.leader_contact.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        r
    }

    /// How long since this member last had word of a live leader: on the leader, since
    /// a quorum last acknowledged it (nothing, for a voter alone); on a follower, since
    /// the leader's last append or heartbeat. None: no leader known, or none heard from
    /// since this process started.
    pub fn leader_contact_age(&self) -> Option<Duration> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let leader = m.current_leader?;
        if leader == self.id && m.state == ServerState::Leader {
            if m.membership_config.membership().voter_ids().count() <= 1 {
                return Some(Duration::ZERO);
            }
            return m.last_quorum_acked.as_ref().map(|t| t.elapsed());
        }
        self.leader_contact.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed())
    }

    /// Whether the leader this member knows was heard from within the contact window:
    /// a follower cut off from its leader, and a leader cut off from its quorum, say
    /// no (`/readyz`, `fenced_raft_has_leader`), though openraft still names the leader.
    pub fn leader_alive(&self) -> bool {
        self.leader_contact_age().is_some_and(|age| age < self.contact_window)
    }

    /// The log's own counters (commits and their durations, leader changes, snapshots).
    pub fn log_metrics(&self) -> &crate::metrics::LogMetrics {
        &self.log.metrics
    }

    /// This member's raft state now, for `/metrics`.
    pub fn figures(&self) -> crate::metrics::RaftFigures {
        let contact = self.leader_contact_age();
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let membership = m.membership_config.membership();
        let last = m.last_log_index.unwrap_or(0);
        let is_leader = m.current_leader == Some(self.id) && m.state == openraft::ServerState::Leader;
        let replication_lag = match (&m.replication, is_leader) {
            (Some(r), true) => r
                .iter()
                .filter(|(id, _)| **id != self.id)
                .map(|(id, matched)| (*id, last.saturating_sub(matched.as_ref().map_or(0, |l| l.index))))
                .collect(),
            _ => Vec::new(),
        };
        crate::metrics::RaftFigures {
            id: self.id,
            has_leader: m.current_leader.is_some() && contact.is_some_and(|age| age < self.contact_window),
            leader_contact_age_ms: contact.map(|age| age.as_millis() as u64),
            is_leader,
            term: m.current_term,
            last_log_index: last,
            commit_index: m.cluster_committed.as_ref().map_or(0, |l| l.index),
            applied_index: m.last_applied.as_ref().map_or(0, |l| l.index),
            snapshot_index: m.snapshot.as_ref().map_or(0, |l| l.index),
            purged_index: m.purged.as_ref().map_or(0, |l| l.index),
            voters: membership.voter_ids().count() as u64,
            members: membership.nodes().count() as u64,
            replication_lag,
            peer_ack_age_ms: match (&m.heartbeat, is_leader) {
                (Some(h), true) => h
                    .iter()
                    .filter(|(id, _)| **id != self.id)
                    .map(|(id, at)| {
                        use openraft::Instant as _;
                        (*id, at.as_ref().map(|t| t.elapsed().as_millis() as u64))
                    })
                    .collect(),
                _ => Vec::new(),
            },
            quorum_ack_age_ms: if is_leader {
                m.last_quorum_acked.as_ref().map(|t| {
                    use openraft::Instant as _;
                    t.elapsed().as_millis() as u64
                })
            } else {
                None
            },
            db_bytes: std::fs::metadata(&self.db_file).map_or(0, |md| md.len())
                + crate::segment_log::SegmentLog::disk_bytes(&self.db_file.with_file_name(crate::log_store::LOG_DIR)),
        }
    }

    fn clock(&self) -> MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets a restore's `--tokens-above` once the table counts it as issued (raised
    /// by this member's first batch in office, or by another's, or by grants past it).
    fn tokens_above_applied(&self) {
        let mut pending = self.tokens_above.lock().unwrap_or_else(|p| p.into_inner());
        let Some(floor) = *pending else { return };
        if self.sm.state().table.highest_issued().is_some_and(|h| h >= floor) {
            let _ = std::fs::remove_file(self.dir.join(crate::backup::TOKENS_ABOVE_FILE));
            *pending = None;
        }
    }

    /// The state machine: views read its table (as of the last applied entry).
    pub fn state_machine(&self) -> &StateMachine {
        &self.sm
    }

    /// True while this node leads and takes proposals.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    /// Waits until this node leads an anchored term, up to `timeout`.
    pub async fn wait_leading(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.anchored.notified();
            if self.is_leading() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_leading();
            }
        }
    }

    /// The member believed to lead, and its URL.
    pub fn not_leader(&self) -> NotLeader {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let leader = m.current_leader;
        let leader_url = leader.and_then(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()));
        NotLeader { leader, leader_url }
    }

    /// Whether this member applied everything through `log_id`.
    pub fn applied_through(&self, log_id: Option<crate::LogId>) -> bool {
        self.sm.state().last_applied >= log_id
    }

    /// This member's vote now (what a snapshot's answer carries).
    pub fn vote(&self) -> crate::Vote {
        self.raft.metrics().borrow_watched().vote
    }

    fn renewals(&self) -> MutexGuard<'_, HashMap<LeaseId, u64>> {
        self.renewals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A keepalive answered from memory, without a log entry of its own: when this node
    /// leads and the lease is alive past now (by the table, or by a keepalive answered
    /// here since). The renewal reaches the log with the next batch (`Command::Renewed`,
    /// applied before that batch's time moves), and at least every `RENEWALS_FLUSH_MS`.
    /// A cluster of one answers at once; a member of a larger cluster answers once a
    /// quorum round begun after the keepalive arrived has confirmed that it still leads
    /// (Err: it does not), and only when every member reads `Renewed`
    /// ([`crate::framing::LEVEL_RENEWED`]). `None`: the log decides (a lease unknown
    /// here or past its time, a node not leading, a member of an earlier release, too
    /// many keepalives waiting for their round).
    ///
    /// Why the promise holds: the renewals are drained and the next batch stamped under
    /// one lock, the one taken here. A keepalive answered before is in that batch, at a
    /// time at or before its stamp; one answered after saw a time at or after the
    /// stamp, and a deadline past it, so no expiry of that batch can take the lease. A
    /// renewal that never reaches a committed entry (a crash, a leader deposed) is
    /// covered by the next leader's `Promote`, which gives every lease its whole TTL
    /// from the moment it takes office: after the quorum round, so after the keepalive
    /// arrived (a leader elected before the round would have a vote of the quorum the
    /// round needs, and the round would fail).
    pub async fn keepalive_here(&self, id: LeaseId) -> Option<Result<LeaseInfo, NotLeader>> {
        if !self.is_leading() || self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let alone = self.is_alone();
        if !alone && !self.members_read(crate::framing::LEVEL_RENEWED) {
            return None;
        }
        let (info, term) = self.renew_in_memory(id)?;
        if alone {
            return Some(Ok(info));
        }
        #[cfg(feature = "fault-injection")]
        if fault::broken("keepalive-unconfirmed") {
            return Some(Ok(info));
        }
        let (tx, rx) = oneshot::channel();
        self.confirmations.try_send(tx).ok()?;
        let confirmed = rx.await.unwrap_or(false);
        // Leadership lost and taken again meanwhile cleared the renewal: refused too.
        let same_term = self.clock().anchor.as_ref().map(|a| a.term) == Some(term);
        Some(if confirmed && same_term { Ok(info) } else { Err(self.not_leader()) })
    }

    /// Records a keepalive of `id` at this leader's time now, if the lease is alive past
    /// it: the lease as renewed, and the term it was recorded in.
    fn renew_in_memory(&self, id: LeaseId) -> Option<(LeaseInfo, u64)> {
        // The table first, on its own: a lease it shows alive and then loses (an expiry
        // applied meanwhile) had a deadline before that batch's stamp, which the time
        // read below is at or after, so the check below refuses it.
        let lease = self.sm.state().table.lease(id)?;
        let mut renewals = self.renewals();
        let (now_ms, term) = {
            let mut clock = self.clock();
            let (now_ms, _) = clock.stamp()?;
            (now_ms, clock.anchor.as_ref()?.term)
        };
        let renewed = renewals.get(&id).map_or(0, |at| at.saturating_add(lease.ttl_ms));
        if lease.expires_at_ms.max(renewed) <= now_ms {
            return None;
        }
        let at = renewals.entry(id).or_insert(now_ms);
        *at = (*at).max(now_ms);
        Some((LeaseInfo { id, ttl_ms: lease.ttl_ms, expires_at_ms: now_ms.saturating_add(lease.ttl_ms) }, term))
    }

    /// Whether every other member said it reads `level` ([`crate::framing::LEVEL`]).
    fn members_read(&self, level: u8) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let mut members = m.membership_config.membership().nodes().map(|(id, _)| *id);
        members.all(|id| id == self.id || self.network.level(id) >= level)
    }

    /// Confirms this member's leadership for the keepalives waiting on it: each round
    /// takes every keepalive queued when it begins (so it began after they arrived)
    /// and is one ReadIndex round, a quorum acknowledging a heartbeat sent after it
    /// began; openraft coalesces the heartbeats of rounds that overlap.
    async fn confirm_loop(self: Arc<Self>, mut rx: mpsc::Receiver<oneshot::Sender<bool>>) {
        let mut waiting = Vec::new();
        loop {
            let gathered = tokio::select! {
                n = rx.recv_many(&mut waiting, CONFIRMATIONS_MAX) => n,
                // The node holds the sender: only the shutdown ends this loop.
                _ = self.stopping() => return,
            };
            if gathered == 0 {
                return;
            }
            let confirmed = self.raft.get_read_linearizer(ReadPolicy::ReadIndex).await.is_ok();
            for w in waiting.drain(..) {
                let _ = w.send(confirmed);
            }
        }
    }

    /// Brings keepalives answered from memory into the log at least every
    /// `RENEWALS_FLUSH_MS` (a `Tick`, whose batch carries them): the table's lease
    /// views are that much behind at most.
    async fn renewals_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(RENEWALS_FLUSH_MS)) => {}
                _ = self.stopping() => return,
            }
            if self.is_leading() && !self.renewals().is_empty() {
                let _ = self.propose(NO_REQUEST, Command::Tick);
            }
        }
    }

    /// Queues a command for the log. Its answer comes out of the state machine.
    /// Refused at once with `not_leader` off the leader, and with `too_busy` when the
    /// proposals waiting for the log are at their bound (nothing was done: the caller
    /// may retry).
    pub fn propose(&self, request: RequestId, cmd: Command) -> Result<(), Error> {
        #[cfg(feature = "fault-injection")]
        if request != NO_REQUEST
            && fault::broken("grant-deposed")
            && !self.is_leading()
            && !self.stopped.load(Ordering::Acquire)
        {
            fault::answer_locally(&self.sm, request, cmd);
            return Ok(());
        }
        if !self.is_leading() || self.stopped.load(Ordering::Acquire) {
            return Err(self.not_leader().into());
        }
        let bytes = cmd.size_hint() as u64;
        if request != NO_REQUEST && !self.admits(bytes) {
            self.log.metrics.proposals_refused.fetch_add(1, Ordering::Relaxed);
            return Err(Error::TooBusy { retry_after_ms: TOO_BUSY_RETRY_MS });
        }
        self.send(request, cmd, bytes).map_err(|()| self.not_leader().into())
    }

    /// Whether a client's command of `bytes` fits beside the proposals waiting now: a
    /// large one ([`LARGE_COMMAND_BYTES`]) below half the bound, a small one below all of
    /// it. One command alone always fits, however large (its size was bounded where it
    /// came in).
    fn admits(&self, bytes: u64) -> bool {
        let m = &self.log.metrics;
        let (count, queued) =
            (m.proposals_pending.load(Ordering::Relaxed), m.proposal_bytes_pending.load(Ordering::Relaxed));
        let bound = if bytes >= LARGE_COMMAND_BYTES { self.proposal_bytes_max / 2 } else { self.proposal_bytes_max };
        count == 0 || (count < PROPOSALS_MAX && queued + bytes <= bound)
    }

    /// Whether a client's command of about `bytes` would be admitted now: the listeners
    /// ask before they read a large body, and hold it back (the wire protocol) or refuse
    /// it `too_busy` (HTTP) unread. True off the leader, which proposes nothing itself.
    pub fn has_room(&self, bytes: u64) -> bool {
        !self.is_leading() || self.admits(bytes)
    }

    /// [`has_room`](Self::has_room), refused as [`propose`](Self::propose) would refuse
    /// the command (counted, `too_busy`): for a body the caller will not read.
    pub fn room_for(&self, bytes: u64) -> Result<(), Error> {
        if self.has_room(bytes) {
            return Ok(());
        }
        self.log.metrics.proposals_refused.fetch_add(1, Ordering::Relaxed);
        Err(Error::TooBusy { retry_after_ms: TOO_BUSY_RETRY_MS })
    }

    fn send(&self, request: RequestId, cmd: Command, bytes: u64) -> Result<(), ()> {
        let proposals = self.proposals.lock().unwrap_or_else(|p| p.into_inner());
        proposals.as_ref().ok_or(())?.send((request, cmd)).map_err(drop)?;
        self.log.metrics.proposals_pending.fetch_add(1, Ordering::Relaxed);
        self.log.metrics.proposal_bytes_pending.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// `n` proposals of `bytes` committed or refused: no longer pending.
    fn proposals_done(&self, n: usize, bytes: u64) {
        self.log.metrics.proposals_pending.fetch_sub(n as u64, Ordering::Relaxed);
        self.log.metrics.proposal_bytes_pending.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Resolves once [`shutdown`](Self::shutdown) has begun.
    pub async fn stopping(&self) {
        let notified = self.stop.notified();
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        notified.await
    }

    /// Waits until the state machine reflects every entry committed before the call, as
    /// confirmed by a quorum (ReadIndex): a read after this is linearizable.
    pub async fn linearize(&self) -> Result<(), NotLeader> {
        self.await_office().await;
        self.read_index().await.map_err(|()| self.not_leader())
    }

    /// A member elected but not yet in office (openraft made it leader, its `Promote`
    /// is not yet applied; a restarted cluster of one is elected at once, on its
    /// committed vote) waits for office, up to the contact window, rather than tell its
    /// caller `not_leader` naming itself (or forward the call to itself). A deposed
    /// leader, which may still name itself until it hears of another, does not wait.
    pub async fn await_office(&self) {
        // `grant-deposed` breaks exactly this discipline: such a member never waits.
        #[cfg(feature = "fault-injection")]
        if fault::broken("grant-deposed") {
            return;
        }
        if !self.is_leading() && self.elected() {
            self.wait_leading(self.contact_window).await;
        }
    }

    /// Whether openraft has made this member the leader (office may not be taken yet).
    fn elected(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    async fn read_index(&self) -> Result<(), ()> {
        self.raft.ensure_linearizable(ReadPolicy::ReadIndex).await.map(drop).map_err(|e| {
            tracing::debug!(error = %e, "a linearizable read was refused");
        })
    }

    async fn propose_loop(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<(RequestId, Command)>) {
        let mut next = None;
        while let Some(first) = match next.take() {
            Some(item) => Some(item),
            None => rx.recv().await,
        } {
            let (items, bytes, held) = gather(first, &mut rx);
            next = held;
            self.propose_batch(items, bytes).await;
        }
    }

    /// Hands one batch to the log; its callers hear from the state machine, or are
    /// refused here if it never commits under this leader.
    async fn propose_batch(self: &Arc<Self>, mut items: Vec<(RequestId, Command)>, bytes: u64) {
        let ids: Vec<RequestId> = items.iter().map(|(r, _)| *r).filter(|r| *r != NO_REQUEST).collect();
        let n = items.len();
        let (stamp, renewed) = {
            // One lock for both: see `keepalive_here`.
            let mut renewals = self.renewals();
            (self.clock().stamp(), std::mem::take(&mut *renewals))
        };
        if !renewed.is_empty() {
            items.insert(0, (NO_REQUEST, Command::Renewed { leases: renewed.into_iter().collect() }));
        }
        let Some((now_ms, leader)) = stamp else {
            self.refusals.refused(&ids, self.not_leader().into());
            self.proposals_done(n, bytes);
            return;
        };
        #[cfg(feature = "fault-injection")]
        if fault::broken("answer-before-commit") {
            fault::speculate(&self.sm, leader, &items, now_ms);
        }
        let (responder, done) = ProgressResponder::complete_only();
        let batch = Batch { items, now_ms };
        if let Err(e) = self.raft.write(batch).with_leader(leader).responder(responder).await {
            tracing::error!(error = %e, "the raft core stopped");
            self.refusals.refused(&ids, Error::ShuttingDown);
            self.proposals_done(n, bytes);
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = done.await;
            this.proposals_done(n, bytes);
            match outcome {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a batch did not commit under this leader");
                    this.refusals.refused(&ids, this.not_leader().into());
                }
                Err(_) => this.refusals.refused(&ids, this.not_leader().into()),
            }
        });
    }

    /// Follows openraft's view of who leads: anchors this node's clock when it takes
    /// office (after its term's blank entry is applied), drops the anchor when it leaves.
    /// Woken by openraft's server metrics, which change with the leadership, not with
    /// every commit; a taking of office that did not complete is tried again shortly.
    async fn leadership_loop(self: Arc<Self>) {
        let mut metrics = self.raft.server_metrics();
        loop {
            let (leader_now, term) = {
                let m = metrics.borrow_watched();
                (m.state == ServerState::Leader && m.current_leader == Some(self.id), m.vote.leader_id.term)
            };
            let anchored_term = self.clock().anchor.as_ref().map(|a| a.term);
            if leader_now && anchored_term != Some(term) {
                self.take_office(term).await;
            } else if !leader_now && anchored_term.is_some() {
                self.clock().anchor = None;
                self.leading.store(false, Ordering::Release);
                let leader = self.not_leader().leader;
                tracing::info!(term, ?leader, "no longer leading");
                self.renewals().clear();
                self.refusals.leadership_lost(leader);
            }
            let unsettled = leader_now && self.clock().anchor.as_ref().map(|a| a.term) != Some(term);
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(OFFICE_RETRY), if unsettled => {}
                _ = self.stopping() => return,
            }
        }
    }

    async fn take_office(&self, term: u64) {
        // Not `linearize`, which would wait for the office this is taking.
        if self.read_index().await.is_err() {
            return;
        }
        // The blank entry of this term is applied once the last applied entry is of it.
        for _ in 0..1_000 {
            let applied_term = self.sm.state().last_applied.as_ref().map(|l| l.leader_id.term);
            if applied_term == Some(term) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let Ok(leader) = self.raft.as_leader() else { return };
        if leader.leader_id().term != term {
            return;
        }
        let table_ms = self.sm.state().table.now_ms();
        {
            let mut clock = self.clock();
            let local_ms = clock.local();
            clock.anchor = Some(Anchor { term, leader: leader.to_committed_leader_id(), table_ms, local_ms });
        }
        // The first batch of every time in office, applied before any proposal is taken:
        // the previous callers are gone, every lease gets its full TTL again
        // (`Command::Promote`). A restarted single node keeps its term (openraft writes
        // no blank entry then), so this cannot ride on the blank entry.
        // Stamped at the anchor's own time, the last applied entry's: no timer fires
        // before `Promote` gives every lease its TTL again (a keepalive answered from
        // memory, lost with a crash, was answered at that time or later).
        let Some((_, leader)) = self.clock().stamp() else { return };
        let now_ms = table_ms;
        let (responder, done) = ProgressResponder::complete_only();
        let mut items = vec![(NO_REQUEST, Command::Promote)];
        if let Some(floor) = *self.tokens_above.lock().unwrap_or_else(|p| p.into_inner()) {
            tracing::info!(floor = floor.get(), "raising the token counter as the restore asked");
            items.push((NO_REQUEST, Command::RaiseTokens { floor }));
        }
        let batch = Batch { items, now_ms };
        if self.raft.write(batch).with_leader(leader).responder(responder).await.is_err() {
            return;
        }
        if !matches!(done.await, Ok(Ok(_))) {
            tracing::info!(term, "lost office before its first entry committed");
            self.clock().anchor = None;
            return;
        }
        #[cfg(feature = "fault-injection")]
        if let Some(a) = self.clock().anchor.as_mut() {
            a.table_ms += fault::office_jump_ms();
        }
        self.tokens_above_applied();
        self.leading.store(true, Ordering::Release);
        tracing::info!(term, table_ms, "leading: the replicated clock continues from {table_ms} ms");
        self.anchored.notify_waiters();
    }

    /// The leader's timer: proposes `Tick` when the table's next deadline is due (one at
    /// a time: the next waits until the last is applied), and reads the clock at least
    /// every `HEARTBEAT_MS` so that stalls are seen.
    async fn timer_loop(self: Arc<Self>) {
        let mut tick_sent_at: Option<u64> = None;
        let mut limits_checked_at: Option<Instant> = None;
        let notify = self.sm.applied_notify.clone();
        while !self.stopped.load(Ordering::Acquire) {
            let stamp = self.clock().stamp();
            let mut wait_ms = HEARTBEAT_MS;
            if let (Some((now_ms, _)), true) = (stamp, self.is_leading()) {
                let (due, applied_ms) = {
                    let st = self.sm.state();
                    (st.table.poll_timeout(), st.table.now_ms())
                };
                match due {
                    Some(at) if at <= now_ms && tick_sent_at.is_none_or(|t| applied_ms >= t) => {
                        tick_sent_at = Some(now_ms);
                        let _ = self.propose(NO_REQUEST, Command::Tick);
                    }
                    // Due with a tick in flight: the apply wakes this loop.
                    Some(at) => wait_ms = wait_ms.min(at.saturating_sub(now_ms)),
                    None => {}
                }
                if limits_checked_at.is_none_or(|t| t.elapsed() >= AGREE_LIMITS_EVERY) {
                    limits_checked_at = Some(Instant::now());
                    if let Some(limits) = self.limits_to_agree() {
                        tracing::info!(?limits, "the cluster's limits are set to this leader's configuration");
                        let _ = self.propose(NO_REQUEST, Command::SetLimits(limits));
                    }
                }
            } else {
                tick_sent_at = None;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait_ms.max(1))) => {}
                _ = notify.notified() => {}
                _ = self.stopping() => return,
            }
        }
    }

    /// A snapshot received from a peer, decoded off the runtime's threads with this
    /// member's limits ([`crate::state_machine::check_snapshot`]): refused when it does
    /// not decode, else ready to install without decoding it again.
    /// `file`: where it was received in the kept layout, renamed at install.
    pub async fn check_snapshot(
        &self,
        bytes: Vec<u8>,
        file: Option<std::path::PathBuf>,
    ) -> std::io::Result<crate::SnapshotBody> {
        let limits = self.sm.configured_limits().clone();
        tokio::task::spawn_blocking(move || crate::state_machine::check_snapshot(bytes, &limits, file))
            .await
            .map_err(crate::io_err)?
    }

    /// This leader's configured limits, when the table's are not already those agreed
    /// through the log and every member said it reads `Command::SetLimits`
    /// ([`crate::framing::LEVEL_SET_LIMITS`]): until then (a rolling upgrade from a release
    /// before it) each member keeps deciding with its own configuration, as before.
    fn limits_to_agree(&self) -> Option<Limits> {
        #[cfg(feature = "fault-injection")]
        if fault::broken("limits-unagreed") {
            return None;
        }
        let configured = self.sm.configured_limits();
        {
            let st = self.sm.state();
            if st.table.limits_agreed() && st.table.limits() == configured {
                return None;
            }
        }
        self.members_read(crate::framing::LEVEL_SET_LIMITS).then(|| configured.clone())
    }

    /// What the log may weigh before it is snapshotted and purged: `LOG_BYTES_MAX`, or
    /// the last snapshot's size when that is larger. A fixed bound made a large state
    /// write itself again and again: a store of 640 MiB was snapshotted whole after
    /// every 64 MiB written, on every member, and the disk, saturated, held the log's
    /// fsyncs so long that followers called elections. Scaled, the snapshots written
    /// stay within twice the bytes the log takes, at the cost of a log in memory as
    /// large as the state (docs/server.md, *API*, "A leader at its bound").
    fn log_bound(&self) -> u64 {
        LOG_BYTES_MAX.max(crate::snapshot_file::bytes(&self.dir))
    }

    /// How many entries the log takes past the last snapshot before the next: at least
    /// `snapshot_every`, and at least as many as the table holds objects (leases,
    /// locks, store keys). A snapshot costs about the state's size; taken every 5,000
    /// entries whatever the state, 100,000 leases kept alive 30,000 times a second were
    /// copied, sorted, encoded and written whole twice a second (14% of the server's
    /// CPU samples). Scaled, a snapshot's cost per entry stays bounded.
    pub fn snapshot_interval(&self) -> u64 {
        let st = self.sm.state();
        let objects = st.table.lease_count() + st.table.lock_count() + st.table.store().usage().0 as usize;
        self.snapshot_every.max(objects as u64)
    }

    /// Asks for a snapshot once the log holds [`Node::snapshot_interval`] entries past
    /// the last one, on every member. It looks every [`SNAPSHOT_COUNT_CHECK_MS`] (a
    /// look is a read of the metrics and three counts), so a snapshot is asked for
    /// within that of the count, as openraft's own policy did at the entry; it asks
    /// again only once the last ask was answered (the snapshot moved) or
    /// [`SNAPSHOT_RETRY`] passed.
    async fn snapshot_count_loop(self: Arc<Self>) {
        let mut asked: Option<(Instant, u64)> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(SNAPSHOT_COUNT_CHECK_MS)) => {}
                _ = self.stopping() => return,
            }
            let (last, snapshot) = {
                let m = self.raft.metrics();
                let m = m.borrow_watched();
                (m.last_applied.as_ref().map_or(0, |l| l.index), m.snapshot.as_ref().map_or(0, |l| l.index))
            };
            let waiting = asked.is_some_and(|(at, from)| snapshot == from && at.elapsed() <= SNAPSHOT_RETRY);
            if !waiting && last.saturating_sub(snapshot) >= self.snapshot_interval() {
                asked = Some((Instant::now(), snapshot));
                let _ = self.raft.trigger().snapshot().await;
            }
        }
    }

    /// Keeps the log within [`Node::log_bound`] on every member: past it, a snapshot is
    /// asked for when the entries it would cover weigh half the bound, and the log is
    /// purged up to the last snapshot, on the leader no further than every other
    /// member holds unless one is more than twice the bound behind (it gets the
    /// snapshot, as a member behind a purge by count does).
    async fn log_bound_loop(self: Arc<Self>) {
        let mut asked_at: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(LOG_CHECK_MS)) => {}
                _ = self.stopping() => return,
            }
            let bound = self.log_bound();
            if self.log.bytes() <= bound {
                continue;
            }
            let (snapshot, purged, followers_have) = {
                let m = self.raft.metrics();
                let m = m.borrow_watched();
                // On the leader: the least any other member holds (a follower never
                // heard from holds nothing), so that no member is cut off from the log
                // and sent a snapshot because of this purge.
                let have = m.replication.as_ref().map(|r| {
                    r.iter().filter(|(id, _)| **id != self.id).map(|(_, l)| l.as_ref().map_or(0, |l| l.index)).min()
                });
                (
                    m.snapshot.as_ref().map_or(0, |l| l.index),
                    m.purged.as_ref().map_or(0, |l| l.index),
                    have.flatten().unwrap_or(u64::MAX),
                )
            };
            if self.log.bytes_after(snapshot) > bound / 2 && asked_at.is_none_or(|t| t.elapsed() > SNAPSHOT_RETRY) {
                asked_at = Some(Instant::now());
                tracing::debug!(bytes = self.log.bytes(), snapshot, "the log is at its bound: snapshotting");
                let _ = self.raft.trigger().snapshot().await;
            }
            // A member so far behind that the log since its position weighs twice the
            // bound is not waited for: it catches up from the snapshot.
            let waited_for = followers_have != u64::MAX && self.log.bytes_after(followers_have) <= 2 * bound;
            let upto = if waited_for { snapshot.min(followers_have) } else { snapshot };
            if upto > purged {
                let _ = self.raft.trigger().purge_log(upto).await;
            }
        }
    }

    /// Where the cluster stands, as this member sees it.
    pub fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let replication = m.replication.clone();
        // This member's own row counts only what is on its disk: a leader applies (and
        // answers) an entry a majority of the others has flushed, maybe before its own
        // fsync, so the log it has appended can run ahead of the log it would keep.
        let flushed = self.raft.watch_log_progress().get().and_then(|p| p.last_log_id).map(|l| l.index);
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let role = if m.current_leader == Some(*id) {
                    "leader"
                } else if voters.contains(id) {
                    "follower"
                } else {
                    "learner"
                };
                let last_log_index = if *id == self.id {
                    flushed
                } else {
                    replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index)
                };
                Member { id: *id, url: node.addr.clone(), role, last_log_index }
            })
            .collect();
        ClusterStatus {
            id: self.id,
            state: format!("{:?}", m.state).to_lowercase(),
            leader_id: m.current_leader,
            term: m.current_term,
            commit_index: m.cluster_committed.as_ref().map(|l| l.index),
            last_applied_index: m.last_applied.as_ref().map(|l| l.index),
            last_log_index: m.last_log_index,
            snapshot_index: m.snapshot.as_ref().map(|l| l.index),
            purged_index: m.purged.as_ref().map(|l| l.index),
            members,
            limits_agreed: self.sm.state().table.limits_agreed(),
        }
    }

    /// Adds a member: first as a learner that catches up, then as a voter. A learner
    /// that has not caught up within `LEARNER_CATCH_UP` (down, a wrong URL, not started
    /// with this cluster's peers) is removed again and never becomes a voter: a voter
    /// that never answers would take the quorum of a single server with it.
    pub async fn add_member(&self, id: NodeId, url: String) -> Result<(), String> {
        self.check_newcomer(id, &url).await?;
        let added =
            self.raft.add_learner(id, BasicNode { addr: url.clone() }, true).await.map_err(|e| e.to_string())?;
        let upto = added.log_id.index;
        let caught_up = self
            .raft
            .wait(Some(LEARNER_CATCH_UP))
            .metrics(
                |m| {
                    let matched = m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten());
                    matched.is_some_and(|l| l.index >= upto)
                },
                "the new learner caught up",
            )
            .await
            .is_ok();
        if !caught_up {
            let remove = openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id]));
            if let Err(e) = self.raft.change_membership(remove, false).await {
                tracing::warn!(id, error = %e, "cannot remove a learner that did not catch up");
            }
            return Err(format!(
                "member {id} at {url} did not catch up within {} s (is it running, reachable from here, \
                 and started with --peers naming this cluster?): not added",
                LEARNER_CATCH_UP.as_secs()
            ));
        }
        let mut voters: BTreeSet<NodeId> = self.raft.voter_ids().collect();
        voters.insert(id);
        self.raft.change_membership(voters, false).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Refuses a member to be added unless it is new to the membership (id and URL), its
    /// URL answers the handshake with that very node id, it is not this node, and it
    /// belongs to no cluster yet. Over mutual TLS the handshake also proves that it
    /// holds a certificate of the cluster CA.
    async fn check_newcomer(&self, id: NodeId, url: &str) -> Result<(), String> {
        let known: Vec<(NodeId, String)> = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            m.membership_config.membership().nodes().map(|(id, n)| (*id, n.addr.clone())).collect()
        };
        if let Some((_, at)) = known.iter().find(|(known_id, _)| *known_id == id) {
            return Err(format!("member {id} is already in the membership (at {at})"));
        }
        if let Some((other, _)) = known.iter().find(|(_, at)| at.trim_end_matches('/') == url) {
            return Err(format!("{url} is already the URL of member {other}: one process holds one vote"));
        }
        let (hello, level) =
            self.network.hello(url, HELLO_TIMEOUT).await.map_err(|e| format!("no handshake with {url}: {e}"))?;
        if level < crate::framing::LEVEL_RENEWED {
            return Err(format!(
                "node {id} at {url} runs an earlier release of Fenced, which cannot read this cluster's log (it \
                 reads peer level {level}; the log's entries need {}: agreed limits, and keepalives a cluster of one \
                 answered from memory): upgrade it first",
                crate::framing::LEVEL_RENEWED
            ));
        }
        if hello.instance == self.instance {
            return Err(format!("{url} reaches this node itself, not a new member"));
        }
        if hello.node_id != id {
            return Err(format!("{url} is node {}, not node {id}", hello.node_id));
        }
        if hello.initialized {
            return Err(format!(
                "node {id} at {url} already belongs to a cluster (its log or vote is not empty): start it on an \
                 empty data directory with this cluster's --peers"
            ));
        }
        Ok(())
    }

    /// This node's answer to the handshake (`GET /raft/hello`).
    pub async fn hello(&self) -> Hello {
        let initialized = self.raft.is_initialized().await.unwrap_or(true);
        Hello { node_id: self.id, instance: self.instance, initialized }
    }

    /// Removes a member from the voters and the cluster, unless the voters left would
    /// be none, or fewer than a majority of them are reachable from here now (the
    /// cluster could then elect no leader: its service would stop).
    pub async fn remove_member(&self, id: NodeId) -> Result<(), String> {
        let mut voters: BTreeSet<NodeId> = self.raft.voter_ids().collect();
        if !voters.remove(&id) {
            return Err(format!("member {id} is not a voter"));
        }
        if voters.is_empty() {
            return Err(format!("member {id} is the last voter: the cluster would have none"));
        }
        let reachable = self.reachable_voters(&voters);
        if reachable * 2 <= voters.len() {
            return Err(format!(
                "without member {id}, only {reachable} of the {} voters left answer this leader: they could not \
                 elect a leader (bring the others back first)",
                voters.len()
            ));
        }
        self.raft.change_membership(voters, false).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// How many of `voters` this leader heard from within `REACHABLE_WITHIN` (itself
    /// included).
    fn reachable_voters(&self, voters: &BTreeSet<NodeId>) -> usize {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let heard = |id: &NodeId| {
            m.heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .is_some_and(|at| at.elapsed() < REACHABLE_WITHIN)
        };
        voters.iter().filter(|id| **id == self.id || heard(id)).count()
    }

    /// True while the membership is this node alone (a cluster of one).
    pub fn is_single(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let nodes: Vec<NodeId> = m.membership_config.membership().nodes().map(|(id, _)| *id).collect();
        nodes.is_empty() || nodes == [self.id]
    }

    /// True while this node is a cluster of one by its committed membership: it
    /// takes no peer message (there is no peer to send one; a joining member's
    /// membership is empty until the leader contacts it, so it is not alone).
    pub fn is_alone(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        // No allocation: asked for every keepalive (`keepalive_here`).
        let mut nodes = m.membership_config.membership().nodes().map(|(id, _)| *id);
        nodes.next() == Some(self.id) && nodes.next().is_none()
    }

    /// The last index in the local log.
    pub fn last_log_index(&self) -> u64 {
        self.log.last_index()
    }

    /// Stops proposing, shuts openraft down, and waits (up to 5 s) until the log's file
    /// is closed, so that the directory can be opened again at once.
    pub async fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        self.leading.store(false, Ordering::Release);
        self.stop.notify_waiters();
        self.proposals.lock().unwrap_or_else(|p| p.into_inner()).take();
        let _ = self.raft.shutdown().await;
    }

    /// Waits until every handle on the log's file is gone (after [`shutdown`] and the
    /// last `Arc<Node>` dropped); false if it is still open after `timeout`.
    pub async fn wait_closed(closed: Arc<AtomicBool>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !closed.load(Ordering::SeqCst) {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// A handle that does not keep the log's file open (for [`Node::wait_closed`]).
    pub fn db_handle(&self) -> Arc<AtomicBool> {
        self.db_closed.clone()
    }
}

/// 64 bits from the standard library's OS-seeded hasher keys (no dependency for it).
/// A batch: `first` and the proposals queued behind it, up to `BATCH_MAX` commands and
/// `BATCH_BYTES_MAX` bytes; the command that would pass the bytes is held for the
/// next batch. Returns the batch, its bytes, and the held command.
#[allow(clippy::type_complexity)]
fn gather(
    first: (RequestId, Command),
    rx: &mut mpsc::UnboundedReceiver<(RequestId, Command)>,
) -> (Vec<(RequestId, Command)>, u64, Option<(RequestId, Command)>) {
    let mut bytes = first.1.size_hint();
    let mut items = vec![first];
    while items.len() < BATCH_MAX {
        let Ok(item) = rx.try_recv() else { break };
        let size = item.1.size_hint();
        if bytes + size > BATCH_BYTES_MAX {
            return (items, bytes as u64, Some(item));
        }
        bytes += size;
        items.push(item);
    }
    (items, bytes as u64, None)
}

fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}
