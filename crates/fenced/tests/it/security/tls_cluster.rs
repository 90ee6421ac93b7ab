//! Three members that authenticate each other by mutual TLS, with clients on `https://`.

use super::*;

/// A member: its client listener (https), its peer listener, and its certificate.
pub(super) struct Member {
    pub(super) id: u64,
    pub(super) client: SocketAddr,
    pub(super) peer: SocketAddr,
    pub(super) cert: (PathBuf, PathBuf),
    pub(super) ca: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) child: Option<Child>,
}

pub(super) struct TlsCluster {
    pub(super) members: Vec<Member>,
    pub(super) peers: String,
    pub(super) token_file: PathBuf,
}

pub(super) const TOKEN: &str = "client-secret-of-the-tls-cluster";

impl TlsCluster {
    pub(super) fn start(name: &str, pki: &Pki, n: u64) -> TlsCluster {
        let token_file = pki.dir.join("client.token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let members: Vec<Member> = (1..=n)
            .map(|id| Member {
                id,
                client: free_addr(),
                peer: free_addr(),
                cert: pki.issue(&format!("{name}-member-{id}")),
                ca: pki.ca(),
                dir: scratch(&format!("{name}-{id}")),
                child: None,
            })
            .collect();
        let peers = members.iter().map(|m| format!("{}=https://{}", m.id, m.peer)).collect::<Vec<_>>().join(",");
        let mut c = TlsCluster { members, peers, token_file };
        for i in 0..c.members.len() {
            c.spawn(i);
        }
        c.leader();
        c
    }

    pub(super) fn spawn(&mut self, i: usize) {
        let m = &mut self.members[i];
        let child = Command::new(BIN)
            .args(["server", "--listen", &m.client.to_string(), "--peer-listen", &m.peer.to_string()])
            .args(["--node-id", &m.id.to_string(), "--peers", &self.peers])
            .arg("--peer-cert")
            .arg(&m.cert.0)
            .arg("--peer-key")
            .arg(&m.cert.1)
            .arg("--peer-ca")
            .arg(&m.ca)
            .arg("--tls-cert")
            .arg(&m.cert.0)
            .arg("--tls-key")
            .arg(&m.cert.1)
            .arg("--auth-token-file")
            .arg(&self.token_file)
            .arg("--data-dir")
            .arg(&m.dir)
            .env("FENCED_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        m.child = Some(child);
        let url = self.url(i, "/livez");
        let ca = self.members[i].ca.clone();
        until(20, || matches!(curl(&url, "GET", "", &["--cacert", ca.to_str().unwrap()]), Some((200, _))));
    }

    pub(super) fn url(&self, i: usize, path: &str) -> String {
        format!("https://{}{path}", self.members[i].client)
    }

    /// A client call to member `i` over https, with the client token.
    pub(super) fn call(&self, i: usize, method: &str, path: &str, body: &str) -> Option<(u16, Value)> {
        let auth = format!("authorization: Bearer {TOKEN}");
        curl(&self.url(i, path), method, body, &["--cacert", self.members[i].ca.to_str().unwrap(), "-H", &auth])
    }

    /// [`Self::call`], asked again while the member answers 503 (a new leader still
    /// taking office) or not at all, for up to 10 s.
    pub(super) fn settled(&self, i: usize, method: &str, path: &str, body: &str) -> (u16, Value) {
        let mut last = None;
        until(10, || {
            last = self.call(i, method, path, body);
            last.as_ref().is_some_and(|r| r.0 != 503)
        });
        last.unwrap()
    }

    pub(super) fn status(&self, i: usize) -> Option<Value> {
        self.call(i, "GET", "/v1/cluster", "").filter(|(st, _)| *st == 200).map(|(_, v)| v)
    }

    pub(super) fn term(&self, i: usize) -> u64 {
        self.status(i).and_then(|s| s["term"].as_u64()).expect("a live member answers its status")
    }

    /// The index of the member that leads, once one does (within 20 s).
    pub(super) fn leader(&self) -> usize {
        let mut found = None;
        until(20, || {
            found = (0..self.members.len())
                .filter(|i| self.members[*i].child.is_some())
                .find(|i| self.status(*i).is_some_and(|s| s["leader_id"].as_u64() == Some(self.members[*i].id)));
            found.is_some()
        });
        found.unwrap()
    }

    pub(super) fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill9(i);
            let _ = std::fs::remove_dir_all(&self.members[i].dir);
        }
    }
}
