//! Pause models with the seeds' numbers.
//!
//! - GC: tens to hundreds of milliseconds routinely, seconds occasionally.
//! - VM live migration: hundreds of milliseconds of blackout.
//! - cgroup CPU throttling: heavy-tailed and unbounded (Pareto).
//! - Network delay: the client's packets held in the network; usually short,
//!   unbounded in principle (a 90 s delay has happened).
//!
//! `mixed`, the default, draws one of the four for each pause.

use crate::rng::Rng;
use crate::PauseModel;

/// What stopped the client.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PauseCause {
    Gc,
    VmMigration,
    CgroupThrottle,
    /// Not a process pause: the client runs, its packets sit in the network.
    NetworkDelay,
}

impl PauseCause {
    pub fn name(self) -> &'static str {
        match self {
            PauseCause::Gc => "gc",
            PauseCause::VmMigration => "vm-migration",
            PauseCause::CgroupThrottle => "cgroup-throttle",
            PauseCause::NetworkDelay => "network-delay",
        }
    }
}

/// Longest pause any model draws: longer than any run's interesting window, short
/// enough that a run still ends.
const PAUSE_MS_CAP: f64 = 120_000.0;

/// Draws one pause, or none for `PauseModel::None`.
pub(crate) fn draw(model: PauseModel, rng: &mut Rng) -> Option<(PauseCause, u64)> {
    let cause = match model {
        PauseModel::None => return None,
        PauseModel::Gc => PauseCause::Gc,
        PauseModel::Vm => PauseCause::VmMigration,
        PauseModel::Cgroup => PauseCause::CgroupThrottle,
        PauseModel::Network => PauseCause::NetworkDelay,
        PauseModel::Mixed => match rng.between(0, 99) {
            0..=49 => PauseCause::Gc,
            50..=64 => PauseCause::VmMigration,
            65..=84 => PauseCause::CgroupThrottle,
            _ => PauseCause::NetworkDelay,
        },
    };
    let ms = match cause {
        PauseCause::Gc => match rng.between(0, 99) {
            0..=89 => rng.log_uniform(10.0, 300.0),
            90..=98 => rng.log_uniform(300.0, 2_000.0),
            _ => rng.log_uniform(2_000.0, 10_000.0),
        },
        PauseCause::VmMigration => match rng.between(0, 99) {
            0..=94 => rng.log_uniform(100.0, 1_000.0),
            _ => rng.log_uniform(1_000.0, 3_000.0),
        },
        PauseCause::CgroupThrottle => rng.pareto(20.0, 1.1, PAUSE_MS_CAP),
        PauseCause::NetworkDelay => match rng.between(0, 999) {
            0..=979 => rng.log_uniform(5.0, 500.0),
            980..=998 => rng.log_uniform(500.0, 10_000.0),
            _ => rng.log_uniform(10_000.0, 90_000.0),
        },
    };
    Some((cause, ms.max(1)))
}
