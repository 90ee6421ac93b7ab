//! How long a snapshot holds the state machine's lock, before and after the copy.
//!
//! Every apply and every view takes the state machine's lock. A snapshot (and a backup,
//! and a digest) used to encode the table while holding it; now it copies the table
//! under the lock and encodes the copy outside. This builds a table of N locks, each
//! held under a lease of its own (as N clients would), and times both.
//!
//!     cargo run --release -p fenced-raft --example snapshot_stall -- [LOCKS] [REPEAT]
//!
//! LOCKS defaults to 750,000 (the table of the probe), REPEAT to 3; each figure
//! is the median of REPEAT runs. It also times the snapshot's two formats, the JSON of
//! releases before format 3 and the binary one (`snapshot_format`), each way, and
//! prints their sizes.

use std::time::{Duration, Instant};

use fenced_core::{Acquire, Command, LeaseId, LeaseRef, Limits, LockName, LockTable, RequestId};

fn main() {
    let mut args = std::env::args().skip(1);
    let locks: u64 = args.next().map_or(750_000, |a| a.parse().expect("LOCKS: a number"));
    let repeat: usize = args.next().map_or(3, |a| a.parse().expect("REPEAT: a number"));
    let built = Instant::now();
    let table = table_of(locks);
    println!("table of {locks} locks, each under its own lease, built in {:.1?}", built.elapsed());
    let mut copy = Vec::new();
    let (mut json_enc, mut json_dec, mut bin_enc, mut bin_dec) = (vec![], vec![], vec![], vec![]);
    let (mut json_bytes, mut bin_bytes) = (0, 0);
    let limits = table.limits().clone();
    for _ in 0..repeat {
        let t = Instant::now();
        let c = table.clone();
        copy.push(t.elapsed());
        let t = Instant::now();
        let json = fenced_raft::snapshot_format::to_legacy_json(&c);
        json_enc.push(t.elapsed());
        let t = Instant::now();
        let back = fenced_raft::snapshot_format::decode(&json, &limits).expect("the JSON decodes");
        json_dec.push(t.elapsed());
        drop(back);
        let t = Instant::now();
        let bin = fenced_raft::snapshot_format::encode(&c);
        bin_enc.push(t.elapsed());
        let t = Instant::now();
        let back = fenced_raft::snapshot_format::decode(&bin, &limits).expect("the binary decodes");
        bin_dec.push(t.elapsed());
        assert_eq!(back.lock_count(), c.lock_count());
        (json_bytes, bin_bytes) = (json.len(), bin.len());
    }
    let (copy, encode) = (median(copy), median(json_enc.clone()));
    println!("lock held, before (encode under the lock): {encode:.1?}");
    println!("lock held, after (copy under the lock):    {copy:.1?}");
    println!("ratio: {:.1}x shorter", encode.as_secs_f64() / copy.as_secs_f64().max(1e-9));
    println!("| snapshot format | bytes | encode | decode |");
    println!("|---|---|---|---|");
    for (name, bytes, enc, dec) in
        [("JSON (before format 3)", json_bytes, json_enc, json_dec), ("binary (format 3)", bin_bytes, bin_enc, bin_dec)]
    {
        println!("| {name} | {:.1} MiB | {:.1?} | {:.1?} |", bytes as f64 / (1 << 20) as f64, median(enc), median(dec));
    }
}

fn table_of(locks: u64) -> LockTable {
    let limits = Limits { leases_max: locks as usize + 1, locks_max: locks as usize + 1, ..Limits::default() };
    let mut table = LockTable::new(limits);
    for i in 0..locks {
        let lease = LeaseId(u128::from(i) + 1);
        let name = LockName::new(&format!("jobs/{i:08}")).expect("a valid name");
        let now_ms = 1 + i / 1000;
        let grant = Command::GrantLease { lease, ttl_ms: 300_000 };
        assert!(table.apply(RequestId(2 * i + 1), grant, now_ms).answers.iter().all(|(_, a)| a.is_ok()));
        let acquire = Acquire {
            name,
            lease: LeaseRef::Existing(lease),
            wait_ms: 0,
            lock_delay_ms: 0,
            holder: Some(format!("worker-{i}")),
        };
        let out = table.apply(RequestId(2 * i + 2), Command::Acquire(acquire), now_ms);
        assert!(out.answers.iter().all(|(_, a)| a.is_ok()), "lock {i} not granted");
    }
    table
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}
