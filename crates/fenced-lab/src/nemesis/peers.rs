//! etcd's and ZooKeeper's clusters as the nemesis strikes them (`--target
//! etcd-cluster|zookeeper-ensemble`): three members of [`crate::ensemble`] behind link
//! proxies, and a Fenced server as the gate that keeps the counter. Their clocks are
//! out of reach ([`clock_refusal`]) and they expose no state hash to compare.

use std::time::Duration;

use anyhow::{bail, Result};

use super::{Aim, Launched, Members, Replicas};
use crate::ensemble::{Ensemble, Links, Probe};
use crate::peers::Service;
use crate::target::{Endpoints, Target};
use crate::torture::TortureConfig;

/// Why the clock nemesis cannot strike `target`, or `None` if it can.
pub fn clock_refusal(target: Target) -> Option<&'static str> {
    match target {
        // Go's runtime reads time through the vDSO itself, not through libc (Debian's
        // etcd links libc, for cgo): LD_PRELOAD (faketime) does not reach it, and etcd
        // has no clock hook of its own.
        Target::EtcdCluster => Some(
            "the clock nemesis cannot strike etcd-cluster: Go's runtime reads the clock through the vDSO, \
             not libc, out of faketime's reach, and etcd has no clock hook",
        ),
        // The JVM reads clock_gettime through libc, which Debian's faketime (LD_PRELOAD)
        // could redirect: possible, not built.
        Target::ZookeeperEnsemble => Some(
            "the clock nemesis is not built for zookeeper-ensemble: Debian's faketime could run the JVM's \
             clock at another rate, but is not wired up",
        ),
        _ => None,
    }
}

/// Three etcd members or a ZooKeeper ensemble, and the gate that keeps the counter;
/// every process is killed when dropped.
pub(super) struct PeerMembers {
    launched: Launched,
    /// Asks who leads without the ensemble's lock (a frozen member makes a question
    /// last seconds).
    probe: Probe,
    target: Target,
    /// Outlives the members (fields drop in order).
    gate: Service,
}

impl PeerMembers {
    /// Starts the gate and the members; refuses the clock nemesis before anything
    /// starts.
    pub(super) async fn start(cfg: &TortureConfig) -> Result<PeerMembers> {
        if cfg.nemesis.clock {
            bail!("{}", clock_refusal(cfg.target).unwrap_or("the clock nemesis is not for this target"));
        }
        let (bin, target) = (cfg.fenced_bin.clone(), cfg.target);
        let gate = tokio::task::spawn_blocking(move || Service::fenced(&bin, &[])).await??;
        let launched = Launched::start(move || match target {
            Target::EtcdCluster => Ensemble::etcd(3, Links::Proxied),
            Target::ZookeeperEnsemble => Ensemble::zookeeper(3, Links::Proxied),
            other => bail!("{other} is not a peer cluster"),
        })
        .await?;
        let probe = launched.locked().probe();
        Ok(PeerMembers { launched, probe, target, gate })
    }
}

impl Members for PeerMembers {
    fn launched(&self) -> &Launched {
        &self.launched
    }

    fn aim(&self) -> Aim {
        let election_ms = self.probe.kind().election_timeout().as_millis() as u64;
        Aim {
            election_ms,
            leader_down_ms: election_ms + 500,
            kill_after_read: false,
            // A frozen member makes a question last seconds.
            watch_every: Duration::from_millis(200),
            report_leader_faults: true,
        }
    }

    fn endpoints(&self, lock: String) -> Endpoints {
        Endpoints { lock, pg: None, s3: None, dynamodb: None, gate: Some(self.gate.addr.to_string()) }
    }

    async fn leader_term(&self) -> Option<(u64, usize)> {
        let probe = self.probe.clone();
        tokio::task::spawn_blocking(move || probe.leader_term()).await.ok().flatten()
    }

    fn set_clock_rate(&self, _i: usize, _rate: f64) -> Result<()> {
        bail!("{}", clock_refusal(self.target).unwrap_or("the clock nemesis is not for this target"))
    }

    async fn replicas(&self, _ttl: Duration) -> Replicas {
        let name = if self.target == Target::EtcdCluster { "etcd" } else { "ZooKeeper" };
        let text = format!("not compared: {name} exposes no state hash the harness reads");
        Replicas { agree: None, text, proof: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_fault_is_refused_for_the_peers_with_a_reason() {
        assert!(clock_refusal(Target::EtcdCluster).unwrap().contains("vDSO"));
        assert!(clock_refusal(Target::ZookeeperEnsemble).unwrap().contains("faketime"));
        assert_eq!(clock_refusal(Target::FencedCluster), None);
    }
}
