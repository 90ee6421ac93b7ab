//! Load generator for `fenced server`: acquire+release throughput and latency with 1,
//! 16 and 64 clients on their own locks and on one shared lock, keepalive cost for
//! 100,000 leases, fenced-store writes, and memory per lease and per lock (RSS of the
//! server process).
//!
//! Usage: `cargo run --release -p fenced-server --example loadgen -- PATH/TO/fenced [SECONDS]`
//! It starts `PATH/TO/fenced server` on a free loopback port with a scratch data
//! directory, drives it over keep-alive HTTP/1.1 connections, and prints one line per
//! measurement.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args.get(1).expect("usage: loadgen PATH/TO/fenced [SECONDS]").clone();
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run(bin, Duration::from_secs(secs)));
}

struct Server {
    child: Child,
    addr: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(bin: &str) -> Server {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = std::env::temp_dir().join(format!("fenced-loadgen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = Command::new(bin)
        .args(["server", "--listen", &addr.to_string(), "--data-dir"])
        .arg(&dir)
        .env("FENCED_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Dropping the Server kills and reaps the child on every path.
    let server = Server { child, addr, dir };
    for _ in 0..500 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return server;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("server did not start");
}

/// Resident set size of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// User + system CPU time of `pid`, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A keep-alive HTTP/1.1 connection.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn new(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Conn { s, buf: Vec::with_capacity(4096) }
    }

    /// Sends a request, returns (status, body).
    async fn call(&mut self, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let head = format!("{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n{headers}\r\n", body.len());
        let mut req = head.into_bytes();
        req.extend_from_slice(body);
        self.s.write_all(&req).await.unwrap();
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
                let status: u16 = head[9..12].parse().unwrap();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                while self.buf.len() < end + 4 + len {
                    self.read_more().await;
                }
                let body = self.buf[end + 4..end + 4 + len].to_vec();
                self.buf.drain(..end + 4 + len);
                return (status, body);
            }
            self.read_more().await;
        }
    }

    async fn read_more(&mut self) {
        let mut chunk = [0u8; 4096];
        let n = self.s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    async fn json(&mut self, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (st, b) = self.call(method, path, "", body.as_bytes()).await;
        (st, if b.is_empty() { serde_json::Value::Null } else { serde_json::from_slice(&b).unwrap() })
    }
}

async fn lease(c: &mut Conn, ttl_ms: u64) -> String {
    let (st, v) = c.json("POST", "/v1/leases", &format!("{{\"ttl_ms\":{ttl_ms}}}")).await;
    assert_eq!(st, 201, "{v}");
    v["lease_id"].as_str().unwrap().to_string()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

/// Every task's count and latencies, added up.
async fn gather(tasks: Vec<tokio::task::JoinHandle<(u64, Histogram<u64>)>>) -> (u64, Histogram<u64>) {
    let mut total = hist();
    let mut ops = 0;
    for t in tasks {
        let (n, h) = t.await.unwrap();
        ops += n;
        total.add(&h).unwrap();
    }
    (ops, total)
}

fn report(what: &str, ops: u64, elapsed: Duration, h: &Histogram<u64>) {
    println!(
        "{what:<44} {:>9.0} ops/s   p50 {:>7.3} ms   p99 {:>7.3} ms   ({ops} ops in {:.1} s)",
        ops as f64 / elapsed.as_secs_f64(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        elapsed.as_secs_f64()
    );
}

/// `clients` tasks loop acquire+release for `dur`; `shared` puts them all on one lock.
async fn acquire_release(addr: SocketAddr, clients: usize, shared: bool, dur: Duration) {
    let mut tasks = Vec::new();
    let start = Instant::now() + Duration::from_millis(200);
    for i in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::new(addr).await;
            let lease = lease(&mut c, 60_000).await;
            let name = if shared { "shared".to_string() } else { format!("own-{i}") };
            let acq = format!("{{\"lease_id\":\"{lease}\",\"wait_ms\":60000}}");
            let rel = format!("{{\"lease_id\":\"{lease}\"}}");
            let (apath, rpath) = (format!("/v1/locks/{name}/acquire"), format!("/v1/locks/{name}/release"));
            tokio::time::sleep_until(start.into()).await;
            let mut h = hist();
            let mut n = 0u64;
            while start.elapsed() < dur {
                let t = Instant::now();
                let (st, _) = c.call("POST", &apath, "", acq.as_bytes()).await;
                assert_eq!(st, 200);
                let (st, _) = c.call("POST", &rpath, "", rel.as_bytes()).await;
                assert_eq!(st, 200);
                h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
                n += 1;
            }
            c.call("DELETE", &format!("/v1/leases/{lease}"), "", b"").await;
            (n, h)
        }));
    }
    let (ops, total) = gather(tasks).await;
    let what = format!("acquire+release, {clients} clients, {}", if shared { "one shared lock" } else { "own locks" });
    report(&what, ops, start.elapsed(), &total);
}

/// Fenced-store writes (each durable: fsync per group commit).
async fn store_writes(addr: SocketAddr, clients: usize, dur: Duration) {
    let mut tasks = Vec::new();
    let start = Instant::now() + Duration::from_millis(200);
    for i in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::new(addr).await;
            tokio::time::sleep_until(start.into()).await;
            let mut h = hist();
            let mut n = 0u64;
            let path = format!("/v1/store/w-{i}");
            while start.elapsed() < dur {
                let t = Instant::now();
                let (st, _) = c.call("PUT", &path, "fencing-token: 7\r\n", b"0123456789abcdef").await;
                assert_eq!(st, 200);
                h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
                n += 1;
            }
            (n, h)
        }));
    }
    let (ops, total) = gather(tasks).await;
    report(&format!("fenced-store write (16 B), {clients} clients"), ops, start.elapsed(), &total);
}

/// Runs `per_conn` calls on each of `conns` connections; `make(i)` gives (method, path, body).
async fn fan_out(
    addr: SocketAddr,
    conns: usize,
    items: std::sync::Arc<Vec<String>>,
    make: fn(&str) -> (&'static str, String, String),
    expect: u16,
) -> (u64, Histogram<u64>, Duration) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..conns {
        let items = items.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::new(addr).await;
            let mut h = hist();
            let mut n = 0;
            for item in items.iter().skip(k).step_by(conns) {
                let (m, p, b) = make(item);
                let t = Instant::now();
                let (st, body) = c.call(m, &p, "", b.as_bytes()).await;
                assert_eq!(st, expect, "{}", String::from_utf8_lossy(&body));
                h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
                n += 1;
            }
            (n, h)
        }));
    }
    let (ops, total) = gather(tasks).await;
    (ops, total, start.elapsed())
}

async fn run(bin: String, dur: Duration) {
    let server = start(&bin);
    let addr = server.addr;
    let pid = server.child.id();
    println!("server {bin} pid {pid} on {addr}; {} s per throughput run", dur.as_secs());
    for shared in [false, true] {
        for clients in [1, 16, 64] {
            acquire_release(addr, clients, shared, dur).await;
        }
    }
    for clients in [1, 64] {
        store_writes(addr, clients, dur).await;
    }

    // 100,000 leases: memory, then the cost of keeping all of them alive.
    const N: usize = 100_000;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss0 = rss_kib(pid);
    let ids: Vec<String> = {
        let mut c = Conn::new(addr).await;
        let mut ids = Vec::with_capacity(N);
        for _ in 0..N {
            ids.push(lease(&mut c, 300_000).await);
        }
        ids
    };
    let rss1 = rss_kib(pid);
    println!(
        "memory per lease: {:.0} B (RSS {} -> {} KiB for {N} leases)",
        (rss1 - rss0) as f64 * 1024.0 / N as f64,
        rss0,
        rss1
    );
    let ids = std::sync::Arc::new(ids);
    let cpu0 = cpu_ticks(pid);
    let (ops, h, el) =
        fan_out(addr, 64, ids.clone(), |id| ("POST", format!("/v1/leases/{id}/keepalive"), String::new()), 200).await;
    let cpu = cpu_ticks(pid) - cpu0;
    report(&format!("keepalive of {N} leases, 64 connections"), ops, el, &h);
    println!(
        "keepalive server CPU: {:.1} us per keepalive ({} ticks of 10 ms for {ops}); one round of all {N} leases: {:.2} s",
        cpu as f64 * 10_000.0 / ops as f64,
        cpu,
        el.as_secs_f64()
    );
    // One lock per lease: memory per held lock.
    let rss2 = rss_kib(pid);
    let (ops, h, el) = fan_out(
        addr,
        64,
        ids.clone(),
        |id| ("POST", format!("/v1/locks/m-{id}/acquire"), format!("{{\"lease_id\":\"{id}\"}}")),
        200,
    )
    .await;
    let rss3 = rss_kib(pid);
    report(&format!("acquire of {N} distinct locks, 64 connections"), ops, el, &h);
    println!(
        "memory per held lock: {:.0} B (RSS {} -> {} KiB for {N} locks)",
        (rss3 - rss2) as f64 * 1024.0 / N as f64,
        rss2,
        rss3
    );
    drop(server);
}
