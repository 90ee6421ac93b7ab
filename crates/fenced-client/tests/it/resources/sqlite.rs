//! SQLite, in a file of a temp dir: the key-value table and the gate on an existing table.

use fenced_client::resource::sqlite::{SqliteFence, SqliteKv};
use fenced_client::{Error, Fenced, Token};
use rusqlite::Connection;

use crate::support::{Server, TempDir};

fn kv(dir: &TempDir) -> SqliteKv {
    SqliteKv::open(dir.path().join("db.sqlite"), "fenced_kv").expect("open")
}

#[tokio::test]
async fn sqlite_refuses_stale_tokens() {
    let dir = TempDir::new("sqlite");
    super::stale_token_is_refused_and_changes_nothing(&kv(&dir), "k").await;
}

#[tokio::test]
async fn sqlite_interleaved_writers() {
    let (server, dir) = (Server::start().await, TempDir::new("sqlite"));
    super::interleaved_writers_leave_the_newer_value(&server.client(), &kv(&dir), "k", "sqlite/k").await;
}

#[tokio::test]
async fn sqlite_counter_workload() {
    let (server, dir) = (Server::start().await, TempDir::new("sqlite"));
    super::counter_workload_loses_no_update(&server.client(), &kv(&dir), "counter", "sqlite/counter").await;
}

#[test]
fn sqlite_gate_on_an_existing_table() {
    let t = |n| Token::new(n).expect("non-zero");
    let mut db = Connection::open_in_memory().expect("open");
    db.execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL); INSERT INTO accounts VALUES (1, 100);")
        .expect("schema");
    let fence = SqliteFence::new("accounts", "id").expect("fence");
    fence.add_fence_column(&db).expect("add column");
    fence.add_fence_column(&db).expect("adding it twice is harmless");
    assert_eq!(fence.update(&mut db, &1, t(7), "balance = balance + ?3", &[&10]).expect("update"), Fenced::Accepted(1));
    assert_eq!(
        fence.update(&mut db, &1, t(6), "balance = balance + ?3", &[&1000]).expect("update"),
        Fenced::Rejected { token: t(6), highest_seen: t(7) }
    );
    let balance: i64 = db.query_row("SELECT balance FROM accounts WHERE id = 1", [], |r| r.get(0)).expect("read");
    assert_eq!(balance, 110, "the stale update changed nothing");
    assert!(matches!(fence.update(&mut db, &2, t(8), "balance = 0", &[]), Err(Error::NotFound(_))));
}
