//! TLS with rustls: a self-signed certificate made by the `openssl` command, a rustls
//! client that trusts exactly that certificate.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_server::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{crypto::ring, ClientConfig, RootCertStore};

use crate::harness::{scratch_dir, TestServer};

#[test]
fn serves_https_with_the_given_certificate() {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, ca) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    let ext = dir.join("ext.cnf");
    std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n").unwrap();
    let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    // A CA, and a leaf certificate for 127.0.0.1 signed by it (webpki refuses a CA
    // certificate as the server's own).
    let steps: [Vec<String>; 3] = [
        ["req", "-x509"]
            .iter()
            .chain(&ec)
            .map(|s| s.to_string())
            .chain(
                ["-days", "1", "-subj", "/CN=fenced-test-ca", "-keyout", &d("ca.key"), "-out", &d("ca.pem")]
                    .map(String::from),
            )
            .collect(),
        ["req"]
            .iter()
            .chain(&ec)
            .map(|s| s.to_string())
            .chain(["-subj", "/CN=localhost", "-keyout", &d("key.pem"), "-out", &d("leaf.csr")].map(String::from))
            .collect(),
        ["x509", "-req", "-in", &d("leaf.csr"), "-CA", &d("ca.pem"), "-CAkey", &d("ca.key"), "-CAcreateserial"]
            .iter()
            .map(|s| s.to_string())
            .chain(["-days", "1", "-extfile", &d("ext.cnf"), "-out", &d("cert.pem")].map(String::from))
            .collect(),
    ];
    for step in steps {
        match Command::new("openssl").args(&step).output() {
            Ok(out) if out.status.success() => {}
            other => {
                assert!(std::env::var_os("CI").is_none(), "openssl is needed for the TLS test: {other:?}");
                eprintln!("skipping the TLS test: cannot run openssl ({other:?})");
                return;
            }
        }
    }
    let server = TestServer::spawn(Config {
        data_dir: dir.join("data"),
        tls_cert: Some(cert.clone()),
        tls_key: Some(key),
        ..Config::default()
    });
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&ca).unwrap()).unwrap();
    let client = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let addr = server.addr;
    let response = rt.block_on(async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let attempt = async {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let mut tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await?;
                tls.write_all(b"GET /livez HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await?;
                let mut out = Vec::new();
                tls.read_to_end(&mut out).await?;
                std::io::Result::Ok(String::from_utf8_lossy(&out).into_owned())
            };
            match attempt.await {
                Ok(text) => return text,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("no TLS answer: {e}"),
            }
        }
    });
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"live\""), "{response}");
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain =
        crate::harness::request_raw(server.addr, b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(!plain.starts_with(b"HTTP/1.1 200"));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
