//! The Fenced client: lock guards with an honest lost-lock signal, and fenced resources.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_client::Error> {
//! use std::time::Duration;
//! use fenced_client::Client;
//!
//! let client = Client::from_env()?; // FENCED_ENDPOINT, FENCED_AUTH_TOKEN
//! let guard = client.lock("orders/42").ttl(Duration::from_secs(10)).wait(Duration::from_secs(30)).acquire().await?;
//! let store = client.store();
//! store.put("orders/42/state", guard.token(), b"paid").await?.into_result()?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! A guard is valid until the send time of its last successful acquire or keepalive,
//! plus the TTL, minus a margin, on this process's monotonic clock ([`LockGuard::valid_until`]).
//! The lock service may still consider the lock held after that; the guard does not,
//! and [`LockGuard::lost`] resolves. The token, not the guard, is what keeps a write
//! safe: pass it to a [`FencedResource`].

mod client;
mod conn;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod failover;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod foreign;
mod guard;
mod http;
mod json;
mod mux;
pub mod resource;
pub mod signing;
pub mod validity;
mod watch;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use client::{Client, ClientBuilder, LockOptions, LockRequest, ENDPOINT_DEFAULT};
pub use error::{Error, LostReason};
pub use failover::{ATTEMPT_TIMEOUT_DEFAULT, ATTEMPT_TIMEOUT_MIN};
pub use fenced_core::{LeaseId, LockName, Token};
pub use guard::{LockGuard, SignedToken};
pub use resource::{Fenced, FencedResource, Store, StoreRead, Verified};
pub use signing::GrantKeys;
pub use tokio_util::sync::CancellationToken;
pub use watch::{EventKind, Leader, LeaderChange, Observe, Watch, WatchEvent};
