//! A linearizability checker for the fenced key-value store (and any key-value store
//! with the same operations): is there one order of the operations, consistent with
//! real time, in which a single copy of each key gives every answer the clients saw?
//!
//! The model of one key is the built-in store's: a value (or absent) and the gate's mark
//! `highest_seen`. A fenced write or fenced read with token `t` is refused as stale when
//! `t < highest_seen` and then changes nothing; otherwise it goes through and the mark
//! becomes `t`. A write without a token (an unfenced key) and a plain read leave the
//! mark alone. `Delete` is there for peer stores; the fenced store has none.
//!
//! Operations whose outcome is unknown (a time-out, a crashed client) may or may not
//! have taken effect: they stay open forever, as in Knossos and Porcupine, so the search
//! may place them anywhere after their invocation, or after everything (which is the
//! same as never). Linearizability is compositional (Herlihy and Wing), so each key is
//! checked alone. The search is Wing and Gong's, as Lowe improved it and Porcupine
//! implements it: a depth-first search over the operations that may go next, memoizing
//! every (set of operations linearized, state) already explored so no state is
//! explored twice. It is bounded by a step budget; past it the answer is `Unknown`,
//! never "linearizable". Before it, a read of a value no write could have written in
//! time is reported at once: the cheap, common refutation needs no search.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

use rustc_hash::FxBuildHasher;

use crate::Token;

mod bookkeeping;

use bookkeeping::{Bits, Explored, List};

/// A value in the store. Recorders map the bytes they wrote to numbers (writing unique
/// values makes a history easiest to judge).
pub type Value = u64;

/// What a client asked.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Call {
    /// `GET`: a plain read without a token, a fenced read (which moves the mark) with one.
    Read { token: Option<Token> },
    /// `PUT`: fenced with a token; without one, a write to an unfenced key.
    Write { token: Option<Token>, value: Value },
    /// Removes the value (for peer stores; the fenced store has no delete).
    Delete,
}

/// What it was answered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Ret {
    /// A read's answer: the value, or absent (404).
    Value(Option<Value>),
    /// A write or delete went through.
    Done,
    /// The gate refused the token (409 `stale_token`): nothing changed. `highest_seen`
    /// as the store reported it, when the recorder kept it.
    Stale { highest_seen: Option<Token> },
    /// No answer (a time-out, a crash): it may or may not have taken effect. Operations
    /// that certainly failed without effect (a 400, a 503 before forwarding) are left out
    /// of the history instead.
    Unknown,
}

/// One operation of a history.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Operation<K> {
    /// Who issued it: for reports only (the check uses real time alone).
    pub process: u32,
    pub key: K,
    pub call: Call,
    pub ret: Ret,
    /// When it was sent, on one clock (or an index) shared by the whole history.
    pub invoke: u64,
    /// When its answer came, on the same clock; ignored when `ret` is `Unknown`.
    pub complete: u64,
}

/// One key of the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct KeyState {
    pub value: Option<Value>,
    pub highest_seen: Option<Token>,
}

impl KeyState {
    /// The answer `call` gets in this state, and the state after it.
    pub fn apply(self, call: Call) -> (Ret, KeyState) {
        let stale = |t: Token| self.highest_seen.filter(|m| t < *m).map(|m| Ret::Stale { highest_seen: Some(m) });
        match call {
            Call::Read { token: None } => (Ret::Value(self.value), self),
            Call::Read { token: Some(t) } => match stale(t) {
                Some(refused) => (refused, self),
                None => (Ret::Value(self.value), KeyState { highest_seen: Some(t), ..self }),
            },
            Call::Write { token: None, value } => (Ret::Done, KeyState { value: Some(value), ..self }),
            Call::Write { token: Some(t), value } => match stale(t) {
                Some(refused) => (refused, self),
                None => (Ret::Done, KeyState { value: Some(value), highest_seen: Some(t) }),
            },
            Call::Delete => (Ret::Done, KeyState { value: None, ..self }),
        }
    }

    /// The state after `call` answered `ret`, if this state can give that answer.
    pub fn step(self, call: Call, ret: Ret) -> Option<KeyState> {
        let (expected, next) = self.apply(call);
        let fits = match (ret, expected) {
            (Ret::Unknown, _) => true,
            (Ret::Stale { highest_seen: None }, Ret::Stale { .. }) => true,
            (seen, expected) => seen == expected,
        };
        fits.then_some(next)
    }
}

/// Why a history is not linearizable, as far as the search got.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Violation<K> {
    pub key: K,
    pub cause: Cause,
    /// The longest linearization the search found, as indices into the history, in
    /// order: no extension of it (nor any other order) accounts for `stuck`.
    pub linearized: Vec<usize>,
    /// The key's state after `linearized`.
    pub state: KeyState,
    /// An operation that completed before any remaining operation could be placed
    /// next: its answer cannot be given after `linearized` (nor after any longer prefix).
    pub stuck: usize,
}

/// How a violation was found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Cause {
    /// `stuck` read a value that no write in the history could have written before the
    /// read completed (none wrote it, or every one was sent after): found before any
    /// search, `linearized` is empty.
    ValueNeverWritten,
    /// The search tried every order: `linearized` is the longest it found.
    NoOrder,
}

/// The checker's answer.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Verdict<K> {
    Linearizable,
    NotLinearizable(Violation<K>),
    /// The search of `key` ran out of its step budget before deciding.
    Unknown {
        key: K,
        steps: u64,
    },
    /// Operation `op` completes before it is invoked: the recorder is wrong.
    Malformed {
        op: usize,
    },
}

/// A step budget that decides ordinary histories of many thousand operations.
pub const STEPS_MAX_DEFAULT: u64 = 10_000_000;

/// Checks a history key by key, each search within `steps_max` steps. A violation on
/// any key is reported (the first key, in order of first appearance, that has one);
/// otherwise `Unknown` if any key's search ran out of budget.
pub fn check<K: Clone + Eq + Hash + Debug>(history: &[Operation<K>], steps_max: u64) -> Verdict<K> {
    if let Some(op) = history.iter().position(|o| o.ret != Ret::Unknown && o.complete < o.invoke) {
        return Verdict::Malformed { op };
    }
    let mut keys: Vec<(&K, Vec<usize>)> = Vec::new();
    let mut slot = std::collections::HashMap::<&K, usize, FxBuildHasher>::default();
    for (i, o) in history.iter().enumerate() {
        let s = *slot.entry(&o.key).or_insert_with(|| {
            keys.push((&o.key, Vec::new()));
            keys.len() - 1
        });
        keys[s].1.push(i);
    }
    for (key, ops) in &keys {
        if let Some(stuck) = read_of_unwritten_value(history, ops) {
            let (cause, linearized, state) = (Cause::ValueNeverWritten, Vec::new(), KeyState::default());
            return Verdict::NotLinearizable(Violation { key: (*key).clone(), cause, linearized, state, stuck });
        }
    }
    let mut unknown = None;
    for (key, ops) in keys {
        match check_key(history, &ops, steps_max) {
            Search::Linearizable => {}
            Search::Stuck { linearized, state, stuck } => {
                let cause = Cause::NoOrder;
                return Verdict::NotLinearizable(Violation { key: key.clone(), cause, linearized, state, stuck });
            }
            Search::OutOfSteps(steps) => {
                unknown.get_or_insert(Verdict::Unknown { key: key.clone(), steps });
            }
        }
    }
    unknown.unwrap_or(Verdict::Linearizable)
}

/// A read that returned a value no write of its key could have written before the read
/// completed: a violation whatever the order, found without a search (Knossos and Elle
/// check the same first). Writes refused as stale wrote nothing.
fn read_of_unwritten_value<K>(all: &[Operation<K>], ops: &[usize]) -> Option<usize> {
    let mut first_sent = std::collections::HashMap::<Value, u64, FxBuildHasher>::default();
    for &i in ops {
        if let (Call::Write { value, .. }, Ret::Done | Ret::Unknown) = (all[i].call, all[i].ret) {
            let at = first_sent.entry(value).or_insert(u64::MAX);
            *at = (*at).min(all[i].invoke);
        }
    }
    ops.iter().copied().find(|&i| match all[i].ret {
        Ret::Value(Some(v)) => first_sent.get(&v).is_none_or(|&sent| sent > all[i].complete),
        _ => false,
    })
}

enum Search {
    Linearizable,
    Stuck { linearized: Vec<usize>, state: KeyState, stuck: usize },
    OutOfSteps(u64),
}

/// One call or return in the time-ordered list the search walks.
#[derive(Clone, Copy)]
struct Entry {
    /// Index into the key's operations.
    op: usize,
    is_call: bool,
    /// The other entry of the same operation.
    matching: usize,
}

/// Drops what cannot matter: a plain read with no answer observed nothing and changed
/// nothing; an unfenced write with no answer whose value nobody read can only make
/// later reads harder to explain, so placing it "never" is always at least as good.
fn relevant(history: &[usize], all: &[Operation<impl Sized>]) -> Vec<usize> {
    let read: HashSet<Value, FxBuildHasher> = history
        .iter()
        .filter_map(|&i| match all[i].ret {
            Ret::Value(Some(v)) => Some(v),
            _ => None,
        })
        .collect();
    history
        .iter()
        .copied()
        .filter(|&i| match (all[i].call, all[i].ret) {
            (Call::Read { token: None }, Ret::Unknown) => false,
            (Call::Write { token: None, value }, Ret::Unknown) => read.contains(&value),
            _ => true,
        })
        .collect()
}

/// Wing–Gong–Lowe over one key's operations (`ops`, indices into `all`).
fn check_key<K>(all: &[Operation<K>], ops: &[usize], steps_max: u64) -> Search {
    let ops = relevant(ops, all);
    let n = ops.len();
    let entries = entries(all, &ops);
    let mut list = List::new(2 * n);
    // Operations with an answer and those without are two bitsets: a search state with
    // fewer unanswered operations placed dominates one with more (see `Explored`).
    let (slot, known, open) = slots(all, &ops);
    let mut done = Bits::new(known);
    let mut placed = Bits::new(open);
    let mut known_left = known;
    let mut explored = Explored::default();
    // The calls linearized so far (list position), with the state before each and the
    // pass that chose it.
    let mut stack: Vec<(usize, KeyState, bool)> = Vec::new();
    let mut state = KeyState::default();
    let mut best: Option<(Vec<usize>, KeyState, usize)> = None;
    let mut steps = 0u64;
    let mut cursor = list.next[0];
    // Each search state tries the answered operations that may go next first, then (a
    // second pass over the same candidates) the unanswered ones: those are optional, and
    // placing one that never took effect only leads the search astray.
    let mut pass_open = false;
    // Done when every answered operation is placed: the unanswered ones left may never
    // have taken effect.
    while known_left > 0 {
        steps += 1;
        if steps > steps_max {
            return Search::OutOfSteps(steps_max);
        }
        // List positions are 1-based; entries are 0-based.
        let e = entries[cursor - 1];
        if e.is_call {
            let o = &all[ops[e.op]];
            let (is_open, bit) = slot[e.op];
            if is_open != pass_open {
                cursor = list.next[cursor];
                continue;
            }
            if let Some(after) = state.step(o.call, o.ret) {
                let (mut d, mut p) = (done.clone(), placed.clone());
                if is_open {
                    p.set(bit)
                } else {
                    d.set(bit)
                }
                if explored.insert(d.clone(), after, &p) {
                    stack.push((cursor, state, pass_open));
                    pass_open = false;
                    state = after;
                    (done, placed) = (d, p);
                    known_left -= usize::from(!is_open);
                    list.unlink(cursor);
                    list.unlink(e.matching + 1);
                    cursor = list.next[0];
                    continue;
                }
            }
            cursor = list.next[cursor];
        } else if !pass_open {
            pass_open = true;
            cursor = list.next[0];
        } else {
            // A return whose call is not linearized yet: nothing can go before it that
            // has not been tried, so undo the last choice.
            if best.as_ref().is_none_or(|b| stack.len() > b.0.len()) {
                let order = stack.iter().map(|(p, _, _)| ops[entries[p - 1].op]).collect();
                best = Some((order, state, ops[e.op]));
            }
            let Some((p, before, pass)) = stack.pop() else {
                let (linearized, state, stuck) = best.expect("recorded just above");
                return Search::Stuck { linearized, state, stuck };
            };
            let (is_open, bit) = slot[entries[p - 1].op];
            if is_open {
                placed.clear(bit)
            } else {
                done.clear(bit)
            }
            known_left += usize::from(!is_open);
            state = before;
            pass_open = pass;
            list.relink(entries[p - 1].matching + 1);
            list.relink(p);
            cursor = list.next[p];
        }
    }
    Search::Linearizable
}

/// The calls and returns of `ops` sorted by time; at equal times calls come first, so
/// operations that touch at one instant count as concurrent (never a false alarm from
/// clock granularity). An operation without an answer returns at the end of time.
fn entries<K>(all: &[Operation<K>], ops: &[usize]) -> Vec<Entry> {
    let n = ops.len();
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (local, &i) in ops.iter().enumerate() {
        let o = &all[i];
        let complete = if o.ret == Ret::Unknown { u64::MAX } else { o.complete };
        order.push((o.invoke, false, local));
        order.push((complete, true, local));
    }
    order.sort_unstable();
    let mut entries = vec![Entry { op: 0, is_call: false, matching: 0 }; 2 * n];
    let mut at = vec![[0usize; 2]; n];
    for (pos, &(_, is_return, op)) in order.iter().enumerate() {
        at[op][is_return as usize] = pos;
    }
    for (pos, &(_, is_return, op)) in order.iter().enumerate() {
        entries[pos] = Entry { op, is_call: !is_return, matching: at[op][!is_return as usize] };
    }
    entries
}

/// Each operation's bit: whether it is unanswered, and its index among the answered or
/// among the unanswered; then how many of each there are.
fn slots<K>(all: &[Operation<K>], ops: &[usize]) -> (Vec<(bool, usize)>, usize, usize) {
    let mut slot = vec![(false, 0usize); ops.len()];
    let (mut known, mut open) = (0usize, 0usize);
    for (local, &i) in ops.iter().enumerate() {
        let counter = if all[i].ret == Ret::Unknown { &mut open } else { &mut known };
        slot[local] = (all[i].ret == Ret::Unknown, *counter);
        *counter += 1;
    }
    (slot, known, open)
}

#[cfg(test)]
mod tests;
