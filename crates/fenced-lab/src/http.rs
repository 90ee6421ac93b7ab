//! The harness's one HTTP client for its own questions to loopback services (a member's
//! status, a peer's health, a bucket made), on hyper: one connection per request,
//! the whole exchange within a bound, the answer's status and body. The clients of
//! the systems under test are elsewhere (`fenced_client::etcd`, Fenced's own client).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// A service's answer.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON, if the status is 200 and the body is JSON.
    pub fn json_if_ok(&self) -> Option<Value> {
        (self.status == 200).then(|| serde_json::from_slice(&self.body).ok())?
    }

    /// The body as text, for a message.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_owned()
    }
}

/// `GET path` of the service at `addr`, within `bound`.
pub async fn get(addr: SocketAddr, path: &str, bound: Duration) -> Result<Answer, String> {
    request(Method::GET, addr, path, "", bound).await
}

/// `method path` with a JSON `body` (none when empty) to the service at `addr`, on a
/// connection of its own, answered within `bound` (connecting included); why not, as
/// text.
pub async fn request(
    method: Method,
    addr: SocketAddr,
    path: &str,
    body: &str,
    bound: Duration,
) -> Result<Answer, String> {
    let exchange = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(text)?;
        // Aborted when the exchange ends or is abandoned at the bound.
        let _conn = Abort(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let mut req = Request::builder().method(method).uri(path).header(HOST, addr.to_string());
        if !body.is_empty() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::copy_from_slice(body.as_bytes()))).map_err(text)?;
        let answer = sender.send_request(req).await.map_err(text)?;
        let status = answer.status().as_u16();
        let body = answer.into_body().collect().await.map_err(text)?.to_bytes();
        Ok(Answer { status, body })
    };
    timeout(bound, exchange).await.map_err(|_| format!("no answer from {addr} within {bound:?}"))?
}

/// [`request`] for the harness's plain threads (see [`block_on`]).
pub fn blocking(method: Method, addr: SocketAddr, path: &str, body: &str, bound: Duration) -> Result<Answer, String> {
    block_on(request(method, addr, path, body, bound))
}

/// Runs `exchange` to its end on a thread and a runtime of its own, so that the
/// harness's plain threads may ask a service from anywhere, a tokio blocking thread or
/// not.
pub fn block_on<T: Send>(exchange: impl Future<Output = Result<T, String>> + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(text)?;
            rt.block_on(exchange)
        })
        .join()
        .unwrap_or_else(|_| Err("the exchange panicked".into()))
    })
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A task aborted when dropped.
struct Abort(JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
