//! TLS set-up from PEM files (rustls on ring): the client listeners' acceptor (with
//! client certificates under `client_ca`), and the
//! peer side's pair, an acceptor that takes only connections presenting a certificate
//! of the cluster CA and the client configuration this member dials the others with.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::Config;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// The certificates of a PEM file, at least one.
fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no certificate found", path.display()));
    }
    Ok(certs)
}

fn key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// The certificates of a PEM file as the only roots of trust.
fn roots(path: &Path, what: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certs(path, what)? {
        roots.add(cert).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The client listeners' acceptor (HTTP/1.1 in ALPN). With `client_ca` it asks for a
/// client certificate and completes the handshake only if the one presented chains to
/// that CA; a client without one still connects (a token may be its credential), and
/// [`crate::identity`] decides what it may do.
pub fn acceptor(cert: &Path, key_file: &Path, client_ca: Option<&Path>) -> Result<TlsAcceptor, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca, "client_ca")?), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("client_ca {}: {e}", ca.display()))?,
        ),
    };
    let mut config = builder
        .with_single_cert(certs(cert, "tls_cert")?, key(key_file, "tls_key")?)
        .map_err(|e| format!("tls: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The subject of the verified client certificate of a finished handshake (canonical,
/// [`crate::subject`]); None without one.
pub fn client_subject(conn: &tokio_rustls::rustls::ServerConnection) -> Option<String> {
    crate::subject::of_certificate(conn.peer_certificates()?.first()?.as_ref())
}

/// The peer side of mutual TLS, when `config` has peer certificates: the peer
/// listener's acceptor, which completes a handshake only with a client presenting a
/// certificate the cluster CA signed, and the configuration for dialling the other
/// members, which trusts only the cluster CA and presents this member's certificate.
pub fn peer(config: &Config) -> Result<Option<(TlsAcceptor, ClientConfig)>, String> {
    let (Some(cert), Some(key_file), Some(ca)) = (&config.peer_cert, &config.peer_key, &config.peer_ca) else {
        return Ok(None);
    };
    let chain = certs(cert, "peer_cert")?;
    let key = key(key_file, "peer_key")?;
    let roots = Arc::new(roots(ca, "peer_ca")?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| format!("peer_ca {}: {e}", ca.display()))?;
    let mut server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| format!("peer_cert: {e}"))?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    // No ALPN here: the peer client's connector (hyper-rustls) sets http/1.1 itself.
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("peer_cert: {e}"))?;
    Ok(Some((TlsAcceptor::from(Arc::new(server)), client)))
}
