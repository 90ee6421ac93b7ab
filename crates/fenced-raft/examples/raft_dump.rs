//! Post-mortem: prints a member's data directory (a copy: opening it may repair it, a
//! torn tail of its log is cut) as lines: the snapshot decoded (its format, agreed limits
//! and counts, from the `snapshot` file), what `raft.redb` still holds (the base state;
//! before format 5 also the log), then the log's segments (`log/`, format 5): the vote,
//! the commit and purge marks, and every entry decoded (a record that does not decode, a
//! damaged one among them, is printed with the reason and its bytes; a damaged segment
//! is printed with the error that refuses it).
//!
//!     cargo run --release -p fenced-raft --example raft_dump -- COPY_OF_DATA_DIR

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::path::PathBuf::from(std::env::args().nth(1).ok_or("usage: raft_dump DATA_DIR")?);
    // A path to raft.redb (as this example took before format 5) names its directory.
    let dir = if arg.ends_with("raft.redb") { arg.parent().unwrap_or(&arg).to_path_buf() } else { arg };
    let beside = dir.join("snapshot");
    if beside.exists() {
        match fenced_raft::snapshot_file::read_path(&beside) {
            Ok((meta, data)) => {
                println!("snapshot file {} meta {}", beside.display(), String::from_utf8_lossy(&meta));
                snapshot(&data);
            }
            Err(e) => println!("snapshot file REFUSED: {e}"),
        }
    }
    let db = Database::create(dir.join("raft.redb"))?;
    let txn = db.begin_read()?;
    if let Ok(meta) = txn.open_table(META) {
        for row in meta.iter()? {
            let (k, v) = row?;
            println!("raft.redb meta {} {}", k.value(), shown(v.value()));
            if k.value() == "snapshot_data" {
                snapshot(v.value());
            }
        }
    }
    if let Ok(log) = txn.open_table(LOG) {
        for row in log.iter()? {
            let (k, v) = row?;
            entry(k.value(), v.value());
        }
    }
    if dir.join("log").is_dir() {
        segments(&dir.join("log"));
    }
    Ok(())
}

fn shown(v: &[u8]) -> String {
    if v.len() > 200 && std::env::var_os("FULL").is_none() {
        format!("<{} bytes>", v.len())
    } else {
        String::from_utf8_lossy(v).into_owned()
    }
}

fn entry(index: u64, bytes: &[u8]) {
    match fenced_raft::entry_format::decode(bytes, index) {
        Ok(entry) => println!("{index} {entry:?}"),
        Err(e) => println!("{index} REFUSED ({e}): {}", String::from_utf8_lossy(bytes)),
    }
}

fn segments(dir: &std::path::Path) {
    match fenced_raft::segment_log::SegmentLog::open(dir) {
        Ok((_, rec)) => {
            let state = &rec.state;
            println!("log vote {}", state.vote.as_deref().map_or("none".into(), shown));
            println!("log committed {}", state.committed.as_deref().map_or("none".into(), shown));
            println!("log purged {}", state.purged.as_ref().map_or("none".into(), |(_, m)| shown(m)));
            if let Some((segment, at)) = &rec.torn {
                println!("log TORN TAIL cut in {} at byte {at}", segment.display());
            }
            for (index, bytes) in &rec.entries {
                entry(*index, bytes);
            }
        }
        Err(e) => println!("log REFUSED: {e}"),
    }
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
