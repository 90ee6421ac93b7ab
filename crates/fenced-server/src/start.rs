//! What a server does before it serves: its listeners bound, its node started (an old data
//! directory migrated), its state assembled, its peers' listener and SIGHUP's reload set up.

use super::*;

/// Binds the listener a setting names, if it names one.
pub(super) async fn bind_setting(addr: Option<&str>, setting: &str) -> Result<Option<TcpListener>, ServerError> {
    let Some(addr) = addr else { return Ok(None) };
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Setup(format!("cannot listen on {addr} ({setting}): {e}")))?;
    Ok(Some(tcp))
}

pub(super) fn warn_ignored_settings(config: &Config) {
    for setting in &config.ignored_settings {
        tracing::warn!(
            setting = %setting,
            "ignored: a setting of the retired single-node durability model (tokens and lock-delays live in the \
             replicated log); remove it from the config file"
        );
    }
}

/// The replicated log's options: this member's identity, its peers, its limits, and
/// the base an old single-node data directory hands over.
pub(super) fn node_options(
    config: &Config,
    peer_addr: std::net::SocketAddr,
    old: &mut Option<migrate::Old>,
    auth_token: Option<&[u8]>,
    peer_tls: Option<&(tokio_rustls::TlsAcceptor, tokio_rustls::rustls::ClientConfig)>,
) -> Result<fenced_raft::NodeOptions, ServerError> {
    let scheme = if config.peer_tls() { "https" } else { "http" };
    let self_url = format!("{scheme}://{peer_addr}");
    let members = config.members(&self_url).map_err(|e| ServerError::Setup(e.to_string()))?;
    let single = members.len() == 1;
    if old.as_ref().is_some_and(|o| o.has_content) && !single {
        // What the old file holds would be this member's alone, not the log's.
        return Err(ServerError::Setup(format!(
            "{} holds a single-node data directory of an earlier format: start it once without --peers (it \
             migrates into the replicated log), then add the other members with `fenced cluster add`",
            config.data_dir.display()
        )));
    }
    let mut opts = fenced_raft::NodeOptions::single(config.data_dir.clone(), config.limits(), self_url);
    opts.id = config.node_id;
    opts.members = members;
    opts.base = old.as_mut().and_then(|o| o.base.take());
    opts.snapshot_every = config.snapshot_entries;
    opts.proposal_bytes_max = config.proposal_bytes_max;
    opts.log_linger = fenced_raft::log_store::Linger { frac: f64::from(config.log_linger_percent) / 100.0 };
    opts.peer_routes = config.routes().map_err(|e| ServerError::Setup(e.to_string()))?;
    if peer_tls.is_none() {
        // Without certificates the members present the client token to each other
        // (`insecure_peers`); with them the handshake is the proof, and no client
        // credential opens a peer route.
        opts.peer_token = auth_token.map(|t| String::from_utf8_lossy(t).into_owned());
        if !single {
            tracing::warn!(
                "insecure_peers: the members do not authenticate each other; anyone who reaches the peer routes \
                 {}can rewrite this cluster's state (docs/server.md, Security)",
                if auth_token.is_some() { "with the client token " } else { "" }
            );
        }
    }
    opts.peer_tls = peer_tls.map(|(_, client)| client.clone());
    opts.force_new_cluster = config.force_new_cluster;
    opts.join = config.join;
    opts.snapshot_keep = config.snapshot_entries / 5;
    if single {
        // One voter elects itself: no reason to wait a network's election timeout.
        (opts.election_timeout_min_ms, opts.election_timeout_max_ms) = (30, 60);
        opts.heartbeat_ms = 10;
    }
    Ok(opts)
}

pub(super) fn open_audit(config: &Config, metrics: &Metrics) -> Result<audit::Audit, ServerError> {
    let Some(path) = &config.audit_log else { return Ok(audit::Audit::default()) };
    let (bytes_max, files) = (config.audit_log_bytes_max, config.audit_log_files as usize);
    audit::Audit::open(path, bytes_max, files, config.audit_all, metrics.audit_dropped.clone())
        .map_err(ServerError::Setup)
}

/// Starts the replicated log; a single member (or a forced new cluster) waits until it
/// leads, so that its first request is not refused.
pub(super) async fn start_node(
    opts: fenced_raft::NodeOptions,
    config: &Config,
    router: Arc<locks::Router>,
) -> Result<Arc<fenced_raft::Node>, ServerError> {
    let single = opts.members.len() == 1;
    let node = fenced_raft::Node::start(opts, router.clone(), router).await.map_err(|e| {
        ServerError::Setup(format!("cannot start the replicated log in {}: {e}", config.data_dir.display()))
    })?;
    if (single || config.force_new_cluster) && !node.wait_leading(Duration::from_secs(10)).await {
        return Err(ServerError::Setup("a single server did not become its own leader within 10 s".into()));
    }
    tracing::info!(
        data_dir = %config.data_dir.display(),
        node_id = config.node_id,
        leading = node.is_leading(),
        highest_issued = node.state_machine().state().table.highest_issued().map_or(0, |t| t.get()),
        "recovered"
    );
    Ok(node)
}

/// Brings an old single-node directory's store into the log, then retires its file.
pub(super) async fn import_old(locks: &Locks, mut old: migrate::Old) -> Result<(), ServerError> {
    let records = std::mem::take(&mut old.import);
    if !records.is_empty() {
        let n = records.len();
        let cmd = fenced_core::Command::Store(fenced_core::StoreCommand::Import { records });
        if let Err(e) = locks.answered::<fenced_core::StoreAnswer>(cmd).await {
            return Err(ServerError::Setup(format!("cannot bring the fenced store into the log: {e:?}")));
        }
        tracing::warn!(keys = n, "brought the fenced store into the replicated log");
    }
    old.retire()
}

/// What every handler shares; the disk guard's watch starts here.
pub(super) fn app_state(
    config: &Config,
    locks: &Arc<Locks>,
    metrics: &Arc<Metrics>,
    identities: identity::Identities,
    audit: audit::Audit,
    signer: Option<Arc<signing::GrantSigner>>,
    stop_rx: &watch::Receiver<bool>,
) -> Result<api::App, ServerError> {
    let disk = Arc::new(disk::DiskGuard::new(config.min_free_bytes, config.data_dir.clone()));
    tokio::spawn(disk::watch(disk.clone(), stop_rx.clone()));
    Ok(Arc::new(api::AppInner {
        locks: locks.clone(),
        config: config.clone(),
        metrics: metrics.clone(),
        identities: std::sync::RwLock::new(Arc::new(identities)),
        identities_generation: std::sync::atomic::AtomicU64::new(0),
        audit,
        body_budget: Arc::new(Semaphore::new(config.body_bytes_in_flight_max)),
        peer_budget: Arc::new(Semaphore::new(api::PEER_BYTES_IN_FLIGHT_MAX)),
        incoming_snapshot: api::recovered_incoming(&config.data_dir),
        shutdown: stop_rx.clone(),
        openapi: api::doc::document(config),
        disk,
        signer,
    }))
}

#[cfg(unix)]
pub(super) fn watch_sighup(app: &api::App) -> Option<AbortOnDrop> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hup) => Some(AbortOnDrop(tokio::spawn(reload_on_sighup(app.clone(), hup)))),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler: the identities cannot be reloaded");
            None
        }
    }
}

/// A listener with the connection limits and timeouts of `config`.
pub(super) fn fenced_listener(
    config: &Config,
    tcp: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    conns: Arc<Semaphore>,
    metrics: &Arc<Metrics>,
) -> listener::FencedListener {
    listener::FencedListener {
        tcp,
        tls,
        conns,
        metrics: metrics.clone(),
        idle: (config.idle_timeout_ms > 0).then(|| Duration::from_millis(config.idle_timeout_ms)),
        head: (config.head_timeout_ms > 0).then(|| Duration::from_millis(config.head_timeout_ms)),
    }
}

/// Serves the peer routes until the stop signal; the task ends when the handle drops.
pub(super) fn serve_peers(
    listener: listener::FencedListener,
    app: &api::App,
    mut stop: watch::Receiver<bool>,
) -> AbortOnDrop {
    let router = api::peer_router(app.clone());
    tracing::info!(addr = ?listener.tcp.local_addr().ok(), tls = listener.tls.is_some(), "serving the peer routes");
    AbortOnDrop(tokio::spawn(async move {
        let serve = axum::serve(listener, router.into_make_service_with_connect_info::<listener::ConnMeta>())
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "the peer listener stopped");
        }
    }))
}
