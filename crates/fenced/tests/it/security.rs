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

mod insecure;
mod mutual_tls;
mod peer_routes;
mod pki;
mod quorum;
mod tls_cluster;

use insecure::Insecure;
use pki::Pki;
use tls_cluster::{Member, TlsCluster, TOKEN};

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
