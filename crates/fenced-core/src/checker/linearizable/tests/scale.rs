//! The check of 5,000 operations by 8 processes, on one key and on three.

use super::*;

/// A plan of exactly `len` operations from a fixed seed (xorshift), on `keys` keys.
fn fixed_plan(len: usize, keys: usize, unknown_per_mille: u64) -> Vec<(usize, u8, u64, u64, u64, u64, bool)> {
    let mut x = crate::xorshift::XorShift(0x9e37_79b9_7f4a_7c15);
    let mut next = move |m: u64| x.next() % m;
    (0..len)
        .map(|_| {
            let key = next(keys as u64) as usize;
            (key, next(4) as u8, next(6), next(4), next(12), next(12), next(1_000) < unknown_per_mille)
        })
        .collect()
}

/// Times the check of 5,000 operations by 8 processes (run with `--nocapture` to see
/// it): on one key (the whole history one search) and on three, without and with
/// operations left open forever. Asserts the verdicts, not the time.
///
/// Refuting is the hard direction. A value never written is caught before any search;
/// a stale value makes the search exhaust every order before the corrupted read. With
/// 49 operations open forever on one key that exceeds the default budget, and the
/// answer is `Unknown`, which the test accepts there: never `ok`.
#[test]
fn five_thousand_operations() {
    for (keys, unknown_per_mille, refutable) in [(1, 0, true), (1, 10, false), (3, 10, true)] {
        let h = super::generated::history(&fixed_plan(5_000, keys, unknown_per_mille), 8);
        let unknown = h.iter().filter(|o| o.ret == Ret::Unknown).count();
        let started = std::time::Instant::now();
        let verdict = check(&h, STEPS_MAX_DEFAULT);
        let took = started.elapsed();
        eprintln!("{} operations, {keys} key(s), 8 processes, {unknown} unknown: {verdict:?} in {took:?}", h.len());
        assert_eq!(verdict, Verdict::Linearizable);
        let read = (0..h.len()).rev().find(|&i| stale_value(&h, i).is_some()).expect("a read after two writes");
        for (what, value) in [("a value never written", u64::MAX), ("a stale value", stale_value(&h, read).unwrap())] {
            let mut corrupted = h.clone();
            corrupted[read].ret = Ret::Value(Some(value));
            let started = std::time::Instant::now();
            let verdict = check(&corrupted, STEPS_MAX_DEFAULT);
            let took = started.elapsed();
            match verdict {
                Verdict::NotLinearizable(v) => {
                    eprintln!("  its last read made {what}: caught ({:?}) in {took:?}", v.cause)
                }
                Verdict::Unknown { steps, .. } if !refutable => {
                    eprintln!("  its last read made {what}: unknown after {steps} steps, {took:?}")
                }
                other => panic!("a corrupted read was not caught: {other:?}"),
            }
        }
    }
}
