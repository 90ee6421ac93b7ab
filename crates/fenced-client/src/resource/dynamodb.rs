//! DynamoDB as a fenced resource: the mark is an attribute of the guarded item (`tok`),
//! and every fenced write or read is ONE `UpdateItem` whose condition checks it
//! (`attribute_not_exists(tok) OR tok <= :t`) and whose update advances it, so the
//! check and the change are one atomic step at the table.
//!
//! A refusal is `ConditionalCheckFailedException`; the item as it was comes back with
//! it (`ReturnValuesOnConditionCheckFailure: ALL_OLD`) and gives `highest_seen`; where a
//! service does not send it, a strongly consistent `GetItem` reads the mark, which only
//! rises, so it is above the refused token.
//!
//! The JSON protocol (`X-Amz-Target: DynamoDB_20120810.*`) is spoken directly, signed
//! with SigV4 by `object_store`'s `AwsAuthorizer` and sent through this crate's hyper
//! pool ([`HyperConnector`]): no AWS SDK to build.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use fenced_core::Token;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use object_store::aws::AwsAuthorizer;
pub use object_store::aws::AwsCredential;
use object_store::client::{ClientOptions, HttpClient, HttpConnector, HttpRequestBody};
use serde_json::{json, Value};

use crate::error::Error;
use crate::resource::aws_http::HyperConnector;
use crate::resource::{Fenced, FencedResource};

/// The item's key attribute (a string: the gate's key).
const KEY: &str = "pk";
/// The mark attribute (a number).
const MARK: &str = "tok";
/// The value attribute (bytes).
const VALUE: &str = "val";
/// The gate's condition: no mark yet, or one no newer than the operation's token.
const CONDITION: &str = "attribute_not_exists(#tok) OR #tok <= :t";

/// One table behind the gate: items keyed by `pk`, the mark in `tok`, the value in `val`.
#[derive(Debug)]
pub struct DynamoGate {
    http: HttpClient,
    /// `http(s)://host[:port]`, no trailing slash.
    endpoint: String,
    region: String,
    credential: AwsCredential,
    table: String,
}

impl DynamoGate {
    /// The gate on `table` at `endpoint` (`https://dynamodb.eu-west-1.amazonaws.com`,
    /// or DynamoDB Local's `http://127.0.0.1:8000`), signing as `credential` in `region`.
    pub fn new(endpoint: &str, region: &str, credential: AwsCredential, table: &str) -> Result<DynamoGate, Error> {
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Error::BadRequest(format!("endpoint '{endpoint}' must be http(s)://HOST[:PORT]")));
        }
        if table.is_empty() || table.len() > 255 {
            return Err(Error::BadRequest(format!("'{table}' is not a DynamoDB table name")));
        }
        let http = HyperConnector.connect(&ClientOptions::default())?;
        Ok(DynamoGate { http, endpoint, region: region.to_owned(), credential, table: table.to_owned() })
    }

    /// Creates the table (`pk` a string hash key, billed per request) unless it exists,
    /// and waits until it is active.
    pub async fn create_table(&self) -> Result<(), Error> {
        let body = json!({
            "TableName": self.table,
            "AttributeDefinitions": [{ "AttributeName": KEY, "AttributeType": "S" }],
            "KeySchema": [{ "AttributeName": KEY, "KeyType": "HASH" }],
            "BillingMode": "PAY_PER_REQUEST",
        });
        match self.call("CreateTable", &body).await? {
            Ok(_) => {}
            Err((kind, _)) if kind == "ResourceInUseException" => {}
            Err((kind, e)) => return Err(refused(&kind, &e)),
        }
        for _ in 0..600 {
            let described = self.call("DescribeTable", &json!({ "TableName": self.table })).await?;
            if let Ok(d) = described {
                if d["Table"]["TableStatus"] == "ACTIVE" {
                    return Ok(());
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(Error::unavailable(format!("table {} did not become active within 60 s", self.table)))
    }

    /// The value under `key` as it stands, read without a token (nothing moves): for a
    /// report or a check after the work. `None` when there is no item or no value.
    pub async fn value(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let body = json!({ "TableName": self.table, "Key": { KEY: { "S": key } }, "ConsistentRead": true });
        let item = self.call("GetItem", &body).await?.map_err(|(kind, e)| refused(&kind, &e))?;
        value_of(&item["Item"])
    }

    /// One conditional `UpdateItem`: sets the mark to `token` (and the value, for a
    /// write) iff the condition holds; answers the item as it is after.
    async fn fenced(&self, key: &str, token: Token, value: Option<&[u8]>) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        let t = json!({ "N": token.get().to_string() });
        let (update, values) = match value {
            Some(v) => ("SET #tok = :t, #val = :v", json!({ ":t": t, ":v": { "B": BASE64.encode(v) } })),
            None => ("SET #tok = :t", json!({ ":t": t })),
        };
        let body = json!({
            "TableName": self.table,
            "Key": { KEY: { "S": key } },
            "UpdateExpression": update,
            "ConditionExpression": CONDITION,
            "ExpressionAttributeNames": { "#tok": MARK, "#val": VALUE },
            "ExpressionAttributeValues": values,
            "ReturnValues": if value.is_some() { "NONE" } else { "ALL_NEW" },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        });
        // `#val` is named even where the update does not use it: DynamoDB refuses
        // unused names, so drop it then.
        let mut body = body;
        if value.is_none() {
            body["ExpressionAttributeNames"] = json!({ "#tok": MARK });
        }
        match self.call("UpdateItem", &body).await? {
            Ok(answer) => Ok(Fenced::Accepted(if value.is_some() { None } else { value_of(&answer["Attributes"])? })),
            Err((kind, e)) if kind == "ConditionalCheckFailedException" => {
                let mark = match mark_of(&e["Item"])? {
                    Some(m) => Some(m),
                    None => {
                        let get =
                            json!({ "TableName": self.table, "Key": { KEY: { "S": key } }, "ConsistentRead": true });
                        let item = self.call("GetItem", &get).await?.map_err(|(kind, e)| refused(&kind, &e))?;
                        mark_of(&item["Item"])?
                    }
                };
                match mark.filter(|m| *m > token) {
                    Some(highest_seen) => Ok(Fenced::Rejected { token, highest_seen }),
                    None => Err(corrupt(key, "the condition failed, yet the mark is not above the token")),
                }
            }
            Err((kind, e)) => Err(refused(&kind, &e)),
        }
    }

    /// POSTs one JSON-protocol call, signed; `Err((type, body))` for DynamoDB's own
    /// refusals (4xx with a `__type`), `Error` for everything else.
    async fn call(&self, action: &str, body: &Value) -> Result<Result<Value, (String, Value)>, Error> {
        let uri = format!("{}/", self.endpoint);
        let host = uri.split('/').nth(2).unwrap_or_default().to_owned();
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(&uri)
            .header(HOST, host)
            .header(CONTENT_TYPE, "application/x-amz-json-1.0")
            .header("x-amz-target", format!("DynamoDB_20120810.{action}"))
            .body(HttpRequestBody::from(body.to_string()))
            .map_err(|e| Error::BadRequest(format!("a request to {uri}: {e}")))?;
        AwsAuthorizer::new(&self.credential, "dynamodb", &self.region).try_authorize(&mut req, None)?;
        let resp = self.http.execute(req).await.map_err(|e| Error::unavailable(format!("DynamoDB at {uri}: {e}")))?;
        let status = resp.status();
        let bytes =
            resp.into_body().bytes().await.map_err(|e| Error::unavailable(format!("DynamoDB at {uri}: {e}")))?;
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Ok(answer));
        }
        match answer["__type"].as_str() {
            // `com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException`
            Some(t) if status.is_client_error() => Ok(Err((t.rsplit('#').next().unwrap_or(t).to_owned(), answer))),
            _ => Err(Error::Server {
                status: Some(status.as_u16()),
                code: answer["__type"].as_str().unwrap_or("dynamodb_error").to_owned(),
                message: String::from_utf8_lossy(&bytes).into_owned(),
            }),
        }
    }
}

impl FencedResource for DynamoGate {
    async fn write(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<()>, Error> {
        Ok(self.fenced(key, token, Some(value)).await?.map(|_| ()))
    }

    async fn read(&self, key: &str, token: Token) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        self.fenced(key, token, None).await
    }
}

/// The mark of an item; `None` when there is no item or it has none, an error when it
/// is there and not a token.
fn mark_of(item: &Value) -> Result<Option<Token>, Error> {
    let Some(n) = item.get(MARK) else { return Ok(None) };
    let mark = n["N"].as_str().and_then(|s| s.parse().ok()).and_then(Token::new);
    mark.map(Some).ok_or_else(|| corrupt("?", "its mark is not a positive integer"))
}

/// The value of an item; `None` when there is none.
fn value_of(item: &Value) -> Result<Option<Vec<u8>>, Error> {
    let Some(v) = item.get(VALUE) else { return Ok(None) };
    let b64 = v["B"].as_str().ok_or_else(|| corrupt("?", "its value is not bytes"))?;
    BASE64.decode(b64).map(Some).map_err(|_| corrupt("?", "its value is not base64"))
}

fn corrupt(key: &str, why: &str) -> Error {
    Error::Server { status: None, code: "corrupt_record".into(), message: format!("item '{key}': {why}") }
}

fn refused(kind: &str, body: &Value) -> Error {
    let message = body["message"].as_str().or(body["Message"].as_str()).unwrap_or("").to_owned();
    match kind {
        "ResourceNotFoundException" => Error::NotFound(message),
        "ValidationException" | "SerializationException" => Error::BadRequest(message),
        "UnrecognizedClientException" | "AccessDeniedException" | "MissingAuthenticationTokenException" => {
            Error::Unauthorised(message)
        }
        "ProvisionedThroughputExceededException" | "ThrottlingException" | "RequestLimitExceeded" => {
            Error::unavailable(message)
        }
        other => Error::Server { status: Some(400), code: other.to_owned(), message },
    }
}
