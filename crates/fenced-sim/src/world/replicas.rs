//! A replicated lock service, every replica a real `LockTable` applying one log of
//! commands, cut in two now and then (`split-brain`).
//!
//! The leader applies each command as a batch of one and ships it, with its timestamp,
//! to the replicas it can reach; they apply the same batches through the core's one
//! apply (`LockTable::apply_batch`, as the server's state machine does), so their
//! tables are the leader's. A cut separates the leader of the moment, with the even clients,
//! from the other replicas, with the odd ones. What happens next is the replication's
//! rule:
//!
//! - `primary-backup` (two replicas, asynchronous shipping): the backup hears nothing
//!   for `FAILOVER_MS` and takes over on its own clock, from the entries it had; the
//!   old primary goes on serving its side. Both mint tokens from the same counter:
//!   equal and regressing tokens, two holders at once.
//! - `majority` (three replicas, an entry counts once a majority has it): the old
//!   leader, alone, can commit nothing and serves nobody; the two others elect one of
//!   them, which starts from every committed entry with time standing still during the
//!   election (every lease extended by the gap, never shortened), as Raft and the
//!   design's cluster do.
//!
//! Either way the replica that takes over first applies `Command::Promote`, as the
//! server's new leader does: every lease gets its full TTL again, counted from then,
//! and the acquires queued in its copy of the table are withdrawn.
//!
//! When the cut heals, every replica follows the leader with the newest term again,
//! rebuilt from its log.

use fenced_core::{Batch, Command, Effect, LockTable, RequestId};

use super::{ClientMsg, Ev, Node, World};
use crate::trace::{Detail, Kind, TraceSink};
use crate::Replication;

/// How long the backup waits without hearing the primary before it takes over (and
/// the majority's election timeout).
const FAILOVER_MS: u64 = 500;
/// Time from a heal to the next cut, and how long a cut lasts, uniform in these ranges.
const CUT_GAP_MS: (u64, u64) = (5_000, 15_000);
const CUT_MS: (u64, u64) = (2_000, 8_000);
/// Primary-backup ships entries asynchronously, this long after applying them.
const SHIP_DELAY_MS: u64 = 2;

/// A cut between the replicas.
pub(super) struct Cut {
    /// The leader when the cut began; it keeps the even clients.
    pub(super) old: usize,
    /// The replica serving the odd clients, once it has taken over.
    pub(super) new: Option<usize>,
}

pub(super) fn count(r: Replication) -> usize {
    match r {
        Replication::PrimaryBackup => 2,
        Replication::Majority => 3,
    }
}

/// The side of a cut a client is on: even clients stay with the old leader.
fn with_old_leader(client: u32) -> bool {
    client & 1 == 0
}

impl<S: TraceSink> World<'_, S> {
    /// True when `node` serves clients now.
    pub(super) fn serving(&self, node: usize) -> bool {
        match (self.cfg.replication, &self.cut) {
            (None, _) => !self.down && node == 0,
            (Some(_), None) => node == self.leader,
            (Some(r), Some(cut)) => (r == Replication::PrimaryBackup && node == cut.old) || cut.new == Some(node),
        }
    }

    /// The node that serves `client` now, if any.
    pub(super) fn route(&self, client: u32) -> Option<usize> {
        match (self.cfg.replication, &self.cut) {
            (None, _) => (!self.down).then_some(0),
            (Some(_), None) => Some(self.leader),
            (Some(r), Some(cut)) if with_old_leader(client) => (r == Replication::PrimaryBackup).then_some(cut.old),
            (Some(_), Some(cut)) => cut.new,
        }
    }

    /// Two replicas can hear each other.
    fn linked(&self, a: usize, b: usize) -> bool {
        self.cut.as_ref().is_none_or(|cut| (a == cut.old) == (b == cut.old))
    }

    pub(super) fn schedule_partition(&mut self) {
        let t = self.fault_rng.between(CUT_GAP_MS.0, CUT_GAP_MS.1);
        self.push(self.now + t, Ev::Partition);
    }

    /// Logs the batch the serving `node` is about to apply, and ships it to the
    /// replicas it reaches.
    pub(super) fn replicate(&mut self, node: usize, batch: &Batch) {
        let index = self.nodes[node].log.len();
        self.nodes[node].log.push(batch.clone());
        let majority = self.cfg.replication == Some(Replication::Majority);
        for to in 0..self.nodes.len() {
            if to == node || !self.linked(node, to) || self.serving(to) {
                continue;
            }
            if majority {
                // Committed on a majority before anything is answered.
                self.nodes[to].follow(batch.clone());
            } else {
                let ev = Ev::Replicate { from: node as u8, to: to as u8, index: index as u32 };
                self.push(self.now + SHIP_DELAY_MS, ev);
            }
        }
    }

    /// A shipped entry arrives, if the replicas can still hear each other and it is the
    /// next one the follower needs.
    pub(super) fn on_replicate(&mut self, from: usize, to: usize, index: usize) {
        if !self.linked(from, to) || !self.serving(from) || self.serving(to) || self.nodes[to].log.len() != index {
            return;
        }
        let Some(batch) = self.nodes[from].log.get(index).cloned() else { return };
        self.nodes[to].follow(batch);
    }

    pub(super) fn on_partition(&mut self) {
        let old = self.leader;
        self.cut = Some(Cut { old, new: None });
        self.record_service(Kind::Partition, Detail::Replica { replica: old as u32 });
        let pb = self.cfg.replication == Some(Replication::PrimaryBackup);
        // Requests now cut off from the node they wait on fail: the caller's connection
        // breaks, and a primary that still serves withdraws them (`Cancel`, as the
        // server does for a caller gone away). Latest first, so that no withdrawal
        // hands the lock to a request about to be withdrawn too.
        let mut gone: Vec<(RequestId, u32, u32)> = self
            .waiters
            .iter()
            .filter(|(_, (client, _, node))| *node == old && !(pb && with_old_leader(*client)))
            .map(|(r, (client, lease_n, _))| (*r, *client, *lease_n))
            .collect();
        gone.sort_by_key(|(r, _, _)| std::cmp::Reverse(*r));
        for (request, client, lease_n) in gone {
            self.waiters.remove(&request);
            let gen = self.clients[client as usize].gen;
            self.reply(client, gen, ClientMsg::NotGranted { lease_n });
            if pb {
                self.service(old, Command::Cancel { request });
                self.after_service_call(old);
            }
        }
        self.push(self.now + FAILOVER_MS, Ev::TakeOver);
        let t = self.fault_rng.between(CUT_MS.0, CUT_MS.1);
        self.push(self.now + t, Ev::Heal);
    }

    /// The replicas on the far side of the cut take over: the backup on its own after
    /// its timeout, or the majority's elected leader.
    pub(super) fn on_take_over(&mut self) {
        let Some(old) = self.cut.as_ref().map(|c| c.old) else { return };
        let new = (0..self.nodes.len()).find(|n| *n != old).expect("two replicas or more");
        self.cut.as_mut().expect("checked").new = Some(new);
        self.summary.failovers += 1;
        self.record_service(Kind::Failover, Detail::Replica { replica: new as u32 });
        self.nodes[new].skew = match self.cfg.replication {
            // Its own clock.
            Some(Replication::PrimaryBackup) | None => 0,
            // The replicated timeline goes on from the last committed entry.
            Some(Replication::Majority) => self.nodes[new].table.now_ms() as i64 - self.now as i64,
        };
        // Its first batch in office is `Promote`, as a new leader's is in the server:
        // every lease its full TTL again, and the acquires it queued as a follower
        // withdrawn. Those wait on the old leader's connections, not its own, so the end
        // of their wait tells nobody here.
        self.nodes[new].timer_at = None;
        self.service(new, Command::Promote);
        let waiters = &self.waiters;
        let elsewhere = |r: &RequestId| waiters.get(r).is_none_or(|(_, _, node)| *node != new);
        self.effects.retain(|e| !matches!(e, Effect::WaitEnded { request, .. } if elsewhere(request)));
        self.after_service_call(new);
    }

    pub(super) fn on_heal(&mut self) {
        let Some(cut) = self.cut.take() else { return };
        let leader = cut.new.unwrap_or(cut.old);
        self.leader = leader;
        self.record_service(Kind::Heal, Detail::Replica { replica: leader as u32 });
        // Requests waiting on a replica that now follows are lost with its state.
        let mut gone: Vec<(RequestId, u32, u32)> = self
            .waiters
            .iter()
            .filter(|(_, (_, _, node))| *node != leader)
            .map(|(r, (client, lease_n, _))| (*r, *client, *lease_n))
            .collect();
        gone.sort_by_key(|(r, _, _)| *r);
        for (request, client, lease_n) in gone {
            self.waiters.remove(&request);
            let gen = self.clients[client as usize].gen;
            self.reply(client, gen, ClientMsg::NotGranted { lease_n });
        }
        let log = self.nodes[leader].log.clone();
        let skew = self.nodes[leader].skew;
        for n in (0..self.nodes.len()).filter(|n| *n != leader) {
            let mut node = Node::new(LockTable::new(self.limits.clone()));
            for batch in &log {
                node.follow(batch.clone());
            }
            node.skew = skew;
            self.nodes[n] = node;
        }
        self.schedule_partition();
    }
}
