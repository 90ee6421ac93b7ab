//! The services a run needs, started as real processes on free loopback ports with
//! temporary data directories: a Fenced server, Redis, etcd, ZooKeeper and PostgreSQL
//! from Debian.
//!
//! Each [`Service`] can be killed with SIGKILL and started again on the same port and
//! data directory (the nemesis's crash), and is always killed and its directory removed
//! when dropped, whatever path the run took.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::Method;

use crate::http;

mod programs;
mod systems;

pub(crate) use programs::find_program;
use programs::pg_tool;
pub use programs::Peer;

/// The key prefix a lab-started Fenced server leaves unfenced (writes need no token).
pub const UNFENCED_PREFIX: &str = "unfenced/";

/// The key prefix under which a lab-started Fenced server takes tokens minted by
/// another lock service (etcd, ZooKeeper, Redis): the gate rule without the check that
/// it issued them itself.
pub const FOREIGN_PREFIX: &str = "foreign/";

/// Debian's ZooKeeper server and client classes; its manifest names the jars it needs.
pub(crate) const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// How long a service may take to listen after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A directory removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Result<TempDir> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("fenced-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        Ok(TempDir(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    /// Removes the directory, unless `FENCED_LAB_KEEP` is set: then it stays for a
    /// post-mortem (the members' logs and data) and its path is printed on stderr.
    fn drop(&mut self) {
        if std::env::var_os("FENCED_LAB_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `fenced server` as the lab runs it: listening on `listen`, its data in `data_dir`,
/// the lab's unfenced and foreign-token prefixes, then `extra`.
pub(crate) fn fenced_server_args(listen: &str, data_dir: &Path, extra: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> =
        ["server", "--listen", listen, "--unfenced-prefix", UNFENCED_PREFIX, "--foreign-token-prefix", FOREIGN_PREFIX]
            .iter()
            .map(OsString::from)
            .collect();
    args.push("--data-dir".into());
    args.push(data_dir.into());
    args.extend(extra.iter().map(OsString::from));
    args
}

/// A free TCP port on 127.0.0.1 (free when asked; the service binds it just after),
/// never handed out twice by one process and below the kernel's ephemeral range (32768
/// and up by default), spread by the process id. The kernel's own choice (binding port
/// 0) once gave two members of one test cluster the same port: the second could not
/// bind, the first answered for both, and the cluster had no quorum; and an outgoing
/// connection can take an ephemeral port between this call and the service's bind.
pub fn free_port() -> Result<u16> {
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..SPAN {
        let port = (FIRST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port between {FIRST} and {}", FIRST + SPAN)
}

/// Sends `sig` to a process. Errors only when the process is gone.
pub fn signal(pid: u32, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) takes no pointers; a stale pid at worst signals nothing.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `true` when running as root (PostgreSQL then runs as the `postgres` user).
fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// One service process.
#[derive(Debug)]
pub struct Service {
    /// What it is, for messages: `fenced`, `redis`, `etcd`, `zookeeper`, `postgres`.
    pub name: &'static str,
    /// Where clients connect.
    pub addr: SocketAddr,
    program: PathBuf,
    args: Vec<OsString>,
    /// Its data directory and log, removed on drop.
    dir: TempDir,
    child: Option<Child>,
    /// PostgreSQL is started and stopped through pg_ctl.
    pg_bin: Option<PathBuf>,
    /// Whether the service serves, asked of a fresh connection once it listens.
    ready: fn(TcpStream) -> bool,
}

impl Service {
    /// A Fenced server from `bin` (`fenced`), with the lab's unfenced prefix.
    pub fn fenced(bin: &Path, extra: &[&str]) -> Result<Service> {
        Service::fenced_at(bin, SocketAddr::from(([127, 0, 0, 1], free_port()?)), extra)
    }

    /// [`Service::fenced`] listening on `addr` (a cluster's members know each other's
    /// addresses before they start).
    pub fn fenced_at(bin: &Path, addr: SocketAddr, extra: &[&str]) -> Result<Service> {
        let dir = TempDir::new("lab-fenced")?;
        let args = fenced_server_args(&addr.to_string(), &dir.path().join("data"), extra);
        Service::launch("fenced", bin.to_path_buf(), args, addr, dir, listening)
    }

    fn launch(
        name: &'static str,
        program: PathBuf,
        args: Vec<OsString>,
        addr: SocketAddr,
        dir: TempDir,
        ready: fn(TcpStream) -> bool,
    ) -> Result<Service> {
        let mut s = Service { name, addr, program, args, dir, child: None, pg_bin: None, ready };
        s.restart()?;
        Ok(s)
    }

    /// `tokio-postgres` connection string (PostgreSQL only).
    pub fn pg_config(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.addr.port())
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// kill -9, and reap. PostgreSQL is stopped in immediate mode (its crash).
    pub fn crash(&mut self) {
        if let Some(bin) = &self.pg_bin {
            let data = self.dir.path().join("data");
            let _ = pg_tool(bin, "pg_ctl", &[&data, "-m".as_ref(), "immediate".as_ref(), "stop".as_ref()]);
            return;
        }
        if let Some(mut child) = self.child.take() {
            let _ = signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its directory: the data directory and the log are in it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the service again on the same port and data directory, and waits until
    /// it accepts connections.
    pub fn restart(&mut self) -> Result<()> {
        self.crash();
        let log_path = self.dir.path().join(format!("{}.log", self.name));
        if let Some(bin) = &self.pg_bin {
            let data = self.dir.path().join("data");
            let opts = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=200",
                self.addr.port(),
                self.dir.path().display()
            );
            let args: [&Path; 7] = [
                &data,
                "-l".as_ref(),
                log_path.as_ref(),
                "-o".as_ref(),
                opts.as_ref(),
                "-w".as_ref(),
                "start".as_ref(),
            ];
            pg_tool(bin, "pg_ctl", &args)?;
            return self.wait_listening(START_TIMEOUT);
        }
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", self.program.display()))?;
        self.child = Some(child);
        self.wait_listening(START_TIMEOUT)
    }

    fn wait_listening(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(conn) = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)) {
                if (self.ready)(conn) {
                    return Ok(());
                }
            }
            if let Some(child) = &mut self.child {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    bail!("{} exited ({status}) before listening on {}: {}", self.name, self.addr, self.log_tail());
                }
            }
            if Instant::now() > deadline {
                bail!("{} did not listen on {} within {timeout:?}: {}", self.name, self.addr, self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of the service's log, for an error message.
    pub fn log_tail(&self) -> String {
        let path = self.dir.path().join(format!("{}.log", self.name));
        let Ok(mut f) = fs::File::open(&path) else { return "(no log)".into() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(1500)));
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        s.trim().to_owned()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.crash();
    }
}

/// `name` on the PATH, or an error naming the package that provides it.
/// Most services serve once they accept connections.
fn listening(_: TcpStream) -> bool {
    true
}

/// Whether the ZooKeeper at the other end of `conn` serves requests (it accepts
/// connections before it does): its `srvr` command answers with its version then, and
/// with an excuse before.
fn zookeeper_serving(conn: TcpStream) -> bool {
    ask(conn, b"srvr", Duration::from_millis(500)).is_some_and(|a| a.starts_with("Zookeeper version"))
}

/// Whether the etcd at the other end of `conn` serves its client API: `/health` answers
/// `"health":"true"` once it does. A bare connect is not enough: the port may be
/// another process's (a free port taken between choosing and binding it, by this
/// etcd's own peer listener in a parallel test), or etcd's before it serves.
fn etcd_serving(conn: TcpStream) -> bool {
    let Ok(addr) = conn.peer_addr() else { return false };
    drop(conn);
    let health = http::blocking(Method::GET, addr, "/health", "", Duration::from_secs(1));
    health.ok().and_then(|a| a.json_if_ok()).is_some_and(|v| v["health"] == "true")
}

/// Sends `request` and reads the answer until the peer closes, within `timeout` per read:
/// for ZooKeeper's four-letter words, which are not HTTP (HTTP goes through
/// [`crate::http`]).
pub(crate) fn ask(mut conn: TcpStream, request: &[u8], timeout: Duration) -> Option<String> {
    use std::io::Write;
    let _ = conn.set_read_timeout(Some(timeout));
    let mut answer = String::new();
    (conn.write_all(request).is_ok() && conn.read_to_string(&mut answer).is_ok()).then_some(answer)
}
