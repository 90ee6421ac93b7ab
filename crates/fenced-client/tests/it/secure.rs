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

/// A certificate authority made with rcgen, and certificates it issues for clients.
struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} CA"));
        let cert = params.self_signed(&key).expect("a CA");
        TestCa { cert, key }
    }

    /// A client certificate with subject `CN=cn` (PEM chain, PEM key).
    fn client(&self, cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("a client certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// Identities by client certificate (`client_ca`, `cert_subject`), over HTTPS and the
/// TLS wire protocol: the certificate of CN=billing is the identity `billing`, with its
/// rights and no more; no certificate and no token, a certificate whose subject is no
/// identity, and the same subject from another CA (refused at the handshake) get
/// nothing; a token identity still works without a certificate.
#[tokio::test]
async fn identities_by_client_certificate_over_https_and_fenceds() {
    let dir = TempDir::new("client-certs");
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("cert");
    let clients = TestCa::new("clients");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p.display().to_string()
    };
    let args = [
        "--tls-cert".to_owned(),
        file("cert.pem", &cert.pem()),
        "--tls-key".into(),
        file("key.pem", &key_pair.serialize_pem()),
        "--client-ca".into(),
        file("clients-ca.pem", &clients.cert.pem()),
        "--identities-file".into(),
        file(
            "identities.toml",
            "[[identity]]\nname = \"billing\"\ncert_subject = \"CN=billing\"\n\
             allow = [{ prefix = \"billing/\", ops = [\"lock\", \"store_read\", \"store_write\"] }]\n\
             [[identity]]\nname = \"admin\"\ntoken_file = \"admin.token\"\n\
             allow = [{ prefix = \"\", ops = [\"lock\", \"store_read\", \"store_write\", \"admin\"] }]\n",
        ),
    ];
    file("admin.token", "admin-secret");
    let server = Server::start_wire(&args).await;
    let endpoints =
        [format!("https://127.0.0.1:{}", server.port), server.wire_endpoint().replace("fenced://", "fenceds://")];
    let (billing_pem, billing_key) = clients.client("billing");
    let (stranger_pem, stranger_key) = clients.client("stranger");
    let (rogue_pem, rogue_key) = TestCa::new("rogue").client("billing");
    for endpoint in &endpoints {
        let with = |pem: Option<(&str, &str)>, token: Option<&str>| {
            let mut b =
                Client::builder().endpoint(endpoint).tls_ca_pem(cert.pem()).request_timeout(Duration::from_secs(5));
            if let Some((c, k)) = pem {
                b = b.tls_client_pem(c.as_bytes(), k.as_bytes());
            }
            if let Some(t) = token {
                b = b.auth_token(t);
            }
            b.build().expect("client")
        };
        let billing = with(Some((&billing_pem, &billing_key)), None);
        let guard = billing.lock("billing/run").try_acquire().await.unwrap_or_else(|e| panic!("{endpoint}: {e}"));
        let written = billing.store().put("billing/total", guard.token(), b"42").await.expect("a fenced write");
        assert!(matches!(written, fenced_client::Fenced::Accepted(_)), "{endpoint}: {written:?}");
        guard.release().await.expect("release");
        // Its rights and no more.
        let refused = billing.lock("orders/1").try_acquire().await;
        assert!(
            matches!(refused, Err(Error::Unauthorised(ref m)) if m.contains("orders/1")),
            "{endpoint}: {refused:?}"
        );
        // No credential; a subject that is no identity: 401.
        for nobody in [with(None, None), with(Some((&stranger_pem, &stranger_key)), None)] {
            let r = nobody.lock("billing/run").try_acquire().await;
            assert!(matches!(r, Err(Error::Unauthorised(_))), "{endpoint}: {r:?}");
        }
        // The same subject signed by another CA: no TLS session at all.
        let rogue = with(Some((&rogue_pem, &rogue_key)), None).lock("billing/run").try_acquire().await;
        assert!(rogue.is_err() && !matches!(rogue, Err(Error::Unauthorised(_))), "{endpoint}: {rogue:?}");
        // A token identity needs no certificate.
        let admin = with(None, Some("admin-secret"));
        admin.lock("orders/1").try_acquire().await.expect("the admin's token").release().await.expect("release");
    }
}
