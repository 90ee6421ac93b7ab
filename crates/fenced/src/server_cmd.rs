//! `fenced server`: flags, environment and config file into a server config, then run.
//!
//! Precedence: flags over `FENCED_*` environment over the TOML file (`--config`) over
//! the defaults. Every setting of the file (see `docs/server.md`) has an environment
//! variable, `FENCED_` plus its name in upper case; the common ones also have a flag.

use std::process::ExitCode;

use clap::Args;
use fenced_server::Config;

use crate::args::{BadArgument, Global};

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on [default: 127.0.0.1:7400].
    #[arg(long)]
    pub listen: Option<String>,
    /// Address of the binary wire protocol (clients use fenced://HOST:PORT, or
    /// fenceds://HOST:PORT when --tls-cert is set: TLS) [default: off].
    #[arg(long)]
    pub wire_listen: Option<String>,
    /// Directory of the embedded database [default: ./fenced-data].
    #[arg(long)]
    pub data_dir: Option<String>,
    /// TOML file with settings (flags and FENCED_* environment override it).
    #[arg(long, env = "FENCED_CONFIG")]
    pub config: Option<String>,
    /// File holding the bearer token every /v1 call must present.
    #[arg(long)]
    pub auth_token_file: Option<String>,
    /// TOML file of identities: a token each, rights on name prefixes (reloaded on SIGHUP).
    #[arg(long)]
    pub identities_file: Option<String>,
    /// The audit log: one JSON line per decision [default: none].
    #[arg(long)]
    pub audit_log: Option<String>,
    /// PEM certificate chain; with --tls-key, serve HTTPS.
    #[arg(long)]
    pub tls_cert: Option<String>,
    /// PEM private key for --tls-cert.
    #[arg(long)]
    pub tls_key: Option<String>,
    /// The CA (PEM) of the clients' certificates: mutual TLS on the client listeners;
    /// identities by cert_subject, or a verified certificate required [default: none].
    #[arg(long)]
    pub client_ca: Option<String>,
    /// Open client connections at once.
    #[arg(long)]
    pub connections_max: Option<u64>,
    /// Fenced-store keys starting with this take writes without a token (last writer
    /// wins): for demonstrations only [default: none].
    #[arg(long)]
    pub unfenced_prefix: Option<String>,
    /// This member's id in a cluster [default: 1].
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Every member of a new cluster, ID=URL,... with this one included (the URL its
    /// peers reach its --listen address at): `1=http://127.0.0.1:7401,2=...`. The lowest
    /// id initialises an empty cluster [default: none: a cluster of one].
    #[arg(long)]
    pub peers: Option<String>,
    /// Address of the peer listener: the raft routes, served to the cluster's members
    /// only; the URLs in --peers point at it [default: the peer routes are on --listen].
    #[arg(long)]
    pub peer_listen: Option<String>,
    /// This member's certificate (PEM) for mutual TLS between members; with --peer-key
    /// and --peer-ca, the member URLs are https:// [default: none].
    #[arg(long)]
    pub peer_cert: Option<String>,
    /// The PEM private key of --peer-cert.
    #[arg(long)]
    pub peer_key: Option<String>,
    /// The cluster CA (PEM): only members with a certificate it signed are peers.
    #[arg(long)]
    pub peer_ca: Option<String>,
    /// Make this member the only voter of its cluster at this start, keeping its log and
    /// state: the way back when its quorum is gone for good (use once, then drop it).
    #[arg(long)]
    pub force_new_cluster: bool,
    /// Never initialise a cluster from --peers, even with the lowest id: start on an
    /// empty data directory and wait to be added (`fenced cluster add`). For replacing
    /// the member with the lowest id.
    #[arg(long)]
    pub join: bool,
    /// Run a cluster of several members without peer certificates (a trusted network
    /// or a laboratory only: anyone reaching the peer routes can speak raft).
    #[arg(long)]
    pub insecure_peers: bool,
    /// Fenced-store keys starting with this take tokens minted by another lock service
    /// (etcd, ZooKeeper, Redis): the gate rule applies, not the issued check [default: none].
    #[arg(long)]
    pub foreign_token_prefix: Option<String>,
    /// Print the effective configuration (TOML, or JSON with --json) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// How log lines are written to stderr: text, or json (one object per line). The
    /// filter is FENCED_LOG (default: info, openraft's internals only on errors).
    #[arg(long, env = "FENCED_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

pub fn run(args: ServerArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let file_text = match &args.config {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| BadArgument::error("--config", format!("cannot read {path}: {e}")))?,
        ),
        None => None,
    };
    let mut flags: Vec<(&str, String)> = Vec::new();
    let strings = [
        ("listen", &args.listen),
        ("wire_listen", &args.wire_listen),
        ("data_dir", &args.data_dir),
        ("auth_token_file", &args.auth_token_file),
        ("identities_file", &args.identities_file),
        ("audit_log", &args.audit_log),
        ("tls_cert", &args.tls_cert),
        ("tls_key", &args.tls_key),
        ("client_ca", &args.client_ca),
        ("unfenced_prefix", &args.unfenced_prefix),
        ("peers", &args.peers),
        ("peer_listen", &args.peer_listen),
        ("peer_cert", &args.peer_cert),
        ("peer_key", &args.peer_key),
        ("peer_ca", &args.peer_ca),
        ("foreign_token_prefix", &args.foreign_token_prefix),
    ];
    for (key, value) in strings {
        if let Some(v) = value {
            flags.push((key, v.clone()));
        }
    }
    if let Some(n) = args.node_id {
        flags.push(("node_id", n.to_string()));
    }
    if args.insecure_peers {
        flags.push(("insecure_peers", "true".into()));
    }
    if args.force_new_cluster {
        flags.push(("force_new_cluster", "true".into()));
    }
    if args.join {
        flags.push(("join", "true".into()));
    }
    if let Some(n) = args.connections_max {
        flags.push(("connections_max", n.to_string()));
    }
    let env = std::env::vars().filter(|(k, _)| k.starts_with("FENCED_") && k != "FENCED_CONFIG" && k != "FENCED_LOG");
    let config = Config::layered(file_text.as_deref(), env, &flags).map_err(|e| {
        let why = match e {
            fenced_server::config::ConfigError::Invalid(why) => why,
            other => other.to_string(),
        };
        BadArgument::error("config", why)
    })?;
    if args.print_config {
        if global.json() {
            println!("{}", serde_json::to_string_pretty(&config)?);
        } else {
            print!("{}", config.to_toml());
        }
        return Ok(ExitCode::SUCCESS);
    }
    fenced_server::init_logging(args.log_format.parse().map_err(|e: String| BadArgument::error("--log-format", e))?);
    fenced_server::serve_forever(config)?;
    Ok(ExitCode::SUCCESS)
}
