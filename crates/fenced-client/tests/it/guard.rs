//! The guard's lost-lock signal: paused keepalive, stopped server, revoked lease,
//! crashed and restarted server; withdrawn waiters; with_lock.

use std::time::Duration;

use fenced_client::{Error, LockOptions, LostReason};
use tokio::time::{timeout, Instant};

use crate::support::Server;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Bound on anything a test awaits, so a bug hangs nothing.
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn paused_keepalive_is_lost_by_valid_until() {
    let server = Server::start().await;
    let client = server.client();
    let ttl = ms(2000);
    // Half the TTL: the margin a client on a loaded machine needs for its own timer to run
    // (the CI machine once ran it 734 ms late with a 500 ms margin, beside a flood test).
    let margin = ms(1000);
    let sent = Instant::now();
    let guard = client.lock("jobs/pause").ttl(ttl).margin(margin).try_acquire().await.expect("acquire");
    let answered = Instant::now();
    let valid_until = guard.valid_until();
    // Counted from the send of the acquire (between `sent` and `answered`), minus the margin.
    assert!(valid_until >= sent + ttl - margin && valid_until <= answered + ttl - margin);
    assert!(guard.is_valid());
    guard.pause_keepalive(true); // as a long GC pause would
    let reason = timeout(PATIENCE, guard.lost()).await.expect("lost() resolves");
    let lost_at = Instant::now();
    assert_eq!(reason, LostReason::Expired);
    assert_eq!(guard.valid_until(), valid_until, "no keepalive extended the deadline");
    // The client gave up before the server could have expired the lease (it started
    // after `sent`): nobody else can have been granted the lock while this guard said valid.
    assert!(lost_at < sent + ttl, "lost() resolved {:?} after the server-side expiry", lost_at - (sent + ttl));
    assert!(!guard.is_valid());
    assert!(matches!(guard.check(), Err(Error::Lost(LostReason::Expired))));
    assert!(guard.cancellation().is_cancelled());
    // The server frees the lock once the lease runs out there; the next grant is newer.
    let next = client.lock("jobs/pause").ttl(ms(2000)).wait(ms(10_000)).acquire().await.expect("next holder");
    assert!(next.token() > guard.token());
    assert!(matches!(guard.release().await, Err(Error::Lost(LostReason::Expired))));
    next.release().await.expect("release");
}

#[tokio::test]
async fn keepalive_keeps_the_lock_past_its_ttl() {
    let server = Server::start().await;
    let client = server.client();
    // TTL/3 between keepalives leaves a loaded machine most of a second of slack.
    let guard = client.lock("jobs/long").ttl(ms(1500)).try_acquire().await.expect("acquire");
    let first = guard.valid_until();
    tokio::time::sleep(ms(3000)).await;
    assert!(guard.is_valid(), "lost: {:?}", guard.lost_reason());
    assert!(guard.valid_until() > first);
    assert!(matches!(client.lock("jobs/long").try_acquire().await, Err(Error::LockHeld { .. })));
    guard.release().await.expect("release");
    client.lock("jobs/long").try_acquire().await.expect("free after release").release().await.expect("release");
}

#[tokio::test]
async fn stopped_server_is_lost_without_its_answer() {
    let server = Server::start().await;
    let client = server.client();
    let ttl = ms(2000);
    let sent = Instant::now();
    let guard = client.lock("jobs/stop").ttl(ttl).margin(ms(500)).try_acquire().await.expect("acquire");
    server.signal(libc::SIGSTOP);
    let reason = timeout(PATIENCE, guard.lost()).await.expect("lost() resolves while the server is stopped");
    let lost_at = Instant::now();
    server.signal(libc::SIGCONT);
    assert!(matches!(reason, LostReason::Expired | LostReason::KeepaliveTooLate), "{reason:?}");
    assert!(lost_at < sent + ttl, "lost() resolved {:?} after the server-side expiry", lost_at - (sent + ttl));
    let next = client.lock("jobs/stop").wait(ms(10_000)).acquire().await.expect("next holder");
    assert!(next.token() > guard.token());
    next.release().await.expect("release");
}

#[tokio::test]
async fn revoked_lease_is_lost_at_the_next_keepalive() {
    let server = Server::start().await;
    let client = server.client();
    let guard = client.lock("orders/42").ttl(ms(3000)).try_acquire().await.expect("acquire");
    assert_eq!(guard.name().as_str(), "orders/42");
    client.revoke_lease(guard.lease_id()).await.expect("revoke");
    let reason = timeout(PATIENCE, guard.lost()).await.expect("lost() resolves");
    assert_eq!(reason, LostReason::LeaseNotFound);
    let next = client.lock("orders/42").try_acquire().await.expect("free once revoked");
    assert!(next.token() > guard.token());
    next.release().await.expect("release");
}

#[tokio::test]
async fn crashed_server_grants_nothing_until_the_old_holder_lets_go() {
    let mut server = Server::start().await;
    let client = server.client();
    let guard = client.lock("jobs/crash").ttl(ms(1500)).try_acquire().await.expect("acquire");
    server.crash_and_restart().await;
    let other = server.client();
    // The lock is in the log: after the restart it is still the holder's.
    match other.lock("jobs/crash").try_acquire().await {
        Err(Error::LockHeld { .. }) | Err(Error::Unavailable { .. }) => {}
        Ok(g) => panic!("granted token {} after a restart while {} is held", g.token(), guard.token()),
        Err(e) => panic!("unexpected error {e}"),
    }
    // The holder's keepalives reconnect, so it normally still holds it; if the restart
    // outlasted its client-side deadline it knows it lost, and the server lets the lease
    // run out before granting. Either way, nobody else holds it before it lets go.
    let (token, lost) = (guard.token(), guard.lost_reason());
    let next = other.lock("jobs/crash").ttl(ms(1500)).wait(ms(15_000)).acquire();
    let release = async {
        if lost.is_none() {
            guard.release().await.expect("the holder kept its lock across the restart");
        }
    };
    let (next, ()) = tokio::join!(next, release);
    let next = next.expect("granted once the holder let go");
    assert!(next.token() > token, "tokens survive a crash");
    next.release().await.expect("release");
}

#[tokio::test]
async fn dropping_a_pending_acquire_withdraws_the_waiter() {
    let server = Server::start().await;
    let client = server.client();
    let holder = client.lock("queue").ttl(ms(5000)).try_acquire().await.expect("acquire");
    let pending = client.lock("queue").wait(ms(10_000)).acquire();
    assert!(timeout(ms(300), pending).await.is_err(), "still waiting, then dropped");
    let mut waiters = u64::MAX;
    for _ in 0..100 {
        let info = client.lock_info("queue").await.expect("info");
        waiters = info["waiters"].as_u64().expect("waiters");
        if waiters == 0 {
            break;
        }
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(waiters, 0, "the dropped waiter left the queue");
    holder.release().await.expect("release");
    client.lock("queue").try_acquire().await.expect("nobody else was granted it").release().await.expect("release");
}

#[tokio::test]
async fn with_lock_runs_the_work_and_releases() {
    let server = Server::start().await;
    let client = server.client();
    let opts = LockOptions { ttl: ms(2000), ..LockOptions::default() };
    let (token, out) = client
        .with_lock("jobs/with", opts, |token, cancel| async move {
            assert!(!cancel.is_cancelled());
            (token, 7)
        })
        .await
        .expect("with_lock");
    assert_eq!(out, 7);
    let again = client.lock("jobs/with").try_acquire().await.expect("released after the work");
    assert!(again.token() > token);
    again.release().await.expect("release");
}

#[tokio::test]
async fn with_lock_cancels_the_work_when_the_lock_is_lost() {
    let server = Server::start().await;
    let client = server.client();
    let pid = server.child.id() as libc::pid_t;
    let opts = LockOptions { ttl: ms(2000), wait: Duration::ZERO, margin: None };
    let checker = client.clone();
    let result = client
        .with_lock("jobs/cancel", opts, |token, cancel| async move {
            let (current, _) = checker.check("jobs/cancel", token).await.expect("check");
            assert!(current, "the token is current");
            let locks = checker.locks(Some("jobs/")).await.expect("locks");
            assert_eq!(locks["locks"][0]["token"].as_u64(), Some(token.get()));
            // The server stops answering (a partition, as the client sees it) and comes
            // back only once the client has given the lock up.
            let resume = cancel.clone();
            tokio::spawn(async move {
                resume.cancelled().await;
                // SAFETY: kill(2) on the test's own child.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            });
            // SAFETY: kill(2) on the test's own child.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::future::pending::<()>().await;
            "never finishes"
        })
        .await;
    assert!(matches!(result, Err(Error::Lost(LostReason::Expired | LostReason::KeepaliveTooLate))), "{result:?}");
}
