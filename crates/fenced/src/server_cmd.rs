//! `fenced server`: flags, environment and config file into a server config, then run.

use std::process::ExitCode;

use clap::Args;

use crate::args::Global;

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory of the embedded database.
    #[arg(long)]
    pub data_dir: Option<String>,
}

pub fn run(_args: ServerArgs, _global: &Global) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the server is being built")
}
