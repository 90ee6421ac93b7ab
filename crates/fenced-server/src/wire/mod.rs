//! The binary wire protocol's listener (`wire_listen`): length-prefixed frames tagged
//! with request ids, many requests in flight on one connection (the codec and the
//! frame layout are in `fenced-wire`). Every request runs through the HTTP API's own
//! handlers in `api`, so tokens, limits, auth, events, metrics and error codes are the
//! same; only the framing differs.

mod conn;
pub mod forward;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::api::{ApiError, App};
use crate::metrics::inc;

/// Accepts wire connections until `stop` flips, then waits for the open ones to
/// finish what they have in flight. `conns` is the HTTP listener's permit pool:
/// `connections_max` counts both. With `tls` (the server's `tls_cert`), every
/// connection is TLS (`fenceds://`): the handshake runs on the connection's own task
/// and must finish within `head_timeout_ms`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: App,
    conns: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    let mut stopped = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let _ = stream.set_nodelay(true);
                    match conns.clone().try_acquire_owned() {
                        Ok(permit) => {
                            let (app, stop) = (app.clone(), stop.clone());
                            match tls.clone() {
                                None => tasks.spawn(conn::serve_conn(stream, Some(remote), None, app, permit, stop)),
                                Some(acceptor) => tasks.spawn(async move {
                                    let ms = app.config.head_timeout_ms.max(1);
                                    let handshake = acceptor.accept(stream);
                                    if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_millis(ms), handshake).await {
                                        let subject = crate::tls::client_subject(s.get_ref().1);
                                        conn::serve_conn(s, Some(remote), subject, app, permit, stop).await;
                                    }
                                }),
                            };
                        }
                        Err(_) => {
                            inc(&app.metrics.connections_refused);
                            let _ = stream.try_write(&busy_frame());
                        }
                    }
                }
                Err(e) => {
                    // Out of descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "wire accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = stopped.wait_for(|s| *s) => break,
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// The answer to a connection over `connections_max`, before it is closed: written
/// before the preamble is read, so in the current version (a client of version 2 reads
/// its code, which comes first in both, and drops the frame of id 0 anyway).
fn busy_frame() -> Vec<u8> {
    let e =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_many_connections", "the server is at its connection limit");
    let mut out = Vec::new();
    conn::encode_error(&mut out, 0, &e, fenced_wire::Version::CURRENT);
    out
}
