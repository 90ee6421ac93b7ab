//! Hand-made histories: sequential, stale, lost and never-written values, overlaps,
//! touching intervals, and operations whose outcome is unknown.

use super::*;

#[test]
fn sequential_history_is_linearizable() {
    let h = [
        op(0, 0, 1, READ, ABSENT),
        op(0, 2, 3, w(1), Ret::Done),
        op(1, 4, 5, READ, got(1)),
        op(1, 6, 7, Call::Delete, Ret::Done),
        op(0, 8, 9, READ, ABSENT),
    ];
    assert_eq!(verdict(&h), Verdict::Linearizable);
}

#[test]
fn stale_read_is_caught() {
    // 2 is written and acknowledged before the read starts, which still returns 1.
    let h = [op(0, 0, 1, w(1), Ret::Done), op(0, 2, 3, w(2), Ret::Done), op(1, 4, 5, READ, got(1))];
    let v = violation(&h);
    assert_eq!((v.key, v.stuck, v.cause), ("k", 2, Cause::NoOrder));
    assert_eq!(v.linearized, vec![0, 1]);
    assert_eq!(v.state.value, Some(2));
}

#[test]
fn lost_write_is_caught() {
    // An acknowledged write that no later read sees: the key reads absent again.
    let h = [op(0, 0, 1, w(1), Ret::Done), op(1, 2, 3, READ, ABSENT)];
    assert_eq!(violation(&h).stuck, 1);
}

#[test]
fn read_of_a_value_never_written_is_caught() {
    let h = [op(0, 0, 10, w(1), Ret::Done), op(1, 0, 10, READ, got(7))];
    let v = violation(&h);
    assert_eq!((v.stuck, v.cause, v.linearized.len()), (1, Cause::ValueNeverWritten, 0));
}

#[test]
fn concurrent_overlap_is_fine() {
    // Two writes overlap; readers overlapping both may see either, in either order,
    // but once a later read has settled on one, everyone after sees it.
    let h = [
        op(0, 0, 10, w(1), Ret::Done),
        op(1, 0, 10, w(2), Ret::Done),
        op(2, 1, 4, READ, got(2)),
        op(3, 2, 5, READ, got(1)),
        op(2, 11, 12, READ, got(1)),
    ];
    assert_eq!(verdict(&h), Verdict::Linearizable);
    // Flip-flop after both completed: 1 then 2 with nothing in between.
    let mut bad = h.to_vec();
    bad.push(op(3, 13, 14, READ, got(2)));
    assert_eq!(violation(&bad).stuck, 5);
}

#[test]
fn touching_intervals_count_as_concurrent() {
    // The read is sent at the instant the write is answered: either order is allowed.
    let h = [op(0, 0, 5, w(1), Ret::Done), op(1, 5, 6, READ, ABSENT)];
    assert_eq!(verdict(&h), Verdict::Linearizable);
}

#[test]
fn unknown_outcomes_may_or_may_not_take_effect() {
    // A timed-out write read later: it took effect (after its invocation, even long
    // after its client gave up).
    let took = [op(0, 0, 0, w(1), Ret::Unknown), op(1, 100, 101, READ, got(1))];
    assert_eq!(verdict(&took), Verdict::Linearizable);
    // A timed-out write never seen: it did not.
    let never = [op(0, 0, 0, w(1), Ret::Unknown), op(1, 100, 101, READ, ABSENT)];
    assert_eq!(verdict(&never), Verdict::Linearizable);
    // Seen, then gone with no other write, then seen again: one write cannot do that.
    let flicker = [
        op(0, 0, 0, w(1), Ret::Unknown),
        op(1, 10, 11, READ, got(1)),
        op(1, 12, 13, READ, ABSENT),
        op(1, 14, 15, READ, got(1)),
    ];
    assert_eq!(violation(&flicker).stuck, 2);
    // An unknown write cannot take effect before it was sent.
    let early = [op(1, 0, 1, READ, got(1)), op(0, 5, 0, w(1), Ret::Unknown)];
    assert_eq!(violation(&early).stuck, 0);
}

#[test]
fn unknown_fenced_read_may_have_moved_the_mark() {
    // Only a fenced read with token 9 that went through explains the refusal of 5.
    let h = [
        op(0, 0, 1, fw(3, 1), Ret::Done),
        op(1, 2, 2, Call::Read { token: tok(9) }, Ret::Unknown),
        op(0, 10, 11, fw(5, 2), Ret::Stale { highest_seen: tok(9) }),
        op(0, 12, 13, READ, got(1)),
    ];
    assert_eq!(verdict(&h), Verdict::Linearizable);
    // Without it, the refusal is unexplained.
    let without = [h[0].clone(), h[2].clone(), h[3].clone()];
    assert_eq!(violation(&without).stuck, 1);
}
