//! Checks the design under `Config::wide`, beyond what the test suite can afford:
//! `cargo run --release -p fenced-model --example wide`. Panics if a property fails.

use std::time::Instant;

use fenced_model::{Config, ProtocolModel, State, Variant};
use stateright::{Checker, Model};

fn main() {
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = Config::wide(Variant::Correct);
    println!("{config:?}");
    let checker =
        ProtocolModel::new(config).checker().threads(threads).symmetry_fn(State::representative).spawn_dfs().join();
    println!(
        "{} states ({} unique up to symmetry), depth {}, {threads} threads, {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
    println!("every property holds");
}
