//! `fenced sim` (being built).

use std::process::ExitCode;

use clap::Args;

use crate::args::Global;

#[derive(Args, Debug)]
pub struct SimArgs {}

pub fn run(_a: SimArgs, _g: &Global) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
