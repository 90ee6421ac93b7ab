//! The client over the wire protocol (`fenced://`): the same API, one multiplexed
//! connection, against a real server binary.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fenced_client::{Client, Error, Fenced, StoreRead};

use crate::support::{Server, TempDir};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test]
async fn every_call_works_over_the_wire() {
    let server = Server::start_wire(&[]).await;
    let client = server.wire_client();
    assert!(client.endpoint().starts_with("fenced://"));
    let guard = client.lock("orders/42").ttl(ms(3000)).try_acquire().await.expect("acquire");
    let token = guard.token();
    assert!(matches!(client.lock("orders/42").try_acquire().await, Err(Error::LockHeld { .. })));
    assert_eq!(client.check("orders/42", token).await.expect("check"), (true, Some(token)));
    client.keepalive(guard.lease_id()).await.expect("keepalive");
    let store = client.store();
    assert_eq!(store.put("k", token, b"v1").await.expect("put"), Fenced::Accepted(token));
    let read = store.get("k", Some(token)).await.expect("get");
    assert_eq!(read, Fenced::Accepted(StoreRead { value: Some(b"v1".to_vec()), highest_seen: Some(token) }));
    let absent = store.get("nothing-here", None).await.expect("get absent");
    assert_eq!(absent, Fenced::Accepted(StoreRead { value: None, highest_seen: None }));
    guard.release().await.expect("release");
    // The HTTP API sees the same table: the next token, over HTTP, is higher.
    let over_http = server.client().lock("orders/42").try_acquire().await.expect("acquire over http");
    assert!(over_http.token() > token);
    let stale = store.put("k", token, b"late").await.expect("stale put");
    assert!(matches!(stale, Fenced::Accepted(_)), "nobody newer wrote yet: accepted");
    assert_eq!(store.put("k", over_http.token(), b"v2").await.expect("put"), Fenced::Accepted(over_http.token()));
    assert_eq!(
        store.put("k", token, b"zombie").await.expect("put"),
        Fenced::Rejected { token, highest_seen: over_http.token() }
    );
    client.revoke_lease(over_http.lease_id()).await.expect("revoke");
    let again = client.lock("orders/42").try_acquire().await.expect("free after the revoke");
    again.release().await.expect("release");
    // The views are HTTP's alone.
    assert!(matches!(client.locks(None).await, Err(Error::BadRequest(_))));
}

#[tokio::test]
async fn many_clients_share_one_connection_and_stay_exclusive() {
    let server = Server::start_wire(&[]).await;
    let client = server.wire_client();
    // 32 tasks on their own locks, all in flight at once on one connection.
    let own: Vec<_> = (0..32)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move {
                let g = c.lock(format!("own/{i}")).try_acquire().await.expect("acquire");
                let t = g.token();
                g.release().await.expect("release");
                t
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in own {
        tokens.push(t.await.expect("task"));
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 32, "every grant has its own token");
    // 8 tasks on one lock, queued server-side: one holder at a time.
    let inside = Arc::new(AtomicU32::new(0));
    let shared: Vec<_> = (0..8)
        .map(|_| {
            let (c, inside) = (client.clone(), inside.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let g = c.lock("shared").wait(Duration::from_secs(20)).acquire().await.expect("acquire");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    tokio::time::sleep(ms(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            })
        })
        .collect();
    for t in shared {
        t.await.expect("task");
    }
}

#[tokio::test]
async fn a_dropped_acquire_leaves_the_queue() {
    let server = Server::start_wire(&[]).await;
    let client = server.wire_client();
    let holder = client.lock("q").try_acquire().await.expect("acquire");
    let waiter = {
        let c = client.clone();
        tokio::spawn(async move { c.lock("q").wait(Duration::from_secs(30)).acquire().await })
    };
    let http = server.client();
    let waiters = |v: serde_json::Value| v["waiters"].as_u64().unwrap_or(0);
    for _ in 0..100 {
        if waiters(http.lock_info("q").await.expect("info")) == 1 {
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert_eq!(waiters(http.lock_info("q").await.expect("info")), 1);
    waiter.abort();
    for _ in 0..100 {
        if waiters(http.lock_info("q").await.expect("info")) == 0 {
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert_eq!(waiters(http.lock_info("q").await.expect("info")), 0, "the waiter was withdrawn");
    holder.release().await.expect("release");
    let next = client.lock("q").try_acquire().await.expect("nobody else got it");
    next.release().await.expect("release");
}

#[tokio::test]
async fn auth_is_required_on_the_wire_too() {
    let dir = TempDir::new("wire-auth");
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret").expect("write token file");
    let server = Server::start_wire(&["--auth-token-file".into(), file.display().to_string()]).await;
    let anonymous = server.wire_client();
    assert!(matches!(anonymous.lock("secured").try_acquire().await, Err(Error::Unauthorised(_))));
    let wrong = Client::builder().endpoint(server.wire_endpoint()).auth_token("nope").build().expect("client");
    assert!(matches!(wrong.lock("secured").try_acquire().await, Err(Error::Unauthorised(_))));
    let client = Client::builder().endpoint(server.wire_endpoint()).auth_token("s3cret").build().expect("client");
    let guard = client.lock("secured").ttl(ms(1500)).try_acquire().await.expect("acquire");
    tokio::time::sleep(ms(2000)).await;
    assert!(guard.is_valid(), "keepalives ride the authenticated connection: {:?}", guard.lost_reason());
    guard.release().await.expect("release");
}

#[tokio::test]
async fn kill_9_and_restart_keep_tokens_rising_and_the_client_reconnects() {
    let mut server = Server::start_wire(&[]).await;
    let client = server.wire_client();
    let mut last = None;
    for _ in 0..20 {
        let g = client.lock("crash").ttl(ms(1000)).try_acquire().await.expect("acquire");
        last = Some(g.token());
        g.release().await.expect("release");
    }
    let guard = client.lock("crash").ttl(ms(1000)).try_acquire().await.expect("acquire");
    server.crash_and_restart().await;
    // The same client reconnects; the lock is in the log, still the holder's.
    match client.lock("crash").try_acquire().await {
        Err(Error::LockHeld { .. }) | Err(Error::Unavailable { .. }) => {}
        Ok(g) => panic!("granted {} after a restart while {} is held", g.token(), guard.token()),
        Err(e) => panic!("unexpected error {e}"),
    }
    let token = guard.token();
    if guard.lost_reason().is_none() {
        let _ = guard.release().await;
    }
    let next = client.lock("crash").ttl(ms(1000)).wait(ms(15_000)).acquire().await.expect("granted once let go");
    assert!(next.token() > token && token > last.expect("tokens"), "tokens survive a crash");
    next.release().await.expect("release");
}

#[tokio::test]
async fn leases_made_by_hand_live_and_die_the_same_on_both_transports() {
    let server = Server::start_wire(&[]).await;
    for client in [server.wire_client(), server.client()] {
        let lease = client.create_lease(ms(2000)).await.expect("create a lease");
        assert_eq!(client.keepalive(lease).await.expect("keepalive"), ms(2000), "{}", client.endpoint());
        client.revoke_lease(lease).await.expect("revoke");
        assert!(matches!(client.keepalive(lease).await, Err(Error::NotFound(_))), "{}", client.endpoint());
        // A TTL out of range is the server's 400, not a lease.
        assert!(client.create_lease(ms(0)).await.is_err(), "{}", client.endpoint());
    }
}

/// A refusal over the wire arrives as the typed error it is, its fields read from the
/// frame's typed fields, and as the same error HTTP gives for the same call.
#[tokio::test]
async fn refusals_arrive_typed_with_their_fields_as_over_http() {
    let server = Server::start_wire(&[]).await;
    for client in [server.wire_client(), server.client()] {
        let at = client.endpoint().to_string();
        let guard = client.lock(format!("typed/{at}")).try_acquire().await.expect("acquire");
        let highest = guard.token();
        let store = client.store();
        let never = fenced_client::Token::new(highest.get() + 1_000).expect("not 0");
        match store.put("typed", never, b"v").await {
            Err(Error::Refused(fenced_core::Error::TokenNotIssued { token, highest_issued })) => {
                assert_eq!((token, highest_issued), (never, Some(highest)), "{at}");
            }
            other => panic!("{at}: {other:?}"),
        }
        let lease = client.create_lease(ms(2000)).await.expect("lease");
        client.revoke_lease(lease).await.expect("revoke");
        match client.keepalive(lease).await {
            Err(Error::NotFound(m)) => assert_eq!(m, fenced_core::Error::LeaseNotFound.to_string(), "{at}"),
            other => panic!("{at}: {other:?}"),
        }
        match client.create_lease(ms(0)).await {
            Err(Error::BadRequest(m)) => assert!(m.starts_with("ttl_ms must be between"), "{at}: {m}"),
            other => panic!("{at}: {other:?}"),
        }
        guard.release().await.expect("release");
    }
}

/// A server of an earlier release, which speaks wire protocol version 2 only, answers
/// the preamble `bad_preamble` in version 2's shape and closes: the call says so, at
/// once, rather than failing as a connection that merely closed.
#[tokio::test]
async fn a_server_of_an_earlier_release_is_named_as_such() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let old_server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut preamble = [0u8; 8];
        s.read_exact(&mut preamble).expect("preamble");
        assert_eq!(preamble, fenced_wire::PREAMBLE, "the client speaks the current version");
        let body = br#"{"error":{"code":"bad_preamble","message":"a wire connection starts with FENCED\\0\\x02"}}"#;
        let mut out = Vec::new();
        fenced_wire::v2::encode_error(&mut out, 0, "bad_preamble", body);
        s.write_all(&out).expect("answer");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        // Read what the client sent until it closes, so that no reset races the answer.
        let _ = s.read_to_end(&mut Vec::new());
    });
    let client = Client::builder()
        .endpoint(format!("fenced://{addr}"))
        .request_timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    // Not `Unavailable` after the request time-out: the server's own refusal.
    match client.create_lease(ms(2000)).await {
        Err(Error::Server { code, message, .. }) => {
            assert_eq!(code, "bad_preamble");
            assert!(message.contains("earlier release") && message.contains("version 3"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    drop(client);
    old_server.join().expect("the old server's thread");
}
