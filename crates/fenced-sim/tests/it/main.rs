//! The laboratory through its public surface: the seeds' four runs and optimistic
//! concurrency hold for every seed tried, runs are byte-for-byte reproducible, and the
//! safety properties hold over random configurations; every misconception the seeds
//! list is refuted by its scenario.

mod misconceptions;
mod properties;
mod scenarios;
mod sweep;

use fenced_sim::{Config, Record, Scenario, Summary};

pub fn run(scenario: Scenario, seed: u64) -> Summary {
    fenced_sim::run(&Config::new(scenario, seed), &mut ()).expect("valid config")
}

pub fn run_traced(cfg: &Config) -> (Summary, Vec<Record>) {
    let mut records = Vec::new();
    let s = fenced_sim::run(cfg, &mut records).expect("valid config");
    (s, records)
}
