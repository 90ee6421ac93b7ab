//! `fenced`: one binary for the lock server, the client commands and the laboratory.
//!
//! Clap glue only: each subcommand lives in its own module and turns its arguments into
//! calls on the library crates. Exit status 2 means bad arguments.

mod args;
#[cfg(feature = "lab")]
mod bench_cmd;
#[cfg(feature = "client")]
mod client_cmd;
#[cfg(all(feature = "server", feature = "client"))]
mod demo_cmd;
#[cfg(feature = "server")]
mod server_cmd;
mod sim_cmd;
#[cfg(all(feature = "server", feature = "client"))]
mod snapshot_cmd;
mod sweep_cmd;
mod term;
#[cfg(feature = "lab")]
mod torture_cmd;

use std::process::ExitCode;

/// mimalloc: the server allocates per request and per log entry on several threads;
/// glibc's malloc and free were a tenth of its CPU (BENCHMARKS.md, per-cycle CPU).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

/// Fenced: a lock service whose every grant carries a strictly increasing fencing
/// token, the resource-side gate that refuses stale tokens, and a laboratory that
/// shows why the token, not the lease, makes mutual exclusion safe.
#[derive(Parser, Debug)]
#[command(name = "fenced", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: args::Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the lock service with its HTTP API and web console.
    #[cfg(feature = "server")]
    Server(server_cmd::ServerArgs),
    /// The laboratory: simulate clients, lock service and resource from one seed.
    Sim(sim_cmd::SimArgs),
    #[cfg(feature = "client")]
    #[command(flatten)]
    Client(client_cmd::ClientCmd),
    /// Backups: save one from a running service, check one, restore one into a new
    /// data directory.
    #[cfg(all(feature = "server", feature = "client"))]
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCmd),
    /// The zombie write on real processes: a holder frozen past its lease, and fencing
    /// stopping its write.
    #[cfg(all(feature = "server", feature = "client"))]
    Demo(demo_cmd::DemoArgs),
    /// One worker process of `fenced demo` (started by it, not by hand).
    #[cfg(all(feature = "server", feature = "client"))]
    #[command(hide = true)]
    DemoWorker(demo_cmd::worker::WorkerArgs),
    /// Fault injection: workers, pauses, crashes and delays against Fenced and its peers.
    #[cfg(feature = "lab")]
    Torture(torture_cmd::TortureArgs),
    /// Load side by side with etcd, Redis and PostgreSQL, durability stated per row.
    #[cfg(feature = "lab")]
    Bench(bench_cmd::BenchArgs),
    #[cfg(feature = "lab")]
    #[command(hide = true)]
    TortureWorker(torture_cmd::WorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        #[cfg(feature = "server")]
        Cmd::Server(a) => server_cmd::run(a, &cli.global),
        Cmd::Sim(a) => sim_cmd::run(a, &cli.global),
        #[cfg(feature = "client")]
        Cmd::Client(c) => client_cmd::run(c, &cli.global),
        #[cfg(all(feature = "server", feature = "client"))]
        Cmd::Snapshot(c) => snapshot_cmd::run(c, &cli.global),
        #[cfg(all(feature = "server", feature = "client"))]
        Cmd::Demo(a) => demo_cmd::run(a, &cli.global),
        #[cfg(all(feature = "server", feature = "client"))]
        Cmd::DemoWorker(a) => demo_cmd::worker::run(a, &cli.global),
        #[cfg(feature = "lab")]
        Cmd::Torture(a) => torture_cmd::run(a, &cli.global),
        #[cfg(feature = "lab")]
        Cmd::Bench(a) => bench_cmd::run(a, &cli.global),
        #[cfg(feature = "lab")]
        Cmd::TortureWorker(a) => torture_cmd::run_worker(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if let Some(bad) = e.downcast_ref::<args::BadArgument>() {
                eprintln!("error: {bad}");
                return ExitCode::from(2);
            }
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
