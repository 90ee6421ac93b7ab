//! Tests of the checker on hand-written histories: the seed's story, and each finding.

use super::*;

fn tok(n: u64) -> Token {
    Token::new(n).unwrap()
}

fn ev(t_ms: u64, client: u32, kind: EventKind) -> Event {
    Event { t_ms, client, kind }
}

fn write(held: u64, value: u64, before: u64, outcome: Outcome) -> EventKind {
    EventKind::Write { held: Some(tok(held)), fenced: true, value, value_before: Some(before), outcome }
}

fn read(held: u64, value: u64) -> EventKind {
    EventKind::Read { held: Some(tok(held)), fenced: false, value, outcome: Outcome::Accepted }
}

/// Client 0 takes 33, reads 0, pauses; its lease expires; client 1 takes 34, reads 0,
/// writes 1; client 0 wakes and writes 1.
fn seed_story(zombie_outcome: Outcome) -> Vec<Event> {
    vec![
        ev(0, 0, EventKind::Granted { token: tok(33) }),
        ev(5, 0, read(33, 0)),
        ev(10, 0, EventKind::Paused { duration_ms: 2_000 }),
        ev(1_000, 0, EventKind::LeaseExpired { token: tok(33) }),
        ev(1_001, 1, EventKind::Granted { token: tok(34) }),
        ev(1_005, 1, read(34, 0)),
        ev(1_010, 1, write(34, 1, 0, Outcome::Accepted)),
        ev(1_011, 1, EventKind::Released { token: tok(34) }),
        ev(2_010, 0, write(33, 1, 1, zombie_outcome)),
    ]
}

#[test]
fn the_zombie_write_without_fencing() {
    let r = Checker::check(&seed_story(Outcome::Accepted));
    assert_eq!((r.grants, r.lease_expiries, r.pauses), (2, 1, 1));
    assert_eq!((r.writes_attempted, r.writes_accepted), (2, 2));
    assert_eq!((r.late_writes, r.zombie_writes, r.lost_updates, r.stale_writes_rejected), (1, 1, 1, 0));
    assert!(!r.is_safe());
    let zombie = r.first_violation().unwrap();
    assert_eq!(zombie.event, 8);
    assert_eq!(zombie.kind, FindingKind::ZombieWrite { token: tok(33), highest_seen: tok(34), pause_ms: 2_000 });
    assert!(r.findings.iter().any(|f| f.kind == FindingKind::LostUpdate { lost: 1, value: 1, value_before: 1 }));
}

#[test]
fn the_same_story_with_fencing() {
    let r = Checker::check(&seed_story(Outcome::Rejected));
    assert_eq!((r.late_writes, r.zombie_writes, r.lost_updates, r.stale_writes_rejected), (1, 0, 0, 1));
    assert!(r.is_safe());
    assert_eq!(r.first_violation(), None);
}

#[test]
fn a_late_write_nobody_raced_is_harmless() {
    let h = vec![
        ev(0, 0, EventKind::Granted { token: tok(1) }),
        ev(1, 0, read(1, 0)),
        ev(1_000, 0, EventKind::LeaseExpired { token: tok(1) }),
        ev(1_500, 0, write(1, 1, 0, Outcome::Accepted)),
    ];
    let r = Checker::check(&h);
    assert_eq!((r.late_writes, r.zombie_writes, r.lost_updates), (1, 0, 0));
    assert!(r.is_safe());
}

#[test]
fn regressions_and_overlaps_are_found() {
    let h = vec![ev(0, 0, EventKind::Granted { token: tok(5) }), ev(1, 1, EventKind::Granted { token: tok(4) })];
    let r = Checker::check(&h);
    assert_eq!((r.token_regressions, r.overlapping_holders), (1, 1));
    assert_eq!(r.findings[0].kind, FindingKind::TokenRegression { token: tok(4), previous: tok(5) });
    assert_eq!(r.findings[1].kind, FindingKind::OverlappingHolders { token: tok(4), live: tok(5) });
}

#[test]
fn serial_history_is_clean() {
    let mut h = Vec::new();
    for i in 0..100u64 {
        let t = i * 10;
        h.push(ev(t, (i % 3) as u32, EventKind::Granted { token: tok(i + 1) }));
        h.push(ev(t + 1, (i % 3) as u32, read(i + 1, i)));
        h.push(ev(t + 2, (i % 3) as u32, write(i + 1, i + 1, i, Outcome::Accepted)));
        h.push(ev(t + 3, (i % 3) as u32, EventKind::Released { token: tok(i + 1) }));
    }
    let r = Checker::check(&h);
    assert_eq!(r.grants, 100);
    assert_eq!(r.findings, vec![]);
    assert!(r.is_safe());
}

#[test]
fn lost_updates_are_net_of_increments_that_come_back() {
    // Counter at 5. A zombie that read 0 writes 1 (five increments gone), then a holder
    // that read 5 writes 6: four of them are back, one is lost for good.
    let h = vec![
        ev(0, 0, EventKind::Granted { token: tok(1) }),
        ev(1, 0, write(1, 1, 5, Outcome::Accepted)),
        ev(2, 0, write(1, 6, 1, Outcome::Accepted)),
    ];
    let r = Checker::check(&h);
    assert_eq!(r.lost_updates, 1);
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].kind, FindingKind::LostUpdate { lost: 5, value: 1, value_before: 5 });
}
