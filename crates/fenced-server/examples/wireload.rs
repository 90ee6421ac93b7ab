//! Load generator for the wire protocol, side by side with HTTP and with Redis:
//! acquire+release through the real `fenced-client` API (`Client::lock().acquire()`,
//! `LockGuard::release()`) over `fenced://` (one multiplexed connection for all
//! clients, or one per client) and over `http://`; Redis without persistence doing
//! `SET key val NX PX` + compare-and-delete (`EVAL`), one connection per client; one
//! contended lock; and the server CPU that keeping 100,000 leases alive costs.
//!
//! Usage: `cargo run --release -p fenced-server --example wireload -- PATH/TO/fenced [SECONDS]`
//! It starts `fenced server` (HTTP and `--wire-listen`) and, if `redis-server` is on
//! the PATH, `redis-server --save '' --appendonly no`, each on a free loopback port
//! with scratch state, and stops them at the end. One line per measurement.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_client::{Client, LeaseId};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args.get(1).expect("usage: wireload PATH/TO/fenced [SECONDS]").clone();
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run(bin, Duration::from_secs(secs)));
}

/// A child process killed and reaped when dropped, with its scratch directory.
struct Proc {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn wait_listening(addr: SocketAddr) {
    for _ in 0..500 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {addr}");
}

fn start_fenced(bin: &str) -> (Proc, SocketAddr, SocketAddr) {
    let (http, wire) = (free_addr(), free_addr());
    let dir = std::env::temp_dir().join(format!("fenced-wireload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = Command::new(bin)
        .args(["server", "--listen", &http.to_string(), "--wire-listen", &wire.to_string(), "--data-dir"])
        .arg(&dir)
        .env("FENCED_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let p = Proc { child, dir };
    wait_listening(wire);
    (p, http, wire)
}

fn start_redis() -> Option<(Proc, SocketAddr)> {
    let addr = free_addr();
    let dir = std::env::temp_dir().join(format!("fenced-wireload-redis-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let port = addr.port().to_string();
    let child = Command::new("redis-server")
        .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn();
    match child {
        Ok(child) => {
            let p = Proc { child, dir };
            wait_listening(addr);
            Some((p, addr))
        }
        Err(e) => {
            println!("redis-server not started ({e}): Redis rows skipped");
            None
        }
    }
}

/// User + system CPU time of `pid`, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// What every closed-loop run returns per task: cycles, cycle latency, acquire latency.
type TaskResult = (u64, Histogram<u64>, Histogram<u64>);

/// Every task's result, in the order they were spawned.
async fn joined<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut results = Vec::with_capacity(tasks.len());
    for t in tasks {
        results.push(t.await.unwrap());
    }
    results
}

fn report(what: &str, results: Vec<TaskResult>, elapsed: Duration) {
    let (mut cycles, mut acq) = (hist(), hist());
    let mut n = 0;
    let (mut lo, mut hi) = (u64::MAX, 0);
    for (k, c, a) in &results {
        n += k;
        lo = lo.min(*k);
        hi = hi.max(*k);
        cycles.add(c).unwrap();
        acq.add(a).unwrap();
    }
    println!(
        "{what:<52} {:>8.0} cycles/s  cycle p50 {:>6.3} p99 {:>6.3} ms  acquire p50 {:>6.3} p99 {:>6.3} ms  per client {lo}..{hi}",
        n as f64 / elapsed.as_secs_f64(),
        ms(&cycles, 0.5),
        ms(&cycles, 0.99),
        ms(&acq, 0.5),
        ms(&acq, 0.99),
    );
}

/// How the tasks of a Fenced run share clients.
#[derive(Clone, Copy, PartialEq)]
enum Sharing {
    /// One `Client` for every task: one connection (`fenced://`) or one pool (`http://`).
    OneClient,
    /// A `Client` per task: a connection each.
    ClientEach,
}

/// `clients` tasks loop acquire+release through the client API for `dur`.
async fn fenced_cycles(endpoint: &str, sharing: Sharing, clients: usize, shared_lock: bool, dur: Duration) {
    let make = || Client::builder().endpoint(endpoint).build().unwrap();
    let one = make();
    let start = Instant::now() + Duration::from_millis(300);
    let mut tasks = Vec::new();
    for i in 0..clients {
        let client = if sharing == Sharing::OneClient { one.clone() } else { make() };
        let name = if shared_lock { "shared".to_string() } else { format!("own-{i}") };
        tasks.push(tokio::spawn(async move {
            // Warm the connection up before the clock starts.
            client.lock(&name).ttl(Duration::from_secs(10)).acquire().await.unwrap().release().await.unwrap();
            tokio::time::sleep_until(start.into()).await;
            let (mut c, mut a, mut n) = (hist(), hist(), 0u64);
            while start.elapsed() < dur {
                let t = Instant::now();
                let guard = client
                    .lock(&name)
                    .ttl(Duration::from_secs(10))
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .unwrap();
                a.record(t.elapsed().as_micros().max(1) as u64).unwrap();
                guard.release().await.unwrap();
                c.record(t.elapsed().as_micros().max(1) as u64).unwrap();
                n += 1;
            }
            (n, c, a)
        }));
    }
    let results = joined(tasks).await;
    let elapsed = start.elapsed();
    let scheme = endpoint.split(':').next().unwrap();
    let how = match (sharing, scheme) {
        (Sharing::OneClient, "fenced") => "one connection",
        (Sharing::OneClient, _) => "one client (pool)",
        (Sharing::ClientEach, _) => "connection each",
    };
    let lock = if shared_lock { "one lock" } else { "own locks" };
    report(&format!("fenced {scheme}, {clients} clients, {how}, {lock}"), results, elapsed);
}

/// A Redis connection speaking just enough RESP.
struct Redis {
    s: TcpStream,
    buf: Vec<u8>,
}

/// `*N $len arg ...` for one command.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

impl Redis {
    async fn new(addr: SocketAddr) -> Redis {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Redis { s, buf: Vec::with_capacity(1024) }
    }

    /// Sends one encoded command; returns the reply's first line (`+OK`, `:1`, `$-1`, ...)
    /// after consuming any bulk payload.
    async fn call(&mut self, cmd: &[u8]) -> String {
        self.s.write_all(cmd).await.unwrap();
        loop {
            if let Some(eol) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..eol]).into_owned();
                let mut used = eol + 2;
                if let Some(len) = line.strip_prefix('$').and_then(|l| l.parse::<i64>().ok()).filter(|l| *l >= 0) {
                    while self.buf.len() < used + len as usize + 2 {
                        self.read_more().await;
                    }
                    used += len as usize + 2;
                }
                self.buf.drain(..used);
                return line;
            }
            self.read_more().await;
        }
    }

    async fn read_more(&mut self) {
        let mut chunk = [0u8; 4096];
        let n = self.s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "redis closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

/// What a client's loop sends its commands through: a connection of its own, or the
/// shared pipelined one.
trait RedisCall {
    /// Sends one encoded command; returns the reply's first line.
    async fn roundtrip(&mut self, cmd: &[u8]) -> String;
}

impl RedisCall for Redis {
    async fn roundtrip(&mut self, cmd: &[u8]) -> String {
        self.call(cmd).await
    }
}

impl RedisCall for RedisMux {
    async fn roundtrip(&mut self, cmd: &[u8]) -> String {
        self.call(cmd).await
    }
}

/// One Redis connection shared by many tasks, commands pipelined: a writer task sends
/// what has queued in one write, a reader task hands replies back in order. This is
/// what a multiplexing Redis client (redis-rs `MultiplexedConnection`) does, the
/// like-for-like peer of one `fenced://` connection.
#[derive(Clone)]
struct RedisMux {
    tx: tokio::sync::mpsc::UnboundedSender<(Vec<u8>, tokio::sync::oneshot::Sender<String>)>,
}

impl RedisMux {
    async fn new(addr: SocketAddr) -> RedisMux {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let (mut rd, mut wr) = s.into_split();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Vec<u8>, tokio::sync::oneshot::Sender<String>)>();
        let (qtx, mut qrx) = tokio::sync::mpsc::unbounded_channel::<tokio::sync::oneshot::Sender<String>>();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some((cmd, reply)) = rx.recv().await {
                buf.extend_from_slice(&cmd);
                let _ = qtx.send(reply);
                while let Ok((cmd, reply)) = rx.try_recv() {
                    buf.extend_from_slice(&cmd);
                    let _ = qtx.send(reply);
                }
                if wr.write_all(&buf).await.is_err() {
                    return;
                }
                buf.clear();
            }
        });
        tokio::spawn(async move {
            let mut buf: Vec<u8> = Vec::new();
            let mut chunk = vec![0u8; 65536];
            loop {
                // Replies here are single lines (+OK, $-1, :1).
                while let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") {
                    let line = String::from_utf8_lossy(&buf[..eol]).into_owned();
                    buf.drain(..eol + 2);
                    let _ = qrx.recv().await.expect("a caller per reply").send(line);
                }
                match rd.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
        RedisMux { tx }
    }

    async fn call(&self, cmd: &[u8]) -> String {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send((cmd.to_vec(), tx)).unwrap();
        rx.await.unwrap()
    }
}

const CAD: &str = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

/// Redis: SET NX PX + compare-and-delete per cycle; on one shared key the clients
/// spin (Redis has no queue), as a Redis lock client does.
async fn redis_cycles(addr: SocketAddr, clients: usize, shared_lock: bool, dur: Duration) {
    let start = Instant::now() + Duration::from_millis(300);
    let mut tasks = Vec::new();
    for i in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut r = Redis::new(addr).await;
            let key = if shared_lock { "shared".to_string() } else { format!("own-{i}") };
            let val = format!("holder-{i}");
            redis_lock_loop(&mut r, &key, &val, true, start, dur).await
        }));
    }
    let results = joined(tasks).await;
    let elapsed = start.elapsed();
    let lock = if shared_lock { "one key, spinning" } else { "own keys" };
    report(&format!("redis no persistence, {clients} clients, connection each, {lock}"), results, elapsed);
}

/// One client's closed loop from `start` for `dur`: SET NX PX, then compare-and-delete,
/// each cycle timed, over `call` (its own connection or the shared one). With `spin` a
/// refused SET is sent again (a shared key: Redis has no queue); without, it may not be
/// refused.
async fn redis_lock_loop(
    r: &mut impl RedisCall,
    key: &str,
    val: &str,
    spin: bool,
    start: Instant,
    dur: Duration,
) -> TaskResult {
    let set = resp(&["SET", key, val, "NX", "PX", "10000"]);
    let del = resp(&["EVAL", CAD, "1", key, val]);
    tokio::time::sleep_until(start.into()).await;
    let (mut c, mut a, mut n) = (hist(), hist(), 0u64);
    while start.elapsed() < dur {
        let t = Instant::now();
        while r.roundtrip(&set).await != "+OK" {
            assert!(spin, "SET NX on a key of its own was refused");
            if start.elapsed() >= dur {
                return (n, c, a);
            }
        }
        a.record(t.elapsed().as_micros().max(1) as u64).unwrap();
        assert_eq!(r.roundtrip(&del).await, ":1");
        c.record(t.elapsed().as_micros().max(1) as u64).unwrap();
        n += 1;
    }
    (n, c, a)
}

/// Redis on own keys through one pipelined connection shared by all clients.
async fn redis_mux_cycles(addr: SocketAddr, clients: usize, dur: Duration) {
    let start = Instant::now() + Duration::from_millis(300);
    let mux = RedisMux::new(addr).await;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let mut r = mux.clone();
        tasks.push(tokio::spawn(async move {
            let (key, val) = (format!("mux-{i}"), format!("holder-{i}"));
            redis_lock_loop(&mut r, &key, &val, false, start, dur).await
        }));
    }
    let results = joined(tasks).await;
    let elapsed = start.elapsed();
    report(&format!("redis no persistence, {clients} clients, one connection, own keys"), results, elapsed);
}

/// Creates `n` leases over one raw wire connection, pipelined.
async fn create_leases(wire: SocketAddr, n: usize, ttl_ms: u64) -> Vec<LeaseId> {
    use fenced_wire::{decode_response, encode_request, split_frame, Request, Response, PREAMBLE};
    let mut s = TcpStream::connect(wire).await.unwrap();
    let mut ids = Vec::with_capacity(n);
    let mut inbuf = Vec::new();
    for chunk in 0..n.div_ceil(1000) {
        let count = 1000.min(n - chunk * 1000);
        let mut out = if chunk == 0 { PREAMBLE.to_vec() } else { Vec::new() };
        for k in 0..count {
            encode_request(&mut out, k as u32 + 1, &Request::CreateLease { ttl_ms });
        }
        s.write_all(&out).await.unwrap();
        let mut got = 0;
        while got < count {
            let mut chunk = [0u8; 65536];
            let r = s.read(&mut chunk).await.unwrap();
            assert!(r > 0);
            inbuf.extend_from_slice(&chunk[..r]);
            let mut start = 0;
            while let Some((id, kind, payload, used)) = split_frame(&inbuf[start..], 1 << 20).unwrap() {
                match decode_response(id, kind, payload).unwrap() {
                    Response::Lease { lease, .. } => ids.push(lease),
                    other => panic!("{other:?}"),
                }
                start += used;
                got += 1;
            }
            inbuf.drain(..start);
        }
    }
    ids
}

/// Keepalives of `leases` through one client (one connection), `concurrency` at a time,
/// spread evenly over `period` (or as fast as possible when zero).
async fn keepalives(client: &Client, leases: Arc<Vec<LeaseId>>, concurrency: usize, period: Duration) -> Duration {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..concurrency {
        let (client, leases) = (client.clone(), leases.clone());
        tasks.push(tokio::spawn(async move {
            let mine: Vec<LeaseId> = leases.iter().skip(k).step_by(concurrency).copied().collect();
            let step = period / mine.len().max(1) as u32;
            for (j, lease) in mine.into_iter().enumerate() {
                if !period.is_zero() {
                    tokio::time::sleep_until((start + step * j as u32).into()).await;
                }
                client.keepalive(lease).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

async fn run(bin: String, dur: Duration) {
    let (server, http, wire) = start_fenced(&bin);
    let pid = server.child.id();
    let redis = start_redis();
    println!("fenced pid {pid} http {http} wire {wire}; {} s per run", dur.as_secs());
    let (wire_ep, http_ep) = (format!("fenced://{wire}"), format!("http://{http}"));
    for clients in [1, 16, 64] {
        fenced_cycles(&wire_ep, Sharing::OneClient, clients, false, dur).await;
        fenced_cycles(&wire_ep, Sharing::ClientEach, clients, false, dur).await;
        fenced_cycles(&http_ep, Sharing::OneClient, clients, false, dur).await;
        if let Some((_, addr)) = &redis {
            redis_cycles(*addr, clients, false, dur).await;
            redis_mux_cycles(*addr, clients, dur).await;
        }
    }
    fenced_cycles(&wire_ep, Sharing::OneClient, 16, true, dur).await;
    fenced_cycles(&wire_ep, Sharing::ClientEach, 16, true, dur).await;
    fenced_cycles(&http_ep, Sharing::OneClient, 16, true, dur).await;
    if let Some((_, addr)) = &redis {
        redis_cycles(*addr, 16, true, dur).await;
    }

    // 100,000 leases with a 30 s TTL kept alive at a third of it: 10,000 keepalives/s.
    const N: usize = 100_000;
    let leases = Arc::new(create_leases(wire, N, 30_000).await);
    let client = Client::builder().endpoint(&wire_ep).build().unwrap();
    let cpu0 = cpu_ticks(pid);
    let el = keepalives(&client, leases.clone(), 64, Duration::ZERO).await;
    let ticks = cpu_ticks(pid) - cpu0;
    println!(
        "keepalive of {N} leases as fast as possible, one connection: {:.0}/s, server CPU {:.1} us per keepalive",
        N as f64 / el.as_secs_f64(),
        ticks as f64 * 10_000.0 / N as f64
    );
    let period = Duration::from_secs(10);
    let cpu0 = cpu_ticks(pid);
    let el = keepalives(&client, leases, 256, period).await;
    let ticks = cpu_ticks(pid) - cpu0;
    println!(
        "keepalive of {N} leases over {:.1} s (a third of a 30 s TTL), one connection: server CPU {:.1}% of one core",
        el.as_secs_f64(),
        ticks as f64 / el.as_secs_f64()
    );
    drop(redis);
    drop(server);
}
