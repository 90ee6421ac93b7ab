//! S3 through `moto`'s server (PyPI `moto[server]`, which honours `If-Match` and
//! `If-None-Match` atomically), started on a free loopback port for each test and
//! killed after it. `.ci/run` installs it in a virtual environment and puts its `bin`
//! on the PATH; without it the tests skip, except under CI.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_client::resource::s3::S3Gate;
use fenced_client::{Error, FencedResource};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{Attribute, Attributes, ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, UpdateVersion};

use crate::support::{free_port, on_path, skip_or_fail, t, Helper, Server};

const BUCKET: &str = "fenced-test";

/// A fresh moto server with the test bucket; `None` (the test skips) when moto is not
/// installed, outside CI.
fn moto() -> Option<Helper> {
    let Some(program) = on_path("moto_server") else {
        return skip_or_fail("moto_server is needed on the PATH (pip install 'moto[server]')");
    };
    let port = free_port();
    let child = Command::new(program)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let moto = Helper { child, port };
    // Listening, then the bucket (moto checks no signature on a bare PUT).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(answer) = http(
            port,
            &format!("PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
        ) {
            assert!(answer.starts_with("HTTP/1.1 200"), "moto refused the bucket: {answer}");
            return Some(moto);
        }
        assert!(Instant::now() < deadline, "moto_server did not listen on {port} within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn http(port: u16, request: &str) -> Option<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    conn.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    Some(answer)
}

fn builder(m: &Helper) -> AmazonS3Builder {
    AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{}", m.port))
        .with_allow_http(true)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
}

fn gate(m: &Helper) -> S3Gate {
    S3Gate::new(builder(m)).expect("an S3 gate")
}

#[tokio::test]
async fn s3_refuses_stale_tokens() {
    let Some(m) = moto() else { return };
    super::stale_token_is_refused_and_changes_nothing(&gate(&m), "k").await;
}

#[tokio::test]
async fn s3_interleaved_writers() {
    let Some(m) = moto() else { return };
    let server = Server::start().await;
    super::interleaved_writers_leave_the_newer_value(&server.client(), &gate(&m), "orders/42", "s3/k").await;
}

#[tokio::test]
async fn s3_counter_workload() {
    let Some(m) = moto() else { return };
    let server = Server::start().await;
    super::counter_workload_loses_no_update(&server.client(), &gate(&m), "counter", "s3/counter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_race_of_many_writers_the_highest_token_wins() {
    let Some(m) = moto() else { return };
    super::many_writers_race_and_the_highest_token_wins(Arc::new(gate(&m))).await;
}

/// Why the mark is in the object's bytes: S3's ETag of a one-part object is the MD5 of
/// its bytes, so a new version with the same bytes and another mark in its metadata
/// keeps the ETag, and an `If-Match` prepared against the older version still matches.
#[tokio::test]
async fn s3_metadata_alone_cannot_hold_the_mark() {
    let Some(m) = moto() else { return };
    // The gate's own client, used around the gate.
    let gate = gate(&m);
    let store = gate.store();
    let path = Path::from("meta");
    let put = |mark: &str, mode: PutMode| {
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::Metadata("fenced-token".into()), mark.to_owned().into());
        (PutOptions { mode, attributes, ..PutOptions::default() }, b"same bytes".to_vec())
    };
    let (opts, body) = put("5", PutMode::Create);
    let first = store.put_opts(&path, body.into(), opts).await.expect("create");
    let old = UpdateVersion { e_tag: first.e_tag.clone(), version: None };
    let (opts, body) = put("9", PutMode::Update(old.clone()));
    let second = store.put_opts(&path, body.into(), opts).await.expect("the fenced read's rewrite");
    assert_eq!(second.e_tag, first.e_tag, "the mark moved from 5 to 9 and the ETag did not");
    // A stale writer holding the first version's ETag gets through.
    let (opts, body) = put("5", PutMode::Update(old));
    assert!(store.put_opts(&path, body.into(), opts).await.is_ok(), "moto refused the stale conditional put");
}

/// An object the gate did not write has no mark it could trust: an error, never "no
/// mark", and nothing is written.
#[tokio::test]
async fn s3_an_object_without_a_mark_line_is_refused_not_guessed() {
    let Some(m) = moto() else { return };
    let gate = gate(&m);
    gate.store().put(&Path::from("plain"), b"written by someone else".to_vec().into()).await.expect("plain put");
    let err = gate.write("plain", t(3), b"v").await.expect_err("no mark, no write");
    assert!(matches!(&err, Error::Server { code, .. } if code == "corrupt_record"), "{err}");
    let err = gate.read("plain", t(3)).await.expect_err("no mark, no read");
    assert!(matches!(&err, Error::Server { code, .. } if code == "corrupt_record"), "{err}");
}

#[tokio::test]
async fn s3_behind_a_signature_check() {
    let Some(m) = moto() else { return };
    crate::signed::a_forged_token_is_refused_with_keys_and_taken_without(gate(&m), "s3").await;
}
