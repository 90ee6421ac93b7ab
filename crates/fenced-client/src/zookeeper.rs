//! A ZooKeeper lock whose fencing token is its lock node's `czxid`, with the same
//! client-side deadline and lost-lock signal as [`crate::LockGuard`]
//! (`fenced exec --lock-service zk://HOST:PORT`).
//!
//! Curator's `InterProcessMutex` recipe, which ZooKeeper's documentation gives: a
//! session whose timeout is the lease; an ephemeral sequential node under the lock's
//! node (`/fenced-locks/NAME/lock-0000000042`); the lowest holds the lock, every other
//! waiter watches only the node just before its own. The token is the node's `czxid`,
//! the zxid of the transaction that created it: it grows with every transaction of the
//! whole service, leader elections included, so each holder of one lock has a higher
//! one than every holder before it. The sequence suffix grows only under one parent and
//! starts again if that parent is made anew.
//!
//! The deadline moves on with a renewal every third of the TTL, a `exists` of the lock
//! node (any request renews a ZooKeeper session): the send time of the last one that
//! found the node, plus the TTL, minus a tenth. A session that expired, or a node that is
//! gone, is a lost lock.

use std::sync::Arc;
use std::time::Duration;

use fenced_core::Token;
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};
use zookeeper_client as zk;

use crate::error::{Error, LostReason};
use crate::foreign::{Lease, Renewal};

/// Where the locks' nodes live.
pub const ROOT: &str = "/fenced-locks";

/// A held ZooKeeper lock.
#[derive(Debug)]
pub struct ZkGuard {
    client: zk::Client,
    name: String,
    /// The lock node's path.
    node: String,
    token: Token,
    lease: Arc<Lease>,
    keeper: JoinHandle<()>,
}

/// Takes lock `name` at the ZooKeeper at `endpoint` (`zk://host:port`) in a new session
/// whose timeout is `ttl` (the server bounds it, by default to 2 to 20 ticks; the
/// deadline counts from the shorter of the two), waiting in line at most `wait`;
/// `Error::LockHeld` when not granted in time.
pub async fn lock(endpoint: &str, name: &str, ttl: Duration, wait: Duration) -> Result<ZkGuard, Error> {
    let addr = endpoint.strip_prefix("zk://").map(|a| a.trim_end_matches('/')).unwrap_or("");
    if addr.is_empty() || addr.contains('/') || name.is_empty() || name.starts_with('/') {
        return Err(Error::BadRequest(format!("'{endpoint}' and '{name}' must be zk://HOST:PORT and a lock name")));
    }
    let op = Duration::from_secs(5);
    let sent = Instant::now();
    let client = zk::Client::connector()
        .with_session_timeout(ttl)
        .with_connection_timeout(Duration::from_secs(2))
        .with_fail_eagerly()
        .connect(addr);
    let client = bounded(op, client).await?;
    let dir = format!("{ROOT}/{name}");
    let (node, czxid) = enqueue(&client, &dir, op).await?;
    let token = u64::try_from(czxid).ok().and_then(Token::new).ok_or_else(|| {
        Error::unavailable(format!("ZooKeeper created {node} without a czxid (a server before 3.5?)"))
    })?;
    // The server may have cut the timeout to its bounds: the deadline counts from the
    // shorter of the two, never from a TTL the server does not keep. Kept from the
    // node's creation, while it waits in line too.
    let lease = Arc::new(Lease::new(sent, ttl.min(client.session_timeout())));
    let keeper = {
        let (client, node, lease) = (client.clone(), node.clone(), lease.clone());
        tokio::spawn(async move {
            lease
                .keep(|| async {
                    match client.check_stat(&node).await {
                        Ok(Some(_)) => Renewal::Alive,
                        Ok(None) | Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => Renewal::Gone,
                        Err(_) => Renewal::Failed,
                    }
                })
                .await
        })
    };
    let guard = ZkGuard { client, name: name.to_owned(), node, token, lease, keeper };
    match wait_or_leave(&guard.client, &dir, &guard.node, op, Instant::now() + wait).await {
        Err(Error::LockHeld { .. }) => Err(Error::LockHeld { name: name.to_owned() }),
        r => r.map(|()| guard),
    }
}

/// Curator's recipe on an open session, for the lock whose node is `dir` (made on first
/// use): queues, then waits its turn until `give_up`, each request within `op`. The
/// lock node's path and its `czxid` (the fencing token); `Error::LockHeld` when the
/// wait ran out. The laboratory's torture and bench recipes call it with their
/// sessions.
pub async fn take(client: &zk::Client, dir: &str, op: Duration, give_up: Instant) -> Result<(String, i64), Error> {
    let (node, czxid) = enqueue(client, dir, op).await?;
    wait_or_leave(client, dir, &node, op, give_up).await?;
    Ok((node, czxid))
}

/// Queues as an ephemeral sequential child of `dir`, making `dir` first if it is
/// missing: the node's path and its `czxid`.
async fn enqueue(client: &zk::Client, dir: &str, op: Duration) -> Result<(String, i64), Error> {
    let prefix = format!("{dir}/lock-");
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (stat, sequence) = match bounded(op, client.create(&prefix, &[], &ephemeral)).await {
        Err(Error::NotFound(_)) => {
            // The lock's first use: make its node (a racing maker's is as good), then queue.
            let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            match bounded(op, client.mkdir(dir, &persistent)).await {
                Ok(()) | Err(Error::Server { .. }) => {}
                Err(e) => return Err(e),
            }
            bounded(op, client.create(&prefix, &[], &ephemeral)).await?
        }
        r => r?,
    };
    Ok((format!("{prefix}{sequence}"), stat.czxid))
}

/// Waits until `node` is the lowest child of `dir`, or `give_up`: then leaves the line
/// (deletes `node`), so that those behind are not stuck behind it, and answers
/// `Error::LockHeld` (the wait ran out) or the failure.
async fn wait_or_leave(
    client: &zk::Client,
    dir: &str,
    node: &str,
    op: Duration,
    give_up: Instant,
) -> Result<(), Error> {
    match timeout_at(give_up, wait_for_turn(client, dir, node, op)).await {
        Ok(Ok(())) => Ok(()),
        outcome => {
            let _ = bounded(op, client.delete(node, None)).await;
            match outcome {
                Ok(Err(e)) => Err(e),
                _ => Err(Error::LockHeld { name: dir.to_owned() }),
            }
        }
    }
}

/// Waits until `node` is the lowest child of `dir`, watching only the node before it.
async fn wait_for_turn(client: &zk::Client, dir: &str, node: &str, op: Duration) -> Result<(), Error> {
    let mine = &node[dir.len() + 1..];
    loop {
        let mut queue = bounded(op, client.list_children(dir)).await?;
        // `lock-` and a zero-padded sequence: text order is queue order.
        queue.sort_unstable();
        let at = queue.iter().position(|c| c == mine).ok_or_else(|| Error::Lost(LostReason::LeaseNotFound))?;
        if at == 0 {
            return Ok(());
        }
        let before = format!("{dir}/{}", queue[at - 1]);
        match bounded(op, client.get_and_watch_data(&before)).await {
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e),
            Ok((_, _, watch)) => drop(watch.changed().await),
        }
    }
}

impl ZkGuard {
    /// The fencing token: the lock node's `czxid`.
    pub fn token(&self) -> Token {
        self.token
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session, in hex as ZooKeeper's tools print it.
    pub fn session_hex(&self) -> String {
        format!("{:x}", self.client.session_id().0)
    }

    pub fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }

    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease.lost_reason()
    }

    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.lease.lost()
    }

    /// Deletes the lock node and closes the session; `Error::Lost` when the lock had
    /// been lost before.
    pub async fn release(self) -> Result<(), Error> {
        self.keeper.abort();
        let lost = self.lost_reason();
        let deleted = bounded(Duration::from_secs(5), self.client.delete(&self.node, None)).await;
        if let Some(reason) = lost {
            return Err(Error::Lost(reason));
        }
        match deleted {
            Err(Error::NotFound(_)) => Err(Error::Lost(LostReason::LeaseNotFound)),
            other => other,
        }
    }
}

impl Drop for ZkGuard {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// `f` within `d`, ZooKeeper's answers mapped onto the client's errors.
async fn bounded<T>(d: Duration, f: impl std::future::Future<Output = Result<T, zk::Error>>) -> Result<T, Error> {
    match timeout(d, f).await {
        Err(_) => Err(Error::unavailable(format!("ZooKeeper: no answer within {d:?}"))),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(zk::Error::NoNode)) => Err(Error::NotFound("no such node".into())),
        Ok(Err(zk::Error::NodeExists)) => {
            Err(Error::Server { status: None, code: "node_exists".into(), message: "the node exists".into() })
        }
        Ok(Err(zk::Error::SessionExpired)) => Err(Error::Lost(LostReason::LeaseNotFound)),
        Ok(Err(e)) => Err(Error::unavailable(format!("ZooKeeper: {e}"))),
    }
}
