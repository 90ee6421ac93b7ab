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
    // The leader may say it leads before the follower heard of it (its first heartbeat):
    // a client given only the follower would be told `not_leader` with no leader named.
    let (leader_id, follower) = (
        leader.cluster().await.expect("the leader's view")["id"].clone(),
        Client::builder().endpoint(&c.http[f]).request_timeout(ms(5_000)).build().expect("client"),
    );
    let deadline = Instant::now() + ms(20_000);
    while follower.cluster().await.map(|v| v["leader_id"].clone()).ok() != Some(leader_id.clone()) {
        assert!(Instant::now() < deadline, "the follower did not learn of the leader within 20 s");
        sleep(ms(20)).await;
    }

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

/// Two identities: `locker` may take locks, `writer` may also write `acct/`.
const IDENTITIES: &str = r#"
[[identity]]
name = "locker"
token_file = "locker.token"
allow = [{ prefix = "", ops = ["lock"] }]

[[identity]]
name = "writer"
token_file = "writer.token"
allow = [{ prefix = "", ops = ["lock"] }, { prefix = "acct/", ops = ["lock", "store_read", "store_write"] }]
"#;

/// The attack through a follower: a forwarded call is decided by the leader as the
/// caller's own identity, over HTTP and over the wire protocol alike. An identity that
/// may take locks but not write the store holds a lock on `acct/x` and writes with its
/// token through a follower: refused, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_call_opens_no_more_than_its_callers_identity() {
    let dir = std::env::temp_dir().join(format!("fenced-forward-ids-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    for who in ["locker", "writer"] {
        std::fs::write(dir.join(format!("{who}.token")), format!("{who}-token\n")).expect("token file");
    }
    let file = dir.join("identities.toml");
    std::fs::write(&file, IDENTITIES).expect("identities file");
    // Without peer certificates the members present this token to each other.
    let members = dir.join("members.token");
    std::fs::write(&members, "members-token\n").expect("token file");
    let flags = ["--identities-file".into(), file.display().to_string()];
    let flags = [&flags[..], &["--auth-token-file".into(), members.display().to_string()]].concat();
    let c = Cluster::start_with(&flags).await;
    let as_who = |endpoint: &str, who: &str| {
        Client::builder()
            .endpoint(endpoint)
            .auth_token(format!("{who}-token"))
            .request_timeout(ms(5_000))
            .build()
            .expect("client")
    };
    let deadline = Instant::now() + ms(20_000);
    let l = loop {
        let mut found = None;
        for (i, url) in c.http.iter().enumerate() {
            let v = as_who(url, "writer").cluster().await;
            if let Ok(v) = v {
                if v["leader_id"].as_u64().is_some() && v["leader_id"] == v["id"] {
                    found = Some(i);
                }
            }
        }
        if let Some(i) = found {
            break i;
        }
        assert!(Instant::now() < deadline, "no leader within 20 s");
        sleep(ms(50)).await;
    };
    let f = (0..3).find(|i| *i != l).expect("a follower");
    for (how, endpoint) in [("http", &c.http[f]), ("wire", &c.wire[f])] {
        let key = format!("acct/{how}");
        let writer = as_who(endpoint, "writer");
        let wg = writer.lock(key.as_str()).ttl(ms(10_000)).try_acquire().await.expect("the writer's lock");
        let put = writer.store().put(&key, wg.token(), b"the writer's").await.expect("the writer writes");
        assert!(put.is_accepted(), "{how}: {put:?}");
        wg.release().await.expect("release");

        let locker = as_who(endpoint, "locker");
        let lg = locker.lock(key.as_str()).ttl(ms(10_000)).try_acquire().await.expect("the locker may lock");
        match locker.store().put(&key, lg.token(), b"the locker's").await {
            Err(Error::Unauthorised(why)) => assert!(why.contains("store_write"), "{how}: {why}"),
            other => panic!("{how}: a store write through a follower by an identity without store_write: {other:?}"),
        }
        let read = writer.store().get(&key, None).await.expect("read").into_result().expect("unfenced read");
        assert_eq!(read.value.as_deref(), Some(&b"the writer's"[..]), "{how}: the refused write changed the value");
        lg.release().await.expect("release");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
