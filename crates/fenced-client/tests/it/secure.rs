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

/// The wire protocol over TLS (`fenceds://`): the server's wire listener speaks TLS
/// whenever it has `tls_cert`; the client checks the certificate against the CA,
/// authenticates, and runs a whole lock cycle and a fenced write on it. A client that
/// does not trust the certificate is refused at the handshake, and a plain `fenced://`
/// client gets no answer from a TLS listener.
#[tokio::test]
async fn the_wire_protocol_over_tls_with_the_servers_ca() {
    let dir = TempDir::new("wire-tls");
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("cert");
    let (cert_file, key_file, token_file) =
        (dir.path().join("cert.pem"), dir.path().join("key.pem"), dir.path().join("token"));
    std::fs::write(&cert_file, cert.pem()).expect("write cert");
    std::fs::write(&key_file, key_pair.serialize_pem()).expect("write key");
    std::fs::write(&token_file, "wire-secret").expect("write token");
    let args = [
        "--tls-cert".to_owned(),
        cert_file.display().to_string(),
        "--tls-key".into(),
        key_file.display().to_string(),
        "--auth-token-file".into(),
        token_file.display().to_string(),
    ];
    let server = Server::start_wire(&args).await;
    let endpoint = server.wire_endpoint().replace("fenced://", "fenceds://");
    let client = Client::builder()
        .endpoint(&endpoint)
        .tls_ca_pem(cert.pem())
        .auth_token("wire-secret")
        .request_timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let guard = client.lock("wire/tls").ttl(Duration::from_secs(5)).try_acquire().await.expect("acquire over fenceds");
    let written = client.store().put("wire/tls/key", guard.token(), b"over tls").await.expect("a fenced write");
    assert!(matches!(written, fenced_client::Fenced::Accepted(_)), "{written:?}");
    guard.release().await.expect("release");
    // Without the token: refused, typed.
    let anonymous = Client::builder().endpoint(&endpoint).tls_ca_pem(cert.pem()).build().expect("client");
    assert!(matches!(anonymous.lock("wire/tls").try_acquire().await, Err(Error::Unauthorised(_))));
    // A client that does not trust the certificate: no connection at all.
    let untrusting = Client::builder().endpoint(&endpoint).auth_token("wire-secret").build().expect("client");
    let refused = untrusting.lock("wire/tls").try_acquire().await;
    assert!(matches!(refused, Err(Error::BadRequest(ref m)) if m.contains("TLS")), "{refused:?}");
    // A plain client on the TLS listener: nothing it sends is taken as a frame.
    let plain = Client::builder()
        .endpoint(server.wire_endpoint())
        .auth_token("wire-secret")
        .request_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    assert!(plain.lock("wire/tls").try_acquire().await.is_err(), "plain frames on a TLS listener");
}
