//! Fenced's own cluster as the nemesis strikes it (`--target fenced-cluster`): the
//! members of [`crate::cluster`], a plain reader per member, the leader's clock behind
//! its test-only rate file, and the replica check of every member's state hash.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use tokio::time::sleep;

use super::{Aim, Members, Replicas};
use crate::cluster::{leader_of, Agreement, Cluster};
use crate::reader::Readers;
use crate::target::{Endpoints, LOCK};
use crate::torture::TortureConfig;

/// A Fenced cluster of `--nodes` members; its counter is in the cluster's own store.
pub(super) struct FencedMembers {
    cluster: Cluster,
}

impl FencedMembers {
    pub(super) async fn start(cfg: &TortureConfig) -> Result<FencedMembers> {
        Ok(FencedMembers { cluster: Cluster::start(&cfg.fenced_bin, cfg.nodes as usize).await? })
    }

    /// Runs `f` on member `i`'s process handle, on a blocking thread.
    async fn on_member<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce(&mut crate::peers::Service) -> T + Send + 'static,
    ) -> Result<T> {
        let m = self.cluster.members[i].clone();
        Ok(tokio::task::spawn_blocking(move || f(&mut m.lock().expect("member"))).await?)
    }
}

impl Members for FencedMembers {
    fn len(&self) -> usize {
        self.cluster.len()
    }

    fn aim(&self) -> Aim {
        Aim {
            // Fenced's election timeout is 600 ms at most.
            election_ms: 600,
            // A leader back soon resumes its term (openraft restores a leader whose
            // vote is committed).
            leader_down_ms: 1_500,
            kill_after_read: true,
            watch_every: Duration::from_millis(100),
            report_leader_faults: false,
        }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.cluster.addrs.clone()
    }

    fn endpoints(&self, lock: String) -> Endpoints {
        Endpoints { lock, pg: None, s3: None, dynamodb: None, gate: None }
    }

    async fn leader_term(&self) -> Option<(u64, usize)> {
        let statuses = self.cluster.statuses().await;
        let i = leader_of(&statuses)?;
        Some((statuses[i].as_ref().and_then(|s| s["term"].as_u64()).unwrap_or(0), i))
    }

    async fn kill(&self, victims: &[usize]) -> Result<()> {
        for &i in victims {
            self.on_member(i, |m| m.crash()).await?;
        }
        Ok(())
    }

    async fn restart(&self, victims: &[usize]) -> Result<()> {
        for &i in victims {
            self.on_member(i, |m| m.restart()).await??;
        }
        Ok(())
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.cluster.members[i].lock().expect("member").pid()
    }

    fn cut(&self, a: &[usize], b: &[usize], both: bool) -> Vec<(u64, u64)> {
        self.cluster.cut(a, b, both)
    }

    fn delay_links(&self, i: usize, d: Duration) {
        self.cluster.delay_links(i, d);
    }

    fn heal(&self) {
        self.cluster.heal();
    }

    /// Through the rate file a `fenced` built with the `fault-injection` feature reads.
    fn set_clock_rate(&self, i: usize, rate: f64) -> Result<()> {
        let file = self.cluster.members[i].lock().expect("member").dir().join("data/fault-clock-rate");
        std::fs::write(&file, format!("{rate}\n"))?;
        Ok(())
    }

    fn readers(&self, first_worker: u32, until_us: u64) -> Option<Readers> {
        Some(Readers::spawn(&self.cluster.addrs, &format!("{LOCK}/counter"), first_worker, until_us))
    }

    /// Once the last leases have run out, every member at one applied index must hold
    /// one state.
    async fn replicas(&self, ttl: Duration) -> Replicas {
        sleep(ttl * 2).await;
        let differ = |text: String| Replicas { agree: Some(false), text: text.clone(), proof: Some(text) };
        match self.cluster.replicas_agree(Duration::from_secs(20)).await {
            Agreement::Agree { applied_index } => {
                Replicas { agree: Some(true), text: format!("agree at applied index {applied_index}"), proof: None }
            }
            Agreement::Differ { applied_index, hashes } => {
                differ(format!("replicas disagree: at applied index {applied_index} the state hashes are {hashes:?}"))
            }
            Agreement::Unsettled { indexes } => {
                differ(format!("replicas disagree: no common applied index within 20 s: {indexes:?}"))
            }
            Agreement::NoHash => {
                Replicas { agree: None, text: "the members report no state_hash: not compared".into(), proof: None }
            }
        }
    }
}
