//! Auth tokens and TLS against a server that requires them.

use std::time::Duration;

use fenced_client::{Client, Error};

use crate::support::{Server, TempDir};

#[tokio::test]
async fn the_auth_token_is_sent_and_its_absence_is_a_typed_error() {
    let dir = TempDir::new("auth");
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret").expect("write token file");
    let server = Server::start_with(&["--auth-token-file".into(), file.display().to_string()]).await;
    let anonymous = Client::builder().endpoint(server.endpoint()).build().expect("client");
    match anonymous.lock("secured").try_acquire().await {
        Err(Error::Unauthorised(_)) => {}
        other => panic!("expected Unauthorised, got {other:?}"),
    }
    let client = Client::builder().endpoint(server.endpoint()).auth_token("s3cret").build().expect("client");
    let guard = client.lock("secured").ttl(Duration::from_millis(1500)).try_acquire().await.expect("acquire");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(guard.is_valid(), "keepalives carry the token too: {:?}", guard.lost_reason());
    guard.release().await.expect("release");
}

#[tokio::test]
async fn https_with_the_servers_ca() {
    let dir = TempDir::new("tls");
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("cert");
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).expect("write cert");
    std::fs::write(&key_file, key_pair.serialize_pem()).expect("write key");
    let args =
        ["--tls-cert".to_owned(), cert_file.display().to_string(), "--tls-key".into(), key_file.display().to_string()];
    let server = Server::start_with(&args).await;
    let endpoint = format!("https://127.0.0.1:{}", server.port);
    let client = Client::builder().endpoint(&endpoint).tls_ca_pem(cert.pem()).build().expect("client");
    let guard = client.lock("tls/lock").try_acquire().await.expect("acquire over https");
    guard.release().await.expect("release");
    // A server whose certificate does not chain to a trusted root is not talked to.
    let untrusting = Client::builder().endpoint(&endpoint).build().expect("client");
    assert!(matches!(untrusting.lock("tls/lock").try_acquire().await, Err(Error::Unavailable { .. })));
}
