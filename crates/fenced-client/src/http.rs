//! The HTTP transport: one pooled hyper client, the endpoint, the auth header and time-outs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::error::{ApiError, Error};

/// Bytes kept when the path carries a lock name or store key: RFC 3986 unreserved
/// characters. Everything else, `/` included, is percent-encoded so that `orders/42`
/// stays one path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// How many times a request that never reached the server (connect failed) is tried,
/// with one endpoint (with several, the next member is tried instead).
pub(crate) const CONNECT_ATTEMPTS_MAX: u32 = 4;

/// Percent-encodes one path segment.
pub(crate) fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// A response, read whole (every answer of the API is small; the store's values are
/// bounded by the server's body limit).
#[derive(Debug)]
pub(crate) struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The headers (the store's read carries the mark in one).
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Response {
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Server {
            status: Some(self.status),
            code: "bad_response".into(),
            message: format!("could not parse the server's answer: {e}"),
        })
    }

    pub fn api_error(&self) -> ApiError {
        ApiError::from_http(self.status, &self.body)
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The server's answer: `read` of a 2xx response, else the server's error.
    pub fn answer<T>(self, read: impl FnOnce(Response) -> Result<T, Error>) -> Result<Result<T, ApiError>, Error> {
        if self.is_success() {
            read(self).map(Ok)
        } else {
            Ok(Err(self.api_error()))
        }
    }
}

/// A stream's answer: its body, or the server's refusal.
pub(crate) enum StreamAnswer {
    Open(hyper::body::Incoming),
    Refused(ApiError),
}

/// Plain TCP, wrapped in TLS for `https://` endpoints when the `tls` feature is on.
#[cfg(feature = "tls")]
pub(crate) type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
pub(crate) type Connector = HttpConnector;

/// Shared by every handle of one client: cloning a `Client` clones an `Arc` of this.
#[derive(Debug)]
pub(crate) struct Transport {
    /// The pooled HTTP/1 client.
    http: HyperClient<Connector, Full<Bytes>>,
    /// `http://host:port`, no trailing slash.
    pub base: String,
    /// `Bearer <token>` when an auth token is configured.
    auth: Option<HeaderValue>,
    /// Upper bound on one request's round trip; a blocking acquire adds its wait.
    pub request_timeout: Duration,
    /// Tries of a request whose connection could not be opened.
    connect_attempts: u32,
}

/// A client's TLS material, in PEM: the certificates a server's chain must lead to
/// (`None`: the public web roots), and this client's own certificate chain and key for
/// a server that takes client certificates (`client_ca`).
#[derive(Clone, Copy, Default)]
pub(crate) struct TlsFiles<'a> {
    pub ca_pem: Option<&'a [u8]>,
    pub client_pem: Option<(&'a [u8], &'a [u8])>,
}

/// How every endpoint of a client is reached, over HTTP or the wire protocol alike.
#[derive(Clone, Copy)]
pub(crate) struct Dial<'a> {
    /// The bearer token, when the servers take one.
    pub auth: Option<&'a str>,
    /// How long opening a connection may take.
    pub connect_timeout: Duration,
    /// Upper bound on one request's round trip; a blocking acquire adds its wait.
    pub request_timeout: Duration,
    /// What a TLS endpoint is verified with and presents.
    pub tls: TlsFiles<'a>,
    /// Tries of a request whose connection could not be opened.
    pub connect_attempts: u32,
}

impl Transport {
    pub fn new(endpoint: &str, dial: Dial<'_>) -> Result<Arc<Transport>, Error> {
        let Dial { auth: auth_token, connect_timeout, request_timeout, tls, connect_attempts } = dial;
        let base = endpoint.trim_end_matches('/').to_owned();
        let rest = base.strip_prefix("http://").or_else(|| base.strip_prefix("https://")).ok_or_else(|| {
            Error::BadRequest(format!(
                "endpoint '{endpoint}' must start with http:// or https://, like http://127.0.0.1:7400"
            ))
        })?;
        if rest.is_empty() || rest.contains('/') {
            return Err(Error::BadRequest(format!("endpoint '{endpoint}' must be http://HOST:PORT with no path")));
        }
        let auth = match auth_token {
            Some(t) => Some(
                HeaderValue::from_str(&format!("Bearer {t}"))
                    .map_err(|_| Error::BadRequest("the auth token has characters a header cannot carry".into()))?,
            ),
            None => None,
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let connector = wrap_tls(connector, base.starts_with("https://"), tls)?;
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Arc::new(Transport { http, base, auth, request_timeout, connect_attempts }))
    }

    /// Sends one request. Only a connection that could not be opened is retried
    /// (the request never left, so retrying cannot do anything twice); every other
    /// failure comes back as `Unavailable`, for the caller to decide.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Response, Error> {
        let mut backoff = Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            match self.send_once(method.clone(), path, headers, body.clone(), timeout).await {
                Err(Attempt::NotSent(_)) if attempt < self.connect_attempts => {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                Err(Attempt::NotSent(e)) | Err(Attempt::Failed(e)) => return Err(e),
                Ok(r) => return Ok(r),
            }
        }
    }

    async fn send_once(
        &self,
        method: Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Response, Attempt> {
        let uri = format!("{}{}", self.base, path);
        let mut req = Request::builder().method(method).uri(&uri);
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| Attempt::Failed(Error::BadRequest(format!("cannot build a request for {uri}: {e}"))))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| {
                let msg = format!("{uri}: {}", error_chain(&e));
                if e.is_connect() {
                    Attempt::NotSent(Error::unavailable(msg))
                } else {
                    Attempt::Failed(Error::unavailable(msg))
                }
            })?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| Attempt::Failed(Error::unavailable(format!("{uri}: reading the answer: {e}"))))?
                .to_bytes();
            Ok(Response { status: parts.status.as_u16(), headers: parts.headers, body })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => {
                Err(Attempt::Failed(Error::unavailable(format!("{uri}: no answer within {} ms", timeout.as_millis()))))
            }
        }
    }

    /// `GET path` whose answer is a stream (the event stream): the status and the body
    /// as it arrives, once the head came within `timeout`. An error answer is read
    /// whole (it is small).
    pub async fn open_stream(&self, path: &str, timeout: Duration) -> Result<StreamAnswer, Error> {
        let uri = format!("{}{}", self.base, path);
        let mut req = Request::builder().method(Method::GET).uri(&uri).header("accept", "text/event-stream");
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| Error::BadRequest(format!("cannot build a request for {uri}: {e}")))?;
        let head = tokio::time::timeout(timeout, self.http.request(req))
            .await
            .map_err(|_| Error::unavailable(format!("{uri}: no answer within {} ms", timeout.as_millis())))?;
        let resp = head.map_err(|e| Error::unavailable(format!("{uri}: {}", error_chain(&e))))?;
        let (parts, body) = resp.into_parts();
        if parts.status.is_success() {
            return Ok(StreamAnswer::Open(body));
        }
        let bytes = tokio::time::timeout(timeout, body.collect())
            .await
            .map_err(|_| Error::unavailable(format!("{uri}: the error answer did not arrive")))?
            .map_err(|e| Error::unavailable(format!("{uri}: reading the answer: {e}")))?
            .to_bytes();
        Ok(StreamAnswer::Refused(ApiError::from_http(parts.status.as_u16(), &bytes)))
    }

    /// POSTs or PUTs a JSON body.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Response, Error> {
        let bytes = Bytes::from(serde_json::to_vec(body).expect("a JSON value serialises"));
        self.send(method, path, &[], Some(bytes), timeout).await
    }
}

#[cfg(feature = "tls")]
pub(crate) fn wrap_tls(http: HttpConnector, _https: bool, tls: TlsFiles<'_>) -> Result<Connector, Error> {
    let config = tls_client_config(tls)?;
    let mut http = http;
    http.enforce_http(false);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// The TLS configuration of `https://` and `fenceds://` endpoints: the PEM certificates
/// of `tls.ca_pem` as the only roots, else the public web roots; with `tls.client_pem`,
/// this client's certificate for a server that asks for one.
#[cfg(feature = "tls")]
pub(crate) fn tls_client_config(tls: TlsFiles<'_>) -> Result<rustls::ClientConfig, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let mut roots = rustls::RootCertStore::empty();
    match tls.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| Error::BadRequest(format!("the CA file is not PEM certificates: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::BadRequest(format!("the CA file has an unusable certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(Error::BadRequest("the CA file holds no certificate".into()));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    // ring, not the default aws-lc-rs: no cmake, and the server uses ring too.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::BadRequest(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots);
    let Some((cert_pem, key_pem)) = tls.client_pem else { return Ok(builder.with_no_client_auth()) };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::BadRequest(format!("the client certificate is not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(Error::BadRequest("the client certificate file holds no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| Error::BadRequest(format!("the client key is not a PEM private key: {e}")))?;
    builder
        .with_client_auth_cert(chain, key)
        .map_err(|e| Error::BadRequest(format!("the client certificate and key do not go together: {e}")))
}

#[cfg(not(feature = "tls"))]
pub(crate) fn wrap_tls(http: HttpConnector, https: bool, _tls: TlsFiles<'_>) -> Result<Connector, Error> {
    if https {
        return Err(Error::BadRequest("https endpoints need fenced-client's `tls` feature".into()));
    }
    Ok(http)
}

/// One try's failure: whether the request may have reached the server.
enum Attempt {
    /// The connection could not be opened: the request never left, so it may be retried.
    NotSent(Error),
    /// It may have reached the server.
    Failed(Error),
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_one_segment() {
        assert_eq!(segment("orders/42"), "orders%2F42");
        assert_eq!(segment("a b?c#d%"), "a%20b%3Fc%23d%25");
        assert_eq!(segment("plain-name_1.x~"), "plain-name_1.x~");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn endpoints_are_checked() {
        let dial = Dial {
            auth: None,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            tls: TlsFiles::default(),
            connect_attempts: 1,
        };
        let t = |e| Transport::new(e, dial);
        assert!(t("http://127.0.0.1:7400/").is_ok());
        assert!(matches!(t("127.0.0.1:7400"), Err(Error::BadRequest(_))));
        assert!(matches!(t("http://127.0.0.1:7400/v1"), Err(Error::BadRequest(_))));
        assert_eq!(t("https://x:1").is_ok(), cfg!(feature = "tls"));
    }
}
