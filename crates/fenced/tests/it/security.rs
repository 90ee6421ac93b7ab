//! The cluster across a network, attacked as an outsider would: three members that
//! authenticate each other by mutual TLS (certificates from a cluster CA made here with
//! the `openssl` commands of docs/server.md, *Security*), clients on `https://`, and the
//! forgeries of the peer side: raft messages from a client, with its token or without,
//! from a process holding another CA's certificate, a member that cannot prove who it
//! is, and the two requests that used to destroy a single server.
//!
//! Every HTTPS call goes through `curl` (a real client, the one the docs use): `.ci/run`
//! installs it, as it installs `openssl`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::server::{call, free_addr, scratch, until, BIN};

/// A certificate authority in a directory, and the certificates it issues.
struct Pki {
    dir: PathBuf,
    name: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `openssl req` (with `kind`: `-x509` for a self-signed certificate) with a new P-256
/// key written to `key`, then `more` arguments.
fn new_key_request(dir: &Path, kind: &[&str], key: &str, more: &[&str]) {
    let mut args = vec!["req"];
    args.extend(kind);
    args.extend(["-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", key]);
    args.extend(more);
    openssl(dir, &args);
}

impl Pki {
    /// A new CA, `NAME-ca.pem` and `NAME-ca.key` in `dir`.
    fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let (pem, key, subj) = (format!("{name}-ca.pem"), format!("{name}-ca.key"), format!("/CN={name} CA"));
        new_key_request(dir, &["-x509"], &key, &["-out", &pem, "-days", "30", "-subj", &subj]);
        Pki { dir: dir.to_path_buf(), name: name.to_string() }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A certificate for 127.0.0.1, good for a server and a client (`who.pem`, `who.key`).
    fn issue(&self, who: &str) -> (PathBuf, PathBuf) {
        let ext = format!("{who}.ext");
        std::fs::write(
            self.dir.join(&ext),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let (csr, pem, key, subj) =
            (format!("{who}.csr"), format!("{who}.pem"), format!("{who}.key"), format!("/CN={who}"));
        let (ca_pem, ca_key) = (format!("{}-ca.pem", self.name), format!("{}-ca.key", self.name));
        new_key_request(&self.dir, &[], &key, &["-out", &csr, "-subj", &subj]);
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_pem,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "30",
                "-extfile",
                &ext,
            ],
        );
        (self.dir.join(pem), self.dir.join(key))
    }
}

/// What `curl` got: the HTTP status and the JSON body, or None when no HTTP exchange
/// happened (the TLS handshake was refused, the connection closed).
fn curl(url: &str, method: &str, body: &str, extra: &[&str]) -> Option<(u16, Value)> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-X", method, "-H", "content-type: application/json", "--data-binary", body])
        .args(["-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n')?;
    let code: u16 = code.trim().parse().ok().filter(|c| *c != 0)?;
    let v = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()));
    Some((code, v))
}

/// A member: its client listener (https), its peer listener, and its certificate.
struct Member {
    id: u64,
    client: SocketAddr,
    peer: SocketAddr,
    cert: (PathBuf, PathBuf),
    ca: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
}

struct TlsCluster {
    members: Vec<Member>,
    peers: String,
    token_file: PathBuf,
}

const TOKEN: &str = "client-secret-of-the-tls-cluster";

impl TlsCluster {
    fn start(name: &str, pki: &Pki, n: u64) -> TlsCluster {
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

    fn spawn(&mut self, i: usize) {
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

    fn url(&self, i: usize, path: &str) -> String {
        format!("https://{}{path}", self.members[i].client)
    }

    /// A client call to member `i` over https, with the client token.
    fn call(&self, i: usize, method: &str, path: &str, body: &str) -> Option<(u16, Value)> {
        let auth = format!("authorization: Bearer {TOKEN}");
        curl(&self.url(i, path), method, body, &["--cacert", self.members[i].ca.to_str().unwrap(), "-H", &auth])
    }

    /// [`Self::call`], asked again while the member answers 503 (a new leader still
    /// taking office) or not at all, for up to 10 s.
    fn settled(&self, i: usize, method: &str, path: &str, body: &str) -> (u16, Value) {
        let mut last = None;
        until(10, || {
            last = self.call(i, method, path, body);
            last.as_ref().is_some_and(|r| r.0 != 503)
        });
        last.unwrap()
    }

    fn status(&self, i: usize) -> Option<Value> {
        self.call(i, "GET", "/v1/cluster", "").filter(|(st, _)| *st == 200).map(|(_, v)| v)
    }

    fn term(&self, i: usize) -> u64 {
        self.status(i).and_then(|s| s["term"].as_u64()).expect("a live member answers its status")
    }

    /// The index of the member that leads, once one does (within 20 s).
    fn leader(&self) -> usize {
        let mut found = None;
        until(20, || {
            found = (0..self.members.len())
                .filter(|i| self.members[*i].child.is_some())
                .find(|i| self.status(*i).is_some_and(|s| s["leader_id"].as_u64() == Some(self.members[*i].id)));
            found.is_some()
        });
        found.unwrap()
    }

    fn kill9(&mut self, i: usize) {
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

/// A child process killed (SIGKILL) when dropped, also when a test panics.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A vote request as openraft 0.10 sends it, from a candidate `node` in `term` whose
/// log looks longer than anyone's: a follower that takes it steps into that term.
fn forged_vote(term: u64, node: u64) -> String {
    format!(
        r#"{{"vote":{{"leader_id":{{"term":{term},"node_id":{node}}},"committed":false}},"last_log_id":{{"leader_id":{{"term":{term},"node_id":{node}}},"index":1000000000}}}}"#
    )
}

/// An append from a "leader" `node` of `term`: a follower that takes it steps into that
/// term (and the real leader, answered with a higher vote, steps down).
fn forged_append(term: u64, node: u64) -> String {
    format!(
        r#"{{"vote":{{"leader_id":{{"term":{term},"node_id":{node}}},"committed":true}},"prev_log_id":null,"entries":[],"leader_commit":null}}"#
    )
}

/// Every route a member may call on another. A forwarded call names its caller's
/// identity, so a client that could reach `forward/...` could call itself anyone.
const PEER_ROUTES: [&str; 9] = [
    "append",
    "append-stream",
    "vote",
    "pre-vote",
    "snapshot",
    "snapshot-offset",
    "transfer-leader",
    "forward/v1/cluster/members",
    "forward/wire",
];

/// The forgery sent to `route`.
fn forged(route: &str, term: u64) -> String {
    if route == "append" {
        forged_append(term, 9)
    } else {
        forged_vote(term, 9)
    }
}

#[test]
fn three_members_over_mutual_tls_serve_https_and_lose_nothing_when_the_leader_is_killed() {
    let dir = scratch("tls-cluster-pki");
    let pki = Pki::new(&dir, "cluster");
    let mut c = TlsCluster::start("tls", &pki, 3);
    let l = c.leader();
    let (st, g) = c.settled(l, "POST", "/v1/locks/held/acquire", r#"{"ttl_ms":60000}"#);
    assert_eq!(st, 200, "{g}");
    let token = g["token"].as_u64().unwrap();
    let auth = format!("authorization: Bearer {TOKEN}");
    let put = curl(
        &c.url(l, "/v1/store/acct"),
        "PUT",
        "balance=1000",
        &["--cacert", c.members[l].ca.to_str().unwrap(), "-H", &auth, "-H", &format!("fencing-token: {token}")],
    );
    assert_eq!(put.as_ref().map(|p| p.0), Some(200), "{put:?}");
    c.kill9(l);
    let l2 = c.leader();
    assert_ne!(l, l2);
    // The held lock kept its holder and token; the store write is there; tokens go on.
    let (st, v) = c.settled(l2, "GET", "/v1/locks/held", "");
    assert_eq!((st, v["held"].as_bool(), v["token"].as_u64()), (200, Some(true), Some(token)), "{v}");
    let (st, v) = c.call(l2, "GET", "/v1/store/acct", "").unwrap();
    assert_eq!((st, v.as_str()), (200, Some("balance=1000")), "{v}");
    let (st, g) = c.call(l2, "POST", "/v1/locks/next/acquire", r#"{"ttl_ms":5000}"#).unwrap();
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > token, "{g}");
    // The killed member comes back over TLS and catches up.
    let target = c.status(l2).and_then(|s| s["commit_index"].as_u64()).expect("the new leader's commit index");
    c.spawn(l);
    until(20, || c.status(l).and_then(|s| s["last_applied_index"].as_u64()) >= Some(target));
    // A follower that served (forwarded) requests stops on SIGTERM as fast as a leader:
    // its peer listener's connections (the leader's appends) do not hold it open.
    for i in 0..3 {
        let (st, v) = c.call(l, "POST", &format!("/v1/locks/f{i}/acquire"), r#"{"ttl_ms":5000}"#).unwrap();
        assert_eq!(st, 200, "{v}");
    }
    // A holder whose keepalives go through this follower, connected when it stops.
    let holder = Command::new(BIN)
        .args(["lock", "--ttl", "3s", "--endpoint", &c.url(l, ""), "held-through-follower"])
        .env("FENCED_CA_FILE", &c.members[l].ca)
        .env("FENCED_AUTH_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut holder = Killed(holder);
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(holder.0.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains("token"), "the holder printed {line:?}");
    }
    std::thread::sleep(Duration::from_millis(1_500));
    // And fenced writes through it, going on while it stops.
    let writes = {
        let (url, ca) = (c.url(l, "/v1/store/through-follower"), c.members[l].ca.clone());
        let fence = format!("fencing-token: {}", g["token"].as_u64().unwrap());
        std::thread::spawn(move || {
            let auth = format!("authorization: Bearer {TOKEN}");
            for _ in 0..30 {
                let extra = ["--cacert", ca.to_str().unwrap(), "-H", &auth, "-H", &fence];
                if curl(&url, "PUT", "v", &extra).is_none() {
                    break;
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let pid = c.members[l].child.as_ref().unwrap().id().to_string();
    let asked = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut child = c.members[l].child.take().unwrap();
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(asked.elapsed() < Duration::from_secs(10), "a follower took over 10 s to stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exited.success(), "{exited}");
    assert!(asked.elapsed() < Duration::from_secs(3), "a follower took {:?} to stop on SIGTERM", asked.elapsed());
    drop(holder);
    writes.join().unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_client_credential_and_no_foreign_certificate_opens_a_peer_route() {
    let dir = scratch("tls-attack-pki");
    let pki = Pki::new(&dir, "cluster");
    let rogue_ca = Pki::new(&dir, "rogue");
    let rogue = rogue_ca.issue("rogue-member");
    let c = TlsCluster::start("tls-attack", &pki, 3);
    let terms: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    let ca = pki.ca();
    let ca = ca.to_str().unwrap();
    let auth = format!("authorization: Bearer {TOKEN}");
    for (i, term) in terms.iter().enumerate() {
        for route in PEER_ROUTES {
            let body = forged(route, term + 100);
            // On the client listener, with the client token or without: refused.
            for extra in [vec!["--cacert", ca, "-H", &auth], vec!["--cacert", ca]] {
                let r = curl(&c.url(i, &format!("/raft/{route}")), "POST", &body, &extra);
                let (st, v) = r.expect("the client listener answers");
                assert_eq!((st, v["error"]["code"].as_str()), (403, Some("forbidden")), "{route} on member {i}: {v}");
            }
            // On the peer listener: no TLS handshake without a certificate of the cluster
            // CA, with the client token, with none, or with another CA's certificate.
            let peer_url = format!("https://{}/raft/{route}", c.members[i].peer);
            let (rogue_cert, rogue_key) = (rogue.0.to_str().unwrap(), rogue.1.to_str().unwrap());
            for extra in
                [vec!["--cacert", ca, "-H", &auth], vec!["--cacert", ca, "--cert", rogue_cert, "--key", rogue_key]]
            {
                let r = curl(&peer_url, "POST", &body, &extra);
                assert!(r.is_none(), "{route} on member {i}'s peer listener with {extra:?}: {r:?}");
            }
        }
    }
    // The control: a member's own certificate does reach the peer listener.
    let (m_cert, m_key) = (c.members[0].cert.0.to_str().unwrap(), c.members[0].cert.1.to_str().unwrap());
    let hello = curl(
        &format!("https://{}/raft/hello", c.members[1].peer),
        "GET",
        "",
        &["--cacert", ca, "--cert", m_cert, "--key", m_key],
    );
    assert_eq!(hello.as_ref().map(|h| (h.0, h.1["node_id"].as_u64())), Some((200, Some(2))), "{hello:?}");
    // No forgery moved a term.
    let after: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    assert_eq!(after, terms, "a forged vote changed a member's term");
    // A process with another CA's certificate cannot join: the handshake fails.
    let l = c.leader();
    let rogue_url = format!("https://{}", free_addr());
    let (st, v) = c.call(l, "POST", "/v1/cluster/members", &format!(r#"{{"id":4,"url":"{rogue_url}"}}"#)).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    let ids: Vec<u64> =
        c.status(l).unwrap()["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member started with a certificate of another CA, listed in the cluster's peers:
/// the leader cannot complete the handshake with it, so it is never added (its forged
/// votes are refused at the TLS handshake in the test above).
#[test]
fn a_member_with_another_cas_certificate_cannot_join_or_vote() {
    let dir = scratch("tls-rogue-pki");
    let pki = Pki::new(&dir, "cluster");
    let rogue_ca = Pki::new(&dir, "rogue");
    let mut c = TlsCluster::start("tls-rogue", &pki, 3);
    let terms: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    let rogue = Member {
        id: 4,
        client: free_addr(),
        peer: free_addr(),
        cert: rogue_ca.issue("rogue-4"),
        ca: rogue_ca.ca(),
        dir: scratch("tls-rogue-4"),
        child: None,
    };
    let url = format!("https://{}", rogue.peer);
    c.peers = format!("{},4={url}", c.peers);
    c.members.push(rogue);
    c.spawn(3);
    let l = c.leader();
    let (st, v) = c.call(l, "POST", "/v1/cluster/members", &format!(r#"{{"id":4,"url":"{url}"}}"#)).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("handshake"), "{v}");
    let ids: Vec<u64> =
        c.status(l).unwrap()["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    let after: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    assert_eq!(after, terms, "the attempt moved a member's term");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three members on loopback without peer authentication (`--insecure-peers`): their
/// ids, client addresses and data directories, and the `--peers` they share.
struct Insecure {
    members: Vec<(u64, SocketAddr, PathBuf)>,
    peers: String,
}

impl Insecure {
    fn new(name: &str) -> Insecure {
        let members: Vec<(u64, SocketAddr, PathBuf)> =
            (1..=3).map(|id| (id, free_addr(), scratch(&format!("{name}-{id}")))).collect();
        let peers = members.iter().map(|(id, a, _)| format!("{id}=http://{a}")).collect::<Vec<_>>().join(",");
        Insecure { members, peers }
    }

    /// Starts member `i` (0-based) with `extra` flags.
    fn start(&self, i: usize, extra: &[&str]) -> Killed {
        let (id, addr, dir) = &self.members[i];
        Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--node-id", &id.to_string(), "--peers", &self.peers])
            .arg("--insecure-peers")
            .args(extra)
            .arg("--data-dir")
            .arg(dir)
            .env("FENCED_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .map(Killed)
            .unwrap()
    }

    fn start_all(&self) -> Vec<Killed> {
        (0..self.members.len()).map(|i| self.start(i, &[])).collect()
    }

    fn status(&self, i: usize) -> Option<Value> {
        call(self.members[i].1, "GET", "/v1/cluster", "", &[]).ok().map(|(_, v)| v)
    }

    /// The index of the member that leads, once one does (within 20 s).
    fn leader(&self) -> usize {
        let mut found = None;
        until(20, || {
            found = (0..self.members.len())
                .find(|i| self.status(*i).is_some_and(|s| s["leader_id"].as_u64() == Some(self.members[*i].0)));
            found.is_some()
        });
        found.unwrap()
    }
}

impl Drop for Insecure {
    fn drop(&mut self) {
        for (_, _, dir) in &self.members {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The negative control of the tests above: the same forged append on a cluster that
/// runs without peer authentication (`--insecure-peers`) is taken, and moves the
/// follower's term. What refuses it above is the peer authentication, not the message.
#[test]
fn without_peer_authentication_the_same_forged_append_is_taken() {
    let c = Insecure::new("insecure-append");
    let _children = c.start_all();
    let l = c.leader();
    let fi = (l + 1) % 3;
    let f = c.members[fi].1;
    let term = c.status(fi).unwrap()["term"].as_u64().unwrap();
    let (st, v) = call(f, "POST", "/raft/append", &forged("append", term + 100), &[]).unwrap();
    assert_eq!((st, &v["Ok"]), (200, &Value::from("Success")), "{v}");
    let after = c.status(fi).unwrap()["term"].as_u64().unwrap();
    assert!(after >= term + 100, "the forged append was not taken (term {term} -> {after}): {v}");
    // A snapshot that does not decode is refused before openraft sees it (its install
    // would stop the log, and the server with it): the member serves on.
    let meta = r#"{"last_log_id":null,"last_membership":{"log_id":null,"membership":{"configs":[],"nodes":{}}},"snapshot_id":"forged"}"#;
    let vote = r#"{"leader_id":{"term":100000,"node_id":9},"committed":true}"#;
    let (st, v) = call(f, "POST", "/raft/snapshot", &format!("[{vote},{meta},[1,2,3]]"), &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_snapshot")), "{v}");
    // One that decodes but whose table breaks an invariant the table relies on (a held
    // lock whose lease is gone: the next release or expiry of it would panic) is
    // refused the same way, saying which.
    let data: Vec<Value> = broken_table_snapshot().into_iter().map(Value::from).collect();
    let body = format!("[{vote},{meta},{}]", Value::from(data));
    let (st, v) = call(f, "POST", "/raft/snapshot", &body, &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_snapshot")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not a live lease"), "{v}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(matches!(call(f, "GET", "/livez", "", &[]), Ok((200, _))), "the member serves on");
}

/// The JSON snapshot (as a release before the binary format sends it) of a table with
/// one held lock whose lease was taken out of the table.
fn broken_table_snapshot() -> Vec<u8> {
    use fenced_core::{Acquire, Command, LeaseId, LeaseRef, Limits, LockName, LockTable, RequestId};
    let mut t = LockTable::new(Limits::default());
    let lease = LeaseId(7);
    t.apply(RequestId(1), Command::GrantLease { lease, ttl_ms: 60_000 }, 1);
    let name = LockName::new("held").unwrap();
    let acquire = Acquire { name, lease: LeaseRef::Existing(lease), wait_ms: 0, lock_delay_ms: 0, holder: None };
    t.apply(RequestId(2), Command::Acquire(acquire), 2);
    let mut table = serde_json::to_value(&t).unwrap();
    table["leases"] = serde_json::json!({});
    serde_json::to_vec(&serde_json::json!({ "table": table })).unwrap()
}

/// The two requests that used to destroy a single server for good (its own URL added
/// as a second voter, then the real member removed), and the raft routes of a server
/// that is a cluster of one: all refused, and the server serves on, also after kill -9.
#[test]
fn a_server_alone_takes_no_peer_message_and_cannot_be_talked_out_of_its_quorum() {
    let dir = scratch("alone");
    let addr = free_addr();
    let start = || {
        Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--data-dir"])
            .arg(&dir)
            .env("FENCED_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let child = Killed(start());
    until(20, || matches!(call(addr, "GET", "/livez", "", &[]), Ok((200, _))));
    let (st, g) = call(addr, "POST", "/v1/locks/a/acquire", r#"{"ttl_ms":60000}"#, &[]).unwrap();
    assert_eq!(st, 200, "{g}");
    for route in PEER_ROUTES {
        let (st, v) = call(addr, "POST", &format!("/raft/{route}"), &forged(route, 100), &[]).unwrap();
        assert_eq!((st, v["error"]["code"].as_str()), (403, Some("not_a_cluster")), "{route}: {v}");
    }
    // Its own URL, and another spelling of it that only the handshake can tell apart.
    for (url, why) in [
        (format!("http://{addr}"), "one process holds one vote"),
        (format!("http://localhost:{}", addr.port()), "this node itself"),
    ] {
        let own = format!(r#"{{"id":17861812,"url":"{url}"}}"#);
        let (st, v) = call(addr, "POST", "/v1/cluster/members", &own, &[]).unwrap();
        assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{url}: {v}");
    }
    let (st, v) = call(addr, "DELETE", "/v1/cluster/members/1", "", &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    let (_, s) = call(addr, "GET", "/v1/cluster", "", &[]).unwrap();
    assert_eq!(s["members"].as_array().map(Vec::len), Some(1), "{s}");
    drop(child);
    let _child = Killed(start());
    until(20, || matches!(call(addr, "GET", "/v1/locks/a", "", &[]), Ok((200, _))));
    let (_, v) = call(addr, "GET", "/v1/locks/a", "", &[]).unwrap();
    assert_eq!((v["held"].as_bool(), v["token"].as_u64()), (Some(true), g["token"].as_u64()), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member whose quorum is gone for good (the other two data directories lost):
/// restarted with `--force-new-cluster` it becomes the only voter, keeping every
/// acknowledged lock and write, and tokens go on above them; restarted again without
/// the flag it stays a cluster of one.
#[test]
fn force_new_cluster_brings_back_a_member_whose_quorum_is_gone_keeping_everything() {
    let c = Insecure::new("force");
    let children = c.start_all();
    // The survivor is the leader. It answered the write once a majority held it, which
    // may have been the two followers before its own fsync: it holds everything
    // acknowledged once its own row of /v1/cluster (the log on its disk) reaches what it
    // applied. That is what an operator reads to pick the survivor.
    let k = c.leader();
    let (id, one) = (c.members[k].0, c.members[k].1);
    // Right after its election a leader may still be taking office (503): ask again.
    let mut g = Value::Null;
    until(10, || {
        let (st, v) = call(one, "POST", "/v1/locks/kept/acquire", r#"{"ttl_ms":60000}"#, &[]).unwrap();
        g = v;
        st == 200
    });
    let token = g["token"].as_u64().unwrap();
    let t = token.to_string();
    let (st, w) = call(one, "PUT", "/v1/store/acct", "balance=1000", &[("fencing-token", t)]).unwrap();
    assert_eq!(st, 200, "{w}");
    until(10, || {
        c.status(k).is_some_and(|s| {
            let own = s["members"].as_array().unwrap().iter().find(|m| m["id"].as_u64() == Some(id)).cloned();
            let flushed = own.and_then(|m| m["last_log_index"].as_u64());
            flushed.is_some() && flushed >= s["last_applied_index"].as_u64()
        })
    });
    // The survivor alone is left; the others' data is gone for good.
    drop(children);
    for (_, _, dir) in c.members.iter().filter(|m| m.0 != id) {
        let _ = std::fs::remove_dir_all(dir);
    }
    let child = c.start(k, &["--force-new-cluster"]);
    until(20, || c.status(k).is_some_and(|s| s["leader_id"].as_u64() == Some(id)));
    let s = c.status(k).unwrap();
    let ids: Vec<u64> = s["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [id], "{s}");
    let (_, v) = call(one, "GET", "/v1/locks/kept", "", &[]).unwrap();
    assert_eq!((v["held"].as_bool(), v["token"].as_u64()), (Some(true), Some(token)), "{v}");
    let (st, v) = call(one, "GET", "/v1/store/acct", "", &[]).unwrap();
    assert_eq!((st, v.as_str()), (200, Some("balance=1000")), "{v}");
    let (st, g) = call(one, "POST", "/v1/locks/after/acquire", r#"{"ttl_ms":5000}"#, &[]).unwrap();
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > token, "{g}");
    // Without the flag it stays a cluster of one.
    drop(child);
    let _child = c.start(k, &[]);
    until(20, || c.status(k).is_some_and(|s| s["leader_id"].as_u64() == Some(id)));
    let (_, v) = call(one, "GET", "/v1/locks/kept", "", &[]).unwrap();
    assert_eq!((v["held"].as_bool(), v["token"].as_u64()), (Some(true), Some(token)), "{v}");
}
