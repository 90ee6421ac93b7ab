//! The search's bookkeeping: the list of operations not yet placed, sets of operations,
//! and the states already explored.

use super::*;

/// A doubly linked list over positions 1..=len, with 0 the head; `NIL` ends it. An
/// entry taken out can be put back in the reverse order of its taking.
pub(super) struct List {
    pub(super) next: Vec<usize>,
    pub(super) prev: Vec<usize>,
}

pub(super) const NIL: usize = usize::MAX;

impl List {
    pub(super) fn new(len: usize) -> List {
        let next = (1..=len + 1).map(|p| if p == len + 1 { NIL } else { p }).collect();
        let prev = (0..=len).map(|p: usize| p.wrapping_sub(1)).collect();
        List { next, prev }
    }

    pub(super) fn unlink(&mut self, p: usize) {
        self.next[self.prev[p]] = self.next[p];
        if self.next[p] != NIL {
            self.prev[self.next[p]] = self.prev[p];
        }
    }

    pub(super) fn relink(&mut self, p: usize) {
        self.next[self.prev[p]] = p;
        if self.next[p] != NIL {
            self.prev[self.next[p]] = p;
        }
    }
}

/// A fixed-size set of operations.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Bits(Box<[u64]>);

impl Bits {
    pub(super) fn new(len: usize) -> Bits {
        Bits(vec![0; len.div_ceil(64)].into_boxed_slice())
    }
    pub(super) fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    pub(super) fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    pub(super) fn is_subset(&self, of: &Bits) -> bool {
        self.0.iter().zip(of.0.iter()).all(|(a, b)| a & !b == 0)
    }
}

/// The search states entered so far. Two with the same answered operations placed and
/// the same key state differ only in which unanswered ones they placed; the one that
/// placed fewer dominates (each unanswered operation it has left may still go anywhere
/// later, or never), so a state dominated by one entered before is not entered: if it
/// could finish, so could its dominator. With no unanswered operations this is
/// Porcupine's exact memo.
#[derive(Default)]
pub(super) struct Explored {
    by_done: std::collections::HashMap<(Bits, KeyState), Vec<Bits>, FxBuildHasher>,
}

impl Explored {
    /// False when `(done, state, placed)` or a state dominating it was entered before.
    pub(super) fn insert(&mut self, done: Bits, state: KeyState, placed: &Bits) -> bool {
        let entered = self.by_done.entry((done, state)).or_default();
        if entered.iter().any(|e| e.is_subset(placed)) {
            return false;
        }
        entered.retain(|e| !placed.is_subset(e));
        entered.push(placed.clone());
        true
    }
}
