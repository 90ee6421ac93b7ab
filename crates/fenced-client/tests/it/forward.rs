//! Issue 28: one wire address of any member serves the whole protocol. A follower
//! sends each frame that needs the leader to it over the peer channel and writes back
//! the leader's answer frame; a CANCEL drops the forwarded call, and the leader
//! withdraws the waiter. With no leader to reach, the follower answers `not_leader`.

use std::time::Duration;

use fenced_client::{Client, Error};
use tokio::time::{sleep, Instant};

use crate::failover::Cluster;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The leader's count of waiters on `name`, within 5 s of `want`.
async fn waiters_become(leader: &Client, name: &str, want: u64) {
    let deadline = Instant::now() + ms(5_000);
    loop {
        let v = leader.lock_info(name).await.expect("the leader's view of the lock");
        if v["waiters"].as_u64() == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name}: waiters did not become {want}: {v}");
        sleep(ms(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_only_a_followers_wire_address_acquires_writes_waits_and_cancels() {
    let c = Cluster::start().await;
    let l = c.leader().await;
    let f = (0..3).find(|i| *i != l).expect("a follower");
    let client = Client::builder().endpoint(&c.wire[f]).request_timeout(ms(5_000)).build().expect("client");
    let leader = Client::builder().endpoint(&c.http[l]).request_timeout(ms(5_000)).build().expect("client");

    // Grants, fenced writes, a stale write refused, a fenced read and a check.
    let first = client.lock("wfwd-first").ttl(ms(10_000)).try_acquire().await.expect("an acquire through a follower");
    let g = client.lock("wfwd").ttl(ms(10_000)).try_acquire().await.expect("a second acquire");
    assert!(g.token() > first.token());
    let put = client.store().put("wfwd-key", g.token(), b"forwarded").await.expect("a write through a follower");
    assert!(put.is_accepted(), "{put:?}");
    let stale = client.store().put("wfwd-key", first.token(), b"stale").await.expect("a stale write answered");
    assert!(!stale.is_accepted(), "a stale token's write was accepted through a follower: {stale:?}");
    let read = client.store().get("wfwd-key", Some(g.token())).await.expect("a read").into_result().expect("fenced");
    assert_eq!(read.value.as_deref(), Some(&b"forwarded"[..]));
    let (current, _) = client.check("wfwd", g.token()).await.expect("a check through a follower");
    assert!(current);
    // The leader holds what the follower was told.
    let v = leader.lock_info("wfwd").await.expect("view");
    assert_eq!(v["token"].as_u64(), Some(g.token().get()), "{v}");

    // A wait through the follower, granted when the holder releases through it.
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.lock("wfwd").ttl(ms(10_000)).wait(ms(10_000)).acquire().await }
    });
    waiters_become(&leader, "wfwd", 1).await;
    let held = g.token();
    g.release().await.expect("a release through a follower");
    let next = waiting.await.expect("waiter").expect("the waiter was granted");
    assert!(next.token() > held);

    // A waiter given up: the client's CANCEL reaches the follower, which drops the
    // forwarded call, and the leader's queue lets it go.
    let withdrawn = tokio::spawn({
        let client = client.clone();
        async move { client.lock("wfwd").ttl(ms(10_000)).wait(ms(10_000)).acquire().await }
    });
    waiters_become(&leader, "wfwd", 1).await;
    withdrawn.abort();
    waiters_become(&leader, "wfwd", 0).await;
    next.release().await.expect("release");
    first.release().await.expect("release");

    // Its leader and the third member gone: no live leader to forward to.
    let mut members = c.members;
    let _follower = members.remove(f);
    drop(members);
    let lonely = Client::builder().endpoint(&c.wire[f]).request_timeout(ms(3_000)).build().expect("client");
    let deadline = Instant::now() + ms(10_000);
    loop {
        match lonely.lock("wfwd").ttl(ms(1_000)).try_acquire().await {
            // It names the leader it last knew (the client moves on to it when it has
            // more than one endpoint).
            Err(Error::Refused(fenced_core::Error::NotLeader { leader })) => {
                assert_eq!(leader, Some(l as u64 + 1), "the follower named another leader");
                break;
            }
            Err(Error::Unavailable { message, .. }) if !message.contains("retry shortly") => break,
            other => assert!(Instant::now() < deadline, "still answered without a leader: {other:?}"),
        }
        sleep(ms(100)).await;
    }
}
