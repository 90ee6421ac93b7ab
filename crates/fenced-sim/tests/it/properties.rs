//! Safety over random configurations and seeds: the lock service never regresses a
//! token or grants a held lock (also with a lock-delay, a stepping wall clock and
//! crashes with restarts from its durable state), and with fencing on nothing unsafe is
//! ever accepted.

use fenced_sim::{Config, PauseModel, Scenario, ServiceClock};
use proptest::prelude::*;

fn config() -> impl Strategy<Value = Config> {
    (
        any::<u64>(),
        1u32..8,
        1u32..3,
        50u64..3_000,
        prop::option::of(0.2f64..0.9),
        prop::sample::select(PauseModel::ALL.to_vec()),
        0.0f64..0.8,
        0.0f64..0.05,
        prop::option::of(0u64..2_000),
        prop::option::of(100u64..5_000),
        prop::option::of(2_000u64..20_000),
    )
        .prop_map(
            |(seed, clients, locks, lease_ms, renew, pauses, pause_chance, crash_chance, delay, step, crashes)| {
                let mut c = Config::new(Scenario::Default, seed);
                c.clients = clients;
                c.locks = locks.min(clients);
                c.lease_ms = lease_ms;
                c.renew_fraction = renew;
                c.pauses = pauses;
                c.pause_chance = pause_chance;
                c.crash_chance = crash_chance;
                c.duration_ms = 20_000;
                c.lock_delay_ms = delay.unwrap_or(0);
                if let Some(step) = step {
                    c.clock = ServiceClock::Wall;
                    c.clock_step_ms = step;
                }
                c.service_crash_every_ms = crashes;
                c
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn fencing_is_always_safe(mut c in config()) {
        c.fencing = true;
        let s = fenced_sim::run(&c, &mut ()).unwrap();
        prop_assert_eq!(s.zombie_writes, 0);
        prop_assert_eq!(s.lost_updates, 0);
        prop_assert_eq!(s.final_value, s.writes_accepted);
        prop_assert!(s.acknowledged <= s.final_value);
        prop_assert_eq!((s.token_regressions, s.overlapping_holders), (0, 0));
    }

    #[test]
    fn the_lock_service_is_sound_without_fencing_too(c in config()) {
        let s = fenced_sim::run(&c, &mut ()).unwrap();
        prop_assert_eq!((s.token_regressions, s.overlapping_holders), (0, 0));
        // A zombie write is always a late write: a holder whose lease is live is the
        // newest holder.
        prop_assert!(s.zombie_writes <= s.late_writes);
    }

    #[test]
    fn runs_are_reproducible(c in config()) {
        let a = fenced_sim::run(&c, &mut Vec::new()).unwrap();
        let b = fenced_sim::run(&c, &mut Vec::new()).unwrap();
        prop_assert_eq!(a, b);
    }
}
