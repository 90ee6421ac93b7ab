//! What the tests ask a cluster's members: their status, the leader they agree on,
//! whether their replicas agree, a call on whichever member answers, a counter.

use super::*;

impl Cluster {
    pub(super) fn status(&self, i: usize) -> Option<Value> {
        match call(self.members[i].addr, "GET", "/v1/cluster", "", &[]) {
            Ok((200, v)) => Some(v),
            _ => None,
        }
    }

    /// The index of the member every live member agrees leads, within `secs`.
    pub(super) fn leader(&self, secs: u64) -> usize {
        match self.try_leader(secs) {
            Ok(i) => i,
            Err(e) => panic!("{e}"),
        }
    }

    /// The member every live member names leader, once it says so itself; an error
    /// after `secs`.
    pub(super) fn try_leader(&self, secs: u64) -> Result<usize, String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let mut votes = BTreeMap::new();
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                if let Some(s) = self.status(i) {
                    if let Some(l) = s["leader_id"].as_u64() {
                        *votes.entry(l).or_insert(0) += 1;
                    }
                }
            }
            let live = self.members.iter().filter(|m| m.child.is_some()).count();
            if let Some((&id, _)) = votes.iter().find(|(_, n)| **n == live) {
                let i = self.members.iter().position(|m| m.id == id).unwrap();
                if call(self.members[i].addr, "GET", "/readyz", "", &[]).is_ok_and(|(_, v)| v["leader"] == true) {
                    return Ok(i);
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no leader agreed within {secs} s: {votes:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every live member reports the same state hash at the same applied index (the
    /// log moves on with ticks, so they are asked until they stand at one index).
    pub(super) fn replicas_agree(&self) {
        if let Err(e) = self.digests_agree() {
            panic!("{e}");
        }
    }

    pub(super) fn digests_agree(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let digests: Vec<(u64, String)> = (0..self.members.len())
                .filter(|i| self.members[*i].child.is_some())
                .filter_map(|i| match call(self.members[i].addr, "GET", "/v1/cluster?digest=true", "", &[]) {
                    Ok((200, v)) => Some((v["applied_index"].as_u64()?, v["state_hash"].as_str()?.to_string())),
                    _ => None,
                })
                .collect();
            let live = self.members.iter().filter(|m| m.child.is_some()).count();
            if digests.len() == live && digests.iter().all(|d| d.0 == digests[0].0) {
                if digests.iter().all(|d| d.1 == digests[0].1) {
                    return Ok(());
                }
                return Err(format!("replicas disagree at one index: {digests:?}"));
            }
            if Instant::now() > deadline {
                return Err(format!("the members never stood at one index: {digests:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A call to whichever live member takes it (the client's failover, by hand).
    pub(super) fn any(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        self.any_with(method, path, body, &[])
    }

    pub(super) fn any_with(&self, method: &str, path: &str, body: &str, headers: &[(&str, String)]) -> (u16, Value) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for m in self.members.iter().filter(|m| m.child.is_some()) {
                if let Ok((st, v)) = call(m.addr, method, path, body, headers) {
                    if v["error"]["code"] != "not_leader" {
                        return (st, v);
                    }
                }
            }
            assert!(Instant::now() < deadline, "no member took {method} {path}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Member `i`'s counter `name` from its `/metrics`.
    pub(super) fn counter(&self, i: usize, name: &str) -> u64 {
        let (_, v) = call(self.members[i].addr, "GET", "/metrics", "", &[]).unwrap();
        let line = format!("{name} ");
        v.as_str().unwrap().lines().find_map(|l| l.strip_prefix(line.as_str())).unwrap().parse().unwrap()
    }
}
