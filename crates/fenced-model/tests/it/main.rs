//! The protocol model, checked: the design holds every property and reaches every
//! interesting state; each broken variant is caught on the property it breaks.

use std::time::Instant;

use fenced_model::{names, Config, ProtocolModel, State, Variant};
use std::collections::BTreeSet;

use stateright::{Checker, HasDiscoveries, Model};

/// Checks `variant` breadth first (so a counterexample is a shortest one), to the end
/// or until `property` is discovered, and prints the state counts and the time.
fn check(variant: Variant, property: Option<&'static str>) -> impl Checker<ProtocolModel> {
    let started = Instant::now();
    let mut builder = ProtocolModel::new(Config::bounded(variant)).checker();
    if let Some(p) = property {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([p])));
    }
    let checker = builder.spawn_bfs().join();
    eprintln!(
        "{variant:?}: {} states ({} unique), depth {}, {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// Exhaustive within the bounds: depth first with the replicas' symmetry reduced (only
/// the local-clock variants read the clocks' offsets, the one thing that tells replicas
/// apart), on every core.
#[test]
fn the_design_holds_every_property() {
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let checker = ProtocolModel::new(Config::bounded(Variant::Correct))
        .checker()
        .threads(threads)
        .symmetry_fn(State::representative)
        .spawn_dfs()
        .join();
    eprintln!(
        "Correct: {} states ({} unique up to symmetry), depth {}, {threads} threads, {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// The counterexample for `property` in `variant`, printed.
fn caught(variant: Variant, property: &'static str) {
    let checker = check(variant, Some(property));
    let path = checker.assert_any_discovery(property);
    let actions = path.into_actions();
    eprintln!("  {property}: counterexample in {} steps: {actions:?}", actions.len());
}

#[test]
fn a_leader_stamping_its_local_clock_expires_leases_early() {
    caught(Variant::LocalClock, names::LEASE_OUTLIVES_KEEPALIVE);
}

#[test]
fn a_timer_on_the_local_clock_expires_leases_early() {
    caught(Variant::TickOnLocalClock, names::LEASE_OUTLIVES_KEEPALIVE);
}

#[test]
fn acknowledging_before_commit_is_caught() {
    caught(Variant::AckBeforeCommit, names::LEASE_OUTLIVES_KEEPALIVE);
}

#[test]
fn acknowledging_a_grant_before_commit_breaks_mutual_exclusion() {
    caught(Variant::AckBeforeCommit, names::MUTUAL_EXCLUSION);
}

#[test]
fn a_leader_without_promote_is_caught() {
    caught(Variant::NoPromote, names::FAILOVER_GRACE);
}

#[test]
fn a_leader_without_the_committed_log_reissues_tokens() {
    caught(Variant::StaleLeader, names::TOKENS_RISE);
}

#[test]
fn a_keepalive_answered_without_its_quorum_round_is_caught() {
    caught(Variant::KeepaliveUnconfirmed, names::LEASE_OUTLIVES_KEEPALIVE);
}

#[test]
fn a_gate_without_a_mark_is_caught() {
    caught(Variant::GateWithoutMark, names::GATE_MONOTONIC);
}

/// The representative of a state is a fixed point, and it keeps each waiting client
/// pointed at the same replica (by content).
#[test]
fn symmetry_keeps_requests_with_their_leader() {
    let model = ProtocolModel::new(Config::bounded(Variant::Correct));
    let s = model.init_states().remove(0);
    // Replica 0 leads with the longest log: the canonical order puts it last.
    let action = fenced_model::Action::Request { client: 1, to: 0, kind: fenced_model::Kind::Keepalive };
    let s = model.next_state(&s, action).expect("enabled");
    let r = s.representative();
    assert_eq!(r.representative(), r);
    let before = &s.replicas[s.clients[1].pending.expect("sent").leader as usize];
    let after = &r.replicas[r.clients[1].pending.expect("kept").leader as usize];
    assert_eq!(before, after);
    assert_ne!(s.replicas, r.replicas, "this state is not canonical already, or the test shows nothing");
}
