//! Who leads: asked of the members, by their own word.

use std::net::SocketAddr;

use hyper::Method;

use super::etcd::etcd_ask;
use super::serving::http_json;
use super::zookeeper::four_letters;
use super::Kind;

/// Asks an ensemble's members who leads, without holding the [`Ensemble`](super::Ensemble) (a frozen
/// member makes a question last seconds).
#[derive(Clone, Debug)]
pub struct Probe {
    pub(super) kind: Kind,
    pub(super) addrs: Vec<SocketAddr>,
}

impl Probe {
    /// What the members are.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The member that says it leads in the highest term, and that term (etcd: its
    /// `raftTerm`; ZooKeeper: the epoch, the high 32 bits of its last zxid), every
    /// member asked at once; `None` while none does.
    pub fn leader_term(&self) -> Option<(u64, usize)> {
        std::thread::scope(|s| {
            let asks: Vec<_> = self.addrs.iter().map(|&a| s.spawn(move || term_if_leader(self.kind, a))).collect();
            asks.into_iter().enumerate().filter_map(|(i, h)| Some((h.join().ok()??, i))).max()
        })
    }
}

/// The term of the member at `addr` if it says it leads (Fenced: 0, its `/readyz`
/// has no term).
pub(super) fn term_if_leader(kind: Kind, addr: SocketAddr) -> Option<u64> {
    match kind {
        Kind::Etcd => {
            let status = etcd_ask(addr, |e| async move { e.status().await }).ok()?;
            (status.member_id != 0 && status.member_id == status.leader).then_some(status.raft_term)
        }
        Kind::Zookeeper => {
            let answer = four_letters(addr, "srvr")?;
            if !answer.contains("Mode: leader") {
                return None;
            }
            let zxid = answer.lines().find_map(|l| l.strip_prefix("Zxid: 0x"))?;
            Some(u64::from_str_radix(zxid.trim(), 16).ok()? >> 32)
        }
        Kind::Fenced => http_json(addr, Method::GET, "/readyz", "").is_some_and(|v| v["leader"] == true).then_some(0),
    }
}
