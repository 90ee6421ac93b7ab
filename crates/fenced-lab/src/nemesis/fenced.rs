//! Fenced's own cluster as the nemesis strikes it (`--target fenced-cluster`): three or
//! five members of [`crate::ensemble`], a plain reader per member, the leader's clock
//! behind its test-only rate file, and the replica check of every member's state hash
//! ([`crate::cluster`]).

use std::time::Duration;

use anyhow::Result;
use tokio::time::sleep;

use super::{Aim, Launched, Members, Replicas};
use crate::cluster::{leader_of, replicas_agree, statuses, Agreement};
use crate::ensemble::{Ensemble, Kind, Links};
use crate::reader::Readers;
use crate::target::{Endpoints, LOCK};
use crate::torture::TortureConfig;

/// A Fenced cluster of `--nodes` members; its counter is in the cluster's own store.
pub(super) struct FencedMembers {
    launched: Launched,
}

impl FencedMembers {
    pub(super) async fn start(cfg: &TortureConfig) -> Result<FencedMembers> {
        let (bin, n) = (cfg.fenced_bin.clone(), cfg.nodes as usize);
        Ok(FencedMembers { launched: Launched::start(move || Ensemble::fenced(&bin, n, Links::Proxied)).await? })
    }
}

impl Members for FencedMembers {
    fn launched(&self) -> &Launched {
        &self.launched
    }

    fn aim(&self) -> Aim {
        Aim {
            election_ms: Kind::Fenced.election_timeout().as_millis() as u64,
            // A leader back soon resumes its term (openraft restores a leader whose
            // vote is committed).
            leader_down_ms: 1_500,
            kill_after_read: true,
            watch_every: Duration::from_millis(100),
            report_leader_faults: false,
        }
    }

    fn endpoints(&self, lock: String) -> Endpoints {
        Endpoints { lock, pg: None, s3: None, dynamodb: None, gate: None }
    }

    async fn leader_term(&self) -> Option<(u64, usize)> {
        let statuses = statuses(&self.launched.addrs).await;
        let i = leader_of(&statuses)?;
        Some((statuses[i].as_ref().and_then(|s| s["term"].as_u64()).unwrap_or(0), i))
    }

    /// Through the rate file a `fenced` built with the `fault-injection` feature reads.
    fn set_clock_rate(&self, i: usize, rate: f64) -> Result<()> {
        let file = self.launched.locked().data_dir(i).join("fault-clock-rate");
        std::fs::write(&file, format!("{rate}\n"))?;
        Ok(())
    }

    fn readers(&self, first_worker: u32, until_us: u64) -> Option<Readers> {
        Some(Readers::spawn(&self.launched.addrs, &format!("{LOCK}/counter"), first_worker, until_us))
    }

    /// Once the last leases have run out, every member at one applied index must hold
    /// one state.
    async fn replicas(&self, ttl: Duration) -> Replicas {
        sleep(ttl * 2).await;
        let differ = |text: String| Replicas { agree: Some(false), text: text.clone(), proof: Some(text) };
        match replicas_agree(&self.launched.addrs, Duration::from_secs(20)).await {
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
