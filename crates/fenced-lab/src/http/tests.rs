//! Tests of the laboratory's small HTTP client against a scripted server.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A server that reads one request and answers `reply` (or nothing, when empty),
/// then closes; the request it read.
async fn serve_once(reply: &'static str) -> (SocketAddr, JoinHandle<String>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let n = s.read(&mut buf).await.unwrap();
        if reply.is_empty() {
            tokio::time::sleep(Duration::from_secs(5)).await;
        } else {
            s.write_all(reply.as_bytes()).await.unwrap();
        }
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    (addr, task)
}

#[tokio::test]
async fn a_json_answer_a_chunked_one_an_error_and_a_silence() {
    let (addr, asked) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"leader\":1}\n").await;
    let a = request(Method::POST, addr, "/v3/x", "{}", Duration::from_secs(2)).await.unwrap();
    assert_eq!(a.json_if_ok(), Some(serde_json::json!({"leader": 1})));
    let asked = asked.await.unwrap();
    assert!(asked.starts_with("POST /v3/x HTTP/1.1\r\n"), "{asked}");
    assert!(asked.contains("content-type: application/json") && asked.ends_with("\r\n\r\n{}"), "{asked}");

    let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":2}\r\n0\r\n\r\n";
    let (addr, _) = serve_once(chunked).await;
    let a = get(addr, "/s", Duration::from_secs(2)).await.unwrap();
    assert_eq!(a.json_if_ok(), Some(serde_json::json!({"a": 2})));

    let (addr, _) = serve_once("HTTP/1.1 421 Misdirected\r\ncontent-length: 12\r\n\r\nnot_leader\r\n").await;
    let a = get(addr, "/s", Duration::from_secs(2)).await.unwrap();
    assert_eq!((a.status, a.text(), a.json_if_ok()), (421, "not_leader".to_owned(), None));

    let (addr, _) = serve_once("").await;
    let e = get(addr, "/s", Duration::from_millis(200)).await.unwrap_err();
    assert!(e.contains("within 200ms"), "{e}");
}

#[test]
fn blocking_answers_from_a_plain_thread_and_from_inside_a_runtime() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (addr, _) = rt.block_on(serve_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"));
    let a = blocking(Method::GET, addr, "/", "", Duration::from_secs(2)).unwrap();
    assert_eq!(a.json_if_ok(), Some(serde_json::json!({})));
    let (addr, _) = rt.block_on(serve_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"));
    let inside = rt.block_on(async { blocking(Method::GET, addr, "/", "", Duration::from_secs(2)) });
    assert_eq!(inside.unwrap().status, 200);
}
