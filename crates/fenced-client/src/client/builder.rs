//! How a client is made: its members, credentials, TLS and time-outs, from the arguments
//! or the environment.

use super::*;

/// Configures a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    /// `http://host:port`, `https://host:port` or `fenced://host:port` (the binary
    /// wire protocol), or several separated by commas (the members of a cluster: a call
    /// moves on to the next when one is unreachable or not the leader);
    /// `FENCED_ENDPOINT`, else [`ENDPOINT_DEFAULT`].
    endpoint: Option<String>,
    /// Sent as `Authorization: Bearer ..`; `FENCED_AUTH_TOKEN` by default.
    auth_token: Option<String>,
    /// Bound on opening a connection.
    connect_timeout: Duration,
    /// Bound on one request's round trip (a blocking acquire adds its wait), failovers
    /// included.
    request_timeout: Duration,
    /// With several endpoints: how long a member may answer neither a request nor a
    /// probe before the call moves on to the next (see [`ClientBuilder::attempt_timeout`]);
    /// `FENCED_ATTEMPT_TIMEOUT`, else [`crate::ATTEMPT_TIMEOUT_DEFAULT`].
    attempt_timeout: Option<Duration>,
    /// PEM certificates a `https://` server must chain to; `FENCED_CA_FILE` by default,
    /// else the public web roots.
    tls_ca_pem: Option<Vec<u8>>,
    /// This client's certificate chain and key (PEM) for a server with `client_ca`;
    /// `FENCED_CLIENT_CERT` and `FENCED_CLIENT_KEY` by default.
    tls_client_pem: Option<ClientPem>,
}

/// A client certificate chain and its private key, PEM.
type ClientPem = (Vec<u8>, Vec<u8>);

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            endpoint: None,
            auth_token: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            attempt_timeout: None,
            tls_ca_pem: None,
            tls_client_pem: None,
        }
    }
}

impl ClientBuilder {
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// With several endpoints (a cluster's members): how long a member may leave a
    /// request unanswered *and* not answer a probe of its liveness before the call
    /// moves on to the next member; the request time-out still bounds the whole call.
    /// A request a live leader keeps on purpose (an acquire parked in the queue) is
    /// not cut: the leader answers the probe. Default `FENCED_ATTEMPT_TIMEOUT` (written
    /// like `750ms` or `2s`), else [`crate::ATTEMPT_TIMEOUT_DEFAULT`] (750 ms); at least
    /// [`crate::ATTEMPT_TIMEOUT_MIN`] (20 ms), or `build` refuses it. Unused with one
    /// endpoint.
    pub fn attempt_timeout(mut self, d: Duration) -> Self {
        self.attempt_timeout = Some(d);
        self
    }

    /// Trusts only these PEM certificates for a `https://` endpoint.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// Presents this certificate chain, with its private key (both PEM), to a server
    /// that takes client certificates (its `client_ca`): the identity of its subject.
    pub fn tls_client_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.tls_client_pem = Some((cert.into(), key.into()));
        self
    }

    /// Builds the client; reads `FENCED_ENDPOINT`, `FENCED_AUTH_TOKEN`,
    /// `FENCED_ATTEMPT_TIMEOUT`, `FENCED_CA_FILE`, `FENCED_CLIENT_CERT` and
    /// `FENCED_CLIENT_KEY` for what was not given, and does no network IO (the first
    /// request connects).
    pub fn build(self) -> Result<Client, Error> {
        let endpoint = self
            .endpoint
            .or_else(|| std::env::var("FENCED_ENDPOINT").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| ENDPOINT_DEFAULT.to_owned());
        let auth = self.auth_token.or_else(|| std::env::var("FENCED_AUTH_TOKEN").ok().filter(|s| !s.is_empty()));
        let ca = match (self.tls_ca_pem, std::env::var_os("FENCED_CA_FILE").filter(|s| !s.is_empty())) {
            (Some(pem), _) => Some(pem),
            (None, Some(path)) => Some(std::fs::read(&path).map_err(|e| {
                Error::BadRequest(format!("FENCED_CA_FILE {}: {e}", std::path::Path::new(&path).display()))
            })?),
            (None, None) => None,
        };
        let client_pem = match self.tls_client_pem {
            Some(pair) => Some(pair),
            None => client_pem_from_env()?,
        };
        let attempt_timeout = attempt_timeout(self.attempt_timeout, std::env::var("FENCED_ATTEMPT_TIMEOUT").ok())?;
        let conn = Conn::new(
            &endpoint,
            auth.as_deref(),
            self.connect_timeout,
            self.request_timeout,
            attempt_timeout,
            crate::http::TlsFiles {
                ca_pem: ca.as_deref(),
                client_pem: client_pem.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
            },
        )?;
        Ok(Client { conn })
    }
}

/// `FENCED_CLIENT_CERT` and `FENCED_CLIENT_KEY` (files, PEM), read; both or neither.
fn client_pem_from_env() -> Result<Option<ClientPem>, Error> {
    let var = |name: &str| std::env::var_os(name).filter(|s| !s.is_empty());
    let read = |name: &str, path: std::ffi::OsString| {
        std::fs::read(&path)
            .map_err(|e| Error::BadRequest(format!("{name} {}: {e}", std::path::Path::new(&path).display())))
    };
    match (var("FENCED_CLIENT_CERT"), var("FENCED_CLIENT_KEY")) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some((read("FENCED_CLIENT_CERT", cert)?, read("FENCED_CLIENT_KEY", key)?))),
        _ => Err(Error::BadRequest("FENCED_CLIENT_CERT and FENCED_CLIENT_KEY go together".into())),
    }
}

/// The attempt time-out: the builder's, else `FENCED_ATTEMPT_TIMEOUT` (`env`), else the
/// default. (The minimum is checked where the members are made.)
fn attempt_timeout(given: Option<Duration>, env: Option<String>) -> Result<Duration, Error> {
    match (given, env) {
        (Some(d), _) => Ok(d),
        (None, Some(s)) if !s.trim().is_empty() => fenced_core::duration_ms(&s)
            .map(Duration::from_millis)
            .map_err(|e| Error::BadRequest(format!("FENCED_ATTEMPT_TIMEOUT: {e}"))),
        (None, _) => Ok(crate::ATTEMPT_TIMEOUT_DEFAULT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempt_timeout_is_the_builders_else_the_environments_else_the_default() {
        let ms = Duration::from_millis;
        assert_eq!(attempt_timeout(Some(ms(40)), Some("2s".into())).unwrap(), ms(40));
        assert_eq!(attempt_timeout(None, Some("2s".into())).unwrap(), ms(2_000));
        assert_eq!(attempt_timeout(None, Some(" ".into())).unwrap(), crate::ATTEMPT_TIMEOUT_DEFAULT);
        assert_eq!(attempt_timeout(None, None).unwrap(), crate::ATTEMPT_TIMEOUT_DEFAULT);
        let bad = attempt_timeout(None, Some("soon".into())).unwrap_err();
        assert!(matches!(&bad, Error::BadRequest(m) if m.starts_with("FENCED_ATTEMPT_TIMEOUT")), "{bad:?}");
        // Below the minimum: refused where the members are made.
        let low = Client::builder().endpoint("http://127.0.0.1:1,http://127.0.0.1:2").attempt_timeout(ms(5)).build();
        assert!(matches!(low, Err(Error::BadRequest(_))));
    }
}
