//! PostgreSQL, a real server this test starts itself: initdb and pg_ctl from Debian's
//! `postgresql` package into a temp dir, listening only on a Unix socket there.

use std::path::PathBuf;
use std::process::Command;

use fenced_client::resource::postgres::{PgFence, PgKv};
use fenced_client::{Error, Fenced, Token};

use crate::support::{free_port, skip_or_fail, Server, TempDir};

/// A PostgreSQL cluster in a temp dir; stopped (immediate) and removed when dropped.
struct Pg {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
}

impl Pg {
    /// Starts one, or says why it cannot: fails loudly under CI, skips otherwise.
    fn start() -> Option<Pg> {
        let Some(bin) = pg_bin() else {
            return skip_or_fail(
                "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install -y postgresql)",
            );
        };
        let dir = TempDir::new("pg");
        let port = free_port();
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            // initdb refuses to run as root: the cluster belongs to the `postgres` user.
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status();
            assert!(ok.map(|s| s.success()).unwrap_or(false), "chown the temp dir to postgres");
        }
        let data = dir.path().join("data");
        let run = |args: &[&str]| {
            let mut c = if root {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(bin.join(args[0]));
                c
            } else {
                Command::new(bin.join(args[0]))
            };
            let out = c.args(&args[1..]).output().expect("run a PostgreSQL tool");
            assert!(out.status.success(), "{} failed: {}", args[0], String::from_utf8_lossy(&out.stderr));
        };
        let data_s = data.to_str().expect("utf8 path");
        run(&["initdb", "-D", data_s, "-U", "postgres", "-A", "trust", "--no-sync"]);
        let opts = format!("-k {} -c listen_addresses='' -p {port} -c fsync=off", dir.path().display());
        let log = dir.path().join("pg.log");
        run(&["pg_ctl", "-D", data_s, "-l", log.to_str().expect("utf8"), "-o", &opts, "-w", "start"]);
        Some(Pg { bin, dir, port })
    }

    async fn connect(&self) -> tokio_postgres::Client {
        let conf = format!("host={} port={} user=postgres dbname=postgres", self.dir.path().display(), self.port);
        let (client, conn) = tokio_postgres::connect(&conf, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let mut c = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(self.bin.join("pg_ctl"));
            c
        } else {
            Command::new(self.bin.join("pg_ctl"))
        };
        let _ = c.arg("-D").arg(data).args(["-m", "immediate", "stop"]).output();
    }
}

fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

#[tokio::test]
async fn postgres_refuses_stale_tokens() {
    let Some(pg) = Pg::start() else { return };
    let kv = PgKv::open(pg.connect().await, "fenced_kv").await.expect("open");
    super::stale_token_is_refused_and_changes_nothing(&kv, "k").await;
}

#[tokio::test]
async fn postgres_interleaved_writers_and_counter() {
    let Some(pg) = Pg::start() else { return };
    let server = Server::start().await;
    let client = server.client();
    let kv = PgKv::open(pg.connect().await, "fenced_kv").await.expect("open");
    super::interleaved_writers_leave_the_newer_value(&client, &kv, "k", "pg/k").await;
    super::counter_workload_loses_no_update(&client, &kv, "counter", "pg/counter").await;
}

#[tokio::test]
async fn postgres_gate_on_an_existing_table() {
    let Some(pg) = Pg::start() else { return };
    let db = pg.connect().await;
    let t = |n| Token::new(n).expect("non-zero");
    db.batch_execute(
        "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL); INSERT INTO accounts VALUES (1, 100);",
    )
    .await
    .expect("schema");
    let fence = PgFence::new("accounts", "id").expect("fence");
    fence.add_fence_column(&db).await.expect("add column");
    fence.add_fence_column(&db).await.expect("adding it twice is harmless");
    let ten = 10i64;
    assert_eq!(
        fence.update(&db, &1i64, t(7), "balance = balance + $3", &[&ten]).await.expect("update"),
        Fenced::Accepted(1)
    );
    let lots = 1000i64;
    assert_eq!(
        fence.update(&db, &1i64, t(6), "balance = balance + $3", &[&lots]).await.expect("update"),
        Fenced::Rejected { token: t(6), highest_seen: t(7) }
    );
    let balance: i64 = db.query_one("SELECT balance FROM accounts WHERE id = 1", &[]).await.expect("read").get(0);
    assert_eq!(balance, 110, "the stale update changed nothing");
    // A fenced read by a newer holder advances the mark and returns the row.
    let read = fence.read(&db, &1i64, t(9), "balance").await.expect("read");
    assert!(matches!(read, Fenced::Accepted(Some(ref row)) if row.get::<_, i64>(0) == 110));
    assert!(matches!(
        fence.update(&db, &1i64, t(7), "balance = 0", &[]).await.expect("update"),
        Fenced::Rejected { .. }
    ));
    assert!(matches!(fence.update(&db, &2i64, t(9), "balance = 0", &[]).await, Err(Error::NotFound(_))));
    assert!(matches!(fence.read(&db, &2i64, t(9), "balance").await.expect("read"), Fenced::Accepted(None)));
}

#[tokio::test]
async fn postgres_behind_a_signature_check() {
    let Some(pg) = Pg::start() else { return };
    let kv = PgKv::open(pg.connect().await, "fenced_signed").await.expect("open");
    crate::signed::a_forged_token_is_refused_with_keys_and_taken_without(kv, "pg").await;
}
