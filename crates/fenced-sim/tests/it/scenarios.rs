//! The scenarios' claims, checked over seeds at the default settings.

use fenced_sim::trace::JsonLines;
use fenced_sim::{diagram, Config, Scenario};

use crate::{run, run_traced};

const SEEDS: std::ops::RangeInclusive<u64> = 1..=30;

#[test]
fn default_has_zombie_writes_and_lost_updates_for_every_seed() {
    for seed in SEEDS {
        let s = run(Scenario::Default, seed);
        assert!(s.zombie_writes > 0, "seed {seed}: {s:?}");
        assert!(s.lost_updates > 0, "seed {seed}: {s:?}");
        assert_eq!(s.stale_writes_rejected, 0, "nothing checks tokens with fencing off");
        assert_eq!(s.lost_updates, s.writes_accepted - s.final_value, "lost updates are the missing increments");
    }
}

#[test]
fn fencing_has_no_zombie_write_and_no_lost_update_for_every_seed() {
    for seed in SEEDS {
        let s = run(Scenario::Fencing, seed);
        assert_eq!((s.zombie_writes, s.lost_updates), (0, 0), "seed {seed}: {s:?}");
        assert!(s.stale_writes_rejected > 0, "seed {seed}: the gate had nothing to refuse");
        assert_eq!(s.final_value, s.writes_accepted, "every accepted increment is in the counter");
        assert!(s.acknowledged <= s.final_value, "replies still in flight when the run ends are not acknowledged");
        assert!(s.is_safe());
    }
}

#[test]
fn fencing_changes_nothing_but_the_fate_of_stale_writes() {
    // Same seed, same pauses, same grants: the runs only part where a stale write
    // reaches the resource.
    let (d, dr) = run_traced(&Config::new(Scenario::Default, 3));
    let (f, fr) = run_traced(&Config::new(Scenario::Fencing, 3));
    let first_zombie = d.zombies[0].seq as usize;
    assert_eq!(f.first_rejection.map(|(_, seq)| seq as usize), Some(first_zombie));
    for (a, b) in dr.iter().zip(&fr).take(first_zombie) {
        assert_eq!((a.t_ms, a.kind, a.client, a.token), (b.t_ms, b.kind, b.client, b.token));
    }
}

#[test]
fn long_lease_makes_zombies_rarer_but_not_zero() {
    let total = |sc| (1..=50).map(|seed| run(sc, seed).zombie_writes).sum::<u64>();
    let (long, default) = (total(Scenario::LongLease), total(Scenario::Default));
    assert!(long > 0, "a longer lease only needs a longer pause");
    assert!(long < default, "long-lease {long} vs default {default}");
}

#[test]
fn renewal_fails_only_on_pauses_longer_than_half_the_lease() {
    let mut zombies = 0;
    for seed in SEEDS {
        let s = run(Scenario::Renewal, seed);
        zombies += s.zombie_writes;
        for z in &s.zombies {
            assert!(
                z.pause_ms > s.lease_ms / 2,
                "seed {seed}: zombie after a {} ms pause, lease {}",
                z.pause_ms,
                s.lease_ms
            );
        }
        if let Some(m) = s.zombie_pause_ms_min {
            assert!(m > s.lease_ms / 2);
        }
    }
    assert!(zombies > 0, "renewal does not help against long pauses");
}

#[test]
fn occ_loses_no_update_without_any_lock() {
    for seed in SEEDS {
        let s = run(Scenario::Occ, seed);
        assert_eq!(s.grants, 0);
        assert_eq!(s.lost_updates, 0, "seed {seed}");
        assert_eq!(s.final_value, s.writes_accepted);
        assert!(s.stale_writes_rejected > 0, "conflicts happen and are refused");
    }
}

#[test]
fn same_seed_same_bytes() {
    let trace = |seed| {
        let mut sink = JsonLines::new(Vec::new());
        let s = fenced_sim::run(&Config::new(Scenario::Default, seed), &mut sink).unwrap();
        (sink.finish().unwrap(), s.to_json())
    };
    let (a, sa) = trace(11);
    let (b, sb) = trace(11);
    assert!(a.len() > 10_000);
    assert_eq!(a, b, "the same seed wrote different traces");
    assert_eq!(sa, sb);
    assert_ne!(a, trace(12).0, "another seed, another run");
}

#[test]
fn the_trace_and_the_summary_tell_the_same_story() {
    let (s, records) = run_traced(&Config::new(Scenario::Default, 5));
    let zombie_records =
        records.iter().filter(|r| matches!(r.detail, fenced_sim::trace::Detail::Write { zombie: true, .. })).count();
    assert_eq!(zombie_records as u64, s.zombie_writes);
    assert!(records.windows(2).all(|w| w[0].t_ms <= w[1].t_ms && w[1].seq == w[0].seq + 1));
    let line = {
        let mut s = String::new();
        fenced_sim::trace::write_json(&mut s, &records[0]);
        s
    };
    for key in ["\"t_ms\":", "\"seq\":", "\"actor\":", "\"kind\":"] {
        assert!(line.contains(key), "{line}");
    }
}

#[test]
fn the_summary_has_the_design_fields() {
    let json = run(Scenario::Default, 1).to_json();
    for f in fenced_sim::SUMMARY_FIELDS {
        assert!(json.contains(&format!("\"{f}\":")), "summary lacks {f}: {json}");
    }
}

#[test]
fn the_diagram_tells_the_zombie_and_the_refusal() {
    let (s, r) = run_traced(&Config::new(Scenario::Default, 1));
    let d = diagram::render(&r, &s);
    for needle in ["lock service", "resource", "granted #", "expired", "paused", "ZOMBIE WRITE accepted"] {
        assert!(d.contains(needle), "diagram lacks {needle}:\n{d}");
    }
    let (s, r) = run_traced(&Config::new(Scenario::Fencing, 1));
    let d = diagram::render(&r, &s);
    assert!(d.contains("REJECTED: stale token"), "{d}");
    assert!(d.contains("refused it"), "{d}");
}

#[test]
fn bad_settings_are_refused_by_name() {
    let mut c = Config::new(Scenario::Default, 1);
    c.lease_ms = 0;
    assert_eq!(fenced_sim::run(&c, &mut ()).unwrap_err().field, "--lease");
    let mut c = Config::new(Scenario::Occ, 1);
    c.fencing = true;
    assert_eq!(fenced_sim::run(&c, &mut ()).unwrap_err().field, "--fencing");
    let mut c = Config::new(Scenario::Default, 1);
    c.locks = 9;
    assert_eq!(fenced_sim::run(&c, &mut ()).unwrap_err().field, "--locks");
}
