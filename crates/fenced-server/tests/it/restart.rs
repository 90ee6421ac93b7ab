//! Restarts on the same data directory: every grant, lease and store write is in the
//! replicated log (a cluster of one), so a restart keeps held locks with their leases
//! and tokens, grants free locks at once, and tokens only go up. (The kill -9 loop is in
//! the `fenced` binary's tests.)

use fenced_server::Config;

use crate::harness::TestServer;

#[test]
fn a_restart_keeps_every_lock_its_lease_and_its_token() {
    let s = TestServer::start();
    let a = s.lease(60_000);
    let (_, g) = s.acquire("held", &format!("{{\"lease_id\":\"{a}\"}}"));
    let t1 = g["token"].as_u64().unwrap();
    assert_eq!(s.request("PUT", "/v1/store/k", &[("Fencing-Token", &t1.to_string())], b"kept").status, 200);
    let dir = s.stop();

    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    assert_eq!(s.get("/readyz").json()["recovering"], false, "no grace: the log knows every lease");
    let lock = s.get("/v1/locks/held").json();
    assert_eq!((lock["held"].as_bool(), lock["token"].as_u64()), (Some(true), Some(t1)), "{lock}");
    // At least the full TTL again, counted from the restart.
    assert!(lock["expires_in_ms"].as_u64().unwrap() > 55_000, "{lock}");
    // The holder's lease is still alive and still the holder: a retry is the same grant.
    let (st, g) = s.acquire("held", &format!("{{\"lease_id\":\"{a}\"}}"));
    assert_eq!((st, g["token"].as_u64()), (200, Some(t1)), "{g}");
    let (st, _) = s.call("POST", &format!("/v1/leases/{a}/keepalive"), "{}");
    assert_eq!(st, 200);
    // Another lease is refused the held lock, and gets a free one at once.
    let b = s.lease(1_000);
    let (st, e) = s.acquire("held", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "{e}");
    let (st, g) = s.acquire("free", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!(st, 200, "{g}");
    assert_eq!(g["token"].as_u64(), Some(t1 + 1), "tokens continue without a jump");
    let r = s.get("/v1/store/k");
    assert_eq!((r.text().as_str(), r.header("fencing-highest-seen")), ("kept", Some(t1.to_string().as_str())));
}

#[test]
fn tokens_stay_above_every_token_of_before_a_restart() {
    let s = TestServer::start();
    let a = s.lease(60_000);
    let mut last = 0;
    for i in 0..20 {
        let (st, g) = s.acquire(&format!("c{i}"), &format!("{{\"lease_id\":\"{a}\"}}"));
        assert_eq!(st, 200);
        let t = g["token"].as_u64().unwrap();
        assert!(t > last);
        last = t;
    }
    s.call("DELETE", &format!("/v1/leases/{a}"), "");
    let dir = s.stop();
    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    let (_, g) = s.acquire("after", "{\"ttl_ms\":1000}");
    assert_eq!(g["token"].as_u64(), Some(last + 1), "the next token, no jump: {g}");
}

/// The `fenced.redb` files of the formats before this one, each written by that
/// format's own code (the fenced store of the release before its removal) and kept:
/// `single-node-format` (token ceiling 1,000, TTL mark 500 ms, a 20 s lock-delay record
/// for `delayed`, key `k` = "old" and a mark on `marked`, both at token 900) and
/// `store-beside-log` (`both` = "side" at token 1, `side` = "only" at token 7).
const OLD_FORMATS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// A data directory of the format before the replicated log (token ceiling, TTL mark,
/// a lock-delay record): migrated once, tokens continue above the old ceiling, the old
/// rule's grace holds back grants once, the lock-delay is served, and the migrated
/// state is put in a snapshot so that members added later start from it.
#[test]
fn a_single_node_directory_of_the_old_format_is_migrated() {
    let dir = std::env::temp_dir().join(format!("fenced-migrate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(format!("{OLD_FORMATS}/single-node-format/fenced.redb"), dir.join("fenced.redb")).unwrap();
    let s = TestServer::on(Config { data_dir: dir.clone(), ..Config::default() });
    // The fenced store came along, marks and all, and the old file is kept aside.
    let r = s.get("/v1/store/k");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"old"[..]));
    let r = s.request("PUT", "/v1/store/marked", &[("Fencing-Token", "899")], b"zombie");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (409, Some("stale_token")), "{:?}", r.json());
    assert!(!dir.join("fenced.redb").exists() && dir.join("fenced.redb.migrated").exists());
    // The old rule's grace, once: every lease of the old run lived in memory.
    let (st, e) = s.acquire("a", "{\"ttl_ms\":1000}");
    assert!(st == 503 || st == 200, "{e}");
    let (st, g) = s.acquire("a", "{\"ttl_ms\":1000,\"wait_ms\":5000}");
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() >= 1_000, "tokens continue above the old ceiling: {g}");
    let (st, e) = s.acquire("delayed", "{\"ttl_ms\":1000}");
    assert_eq!((st, e["error"]["code"].as_str()), (409, Some("lock_held")), "the lock-delay is served: {e}");
    crate::harness::eventually(10, || s.get("/v1/cluster").json()["snapshot_index"].as_u64().is_some());
    let t = g["token"].as_u64().unwrap();
    let dir = s.stop();
    // The next start is not a migration: no grace, the same state.
    let s = TestServer::on(Config { data_dir: dir, ..Config::default() });
    let (st, g) = s.acquire("b", "{\"ttl_ms\":1000}");
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > t);
    let (st, _) = s.acquire("delayed", "{\"ttl_ms\":1000}");
    assert_eq!(st, 409);
}

/// A data directory of the second format (the log in `raft.redb`, the fenced store
/// beside it in `fenced.redb`): the store's records are brought into the log once; a
/// key the log already has keeps its record.
#[test]
fn a_store_kept_beside_the_log_is_brought_into_it() {
    let dir = std::env::temp_dir().join(format!("fenced-import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = TestServer::on(Config { data_dir: dir.clone(), ..Config::default() });
    let (_, g) = s.acquire("a", "{\"ttl_ms\":60000}");
    let t = g["token"].as_u64().unwrap().to_string();
    assert_eq!(s.request("PUT", "/v1/store/both", &[("Fencing-Token", &t)], b"log").status, 200);
    let dir = s.stop();
    std::fs::copy(format!("{OLD_FORMATS}/store-beside-log/fenced.redb"), dir.join("fenced.redb")).unwrap();
    let s = TestServer::on(Config { data_dir: dir.clone(), ..Config::default() });
    assert_eq!(s.get("/v1/store/both").body.as_slice(), b"log");
    let r = s.get("/v1/store/side");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"only"[..]));
    assert!(!dir.join("fenced.redb").exists() && dir.join("fenced.redb.migrated").exists());
    // The lock taken before is still held, by the same token.
    let v = s.get("/v1/locks/a").json();
    assert_eq!(v["token"].as_u64().map(|t| t.to_string()), Some(t), "{v}");
    let dir = s.stop();
    let _ = std::fs::remove_dir_all(dir);
}

/// The data directory of each format, kept: every later release must read them.
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
/// The implicit lease that holds `fixture-held` in them. The fixtures are written by
/// `scripts/write-data-dir-fixture.sh` (by hand, once per format), which uses it too.
const FIXTURE_LEASE: &str = "6f1d2c3b4a5968778695a4b3c2d1e0f1";

/// The data directory written by the release that introduced `format`, opened by this
/// one: it is marked with this release's format, its held lock is held by the same
/// lease with the same token, its store write is there with its mark, tokens continue
/// above it, and it reads again after a restart (entries of both formats in one log).
fn a_data_directory_of_an_earlier_format_reads(format: u32) {
    let dir = crate::harness::scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    copy_tree(std::path::Path::new(&format!("{FIXTURES}/data-dir-format-{format}")), &dir);
    let said = |dir: &std::path::Path| std::fs::read_to_string(dir.join("FORMAT")).unwrap();
    assert_eq!(said(&dir), format!("fenced data directory format {format}\n"));
    let s = TestServer::on(Config { data_dir: dir.clone(), ..Config::default() });
    assert_eq!(said(&dir), format!("fenced data directory format {}\n", fenced_server::format::FORMAT_VERSION));
    if format >= 3 {
        let c = s.get("/v1/cluster").json();
        assert!(c["snapshot_index"].as_u64().is_some(), "the fixture holds a snapshot: {c}");
        assert!(dir.join("snapshot").exists(), "the snapshot is kept in its own file from format 4");
    }
    assert!(dir.join("log").is_dir(), "the log is kept in segments of its own from format 5");
    let lock = s.get("/v1/locks/fixture-held").json();
    assert_eq!((lock["held"].as_bool(), lock["token"].as_u64()), (Some(true), Some(1)), "{lock}");
    let (st, g) = s.acquire("fixture-held", &format!("{{\"lease_id\":\"{FIXTURE_LEASE}\",\"ttl_ms\":300000}}"));
    assert_eq!((st, g["token"].as_u64()), (200, Some(1)), "the holder's retry is the same grant: {g}");
    let r = s.get("/v1/store/fixture-key");
    let value = format!("format {format}");
    assert_eq!((r.status, r.text().as_str(), r.header("fencing-highest-seen")), (200, value.as_str(), Some("2")));
    let b = s.lease(10_000);
    let (st, g) = s.acquire("fixture-new", &format!("{{\"lease_id\":\"{b}\"}}"));
    assert_eq!((st, g["token"].as_u64()), (200, Some(3)), "{g}");
    let dir = s.stop();
    let s = TestServer::on(Config { data_dir: dir.clone(), ..Config::default() });
    let lock = s.get("/v1/locks/fixture-new").json();
    assert_eq!((lock["held"].as_bool(), lock["token"].as_u64()), (Some(true), Some(3)), "{lock}");
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Copies the fixture `from` (files and the `log` directory of format 5) into `to`.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).expect("the fixture is there") {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(to.join(entry.file_name())).unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn a_data_directory_of_format_1_still_reads() {
    a_data_directory_of_an_earlier_format_reads(1);
}

#[test]
fn a_data_directory_of_format_2_still_reads() {
    a_data_directory_of_an_earlier_format_reads(2);
}

/// Format 3's fixture holds a binary snapshot (of everything above) and the entry that
/// agreed the limits: the state is restored from that snapshot.
#[test]
fn a_data_directory_of_format_3_still_reads() {
    a_data_directory_of_an_earlier_format_reads(3);
}

/// Format 4's fixture keeps its snapshot in the file `snapshot`, beside `raft.redb`.
#[test]
fn a_data_directory_of_format_4_still_reads() {
    a_data_directory_of_an_earlier_format_reads(4);
}

/// Format 5's fixture keeps its log in segments (`log/`), not in `raft.redb`.
#[test]
fn a_data_directory_of_format_5_still_reads() {
    a_data_directory_of_an_earlier_format_reads(5);
}

/// A directory of a later format is refused with both versions, and left as it was.
#[test]
fn a_data_directory_of_a_later_format_is_refused_untouched() {
    let dir = crate::harness::scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("FORMAT"), "fenced data directory format 9\n").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let e = rt
        .block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let config = Config { data_dir: dir.clone(), ..Config::default() };
            fenced_server::run_with_wire(listener, None, config, std::future::pending::<()>()).await
        })
        .expect_err("a later format is refused");
    let e = e.to_string();
    let reads = format!("reads format {}", fenced_server::format::FORMAT_VERSION);
    assert!(e.contains("format 9, written by a later release") && e.contains(&reads), "{e}");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, vec![std::ffi::OsString::from("FORMAT")], "nothing else was made");
    let _ = std::fs::remove_dir_all(&dir);
}
