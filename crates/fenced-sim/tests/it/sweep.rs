//! The sweep's rows say what the seed says.

use fenced_sim::sweep::{self, Axis, Spec};
use fenced_sim::{Config, Scenario};

#[test]
fn fencing_rows_are_zero_and_longer_leases_are_rarer() {
    let spec = Spec { base: Config::new(Scenario::Default, 0), axis: Axis::Lease, values: vec![1, 4], seeds: 1..=10 };
    let rows = sweep::run(&spec, 2, &|| {}).unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows.iter().filter(|r| r.fencing) {
        assert_eq!((r.zombie_writes, r.lost_updates), (0, 0), "{r:?}");
    }
    let off: Vec<_> = rows.iter().filter(|r| !r.fencing).collect();
    assert!(off[0].zombie_writes > off[1].zombie_writes, "{off:?}");
    assert!(off[1].zombie_writes > 0, "{off:?}");
    // The same runs with fencing on refuse exactly the writes that were zombies.
    assert_eq!(rows[1].stale_writes_rejected, rows[0].zombie_writes);
    let csv = sweep::to_csv(&rows);
    assert_eq!(csv.lines().count(), 5);
    assert!(sweep::to_svg(&rows, "t").starts_with("<svg"));
}

#[test]
fn threads_do_not_change_the_rows() {
    let spec = Spec { base: Config::new(Scenario::Renewal, 0), axis: Axis::Lease, values: vec![1, 2], seeds: 1..=6 };
    assert_eq!(sweep::run(&spec, 1, &|| {}).unwrap(), sweep::run(&spec, 3, &|| {}).unwrap());
}

#[test]
fn bad_specs_are_refused() {
    let spec = Spec { base: Config::new(Scenario::Occ, 0), axis: Axis::Lease, values: vec![1], seeds: 1..=2 };
    assert_eq!(sweep::run(&spec, 1, &|| {}).unwrap_err().field, "--scenario");
    let spec = Spec { base: Config::new(Scenario::Default, 0), axis: Axis::Lease, values: vec![], seeds: 1..=2 };
    assert_eq!(sweep::run(&spec, 1, &|| {}).unwrap_err().field, "--leases");
}

#[test]
fn lock_delay_rows_are_rarer_never_zero_and_fencing_rows_zero() {
    let base = Config::new(Scenario::LockDelay, 0);
    let spec = Spec { base, axis: Axis::LockDelay, values: vec![0, 1_000, 4_000], seeds: 1..=50 };
    let rows = sweep::run(&spec, 2, &|| {}).unwrap();
    let off: Vec<_> = rows.iter().filter(|r| !r.fencing).collect();
    assert!(off[0].zombie_writes > off[1].zombie_writes && off[1].zombie_writes > 0, "{off:?}");
    assert!(off[2].zombie_writes > 0, "even a four-lease delay: {off:?}");
    assert!(rows.iter().filter(|r| r.fencing).all(|r| r.zombie_writes == 0 && r.lost_updates == 0));
    // Delay 0 is the default scenario's own run.
    let default: u64 = (1..=50).map(|seed| crate::run(Scenario::Default, seed).zombie_writes).sum();
    assert_eq!(off[0].zombie_writes, default);
    assert!(sweep::to_csv(&rows).starts_with("lock_delay_ms,lease_ms,"));
    assert!(sweep::to_svg(&rows, "t").contains("lock-delay"));
}

#[test]
fn clock_steps_beyond_the_lease_make_zombie_writes_climb() {
    let base = Config::new(Scenario::ClockDrift, 0);
    let spec = Spec { base, axis: Axis::ClockStep, values: vec![250, 2_000], seeds: 1..=20 };
    let rows = sweep::run(&spec, 2, &|| {}).unwrap();
    let off: Vec<_> = rows.iter().filter(|r| !r.fencing).collect();
    assert!(off[1].zombie_writes > off[0].zombie_writes, "{off:?}");
    assert!(rows.iter().filter(|r| r.fencing).all(|r| r.zombie_writes == 0 && r.lost_updates == 0));
    let spec = Spec { axis: Axis::ClockStep, values: vec![0], ..spec };
    assert_eq!(sweep::run(&spec, 1, &|| {}).unwrap_err().field, "--values");
}
