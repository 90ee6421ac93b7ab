//! Test harness: a real `fenced server` child process on a free loopback port, temp dirs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fenced_client::{Client, Token};

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("fenced-client-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `fenced` binary: `FENCED_BIN`, else the one cargo built next to this test
/// (`cargo test --workspace` builds it; alone, `cargo build -p fenced` first).
pub fn fenced_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FENCED_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let debug_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/..");
    let bin = debug_dir.join("fenced");
    assert!(
        bin.exists(),
        "no fenced binary at {}: run `cargo build -p fenced --bin fenced` first, or set FENCED_BIN",
        bin.display()
    );
    bin
}

/// A free port below the kernel's ephemeral range (32768 and up by default), so that an
/// outgoing connection of a test running beside this one cannot take it between this
/// call and the server's bind (seen: "the server did not listen" under load). Spread by
/// the process id, distinct within the process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    loop {
        let port = 20_000 + (start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A token in a test (never 0).
pub fn t(n: u64) -> Token {
    Token::new(n).expect("non-zero")
}

/// What a test needs and this machine lacks: fails loudly under CI, skips (None) with
/// the reason otherwise.
pub fn skip_or_fail<T>(why: &str) -> Option<T> {
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipping: {why}");
    None
}

/// `program` in a directory of the PATH.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

/// A service a resource's tests run against (moto, DynamoDB Local) on a loopback port,
/// killed when dropped.
pub struct Helper {
    pub child: Child,
    pub port: u16,
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running server; killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub data: TempDir,
    /// Extra flags, kept for restarts.
    args: Vec<String>,
}

impl Server {
    pub async fn start() -> Server {
        Server::start_with(&[]).await
    }

    pub async fn start_with(args: &[String]) -> Server {
        Server::start_on(free_port(), args).await
    }

    /// Starts on `port` (a cluster's members must know each other's ports first).
    pub async fn start_on(port: u16, args: &[String]) -> Server {
        let data = TempDir::new("server");
        let child = spawn(port, data.path(), args);
        let s = Server { child, port, data, args: args.to_vec() };
        s.wait_live().await;
        s
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts with the wire protocol on a second free port as well.
    pub async fn start_wire(extra: &[String]) -> Server {
        let mut args = vec!["--wire-listen".to_owned(), format!("127.0.0.1:{}", free_port())];
        args.extend_from_slice(extra);
        Server::start_with(&args).await
    }

    /// `fenced://127.0.0.1:PORT` when started with `start_wire`.
    pub fn wire_endpoint(&self) -> String {
        let at = self.args.iter().position(|a| a == "--wire-listen").expect("started with start_wire");
        format!("fenced://{}", self.args[at + 1])
    }

    /// A client on the wire protocol.
    pub fn wire_client(&self) -> Client {
        let endpoint = self.wire_endpoint();
        Client::builder().endpoint(endpoint).request_timeout(Duration::from_secs(5)).build().expect("client")
    }

    pub fn client(&self) -> Client {
        Client::builder().endpoint(self.endpoint()).request_timeout(Duration::from_secs(5)).build().expect("client")
    }

    /// kill -9, then start again on the same port and data dir.
    pub async fn crash_and_restart(&mut self) {
        self.child.kill().expect("kill server");
        self.child.wait().expect("reap server");
        self.child = spawn(self.port, self.data.path(), &self.args);
        self.wait_live().await;
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "signal the server");
    }

    async fn wait_live(&self) {
        let wire = self.args.iter().position(|a| a == "--wire-listen").map(|at| self.args[at + 1].clone());
        for _ in 0..200 {
            let http = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if http && wire.as_ref().is_none_or(|w| std::net::TcpStream::connect(w).is_ok()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the server did not listen on port {} within 10 s", self.port);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A stopped server must be continued to die promptly.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(port: u16, data: &Path, args: &[String]) -> Child {
    Command::new(fenced_bin())
        .args(["server", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data.join("data"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(match std::env::var_os("FENCED_TEST_SERVER_LOGS") {
            // Kept for a look after the test: one file per server, by port.
            Some(dir) => std::fs::File::create(Path::new(&dir).join(format!("{port}.log")))
                .map_or_else(|_| Stdio::null(), Stdio::from),
            None => Stdio::null(),
        })
        .spawn()
        .expect("spawn fenced server")
}
