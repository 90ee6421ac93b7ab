//! Giving locks back: a lease revoked, a stranger's release refused, an operator's revoke
//! of a lock (the next waiter gets a higher token; an implicit lease ends).

use super::*;

#[test]
fn revoke_releases_everything_and_withdraws_waiters() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    t.acquire(acq("b", 1, 0), 0).unwrap();
    t.acquire(acq("c", 2, 0), 0).unwrap();
    t.acquire(acq("c", 1, 500), 0).unwrap();
    effects(&mut t);
    t.revoke(LeaseId(1), 10).unwrap();
    check(
        &mut t,
        &["10 wait-ended c waiter=6 LeaseGone", "10 released a token=1 Revoked", "10 released b token=2 Revoked"],
    );
    assert_eq!(t.revoke(LeaseId(1), 10), Err(Error::LeaseNotFound));
    assert_eq!(t.lock_count(), 1);
}

#[test]
fn ending_an_implicit_lease_is_its_holders_release() {
    // A guard gives back a lock it acquired with an implicit lease by ending that
    // lease: one command, reported as a release (not as a revoke), with no lock-delay.
    let mut t = table();
    let req = Acquire {
        name: name("a"),
        lease: LeaseRef::Implicit { id: LeaseId(3), ttl_ms: TTL },
        wait_ms: 0,
        lock_delay_ms: 500,
        holder: None,
    };
    t.acquire(req, 0).unwrap();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 1_000), 0).unwrap();
    effects(&mut t);
    t.revoke(LeaseId(3), 10).unwrap();
    check(&mut t, &["10 released a token=1 Released", "10 granted a token=2 lease=1 waiter=3"]);
    assert_eq!(t.revoke(LeaseId(3), 10), Err(Error::LeaseNotFound));
}

#[test]
fn release_by_a_stranger_is_refused() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.acquire(acq("a", 1, 0), 0).unwrap();
    assert_eq!(t.release(&name("a"), LeaseId(9), 1), Err(Error::NotHolder { holder: Token::new(1) }));
    assert_eq!(t.release(&name("b"), LeaseId(1), 1), Err(Error::NotHolder { holder: None }));
    assert_eq!(t.check(&name("a"), Token::new(1).unwrap(), 1), (true, Token::new(1)));
    assert_eq!(t.check(&name("a"), Token::new(2).unwrap(), 1), (false, Token::new(1)));
}

fn revoke_lock(t: &mut T, n: &str, token: Option<Token>, now: u64) -> Result<Token, Error> {
    match t.run(Command::RevokeLock { name: name(n), token }, now).1.unwrap() {
        Ok(Answer::Released(t)) => Ok(t),
        Ok(a) => panic!("{a:?}"),
        Err(e) => Err(e),
    }
}

#[test]
fn an_operator_takes_a_lock_from_its_holder_and_the_next_waiter_gets_a_higher_token() {
    let mut t = table();
    t.grant_lease(LeaseId(1), TTL, 0).unwrap();
    t.grant_lease(LeaseId(2), TTL, 0).unwrap();
    let AcquireOutcome::Granted { grant: held } = t.acquire(acq("a", 1, 0), 0).unwrap() else { panic!() };
    t.acquire(acq("b", 1, 0), 0).unwrap();
    let AcquireOutcome::Queued(waiter) = t.acquire(acq("a", 2, TTL), 0).unwrap() else { panic!() };
    t.drain_effects().for_each(drop);

    // Naming another token takes nothing.
    let other = Token::new(held.token.get() + 100).unwrap();
    assert_eq!(revoke_lock(&mut t, "a", Some(other), 1), Err(Error::NotHolder { holder: Some(held.token) }));
    assert_eq!(revoke_lock(&mut t, "a", Some(held.token), 1), Ok(held.token));
    let (ok, _) = t.check(&name("a"), held.token, 1);
    assert!(!ok, "the old token no longer holds");
    let next = t.answers.iter().find(|(r, _)| *r == waiter).expect("the waiter was answered");
    let Ok(Answer::Granted(next)) = &next.1 else { panic!("{next:?}") };
    assert!(next.token > held.token);
    assert!(t.drain_effects().any(|e| matches!(e, Effect::Released { reason: ReleaseReason::Forced, .. })));
    // The holder's lease lives on with its other lock.
    assert!(t.keepalive(LeaseId(1), 2).is_ok());
    assert!(t.check(&name("b"), Token::new(held.token.get() + 1).unwrap(), 2).0);
    // Nobody holds "c": a clear refusal, nothing changed.
    assert_eq!(revoke_lock(&mut t, "c", None, 3), Err(Error::NotHolder { holder: None }));
}

#[test]
fn revoking_a_lock_held_under_an_implicit_lease_ends_that_lease() {
    let mut t = table();
    let AcquireOutcome::Granted { grant } = t.acquire(implicit("a", 9, TTL, 0), 0).unwrap() else { panic!() };
    assert_eq!(revoke_lock(&mut t, "a", None, 1), Ok(grant.token));
    assert_eq!(t.keepalive(LeaseId(9), 2), Err(Error::LeaseNotFound), "the guard hears at its next keepalive");
}
