//! The fence gate: the resource-side rule that makes a lease-based lock safe.
//!
//! Per resource key the gate keeps `highest_seen`. An operation carrying token `t` is
//! accepted iff `t >= highest_seen`, and then `highest_seen := t`. Reads that carry a
//! token advance the mark too (a fenced read), so a new holder's first read already
//! shuts out every older holder. A write without a token is refused. A refusal is a
//! value, not an error: it says which token was refused and what the gate had seen.

use std::collections::HashMap;
use std::hash::Hash;

use crate::Token;

/// What the operation does to the resource.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Read,
    Write,
}

/// The gate's answer for one operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Admission {
    /// Go ahead; the mark is now `token` (it was `highest_seen_before`).
    Accepted { token: Token, highest_seen_before: Option<Token> },
    /// A newer holder has already touched the resource.
    Rejected { token: Token, highest_seen: Token },
    /// A write came without a token.
    TokenRequired { highest_seen: Option<Token> },
    /// A read without a token: allowed, the mark does not move.
    PlainRead { highest_seen: Option<Token> },
}

impl Admission {
    pub fn is_accepted(self) -> bool {
        matches!(self, Admission::Accepted { .. } | Admission::PlainRead { .. })
    }

    /// The mark after this operation.
    pub fn highest_seen(self) -> Option<Token> {
        match self {
            Admission::Accepted { token, .. } => Some(token),
            Admission::Rejected { highest_seen, .. } => Some(highest_seen),
            Admission::TokenRequired { highest_seen } | Admission::PlainRead { highest_seen } => highest_seen,
        }
    }
}

/// The rule itself, for resources that keep the mark in their own storage (the
/// server's store keeps it in the same transaction as the value). `highest_seen` is
/// the stored mark, `None` for a key never touched with a token.
pub fn admit(highest_seen: Option<Token>, token: Option<Token>, op: Op) -> Admission {
    match (token, op) {
        (None, Op::Write) => Admission::TokenRequired { highest_seen },
        (None, Op::Read) => Admission::PlainRead { highest_seen },
        (Some(token), _) => match highest_seen {
            Some(mark) if token < mark => Admission::Rejected { token, highest_seen: mark },
            _ => Admission::Accepted { token, highest_seen_before: highest_seen },
        },
    }
}

/// An in-memory gate over many keys, for the simulator and for resources that can
/// keep the marks in memory.
#[derive(Debug, Default)]
pub struct FenceGate<K: Hash + Eq> {
    marks: HashMap<K, Token, rustc_hash::FxBuildHasher>,
}

impl<K: Hash + Eq> FenceGate<K> {
    pub fn new() -> Self {
        FenceGate { marks: HashMap::default() }
    }

    pub fn highest_seen(&self, key: &K) -> Option<Token> {
        self.marks.get(key).copied()
    }

    /// Applies the rule and, when accepted with a token, advances the mark.
    pub fn admit(&mut self, key: K, token: Option<Token>, op: Op) -> Admission {
        let before = self.marks.get(&key).copied();
        let admission = admit(before, token, op);
        if let Admission::Accepted { token, .. } = admission {
            // Invariant relied on by every reader of the gate: the mark never goes down.
            assert!(before.is_none_or(|mark| token >= mark), "fence mark would regress");
            self.marks.insert(key, token);
        }
        admission
    }
}

#[cfg(test)]
mod tests;
