//! One HTTP stack for the AWS-protocol adapters (S3, DynamoDB): `object_store`'s client
//! interface served by this crate's hyper pool (rustls on ring with the `tls` feature),
//! so neither adapter brings a second HTTP client (`reqwest`) or a C crypto build.

use std::time::Duration;

use async_trait::async_trait;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody, HttpResponse,
    HttpResponseBody, HttpService,
};

use crate::http::{wrap_tls, Connector};

/// The bound on one HTTP exchange with the store.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `object_store`'s HTTP client on hyper, the stack the rest of this crate uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct HyperConnector;

impl HttpConnector for HyperConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut tcp = TcpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(Duration::from_secs(5)));
        let connector = wrap_tls(tcp, true, crate::http::TlsFiles::default())
            .map_err(|e| object_store::Error::Generic { store: "HTTP", source: Box::new(e) })?;
        Ok(HttpClient::new(HyperService(HyperClient::builder(TokioExecutor::new()).build(connector))))
    }
}

/// One pooled hyper client serving `object_store`'s requests.
#[derive(Debug)]
struct HyperService(HyperClient<Connector, HttpRequestBody>);

#[async_trait]
impl HttpService for HyperService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.0.request(req))
            .await
            .map_err(|e| HttpError::new(HttpErrorKind::Timeout, e))?;
        let resp = answer.map_err(|e| {
            let kind = if e.is_connect() { HttpErrorKind::Connect } else { HttpErrorKind::Request };
            HttpError::new(kind, e)
        })?;
        let (parts, body) = resp.into_parts();
        let body = HttpResponseBody::new(body.map_err(|e| HttpError::new(HttpErrorKind::Decode, e)));
        Ok(HttpResponse::from_parts(parts, body))
    }
}
