//! openraft's RPCs between members: `POST {member URL}/raft/{append,vote,pre-vote,
//! snapshot,transfer-leader}` with a JSON body, answered with openraft's
//! `Result<Response, RaftError>` as JSON. The server side is the peer routes of
//! `fenced-server`, which call [`crate::Raft`]'s handlers.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::io::Cursor;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
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

/// Makes one [`Peer`] per member; all share one connection pool.
#[derive(Clone)]
pub struct Network {
    http: Client<HttpConnector, Full<Bytes>>,
    /// `Authorization: Bearer ...` for every RPC, when the members share a token.
    auth: Option<String>,
    /// Where this node dials a member instead of the address in the membership (a
    /// proxy, a NAT): the membership stays what every member agrees on, the route is
    /// this node's own. The torture harness puts a fault proxy on each directed link.
    routes: BTreeMap<NodeId, String>,
}

impl Network {
    /// A network whose RPCs carry `token` (the members' shared bearer token) and dial
    /// the members in `routes` at the URL given there.
    pub fn new(token: Option<String>, routes: BTreeMap<NodeId, String>) -> Network {
        Network { auth: token.map(|t| format!("Bearer {t}")), routes, ..Network::default() }
    }
}

impl Default for Network {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(500)));
        let http = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Network { http, auth: None, routes: BTreeMap::new() }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let addr = self.routes.get(&target).unwrap_or(&node.addr);
        Peer { target, base: addr.trim_end_matches('/').to_string(), http: self.http.clone(), auth: self.auth.clone() }
    }
}

/// The client side of one member's RPCs.
pub struct Peer {
    target: NodeId,
    base: String,
    http: Client<HttpConnector, Full<Bytes>>,
    auth: Option<String>,
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
        let url = format!("{}/raft/{what}", self.base);
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(net_err(e)))?;
        let mut request = hyper::Request::post(&url).header("content-type", "application/json");
        if let Some(auth) = &self.auth {
            request = request.header("authorization", auth);
        }
        let request = request.body(Full::new(Bytes::from(body))).map_err(|e| RPCError::Network(net_err(e)))?;
        let exchange = async {
            let resp = self.http.request(request).await.map_err(|e| {
                if e.is_connect() {
                    RPCError::Unreachable(Unreachable::from_string(format!("member {} at {url}: {e}", self.target)))
                } else {
                    RPCError::Network(net_err(format!("member {} at {url}: {e}", self.target)))
                }
            })?;
            let status = resp.status();
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
        match tokio::time::timeout(option.hard_ttl(), exchange).await {
            Ok(r) => r,
            Err(_) => Err(RPCError::Network(net_err(format!("member {} did not answer {what} in time", self.target)))),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
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
        let req = (vote, snapshot.meta, snapshot.snapshot.into_inner());
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = self.call("snapshot", &req, &option) => Ok(r?),
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
