//! Every misconception the seeds list, refuted by its scenario over seeds 1 to 50:
//! fencing off shows the failure where there is one, fencing on shows none, and each
//! check has a negative control (a run in which the same checker must find something).

use fenced_sim::trace::{Detail, JsonLines, Kind};
use fenced_sim::{Config, PauseModel, Replication, Scenario, ServiceClock, ServiceRestart, Summary};

use crate::{run, run_traced};

const SEEDS: std::ops::RangeInclusive<u64> = 1..=50;

fn run_cfg(c: &Config) -> Summary {
    fenced_sim::run(c, &mut ()).expect("valid config")
}

fn fenced(scenario: Scenario, seed: u64) -> Summary {
    let mut c = Config::new(scenario, seed);
    c.fencing = true;
    run_cfg(&c)
}

/// Fencing on, same seed: no zombie write, no lost update, and the gate refused exactly
/// the writes that were zombies with fencing off (the runs are the same up to each).
fn fencing_refuses_every_zombie(scenario: Scenario, seed: u64, off: &Summary) {
    let on = fenced(scenario, seed);
    assert_eq!((on.zombie_writes, on.lost_updates), (0, 0), "{scenario:?} seed {seed}: {on:?}");
    assert_eq!(on.stale_writes_rejected, off.zombie_writes, "{scenario:?} seed {seed}");
    assert_eq!(on.final_value, on.writes_accepted, "{scenario:?} seed {seed}");
}

/// Fencing on, same seed, where the gate may refuse a fenced read too: no zombie write,
/// no lost update, and refusals whenever the run without fencing had zombie writes. The
/// two runs are the same only up to the first refused read (that holder gives up
/// without writing), so the counts need not match as in `fencing_refuses_every_zombie`.
fn fencing_is_safe(scenario: Scenario, seed: u64, off: &Summary) {
    let on = fenced(scenario, seed);
    assert_eq!((on.zombie_writes, on.lost_updates), (0, 0), "{scenario:?} seed {seed}: {on:?}");
    assert_eq!(on.final_value, on.writes_accepted, "{scenario:?} seed {seed}");
    assert!(off.zombie_writes == 0 || on.stale_writes_rejected > 0, "{scenario:?} seed {seed}: {on:?}");
}

#[test]
fn network_delay_writes_land_late_without_any_pause() {
    for seed in SEEDS {
        let s = run(Scenario::NetworkDelay, seed);
        assert!(s.zombie_writes > 0, "seed {seed}: {s:?}");
        assert!(s.lost_updates > 0, "seed {seed}: {s:?}");
        assert!(s.delayed_messages > 0, "seed {seed}");
        fencing_refuses_every_zombie(Scenario::NetworkDelay, seed, &s);
    }
    // No process ever stops: every pause is packets held in the network, and the
    // zombie writes were sent by clients that were running.
    let (s, records) = run_traced(&Config::new(Scenario::NetworkDelay, 1));
    assert_eq!(s.pause_model, PauseModel::Network);
    for r in records.iter().filter(|r| r.kind == Kind::Pause) {
        assert!(matches!(r.detail, Detail::Pause { cause: "network-delay", .. }), "{r:?}");
    }
    assert!(s.zombies.iter().all(|z| z.pause_ms > 0));
    assert!(s.to_json().contains(r#""delayed_messages":"#));
}

#[test]
fn idempotent_writes_from_a_stale_read_still_lose_updates() {
    for seed in SEEDS {
        let s = run(Scenario::Idempotent, seed);
        // Every write went out twice and the second copy changed nothing...
        assert!(s.duplicates_absorbed > 0, "seed {seed}");
        assert!(s.duplicates_absorbed <= s.writes_attempted, "seed {seed}: {s:?}");
        assert!(s.writes_attempted - s.duplicates_absorbed <= 1, "seed {seed}: at most one copy in flight at the end");
        // ...and still the counter misses increments.
        assert!(s.lost_updates > 0, "seed {seed}: {s:?}");
        assert!(s.zombie_writes > 0, "seed {seed}: {s:?}");
        fencing_refuses_every_zombie(Scenario::Idempotent, seed, &s);
    }
}

#[test]
fn partitioned_work_needs_no_lock_and_loses_nothing() {
    let (mut partitioned, mut locked) = (0, 0);
    for seed in SEEDS {
        let s = run(Scenario::Partitioned, seed);
        assert_eq!(s.grants, 0, "no lock at all");
        assert_eq!((s.zombie_writes, s.lost_updates), (0, 0), "seed {seed}: {s:?}");
        assert_eq!(s.final_value, s.writes_accepted, "seed {seed}");
        // Beside one lock for all: several times the writes.
        let one_lock = run(Scenario::Fencing, seed);
        assert!(s.writes_accepted > 2 * one_lock.writes_accepted, "seed {seed}");
        // Beside a lock per key (the same keys, each behind its lock, fenced).
        let mut c = Config::new(Scenario::Fencing, seed);
        c.locks = c.clients;
        partitioned += s.writes_accepted;
        locked += run_cfg(&c).writes_accepted;
        // Negative control: two workers per key, no lock, and the checker finds the
        // lost updates at once.
        let mut shared = Config::new(Scenario::Partitioned, seed);
        shared.locks = 2;
        assert!(run_cfg(&shared).lost_updates > 0, "seed {seed}: sharing keys without a lock loses updates");
    }
    assert!(partitioned > locked, "no lock round trips: {partitioned} writes against {locked}");
}

#[test]
fn a_wall_clock_that_steps_ends_leases_early_and_adds_zombie_writes() {
    let (mut wall_total, mut mono_total) = (0, 0);
    for seed in SEEDS {
        let wall = run(Scenario::ClockDrift, seed);
        let mut c = Config::new(Scenario::ClockDrift, seed);
        c.clock = ServiceClock::Monotonic;
        let mono = run_cfg(&c);
        assert!(wall.clock_steps > 0 && wall.early_expiries > 0, "seed {seed}: {wall:?}");
        assert_eq!((mono.clock_steps, mono.early_expiries), (0, 0), "seed {seed}: a monotonic clock never steps");
        assert!(wall.zombie_writes >= mono.zombie_writes, "seed {seed}: wall {wall:?} monotonic {mono:?}");
        wall_total += wall.zombie_writes;
        mono_total += mono.zombie_writes;
        // The monotonic run is the default scenario's run: the clock is the only change.
        assert_eq!(mono.zombie_writes, run(Scenario::Default, seed).zombie_writes, "seed {seed}");
        // A step can end a lease between its grant and the holder's fenced read (an
        // implicit lease, as the real client's, lives from its grant: a step while the
        // client waits no longer ends it first), and the gate refuses that read: the
        // fenced run parts from the unfenced one there (seeds 1, 29, 37, 41 and 50).
        fencing_is_safe(Scenario::ClockDrift, seed, &wall);
        // With no pause at all, every zombie write is the clock's doing.
        c.pauses = PauseModel::None;
        assert_eq!(run_cfg(&c).zombie_writes, 0, "seed {seed}: no pause, monotonic clock, nothing late");
        c.clock = ServiceClock::Wall;
        assert!(run_cfg(&c).zombie_writes > 0, "seed {seed}: no pause, but the clock stepped");
    }
    assert!(wall_total > mono_total, "wall {wall_total} monotonic {mono_total}");
}

#[test]
fn lock_delay_makes_zombie_writes_rarer_never_zero() {
    let (mut delayed, mut plain) = (0, 0);
    for seed in SEEDS {
        let s = run(Scenario::LockDelay, seed);
        delayed += s.zombie_writes;
        plain += run(Scenario::Default, seed).zombie_writes;
        fencing_refuses_every_zombie(Scenario::LockDelay, seed, &s);
    }
    assert!(delayed > 0, "a pause longer than lease and delay together still makes a zombie");
    assert!(delayed < plain, "lock-delay {delayed} against {plain} without");
    // The delay is the table's rule, seen in the trace: after an expiry the lock goes to
    // nobody for the delay.
    let (s, records) = run_traced(&Config::new(Scenario::LockDelay, 2));
    let mut checked = 0;
    for (i, e) in records.iter().enumerate().filter(|(_, r)| r.kind == Kind::Expired) {
        if let Some(g) = records[i..].iter().find(|r| r.kind == Kind::Granted && r.lock == e.lock) {
            assert!(g.t_ms >= e.t_ms + s.lock_delay_ms, "granted at {} after an expiry at {}", g.t_ms, e.t_ms);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn a_crashed_service_restarts_from_its_durable_state_and_tokens_never_go_back() {
    for seed in SEEDS {
        let s = run(Scenario::ServiceCrash, seed);
        assert!(s.service_crashes.is_some_and(|n| n > 0), "seed {seed}");
        assert_eq!((s.token_regressions, s.duplicate_tokens, s.overlapping_holders), (0, 0, 0), "seed {seed}: {s:?}");
        assert!(s.grants > 100, "seed {seed}: the service came back and granted again");
        fencing_refuses_every_zombie(Scenario::ServiceCrash, seed, &s);
        // Negative control: a restart from nothing mints tokens again from 1, and the
        // checker sees them go back.
        let mut c = Config::new(Scenario::ServiceCrash, seed);
        c.service_restart = ServiceRestart::Empty;
        let amnesia = run_cfg(&c);
        assert!(amnesia.token_regressions > 0 && amnesia.duplicate_tokens > 0, "seed {seed}: {amnesia:?}");
    }
}

#[test]
fn split_brain_primary_backup_grants_one_token_twice_and_the_gate_cannot_help() {
    for seed in SEEDS {
        let s = run(Scenario::SplitBrain, seed);
        assert!(s.failovers > 0, "seed {seed}");
        assert!(s.duplicate_tokens > 0 && s.overlapping_holders > 0, "seed {seed}: {s:?}");
        let on = fenced(Scenario::SplitBrain, seed);
        assert!(on.duplicate_tokens > 0, "seed {seed}");
        assert_eq!(on.zombie_writes, 0, "seed {seed}: the gate refuses every lower token...");
        assert!(on.lost_updates > 0, "seed {seed}: ...but two holders of an equal token both get through");
    }
}

#[test]
fn split_brain_with_a_majority_never_grants_a_token_twice() {
    for seed in SEEDS {
        let mut c = Config::new(Scenario::SplitBrain, seed);
        c.replication = Some(Replication::Majority);
        let s = run_cfg(&c);
        assert!(s.failovers > 0, "seed {seed}: the cut and the election happened");
        assert_eq!((s.duplicate_tokens, s.token_regressions, s.overlapping_holders), (0, 0, 0), "seed {seed}: {s:?}");
        c.fencing = true;
        let on = run_cfg(&c);
        assert_eq!((on.zombie_writes, on.lost_updates), (0, 0), "seed {seed}: {on:?}");
        assert_eq!(on.stale_writes_rejected, s.zombie_writes, "seed {seed}");
    }
}

#[test]
fn every_scenario_is_reproducible_byte_for_byte() {
    for scenario in Scenario::ALL {
        let trace = |seed| {
            let mut sink = JsonLines::new(Vec::new());
            let s = fenced_sim::run(&Config::new(scenario, seed), &mut sink).unwrap();
            (sink.finish().unwrap(), s.to_json())
        };
        let (a, sa) = trace(4);
        assert_eq!((a.clone(), sa.clone()), trace(4), "{scenario:?}");
        assert_ne!(a, trace(5).0, "{scenario:?}");
        assert!(sa.starts_with(&format!(r#"{{"scenario":"{}""#, scenario.name())));
    }
}

#[test]
fn scenario_fields_appear_only_where_the_scenario_has_them() {
    let json = |c: &Config| run_cfg(c).to_json();
    assert!(!json(&Config::new(Scenario::Default, 1)).contains("service_crashes"));
    assert!(json(&Config::new(Scenario::ServiceCrash, 1)).contains(r#""service_crashes":"#));
    let sb = json(&Config::new(Scenario::SplitBrain, 1));
    assert!(sb.contains(r#""duplicate_tokens":"#) && sb.contains(r#""replication":"primary-backup""#));
    assert!(json(&Config::new(Scenario::ClockDrift, 1)).contains(r#""clock":"wall""#));
    assert!(json(&Config::new(Scenario::Partitioned, 1)).contains(r#""writes_per_s":"#));
}

#[test]
fn settings_that_do_not_fit_the_scenario_are_refused_by_name() {
    let field = |c: Config| fenced_sim::run(&c, &mut ()).unwrap_err().field;
    let mut c = Config::new(Scenario::Default, 1);
    c.replication = Some(Replication::Majority);
    assert_eq!(field(c), "--replication");
    let mut c = Config::new(Scenario::Partitioned, 1);
    c.fencing = true;
    assert_eq!(field(c), "--fencing");
    let mut c = Config::new(Scenario::Occ, 1);
    c.lock_delay_ms = 100;
    assert_eq!(field(c), "--lock-delay");
    let mut c = Config::new(Scenario::ClockDrift, 1);
    c.clock_step_ms = 0;
    assert_eq!(field(c), "--clock-step");
}

#[test]
fn the_diagrams_tell_the_new_stories() {
    // Split brain with fencing on: no zombie, no refusal story first, but the write
    // that lost an increment under a token another client held too.
    let mut c = Config::new(Scenario::SplitBrain, 1);
    c.fencing = true;
    let (s, records) = run_traced(&c);
    let d = fenced_sim::diagram::render(&records, &s);
    assert!(d.contains("Two holders of one token"), "{d}");
    assert!(d.contains("had been granted token"), "{d}");
    // A crash and its restart are drawn on the lock service's lane when they fall in
    // the story's window.
    let (s, records) = run_traced(&Config::new(Scenario::ServiceCrash, 1));
    let crash = records.iter().position(|r| r.kind == Kind::ServiceCrash).expect("a crash");
    let window = &records[crash.saturating_sub(20)..crash + 20];
    assert!(window.iter().all(|r| !r.kind.is_service_wide() || (r.client, r.lock) == (0, 0)));
    let d = fenced_sim::diagram::render(&records, &s);
    assert!(d.contains("--fencing on"), "the hint names the flag for this scenario: {d}");
    // No pause at all: the lease ended early because the clock stepped, and the writer
    // never slept.
    let mut c = Config::new(Scenario::ClockDrift, 1);
    c.pauses = PauseModel::None;
    let (s, records) = run_traced(&c);
    let d = fenced_sim::diagram::render(&records, &s);
    assert!(d.contains("wall clock +2000 ms") && d.contains("had just stepped forward 2000 ms"), "{d}");
    assert!(!d.contains("woke up"), "{d}");
}
