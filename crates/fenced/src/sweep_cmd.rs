//! `fenced sim sweep` (being built).

use std::process::ExitCode;

use clap::Args;

use crate::args::Global;

#[derive(Args, Debug)]
pub struct SweepArgs {}

pub fn run(_a: SweepArgs, _g: &Global) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
