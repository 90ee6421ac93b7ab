//! Client commands: `exec`, `lock`, `locks`, `put`, `get` (being built).

use std::process::ExitCode;

use clap::Subcommand;

use crate::args::Global;

#[derive(Subcommand, Debug)]
pub enum ClientCmd {
    /// List the locks held on the server.
    Locks,
}

pub fn run(_cmd: ClientCmd, _global: &Global) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the client commands are being built")
}
