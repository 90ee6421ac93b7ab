//! The linearizability checker on hand-made histories, and a property: a sequential
//! run with its operations stretched into random overlaps is always linearizable, and
//! the same run with one read corrupted never is.

use super::*;

mod generated;
mod hand_made;
mod rules;
mod scale;

fn tok(n: u64) -> Option<Token> {
    Token::new(n)
}

/// `[invoke, complete]` on one key, process `p`.
fn op(p: u32, invoke: u64, complete: u64, call: Call, ret: Ret) -> Operation<&'static str> {
    Operation { process: p, key: "k", call, ret, invoke, complete }
}

fn w(value: Value) -> Call {
    Call::Write { token: None, value }
}

fn fw(token: u64, value: Value) -> Call {
    Call::Write { token: tok(token), value }
}

const READ: Call = Call::Read { token: None };

fn got(v: Value) -> Ret {
    Ret::Value(Some(v))
}

const ABSENT: Ret = Ret::Value(None);
const STALE: Ret = Ret::Stale { highest_seen: None };

fn verdict(h: &[Operation<&'static str>]) -> Verdict<&'static str> {
    check(h, STEPS_MAX_DEFAULT)
}

fn violation(h: &[Operation<&'static str>]) -> Violation<&'static str> {
    match verdict(h) {
        Verdict::NotLinearizable(v) => v,
        other => panic!("expected a violation, got {other:?}"),
    }
}

/// For the read at `read` (with an answer), a value that was certainly overwritten
/// before it was sent: written by an acknowledged write that completed before another
/// acknowledged write or delete of the key, which completed before the read was sent.
fn stale_value(h: &[Operation<&'static str>], read: usize) -> Option<Value> {
    let r = &h[read];
    if !matches!(r.ret, Ret::Value(_)) {
        return None;
    }
    let done = |o: &Operation<&'static str>| o.key == r.key && o.ret == Ret::Done;
    h.iter().filter(|w1| done(w1)).find_map(|w1| {
        let Call::Write { value, .. } = w1.call else { return None };
        let overwritten = h.iter().any(|w2| {
            done(w2)
                && matches!(w2.call, Call::Write { .. } | Call::Delete)
                && w1.complete < w2.invoke
                && w2.complete < r.invoke
        });
        overwritten.then_some(value)
    })
}
