//! Generates histories from a sequential run of the model itself.

use super::*;
use proptest::prelude::*;

const KEYS: [&str; 3] = ["a", "b", "c"];

/// A raw plan: per operation (key, kind, token, gap before its linearization point,
/// how long before that it was invoked, how long after it completed, unknown?).
type Plan = Vec<(usize, u8, u64, u64, u64, u64, bool)>;

/// Runs `plan` sequentially on the reference model; each operation is placed on a
/// process free at its linearization point, its interval stretched around that
/// point. An unknown operation took effect or not at random (`took`); its process
/// is retired, as Jepsen retires a crashed client.
pub(super) fn history(plan: &Plan, processes: u32) -> Vec<Operation<&'static str>> {
    let mut state = [KeyState::default(); 3];
    let mut busy_until = vec![0u64; processes as usize];
    let mut next_process = processes;
    let mut ids: Vec<u32> = (0..processes).collect();
    let mut point = 0u64;
    let mut value = 0u64;
    let mut out = Vec::new();
    for &(key, kind, token, gap, before, after, unknown) in plan {
        point += gap + 1;
        let slot = match (0..busy_until.len()).filter(|&s| busy_until[s] < point).min_by_key(|&s| busy_until[s]) {
            Some(s) => s,
            None => {
                let s = (0..busy_until.len()).min_by_key(|&s| busy_until[s]).unwrap();
                point = busy_until[s] + 1;
                s
            }
        };
        let invoke = point.saturating_sub(before).max(busy_until[slot] + 1);
        let complete = point + after;
        value += 1;
        let call = match kind % 4 {
            0 => Call::Read { token: None },
            1 => Call::Read { token: Token::new(token) },
            2 => Call::Write { token: Token::new(token), value },
            _ => Call::Delete,
        };
        let (ret, next) = state[key].apply(call);
        // An unknown operation's effect happens, or not, by its own bit.
        let took = !unknown || value.is_multiple_of(2);
        if took {
            state[key] = next;
        }
        let ret = if unknown { Ret::Unknown } else { ret };
        out.push(Operation { process: ids[slot], key: KEYS[key], call, ret, invoke, complete });
        busy_until[slot] = complete;
        if unknown {
            ids[slot] = next_process;
            next_process += 1;
        }
    }
    out
}

pub(super) fn plan(len: usize) -> impl Strategy<Value = Plan> {
    prop::collection::vec((0..3usize, 0..4u8, 0..6u64, 0..4u64, 0..12u64, 0..12u64, prop::bool::weighted(0.05)), 1..len)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sequential_runs_are_linearizable(plan in plan(120), processes in 1..8u32) {
        let h = history(&plan, processes);
        prop_assert_eq!(check(&h, STEPS_MAX_DEFAULT), Verdict::Linearizable);
    }

    /// One read's answer replaced by a value nobody wrote: caught before any search.
    #[test]
    fn a_read_of_an_unwritten_value_is_caught(plan in plan(120), processes in 1..8u32, pick in any::<prop::sample::Index>()) {
        let mut h = history(&plan, processes);
        let reads: Vec<usize> =
            (0..h.len()).filter(|&i| matches!(h[i].ret, Ret::Value(_))).collect();
        prop_assume!(!reads.is_empty());
        let victim = reads[pick.index(reads.len())];
        h[victim].ret = Ret::Value(Some(u64::MAX));
        match check(&h, STEPS_MAX_DEFAULT) {
            Verdict::NotLinearizable(v) => {
                prop_assert_eq!((v.key, v.cause, v.stuck), (h[victim].key, Cause::ValueNeverWritten, victim));
            }
            other => prop_assert!(false, "corrupted read {} not caught: {:?}", victim, other),
        }
    }

    /// One read's answer replaced by a value overwritten before it was sent: only the
    /// search can refute that one.
    #[test]
    fn a_stale_read_is_caught(plan in plan(120), processes in 1..8u32, pick in any::<prop::sample::Index>()) {
        let mut h = history(&plan, processes);
        let stale: Vec<(usize, Value)> = (0..h.len()).filter_map(|i| stale_value(&h, i).map(|v| (i, v))).collect();
        prop_assume!(!stale.is_empty());
        let (victim, value) = stale[pick.index(stale.len())];
        h[victim].ret = Ret::Value(Some(value));
        match check(&h, STEPS_MAX_DEFAULT) {
            Verdict::NotLinearizable(v) => prop_assert_eq!((v.key, v.cause), (h[victim].key, Cause::NoOrder)),
            other => prop_assert!(false, "stale read {} not caught: {:?}", victim, other),
        }
    }
}
