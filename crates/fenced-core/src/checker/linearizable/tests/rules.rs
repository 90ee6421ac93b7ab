//! What the model decides: the gate's rule, keys checked apart, a spent search budget
//! (unknown, never ok), a malformed history refused.

use super::*;

#[test]
fn the_gate_rule_is_part_of_the_model() {
    // Holder 33 writes; holder 34's fenced read shuts 33 out; the zombie's write is
    // refused and has no effect.
    let fenced = [
        op(0, 0, 1, fw(33, 1), Ret::Done),
        op(1, 2, 3, Call::Read { token: tok(34) }, got(1)),
        op(0, 4, 5, fw(33, 2), Ret::Stale { highest_seen: tok(34) }),
        op(1, 6, 7, fw(34, 3), Ret::Done),
        op(1, 8, 9, READ, got(3)),
    ];
    assert_eq!(verdict(&fenced), Verdict::Linearizable);
    // A zombie write accepted after the mark rose: a broken gate.
    let mut zombie = fenced.to_vec();
    zombie[2].ret = Ret::Done;
    assert_eq!(violation(&zombie).stuck, 2);
    // A refused write whose value is read anyway: the refusal lied.
    let mut leaked = fenced.to_vec();
    leaked[4].ret = got(2);
    assert_eq!(violation(&leaked).stuck, 4);
    // A refusal with nothing higher seen.
    let spurious = [op(0, 0, 1, fw(5, 1), Ret::Done), op(1, 2, 3, fw(6, 2), STALE)];
    assert_eq!(violation(&spurious).stuck, 1);
    // The mark reported with a refusal is checked when recorded.
    let wrong_mark = [op(0, 0, 1, fw(7, 1), Ret::Done), op(1, 2, 3, fw(6, 2), Ret::Stale { highest_seen: tok(8) })];
    assert_eq!(violation(&wrong_mark).stuck, 1);
    // Equal tokens pass: one holder writes many times.
    let same = [op(0, 0, 1, fw(7, 1), Ret::Done), op(0, 2, 3, fw(7, 2), Ret::Done), op(1, 4, 5, READ, got(2))];
    assert_eq!(verdict(&same), Verdict::Linearizable);
}

#[test]
fn keys_are_independent() {
    let mut h = vec![op(0, 0, 1, w(1), Ret::Done), op(1, 2, 3, READ, got(1))];
    h.push(Operation { process: 2, key: "other", call: READ, ret: ABSENT, invoke: 4, complete: 5 });
    assert_eq!(verdict(&h), Verdict::Linearizable);
    h.push(Operation { process: 2, key: "other", call: READ, ret: got(1), invoke: 6, complete: 7 });
    let v = violation(&h);
    assert_eq!((v.key, v.stuck), ("other", 3));
}

#[test]
fn budget_exhausted_is_unknown_never_ok() {
    let h = [op(0, 0, 10, w(1), Ret::Done), op(1, 0, 10, w(2), Ret::Done), op(2, 11, 12, READ, got(1))];
    assert_eq!(check(&h, 2), Verdict::Unknown { key: "k", steps: 2 });
    assert_eq!(check(&h, 1_000), Verdict::Linearizable);
}

#[test]
fn malformed_history_is_refused() {
    let h = [op(0, 5, 4, w(1), Ret::Done)];
    assert_eq!(verdict(&h), Verdict::Malformed { op: 0 });
}
