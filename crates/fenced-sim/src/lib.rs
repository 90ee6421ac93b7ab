//! The laboratory: a deterministic discrete-event simulator of clients, the lock service
//! and the resource.
//!
//! Virtual time, one `u64` seed, a ChaCha RNG and a priority queue of events; no real
//! clock, no real randomness, so the same seed prints the same bytes. The lock service
//! is `fenced_core::LockTable` and the resource's gate is `fenced_core::gate`: the very
//! code the server runs, not a copy. Every run's history goes through
//! `fenced_core::checker`, which is where the numbers in the summary come from.

mod config;
pub mod diagram;
mod pauses;
mod queue;
mod rng;
mod summary;
pub mod sweep;
pub mod trace;
mod world;

pub use config::{
    Config, ConfigError, PauseModel, Replication, Scenario, ServiceClock, ServiceRestart, CLOCK_STEP_MS_DEFAULT,
    LEASE_MS_DEFAULT, LOCK_DELAY_MS_DEFAULT,
};
pub use pauses::PauseCause;
pub use summary::{Summary, ZombieProof, SUMMARY_FIELDS};
pub use trace::{Kind, Record, TraceSink};
pub use world::{run, Replica};
