//! Tests of `gate`.

use super::*;

fn t(n: u64) -> Option<Token> {
    Token::new(n)
}

#[test]
fn the_rule() {
    let mut gate = FenceGate::new();
    assert!(matches!(gate.admit("k", t(33), Op::Write), Admission::Accepted { .. }));
    assert!(matches!(gate.admit("k", t(34), Op::Write), Admission::Accepted { .. }));
    // The zombie wakes up with 33.
    assert_eq!(
        gate.admit("k", t(33), Op::Write),
        Admission::Rejected { token: Token::new(33).unwrap(), highest_seen: Token::new(34).unwrap() }
    );
    // Equal tokens pass: the holder writes many times.
    assert!(gate.admit("k", t(34), Op::Write).is_accepted());
    assert_eq!(gate.admit("k", None, Op::Write), Admission::TokenRequired { highest_seen: t(34) });
    assert_eq!(gate.admit("k", None, Op::Read), Admission::PlainRead { highest_seen: t(34) });
    // Keys are independent.
    assert!(gate.admit("other", t(1), Op::Write).is_accepted());
}

#[test]
fn fenced_reads_advance_the_mark() {
    let mut gate = FenceGate::new();
    gate.admit("k", t(5), Op::Write);
    assert!(gate.admit("k", t(9), Op::Read).is_accepted());
    assert_eq!(gate.highest_seen(&"k"), t(9));
    assert!(matches!(gate.admit("k", t(5), Op::Write), Admission::Rejected { .. }));
    assert!(matches!(gate.admit("k", t(8), Op::Read), Admission::Rejected { .. }));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the sequence, the mark is the running maximum of the tokens seen,
        /// every accepted token is at least the mark before it, every rejected one is
        /// below it, and a refusal changes nothing.
        #[test]
        fn mark_is_running_max(ops in prop::collection::vec((0u64..20, any::<bool>(), 0u8..3), 0..200)) {
            let mut gate = FenceGate::new();
            let mut model: [Option<u64>; 3] = [None; 3];
            for (raw, is_read, key) in ops {
                let op = if is_read { Op::Read } else { Op::Write };
                let token = Token::new(raw);
                let before = gate.highest_seen(&key);
                let a = gate.admit(key, token, op);
                let m = &mut model[key as usize];
                match a {
                    Admission::Accepted { token, .. } => {
                        prop_assert!(m.is_none_or(|m| token.get() >= m));
                        *m = Some(token.get());
                    }
                    Admission::Rejected { token, highest_seen } => {
                        prop_assert!(token < highest_seen);
                        prop_assert_eq!(gate.highest_seen(&key), before);
                    }
                    Admission::TokenRequired { .. } => prop_assert!(token.is_none() && !is_read),
                    Admission::PlainRead { .. } => prop_assert!(token.is_none() && is_read),
                }
                prop_assert_eq!(gate.highest_seen(&key).map(Token::get), *m);
            }
        }
    }
}
