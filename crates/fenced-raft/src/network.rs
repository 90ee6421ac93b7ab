//! openraft's RPCs between members: `POST {member URL}/raft/{append,vote,pre-vote,
//! snapshot,transfer-leader}` with a JSON body, answered with openraft's
//! `Result<Response, RaftError>` as JSON, and `GET {member URL}/raft/hello`, the
//! handshake a leader makes before it adds a member. The server side is the peer routes
//! of `fenced-server`, which call [`crate::Raft`]'s handlers. With a cluster CA the
//! members dial each other over mutual TLS (`https://` member URLs), each presenting
//! its own certificate.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use openraft::errors::{NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, TransferLeaderResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{NodeId, Snapshot, TypeConfig, Vote};

/// The largest answer a peer may send (a snapshot request's answer is small; this
/// bounds what a confused or hostile peer can make us buffer).
const RESPONSE_BYTES_MAX: usize = 16 << 20;

/// A peer message's body: whole in memory, or a snapshot streamed in chunks.
pub(crate) type PeerBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A body of `bytes`, whole.
pub(crate) fn full(bytes: impl Into<Bytes>) -> PeerBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// How much of a snapshot is read from its file and sent at a time.
const SNAPSHOT_CHUNK: usize = 1 << 20;

/// A snapshot message's body: the frame's header, then `len` bytes from `reader`, read
/// off the runtime's threads a chunk at a time: a snapshot is never copied whole into
/// a message, whatever its size.
fn streamed(head: Vec<u8>, reader: Box<dyn std::io::Read + Send + Sync>, len: u64) -> PeerBody {
    use hyper::body::Frame;
    let head = futures_util::stream::once(async move { Ok(Frame::data(Bytes::from(head))) });
    let chunks = futures_util::stream::unfold(Some((reader, len)), |state| async move {
        let (mut reader, left) = state?;
        if left == 0 {
            return None;
        }
        let want = left.min(SNAPSHOT_CHUNK as u64) as usize;
        let read = tokio::task::spawn_blocking(move || {
            let mut chunk = vec![0u8; want];
            std::io::Read::read_exact(&mut reader, &mut chunk).map(|()| (chunk, reader))
        });
        match read.await.map_err(std::io::Error::other).and_then(|r| r) {
            Ok((chunk, reader)) => Some((Ok(Frame::data(Bytes::from(chunk))), Some((reader, left - want as u64)))),
            Err(e) => Some((Err(e), None)),
        }
    });
    http_body_util::StreamBody::new(futures_util::StreamExt::chain(head, chunks)).boxed()
}

/// The connector of every peer call: plain TCP for `http://` members, TLS with this
/// member's certificate for `https://` ones.
type Connector = HttpsConnector<HttpConnector>;

/// What a member answers at `GET /raft/hello`: who it is, so that a leader about to add
/// it can tell that the URL reaches the node it was told of, not another one, not a
/// member of another cluster and not itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Hello {
    /// Its node id.
    pub node_id: NodeId,
    /// Drawn at each start of a process: a node that reaches itself sees its own.
    pub instance: u64,
    /// Whether it already belongs to a cluster (its log or vote is not empty).
    pub initialized: bool,
}

/// Makes one [`Peer`] per member; all share one connection pool.
#[derive(Clone)]
pub struct Network {
    http: Client<Connector, PeerBody>,
    /// `Authorization: Bearer ...` for every RPC, when the members share a token.
    auth: Option<String>,
    /// Where this node dials a member instead of the address in the membership (a
    /// proxy, a NAT): the membership stays what every member agrees on, the route is
    /// this node's own. The torture harness puts a fault proxy on each directed link.
    routes: BTreeMap<NodeId, String>,
    /// The members whose last RPC failed: a member that cannot be reached is logged
    /// once when it goes and once when it comes back, not at every heartbeat.
    unreachable: Arc<Mutex<BTreeSet<NodeId>>>,
    /// What each member said it reads ([`crate::framing::ACCEPTS_HEADER`]); absent: a
    /// member of a release before frames, or one not heard from yet.
    levels: Levels,
    /// Where the append streams opened are counted.
    metrics: Arc<crate::metrics::LogMetrics>,
}

/// Each member's [`crate::framing::LEVEL`], as it last said.
type Levels = Arc<Mutex<BTreeMap<NodeId, u8>>>;

/// What `member` last said it reads; 0 when it never said.
fn level_of(levels: &Levels, member: NodeId) -> u8 {
    levels.lock().unwrap_or_else(|p| p.into_inner()).get(&member).copied().unwrap_or(0)
}

impl Network {
    /// A network whose RPCs carry `token` (the members' shared bearer token, only
    /// without peer certificates), dial the members in `routes` at the URL given there,
    /// and speak TLS with `tls` (this member's certificate, the cluster CA as the only
    /// root) to `https://` members.
    pub fn new(token: Option<String>, routes: BTreeMap<NodeId, String>, tls: Option<rustls::ClientConfig>) -> Network {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(Duration::from_millis(500)));
        tcp.enforce_http(false);
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let connector = match tls {
            Some(config) => builder.with_tls_config(config).https_only().enable_http1().wrap_connector(tcp),
            // Without a cluster CA there is nothing to trust a member's certificate by:
            // `https://` members are refused by the configuration before this.
            None => builder.with_tls_config(no_tls()).https_or_http().enable_http1().wrap_connector(tcp),
        };
        let http = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Network {
            http,
            auth: token.map(|t| format!("Bearer {t}")),
            routes,
            unreachable: Arc::default(),
            levels: Arc::default(),
            metrics: Arc::default(),
        }
    }

    /// The network, counting the append streams it opens into `metrics` (the node's).
    pub fn counting_into(mut self, metrics: Arc<crate::metrics::LogMetrics>) -> Network {
        self.metrics = metrics;
        self
    }

    /// What `member` said it reads ([`crate::framing::LEVEL`]): 0 until it answered an
    /// RPC of this member's, or when it is of a release before frames.
    pub fn level(&self, member: NodeId) -> u8 {
        level_of(&self.levels, member)
    }

    /// Asks the member at `url` who it is (`GET {url}/raft/hello`), within `timeout`,
    /// and what it reads ([`crate::framing::LEVEL`]; 0 when its answer does not say).
    pub async fn hello(&self, url: &str, timeout: Duration) -> Result<(Hello, u8), String> {
        let url = format!("{}/raft/hello", url.trim_end_matches('/'));
        let mut request = hyper::Request::get(&url);
        if let Some(auth) = &self.auth {
            request = request.header("authorization", auth);
        }
        let request = request.body(full(Bytes::new())).map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = self.http.request(request).await.map_err(|e| format!("{url}: {}", error_chain(&e)))?;
            let status = resp.status();
            let level = resp.headers().get(crate::framing::ACCEPTS_HEADER).map_or(0, crate::framing::parse_level);
            let body = http_body_util::Limited::new(resp.into_body(), 4096)
                .collect()
                .await
                .map_err(|e| format!("{url}: {e}"))?
                .to_bytes();
            if !status.is_success() {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                return Err(format!("{url} answered HTTP {status}: {text}"));
            }
            let hello: Hello =
                serde_json::from_slice(&body).map_err(|e| format!("{url} did not answer as a Fenced member: {e}"))?;
            Ok((hello, level))
        };
        tokio::time::timeout(timeout, exchange).await.unwrap_or_else(|_| Err(format!("{url} did not answer in time")))
    }
}

/// A client request a follower passes to its leader (`/raft/forward/...`).
#[derive(Debug)]
pub struct Outgoing {
    pub method: hyper::Method,
    /// The client's path and query, `/v1/...`.
    pub path_and_query: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
}

/// The leader's answer to a forwarded request: its head, and its body as it arrives
/// (relayed as a stream, so that a large answer, a backup, is never held whole here).
#[derive(Debug)]
pub struct Forwarded {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: hyper::body::Incoming,
}

impl Network {
    /// Sends a client's request to member `target` (at `addr` unless this node routes it
    /// elsewhere) as `{method} {addr}/raft/forward{path_and_query}`, with this member's
    /// peer credentials and the request's headers; the answer's head within `timeout`.
    /// Err: the member could not be asked or did not answer (the caller says
    /// `not_leader` with the leader's URL).
    pub async fn forward(
        &self,
        target: NodeId,
        addr: &str,
        req: Outgoing,
        timeout: Duration,
    ) -> Result<Forwarded, String> {
        let base = self.routes.get(&target).map_or(addr, String::as_str).trim_end_matches('/');
        let url = format!("{base}/raft/forward{}", req.path_and_query);
        let mut request = hyper::Request::builder().method(req.method).uri(&url);
        for (k, v) in &req.headers {
            request = request.header(k.as_str(), v.as_slice());
        }
        if let Some(auth) = &self.auth {
            request = request.header("authorization", auth);
        }
        let request = request.body(full(req.body)).map_err(|e| format!("{url}: {e}"))?;
        let exchange = async {
            let resp = self.http.request(request).await.map_err(|e| format!("{url}: {}", error_chain(&e)))?;
            let status = resp.status().as_u16();
            let headers = resp.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec())).collect();
            Ok(Forwarded { status, headers, body: resp.into_body() })
        };
        tokio::time::timeout(timeout, exchange).await.unwrap_or_else(|_| Err(format!("{url} did not answer in time")))
    }
}

/// A TLS configuration for a network that has no cluster CA: it trusts no root, so it
/// can complete no handshake (it exists because the connector's type is one for both).
fn no_tls() -> rustls::ClientConfig {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

/// An error with its causes, `: `-separated (a TLS refusal is a cause of a connect error).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let addr = self.routes.get(&target).unwrap_or(&node.addr);
        Peer {
            target,
            base: addr.trim_end_matches('/').to_string(),
            http: self.http.clone(),
            auth: self.auth.clone(),
            unreachable: self.unreachable.clone(),
            levels: self.levels.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The client side of one member's RPCs.
pub struct Peer {
    target: NodeId,
    base: String,
    http: Client<Connector, PeerBody>,
    auth: Option<String>,
    unreachable: Arc<Mutex<BTreeSet<NodeId>>>,
    levels: Levels,
    metrics: Arc<crate::metrics::LogMetrics>,
}

/// Bytes per second a message is given to travel, and the least time a message with
/// entries is given: openraft's time-out for an append is the heartbeat interval (100
/// ms), which a message of megabytes (and the follower's fsync of it) can miss under
/// load; missed every time, it is sent again and again and nothing commits. Heartbeats
/// and votes are small and keep openraft's time-out.
const RPC_BYTES_PER_SECOND: u64 = 16 << 20;
const RPC_LARGE_FROM_BYTES: usize = 64 << 10;
const RPC_LARGE_TTL_MIN: Duration = Duration::from_secs(1);

/// How long an RPC of `len` bytes may take: openraft's `hard_ttl` for a small one.
pub(crate) fn rpc_ttl(hard_ttl: Duration, len: usize) -> Duration {
    if len < RPC_LARGE_FROM_BYTES {
        return hard_ttl;
    }
    hard_ttl.max(RPC_LARGE_TTL_MIN) + Duration::from_millis(len as u64 * 1000 / RPC_BYTES_PER_SECOND)
}

fn net_err(e: impl Display) -> NetworkError<TypeConfig> {
    NetworkError::from_string(e.to_string())
}

impl Peer {
    async fn call<Req, Resp>(&self, what: &str, req: &Req, option: &RPCOption) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Result<Resp, RaftError<TypeConfig>>: DeserializeOwned,
    {
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(net_err(e)))?;
        self.send(what, body, "application/json", option).await
    }

    /// What the member said it reads (0: nothing beyond JSON).
    fn level(&self) -> u8 {
        level_of(&self.levels, self.target)
    }

    /// Whether the member said it takes frames.
    fn takes_frames(&self) -> bool {
        self.level() >= 1
    }

    /// Notes what the member says it reads, saying so when that changes.
    fn note_level(&self, said: Option<&hyper::header::HeaderValue>) {
        let Some(level) = said.map(crate::framing::parse_level) else { return };
        let before = self.levels.lock().unwrap_or_else(|p| p.into_inner()).insert(self.target, level);
        if before != Some(level) {
            tracing::info!(
                member = self.target,
                level,
                "the member takes binary frames (appends and snapshots go framed)"
            );
        }
    }

    async fn send<Resp>(
        &self,
        what: &str,
        body: Vec<u8>,
        content_type: &str,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Result<Resp, RaftError<TypeConfig>>: DeserializeOwned,
    {
        let len = body.len() as u64;
        self.send_body(what, full(body), len, content_type, &[], option).await
    }

    /// Sends a message of `len` bytes in `body`, with `headers` besides the usual ones,
    /// and reads the answer.
    async fn send_body<Resp>(
        &self,
        what: &str,
        body: PeerBody,
        len: u64,
        content_type: &str,
        headers: &[(&str, String)],
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Result<Resp, RaftError<TypeConfig>>: DeserializeOwned,
    {
        let url = format!("{}/raft/{what}", self.base);
        let ttl = rpc_ttl(option.hard_ttl(), usize::try_from(len).unwrap_or(usize::MAX));
        let mut request =
            hyper::Request::post(&url).header("content-type", content_type).header(hyper::header::CONTENT_LENGTH, len);
        if let Some(auth) = &self.auth {
            request = request.header("authorization", auth);
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request.body(body).map_err(|e| RPCError::Network(net_err(e)))?;
        let exchange = async {
            let resp = self.http.request(request).await.map_err(|e| {
                let connect = e.is_connect();
                let e = error_chain(&e);
                if connect {
                    RPCError::Unreachable(Unreachable::from_string(format!("member {} at {url}: {e}", self.target)))
                } else {
                    RPCError::Network(net_err(format!("member {} at {url}: {e}", self.target)))
                }
            })?;
            let status = resp.status();
            self.note_level(resp.headers().get(crate::framing::ACCEPTS_HEADER));
            let body = http_body_util::Limited::new(resp.into_body(), RESPONSE_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| RPCError::Network(net_err(e)))?
                .to_bytes();
            if !status.is_success() {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                return Err(RPCError::Network(net_err(format!("HTTP {status} from {url}: {text}"))));
            }
            let answer: Result<Resp, RaftError<TypeConfig>> =
                serde_json::from_slice(&body).map_err(|e| RPCError::Network(net_err(e)))?;
            answer.map_err(|e| RPCError::Network(net_err(e)))
        };
        let result = match tokio::time::timeout(ttl, exchange).await {
            Ok(r) => r,
            Err(_) => Err(RPCError::Network(net_err(format!("member {} did not answer {what} in time", self.target)))),
        };
        self.note_reachability(&result);
        result
    }

    /// Whether the member is marked as not answering (by a failed heartbeat, append or
    /// vote since it last answered).
    fn is_down(&self) -> bool {
        self.unreachable.lock().unwrap_or_else(|p| p.into_inner()).contains(&self.target)
    }

    /// Says so once when the member stops answering, and once when it answers again
    /// (openraft's own complaints, at every heartbeat, are below the default log level).
    fn note_reachability<T>(&self, result: &Result<T, RPCError<TypeConfig>>) {
        let mut down = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(_) if down.remove(&self.target) => {
                tracing::info!(member = self.target, url = %self.base, "member reachable again");
            }
            Err(e @ (RPCError::Unreachable(_) | RPCError::Network(_))) if down.insert(self.target) => {
                tracing::warn!(member = self.target, url = %self.base, error = %e, "member unreachable");
            }
            _ => {}
        }
    }
}

impl Peer {
    /// Streams a snapshot: the frame's header, then the bytes. To a member that
    /// resumes a cut transfer (`resumable`), it first asks how much of these bytes the
    /// member holds already and sends the rest, naming them; a transfer of a full store
    /// (about 720 MiB) cut near its end no longer starts again from its first byte.
    async fn streamed_snapshot(
        &self,
        vote: Vote,
        meta: crate::SnapshotMeta,
        body: crate::SnapshotBody,
        resumable: bool,
        option: &RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, RPCError<TypeConfig>> {
        let network = |e: std::io::Error| RPCError::Network(net_err(e));
        let source = tokio::task::spawn_blocking(move || body.into_source())
            .await
            .map_err(|e| RPCError::Network(net_err(e)))?
            .map_err(network)?;
        let len = source.len();
        let (mut offset, mut headers) = (0, Vec::new());
        if resumable {
            let id = snapshot_id(&meta, len, source.crc());
            let held: u64 = self.call("snapshot-offset", &id, option).await?;
            offset = if held <= len { held } else { 0 };
            if offset > 0 {
                tracing::info!(member = self.target, offset, len, "resuming a cut snapshot transfer where it stopped");
            }
            headers = vec![
                (crate::framing::SNAPSHOT_ID_HEADER, id),
                (crate::framing::SNAPSHOT_OFFSET_HEADER, offset.to_string()),
            ];
        }
        let reader = tokio::task::spawn_blocking(move || source.from(offset))
            .await
            .map_err(|e| RPCError::Network(net_err(e)))?
            .map_err(network)?;
        #[cfg(feature = "fault-injection")]
        let reader = crate::fault::cut_snapshot(reader, offset);
        let head = crate::framing::snapshot_head(&vote, &meta);
        let total = head.len() as u64 + (len - offset);
        let body = streamed(head, reader, len - offset);
        self.send_body("snapshot", body, total, crate::framing::CONTENT_TYPE, &headers, option).await
    }
}

/// The name of a snapshot's bytes: the log id they cover, their length and checksum.
/// Two leaders' snapshots of one log id may differ byte for byte (each encodes its own
/// table), so the log id alone does not name the bytes.
fn snapshot_id(meta: &crate::SnapshotMeta, len: u64, crc: u32) -> String {
    match &meta.last_log_id {
        Some(id) => format!("{}-{}-{}-{len}-{crc:08x}", id.leader_id.term, id.leader_id.node_id, id.index),
        None => format!("none-{len}-{crc:08x}"),
    }
}

impl Peer {
    /// Opens an append stream to the member (`crate::append_stream`): the upgrade
    /// exchange, within the call's time-out (at least a second: a new connection, and
    /// its TLS handshake, come first).
    async fn open_append_stream(
        &self,
        option: &RPCOption,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, RPCError<TypeConfig>> {
        let url = format!("{}{}", self.base, crate::append_stream::PATH);
        let request = crate::append_stream::upgrade_request(&url, self.auth.as_deref())
            .map_err(|e| RPCError::Network(net_err(e)))?;
        let exchange = async {
            let mut resp = self.http.request(request).await.map_err(|e| {
                let connect = e.is_connect();
                let e = format!("member {} at {url}: {}", self.target, error_chain(&e));
                match connect {
                    true => RPCError::Unreachable(Unreachable::from_string(e)),
                    false => RPCError::Network(net_err(e)),
                }
            })?;
            self.note_level(resp.headers().get(crate::framing::ACCEPTS_HEADER));
            if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
                let status = resp.status();
                let body = http_body_util::Limited::new(resp.into_body(), 4096).collect().await;
                let text = body.map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned()).unwrap_or_default();
                return Err(RPCError::Network(net_err(format!("HTTP {status} from {url}: {text}"))));
            }
            let upgraded = hyper::upgrade::on(&mut resp).await.map_err(|e| RPCError::Network(net_err(e)))?;
            Ok(TokioIo::new(upgraded))
        };
        let result = match tokio::time::timeout(option.hard_ttl().max(RPC_LARGE_TTL_MIN), exchange).await {
            Ok(r) => r,
            Err(_) => {
                Err(RPCError::Network(net_err(format!("member {} did not open an append stream in time", self.target))))
            }
        };
        self.note_reachability(&result);
        result
    }
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = crate::SnapshotBody;

    /// Pipelined on a connection of its own to a member that takes it
    /// ([`crate::append_stream`]); a heartbeat (a stream of one append, which says so
    /// in its size hint) and every append to a member of an earlier release go one at
    /// a time on the pooled connections.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> openraft::base::BoxFuture<
        's,
        Result<
            openraft::base::BoxStream<'s, Result<openraft::raft::StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + openraft::OptionalSend + Unpin + 'static,
    {
        if self.level() < crate::framing::LEVEL_APPEND_STREAM || input.size_hint().1 == Some(1) {
            return openraft::network::stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            use futures_util::StreamExt;
            // The first append is taken before the connection is opened: openraft's
            // backoff after a failed stream sleeps in the taking (a member that is down
            // would otherwise be dialled again at once, without end).
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(futures_util::stream::empty().boxed());
            };
            let io = self.open_append_stream(&option).await?;
            self.metrics.append_streams_opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let input = futures_util::stream::iter([first]).chain(input);
            Ok(crate::append_stream::pipelined(io, input, option.hard_ttl(), self.target).boxed())
        })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        if self.takes_frames() {
            return self
                .send("append", crate::framing::encode_append(&rpc), crate::framing::CONTENT_TYPE, &option)
                .await;
        }
        self.call("append", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("pre-vote", &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        if self.is_down() {
            // Known down (its heartbeats fail): not worth reading the snapshot for. The
            // error makes openraft back off and ask again.
            let why = format!("member {} is not answering: the snapshot waits", self.target);
            return Err(StreamingError::Unreachable(Unreachable::from_string(why)));
        }
        let (meta, body) = (snapshot.meta, snapshot.snapshot);
        let sent = async {
            let level = self.level();
            if level >= crate::framing::LEVEL_BINARY_SNAPSHOTS {
                let resumable = level >= crate::framing::LEVEL_RESUMABLE_SNAPSHOTS;
                return self.streamed_snapshot(vote, meta, body, resumable, &option).await;
            }
            // A member of an earlier release reads only the JSON snapshot, whole.
            let data = tokio::task::spawn_blocking(move || body.into_bytes())
                .await
                .map_err(|e| RPCError::Network(net_err(e)))?
                .map_err(|e| RPCError::Network(net_err(e)))?;
            let data = match crate::snapshot_format::is_legacy(&data) {
                true => data,
                false => {
                    let table = crate::state_machine::decode_table(&data, &fenced_core::Limits::default())
                        .map_err(|e| RPCError::Network(net_err(e)))?;
                    crate::snapshot_format::to_legacy_json(&table)
                }
            };
            if self.takes_frames() {
                let body = crate::framing::encode_snapshot(&vote, &meta, &data);
                return self.send("snapshot", body, crate::framing::CONTENT_TYPE, &option).await;
            }
            self.call("snapshot", &(vote, meta, data), &option).await
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = sent => Ok(r?),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("transfer-leader", &req, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> crate::SnapshotMeta {
        let log_id = serde_json::json!({"leader_id": {"term": 2, "node_id": 1}, "index": 41});
        crate::SnapshotMeta {
            last_log_id: Some(serde_json::from_value(log_id).unwrap()),
            last_membership: Default::default(),
        }
    }

    /// A snapshot streamed in chunks is, byte for byte, the framed message sent whole
    /// before: a receiver of either release reads it alike.
    #[tokio::test]
    async fn a_streamed_snapshot_is_the_framed_message() {
        let data: Vec<u8> = (0..(3 * SNAPSHOT_CHUNK + 12_345)).map(|i| (i % 251) as u8).collect();
        let vote = Vote::new_committed(2, 1);
        let reader = Box::new(std::io::Cursor::new(data.clone()));
        let body = streamed(crate::framing::snapshot_head(&vote, &meta()), reader, data.len() as u64);
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(sent.as_ref(), crate::framing::encode_snapshot(&vote, &meta(), &data).as_slice());
    }

    /// A file shorter than it said ends the body with an error: the receiver never
    /// takes a cut snapshot for a whole one.
    #[tokio::test]
    async fn a_snapshot_shorter_than_it_said_fails_the_message() {
        let vote = Vote::new_committed(2, 1);
        let reader = Box::new(std::io::Cursor::new(vec![7u8; 100]));
        let body = streamed(crate::framing::snapshot_head(&vote, &meta()), reader, 200);
        assert!(body.collect().await.is_err());
    }
}
