//! The Fenced lock server: the HTTP/JSON API of version 1 over the `fenced-core` lock
//! table and fence gate, durable on redb.
//!
//! Entry points: [`run`] serves on a bound listener until `shutdown` resolves (tests
//! call it in-process), [`serve_forever`] builds the runtime, binds, and stops on
//! SIGTERM or Ctrl-C (the binary calls it).

pub mod config;

mod api;
mod audit;
mod disk;
mod events;
pub mod format;
mod identity;
mod listener;
mod locks;
mod metrics;
mod migrate;
mod notify;
pub mod restore;
pub mod signing;
mod start;
mod subject;
mod tls;
pub mod watcher;
mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

pub use api::ROUTES;
pub use config::{Config, ConfigError};

use crate::locks::Locks;
use crate::metrics::Metrics;
use start::*;

/// The OpenAPI 3.1 document a server with `config` serves at `/openapi.json`.
pub fn openapi_json(config: &Config) -> String {
    api::doc::document(config)
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Setup(String),
}

/// Serves on `listener` (and on `config.wire_listen` when set) until `shutdown`
/// resolves, then drains in-flight requests (bounded by `shutdown_drain_ms`) and
/// closes the database.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let wire = bind_setting(config.wire_listen.as_deref(), "wire_listen").await?;
    run_with_wire(listener, wire, config, shutdown).await
}

/// [`run`] with the wire protocol's listener bound by the caller (tests bind port 0);
/// `config.wire_listen` is not read.
pub async fn run_with_wire(
    listener: TcpListener,
    wire: Option<TcpListener>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let auth_token = match &config.auth_token_file {
        None => None,
        Some(path) => Some(identity::read_token(path, "auth_token_file").map_err(ServerError::Setup)?),
    };
    let identities = load_identities(&config).map_err(ServerError::Setup)?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            Some(tls::acceptor(cert, key, config.client_ca.as_deref()).map_err(ServerError::Setup)?)
        }
        _ => None,
    };
    let peer_tls = tls::peer(&config).map_err(ServerError::Setup)?;
    let peer_listener = bind_setting(config.peer_listen.as_deref(), "peer_listen").await?;
    warn_ignored_settings(&config);
    // Every setting that can be refused is read before the data directory is touched:
    // a refused start changes nothing there.
    let signer = signing::GrantSigner::load(&config).map_err(ServerError::Setup)?.map(Arc::new);
    let metrics = Arc::new(Metrics::default());
    let audit = open_audit(&config, &metrics)?;
    let marking = format::check(&config.data_dir).map_err(ServerError::Setup)?;
    if config.force_new_cluster && matches!(marking, format::Marking::New) {
        // Refused before anything is created: a mistyped path gets no new directory.
        return Err(ServerError::Setup(format!(
            "force_new_cluster: {} holds no data directory, so no log to keep (start a new member without it); \
             nothing was created",
            config.data_dir.display()
        )));
    }
    let mut old = migrate::read(&config)?;
    let peer_addr = peer_listener.as_ref().map_or_else(|| listener.local_addr(), |l| l.local_addr())?;
    let opts = node_options(&config, peer_addr, &mut old, auth_token.as_deref(), peer_tls.as_ref())?;
    // Nothing refused the start: `FORMAT` says the format before anything is written.
    format::mark(&config.data_dir, marking).map_err(ServerError::Setup)?;
    let hand_over_within = Duration::from_millis(opts.election_timeout_max_ms.max(500) * 2);
    let router = locks::Router::new(metrics.clone(), config.events_retained);
    let node = start_node(opts, &config, router.clone()).await?;
    let fatal = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(watch_fatal(node.clone(), fatal.clone()));
    let locks = Locks::new(node.clone(), router);
    if let Some(old) = old {
        import_old(&locks, old).await?;
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let app = app_state(&config, &locks, &metrics, identities, audit, signer, &stop_rx)?;
    // Registered here, before the server answers: a SIGHUP that comes once it serves
    // reloads, never kills.
    #[cfg(unix)]
    let reload = watch_sighup(&app);
    if let Some(w) = &wire {
        tracing::info!(addr = %w.local_addr()?, "serving the wire protocol");
    }
    let peer_serve = peer_listener.map(|tcp| {
        let conns = Arc::new(Semaphore::new(api::PEER_CONNECTIONS_MAX));
        let listener = fenced_listener(&config, tcp, peer_tls.map(|(acceptor, _)| acceptor), conns, &metrics);
        serve_peers(listener, &app, stop_rx.clone())
    });
    // The wire protocol speaks TLS whenever the HTTP listener does (fenceds://).
    let listeners = Listeners {
        http: fenced_listener(
            &config,
            listener,
            tls.clone(),
            Arc::new(Semaphore::new(config.connections_max)),
            &metrics,
        ),
        wire: wire.map(|tcp| (tcp, tls)),
    };
    let signal = shut_down(shutdown, node.clone(), locks.clone(), stop_tx, hand_over_within);
    let served = serve(listeners, app, stop_rx, config.shutdown_drain_ms, signal, &fatal).await?;
    locks.close();
    node.shutdown().await;
    match served {
        Served::Drained => {}
        Served::DeadlinePassed => tracing::warn!("closing with requests in flight"),
        Served::LogStopped => {
            return Err(ServerError::Setup("the replicated log stopped (a write failed); stopped".into()))
        }
    }
    // The tasks that hold the app (and so the log) end before the log's file is closed.
    drop(peer_serve);
    #[cfg(unix)]
    drop(reload);
    close_log(node, locks).await;
    Ok(())
}

/// The client-facing listeners: HTTP, and the wire protocol with its TLS when set.
struct Listeners {
    http: listener::FencedListener,
    wire: Option<(TcpListener, Option<tokio_rustls::TlsAcceptor>)>,
}

/// How serving ended.
enum Served {
    /// Every in-flight request was answered.
    Drained,
    /// `shutdown_drain_ms` passed with requests in flight.
    DeadlinePassed,
    /// The replicated log stopped on an error.
    LogStopped,
}

/// The shutdown sequence `signal` starts: a leader hands its office over, then the
/// listeners stop accepting and queued acquires are answered.
async fn shut_down(
    signal: impl Future<Output = ()> + Send,
    node: Arc<fenced_raft::Node>,
    locks: Arc<Locks>,
    stop_tx: watch::Sender<bool>,
    hand_over_within: Duration,
) {
    signal.await;
    // A leader first gives its office to a caught-up follower: requests that come
    // meanwhile are forwarded to it once it leads.
    node.hand_over(hand_over_within).await;
    tracing::info!("shutting down: draining in-flight requests");
    notify::notify("STOPPING=1");
    let _ = stop_tx.send(true);
    // Queued acquires answer 503 now rather than hold the drain up.
    locks.close();
}

/// Serves HTTP and the wire protocol until `signal` has run and the requests in flight
/// are answered, the drain deadline passes, or the log stops.
async fn serve(
    listeners: Listeners,
    app: api::App,
    stop_rx: watch::Receiver<bool>,
    drain_ms: u64,
    signal: impl Future<Output = ()> + Send + 'static,
    fatal: &tokio::sync::Notify,
) -> Result<Served, ServerError> {
    let Listeners { http, wire } = listeners;
    let router = api::router(app.clone());
    // The wire protocol's connections count against the HTTP listener's limit.
    let conns = http.conns.clone();
    let wire_serve = async {
        if let Some((w, wire_tls)) = wire {
            wire::serve(w, wire_tls, app, conns, stop_rx.clone()).await;
        }
    };
    tracing::info!(addr = %http.tcp.local_addr()?, tls = http.tls.is_some(), "serving");
    // Every listener is bound and the log recovered: connections queue from here on.
    notify::notify("READY=1");
    let mut drain_rx = stop_rx.clone();
    let drain_deadline = async move {
        let _ = drain_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(Duration::from_millis(drain_ms)).await;
    };
    let serve = axum::serve(http, router.into_make_service_with_connect_info::<listener::ConnMeta>())
        .with_graceful_shutdown(signal);
    let both = async { tokio::join!(serve, wire_serve).0 };
    tokio::select! {
        r = both => { r?; Ok(Served::Drained) }
        _ = drain_deadline => {
            tracing::warn!("drain deadline passed; closing with requests in flight");
            Ok(Served::DeadlinePassed)
        }
        _ = fatal.notified() => Ok(Served::LogStopped),
    }
}

/// Waits until the raft log's file is closed: every holder of the node is gone.
async fn close_log(node: Arc<fenced_raft::Node>, locks: Arc<Locks>) {
    let raft_db = node.db_handle();
    drop(locks);
    drop(node);
    if !fenced_raft::Node::wait_closed(raft_db, Duration::from_secs(5)).await {
        tracing::warn!("the raft log's file is still open at exit");
    }
}

fn load_identities(config: &Config) -> Result<identity::Identities, String> {
    identity::Identities::load(
        config.identities_file.as_deref(),
        config.auth_token_file.as_deref(),
        config.client_ca.is_some(),
    )
}

/// Reads the identities again on each SIGHUP; a file that does not load is refused
/// with the reason, and the identities in force stay. Connections stay open: each
/// request is decided with the identities of its moment.
#[cfg(unix)]
async fn reload_on_sighup(app: api::App, mut hup: tokio::signal::unix::Signal) {
    while hup.recv().await.is_some() {
        match load_identities(&app.config) {
            Ok(ids) => {
                *app.identities.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ids);
                app.identities_generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                tracing::info!("identities reloaded");
            }
            Err(e) => tracing::error!(error = %e, "identities not reloaded: the ones in force stay"),
        }
    }
}

/// A task that ends when its handle is dropped (the peer listener's, on every way out).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Wakes `fatal` when openraft stops on an error (a log write failed): answering on
/// would break the promise that what is acknowledged is durable.
async fn watch_fatal(node: Arc<fenced_raft::Node>, fatal: Arc<tokio::sync::Notify>) {
    use fenced_raft::openraft::async_runtime::WatchReceiver;
    // The server's metrics change only with the leadership, not with every commit, and
    // their sender goes with the core: a core that stops is seen closing it.
    let mut m = node.raft.server_metrics();
    loop {
        if let Err(e) = &node.raft.metrics().borrow_watched().running_state {
            if node.is_shutting_down() {
                return;
            }
            tracing::error!(error = %e, "the replicated log stopped");
            fatal.notify_waiters();
            fatal.notify_one();
            return;
        }
        if m.changed().await.is_err() && node.raft.metrics().borrow_watched().running_state.is_ok() {
            return;
        }
    }
}

/// The binary's entry: the runtime (`worker_threads`), bind `config.listen`, serve
/// until SIGTERM or Ctrl-C. One thread is tokio's current-thread scheduler, which
/// hands tasks to no other worker: on two cores it cost about a tenth less CPU per
/// command than a multi-threaded scheduler of one worker (5 to 17% in alternated
/// pairs; BENCHMARKS.md, stop 49).
pub fn serve_forever(config: Config) -> Result<(), ServerError> {
    let mut builder = match runtime_threads(&config) {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    let rt = builder.enable_all().build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&config.listen)
            .await
            .map_err(|e| ServerError::Setup(format!("cannot listen on {}: {e}", config.listen)))?;
        run(listener, config, shutdown_signal()).await
    })
}

/// The runtime's threads: as configured, else one fewer than the cores (the log's
/// writer thread takes the last one), at least one.
fn runtime_threads(config: &Config) -> usize {
    match config.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1)),
        n => n,
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The default log filter: this program's events at info, openraft's internals only
/// when they are errors (its state dumps are debug detail, and its complaint about an
/// unreachable peer, at every heartbeat, is said once by the network instead).
pub const LOG_FILTER_DEFAULT: &str = "info,openraft=error";

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One line of text per event (coloured on a terminal).
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format '{other}' is text or json")),
        }
    }
}

/// Logs to stderr; a `RUST_LOG`-style filter from `FENCED_LOG` (default
/// [`LOG_FILTER_DEFAULT`]).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FENCED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_FILTER_DEFAULT));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init(),
    };
}
