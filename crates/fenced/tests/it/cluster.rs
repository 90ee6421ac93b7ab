//! Three `fenced server` processes on loopback as one cluster: the harness that starts,
//! kills, freezes and restarts them ([`Cluster`], asked through `queries`), and a
//! module per topic: `kill -9` under load, snapshots and their transfers, frozen
//! leaders, membership changes, backups, readiness, forwarding, the limits in the log,
//! the append stream (a member's side spoken by hand; no redial loop to a member down).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::server::{call, free_addr, scratch, until, BIN};

mod backup;
mod forward;
mod frozen;
mod kill;
mod limits;
mod load;
mod member_stream;
mod membership;
mod queries;
mod readiness;
mod redial;
mod snapshot_transfer;
mod snapshots;

use load::{progress, Load};

struct Member {
    id: u64,
    addr: SocketAddr,
    dir: PathBuf,
    child: Option<Child>,
}

struct Cluster {
    members: Vec<Member>,
    peers: String,
    /// `FENCED_BREAK` for every member (a test-only negative control), if any.
    breaks: Option<&'static str>,
    /// More environment for every member (a test-only fault).
    env: Vec<(&'static str, String)>,
}

impl Cluster {
    fn start(name: &str, n: u64) -> Cluster {
        Cluster::start_broken(name, n, None)
    }

    fn start_broken(name: &str, n: u64, breaks: Option<&'static str>) -> Cluster {
        let mut c = Cluster::unstarted(name, n, breaks);
        c.start_all();
        c
    }

    /// The members' addresses and (absent) data directories, no process yet.
    fn unstarted(name: &str, n: u64, breaks: Option<&'static str>) -> Cluster {
        let members: Vec<Member> = (1..=n)
            .map(|id| Member { id, addr: free_addr(), dir: scratch(&format!("{name}-{id}")), child: None })
            .collect();
        let peers = members.iter().map(|m| format!("{}=http://{}", m.id, m.addr)).collect::<Vec<_>>().join(",");
        Cluster { members, peers, breaks, env: Vec::new() }
    }

    fn start_all(&mut self) {
        for i in 0..self.members.len() {
            self.spawn(i);
        }
        self.leader(20);
    }

    fn endpoints(&self) -> String {
        self.members.iter().map(|m| format!("http://{}", m.addr)).collect::<Vec<_>>().join(",")
    }

    fn spawn(&mut self, i: usize) {
        self.spawn_with(i, &[]);
    }

    /// [`spawn`](Self::spawn) with more flags.
    fn spawn_with(&mut self, i: usize, extra: &[&str]) {
        if let Err(e) = self.try_spawn_with(i, extra) {
            panic!("{e}");
        }
    }

    /// Starts member `i` and waits up to 20 s for it to serve; an error when it exits
    /// first or does not serve by then (a member that refuses its own data directory).
    fn try_spawn_with(&mut self, i: usize, extra: &[&str]) -> Result<(), String> {
        let m = &mut self.members[i];
        let child = Command::new(BIN)
            .args([
                "server",
                "--listen",
                &m.addr.to_string(),
                "--node-id",
                &m.id.to_string(),
                "--peers",
                &self.peers,
                "--insecure-peers",
            ])
            .args(extra)
            .arg("--data-dir")
            .arg(&m.dir)
            .env("FENCED_LOG", "warn")
            .env("FENCED_SNAPSHOT_ENTRIES", "50")
            .env("FENCED_BREAK", self.breaks.unwrap_or(""))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        m.child = Some(child);
        let (addr, id) = (m.addr, m.id);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(call(addr, "GET", "/livez", "", &[]), Ok((200, _))) {
            if let Some(status) = self.members[i].child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                self.members[i].child = None;
                return Err(format!("member {id} exited at start ({status})"));
            }
            if Instant::now() > deadline {
                return Err(format!("member {id} did not serve within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn signal(&self, i: usize, sig: &str) {
        let pid = self.members[i].child.as_ref().unwrap().id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill9(i);
            let _ = std::fs::remove_dir_all(&self.members[i].dir);
        }
    }
}
