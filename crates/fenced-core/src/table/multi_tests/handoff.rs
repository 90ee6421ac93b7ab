//! A set's wait that ends hands every name on, a withdrawn grant gives all back, and an
//! implicit retry of a queued set is granted with its original.

use super::*;

#[test]
fn a_wait_that_ends_hands_every_name_on_and_a_withdrawn_grant_gives_all_back() {
    let mut m = M::new(4);
    m.run(one("b", 1, 0), 0);
    let both = m.run(all(&["a", "b"], 2, 500), 1);
    let single = m.run(one("a", 3, 60_000), 2);
    assert_eq!(m.answer(single), None, "behind the waiter for both");
    let mut out = m.t.apply(RequestId(1_000), Command::Tick, 600);
    m.answers.append(&mut out.answers);
    assert!(matches!(m.answer(both), Some(Err(Error::LockHeld { .. }))), "its wait ended");
    assert_eq!(m.holder("a"), Some(LeaseId(3)), "its leaving granted a to the next in line");
    // A queued set granted, then withdrawn by its departed caller: every name back.
    let late = m.run(all(&["c", "d"], 4, 60_000), 700);
    assert!(matches!(m.answer(late), Some(Ok(Answer::GrantedAll(_)))), "c and d were free");
    m.run(one("c", 1, 0), 700);
    let queued = m.run(all(&["c", "e"], 2, 60_000), 701);
    m.run(Command::Revoke { lease: LeaseId(4) }, 702);
    m.run(Command::Release { name: n("c"), lease: LeaseId(1) }, 703);
    assert!(matches!(m.answer(queued), Some(Ok(Answer::GrantedAll(_)))));
    m.run(Command::Cancel { request: queued }, 704);
    assert_eq!((m.holder("c"), m.holder("e")), (None, None), "given back together");
}

#[test]
fn an_implicit_retry_of_a_queued_set_is_granted_with_its_original() {
    let mut m = M::new(1);
    m.run(one("a", 1, 0), 0);
    let implicit = |wait_ms| {
        let names = vec![n("a"), n("b")];
        let lease = LeaseRef::Implicit { id: LeaseId(77), ttl_ms: TTL };
        Command::AcquireAll(AcquireAll { names, lease, wait_ms, lock_delay_ms: 0, holder: None })
    };
    let first = m.run(implicit(60_000), 1);
    let retry = m.run(implicit(60_000), 2);
    assert_eq!((m.answer(first), m.answer(retry)), (None, None));
    m.run(Command::Release { name: n("a"), lease: LeaseId(1) }, 3);
    let (a, b) = (tokens(m.answer(first)), tokens(m.answer(retry)));
    assert_eq!(a, b, "one grant, told twice");
    m.run(Command::Cancel { request: first }, 4);
    assert_eq!(m.holder("a"), Some(LeaseId(77)), "the retry was told of it too: it stays");
    let again = m.run(implicit(0), 5);
    assert_eq!(tokens(m.answer(again)), a, "a third try gets the same grant");
}
