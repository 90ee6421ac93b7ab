//! A server on a free loopback port with a scratch data directory, and a tiny
//! blocking HTTP/1.1 client (one connection per request, `Connection: close`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use fenced_server::Config;
use serde_json::Value;

pub struct TestServer {
    pub addr: SocketAddr,
    /// The wire protocol's listener (every test server has one).
    pub wire: SocketAddr,
    pub dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

pub fn scratch_dir() -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("fenced-server-it-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A fresh file holding `secret` and a newline, as `auth_token_file` takes it.
pub fn token_file(secret: &str) -> PathBuf {
    let file = scratch_dir().with_extension("token");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    file
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::with(|_| {})
    }

    pub fn with(tune: impl FnOnce(&mut Config)) -> TestServer {
        let mut config = Config { data_dir: scratch_dir(), ..Config::default() };
        tune(&mut config);
        TestServer::on(config)
    }

    /// Starts on `config.data_dir` (which may hold a previous run's state).
    pub fn on(config: Config) -> TestServer {
        let server = TestServer::spawn(config);
        server.wait_live();
        server
    }

    /// Starts without waiting for plain-HTTP liveness (for TLS).
    pub fn spawn(config: Config) -> TestServer {
        let dir = config.data_dir.clone();
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let wire_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        wire_listener.set_nonblocking(true).unwrap();
        let wire = wire_listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let wire = tokio::net::TcpListener::from_std(wire_listener).unwrap();
                fenced_server::run_with_wire(listener, Some(wire), config, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        TestServer { addr, wire, dir, stop: Some(stop), thread: Some(thread) }
    }

    fn wait_live(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if TcpStream::connect(self.addr).is_ok() && self.get("/livez").status == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server did not come up");
    }

    /// Clean shutdown (as on SIGTERM); returns the data directory for a restart.
    pub fn stop(mut self) -> PathBuf {
        self.shutdown();
        std::mem::take(&mut self.dir)
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread panicked");
        }
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        request(self.addr, method, path, headers, body)
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    /// `GET /v1/events`, read past its head: the subscription exists when this returns.
    pub fn subscribe(&self) -> std::io::BufReader<std::net::TcpStream> {
        use std::io::{BufRead, Write};
        let mut c = std::net::TcpStream::connect(self.addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        write!(c, "GET /v1/events HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut events = std::io::BufReader::new(c);
        let mut line = String::new();
        while line != "\r\n" {
            line.clear();
            assert!(events.read_line(&mut line).unwrap() > 0, "the event stream closed in its head");
        }
        events
    }

    /// A JSON call; returns the status and the parsed body (Null when empty).
    pub fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let r = self.request(method, path, &[("content-type", "application/json")], body.as_bytes());
        (r.status, r.json())
    }

    pub fn lease(&self, ttl_ms: u64) -> String {
        let (s, v) = self.call("POST", "/v1/leases", &format!("{{\"ttl_ms\":{ttl_ms}}}"));
        assert_eq!(s, 201, "{v}");
        v["lease_id"].as_str().unwrap().to_string()
    }

    pub fn acquire(&self, name: &str, body: &str) -> (u16, Value) {
        self.call("POST", &format!("/v1/locks/{name}/acquire"), body)
    }

    /// Grants and releases a scratch lock until token `up_to` has been issued: the
    /// fenced store refuses tokens the service never issued, so a test that writes
    /// with made-up tokens mints them first.
    pub fn mint_tokens(&self, up_to: u64) {
        let lease = self.lease(60_000);
        loop {
            let (st, g) = self.acquire("test/mint", &format!("{{\"lease_id\":\"{lease}\"}}"));
            assert_eq!(st, 200, "{g}");
            let body = format!("{{\"lease_id\":\"{lease}\"}}");
            assert_eq!(self.call("POST", "/v1/locks/test/mint/release", &body).0, 200);
            if g["token"].as_u64().unwrap() >= up_to {
                break;
            }
        }
        assert_eq!(self.call("DELETE", &format!("/v1/leases/{lease}"), "").0, 204);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
        if !std::thread::panicking() && !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (413) before reading the whole body and close.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| {
        panic!("no complete response: {:?}", String::from_utf8_lossy(raw));
    });
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Resp { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else { return out };
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// Polls `f` until it returns true; panics after `secs` seconds. For waiting on
/// things that take real time (an expiry), never for asserting a duration.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("condition not reached within {secs} s");
}

/// Writes raw bytes and reads whatever comes back until the server closes.
/// A JSON `POST` (from another thread: it needs no `TestServer`).
pub fn post_json(addr: SocketAddr, path: &str, body: &str) -> Resp {
    request(addr, "POST", path, &[("content-type", "application/json")], body.as_bytes())
}

pub fn request_raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    raw
}
