//! The server's built-in store through `Client::store`.

use fenced_client::{Client, Fenced, Token};

use crate::support::Server;

/// Grants and releases a scratch lock until token `up_to` was issued: the store refuses
/// tokens the lock service never issued, so tests that write made-up tokens mint them.
async fn mint(client: &Client, up_to: u64) {
    loop {
        let g = client.lock("test/mint").try_acquire().await.expect("mint");
        let token = g.token().get();
        g.release().await.expect("release");
        if token >= up_to {
            return;
        }
    }
}

#[tokio::test]
async fn store_refuses_stale_tokens() {
    let server = Server::start().await;
    mint(&server.client(), 9).await;
    super::stale_token_is_refused_and_changes_nothing(&server.client().store(), "accounts/1").await;
}

#[tokio::test]
async fn store_interleaved_writers() {
    let server = Server::start().await;
    let client = server.client();
    super::interleaved_writers_leave_the_newer_value(&client, &client.store(), "k", "locks/k").await;
}

#[tokio::test]
async fn store_counter_workload() {
    let server = Server::start().await;
    let client = server.client();
    super::counter_workload_loses_no_update(&client, &client.store(), "counter", "locks/counter").await;
}

#[tokio::test]
async fn store_plain_reads_and_absent_keys() {
    let server = Server::start().await;
    let store = server.client().store();
    mint(&server.client(), 4).await;
    let t = |n| Token::new(n).expect("non-zero");
    let absent = store.get("nothing/here", None).await.expect("get");
    assert!(matches!(absent, Fenced::Accepted(ref r) if r.value.is_none()), "{absent:?}");
    assert_eq!(store.put("a b/c", t(4), b"v").await.expect("put"), Fenced::Accepted(t(4)));
    let plain = store.get("a b/c", None).await.expect("get");
    assert!(
        matches!(plain, Fenced::Accepted(ref r) if r.value.as_deref() == Some(&b"v"[..]) && r.highest_seen == Some(t(4)))
    );
}
