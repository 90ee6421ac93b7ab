//! Post-mortem: prints a member's `raft.redb` (a copy: opening it may repair it) as
//! lines, the metadata first, then the snapshot decoded (its format, agreed limits and
//! counts: from the `snapshot` file beside it, or from `raft.redb` for a directory
//! before format 4), then every log entry decoded (a record that does not decode, a
//! damaged one among them, is printed with the reason and its bytes).
//!
//!     cargo run --release -p fenced-raft --example raft_dump -- DATA_DIR/raft.redb

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: raft_dump FILE")?;
    let beside = std::path::Path::new(&path).with_file_name("snapshot");
    if beside.exists() {
        match fenced_raft::snapshot_file::read_path(&beside) {
            Ok((meta, data)) => {
                println!("snapshot file {} meta {}", beside.display(), String::from_utf8_lossy(&meta));
                snapshot(&data);
            }
            Err(e) => println!("snapshot file REFUSED: {e}"),
        }
    }
    let db = Database::create(path)?;
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    for row in meta.iter()? {
        let (k, v) = row?;
        let v = v.value();
        let shown = if v.len() > 200 && std::env::var_os("FULL").is_none() {
            format!("<{} bytes>", v.len())
        } else {
            String::from_utf8_lossy(v).into_owned()
        };
        println!("meta {} {}", k.value(), shown);
        if k.value() == "snapshot_data" {
            snapshot(v);
        }
    }
    let log = txn.open_table(LOG)?;
    for row in log.iter()? {
        let (k, v) = row?;
        match fenced_raft::entry_format::decode(v.value(), k.value()) {
            Ok(entry) => println!("{} {entry:?}", k.value()),
            Err(e) => println!("{} REFUSED ({e}): {}", k.value(), String::from_utf8_lossy(v.value())),
        }
    }
    Ok(())
}

fn snapshot(bytes: &[u8]) {
    let format = if fenced_raft::snapshot_format::is_legacy(bytes) { "JSON (before format 3)" } else { "binary" };
    match fenced_raft::snapshot_format::decode(bytes, &fenced_core::Limits::default()) {
        Ok(t) => println!(
            "snapshot {format}: limits agreed {}, leases {}, locks {}, waiters {}, store keys {}, highest token {:?}",
            if t.limits_agreed() { format!("{:?}", t.limits()) } else { "no".into() },
            t.lease_count(),
            t.lock_count(),
            t.waiter_count(),
            t.store().usage().0,
            t.highest_issued().map(|t| t.get()),
        ),
        Err(e) => println!("snapshot {format} REFUSED: {e}"),
    }
}
