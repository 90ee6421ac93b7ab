//! What this disk allows a durable lock service (`fenced_lab::bench::ceiling`): N
//! closed-loop clients, two commits a cycle, one writer group-committing, no other work.
//! Prints one JSON line.
//!
//! ```text
//! cargo run --release -p fenced-lab --example disk_ceiling -- \
//!     [--clients 16] [--seconds 5] [--engine file|redb] [--members 1|3|5] \
//!     [--segment prealloc|falloc|grow|recycle] [--writers 1|2] \
//!     [--linger-us 0 | --linger-frac F] [--dir DIR]
//! ```

use std::path::PathBuf;
use std::time::Duration;

use fenced_lab::bench::ceiling::{measure, CeilingConfig, Log, Segment};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let parsed = |name: &str, default: &str| arg(&args, name).unwrap_or_else(|| default.into());
    let number = |name: &str, default: &str| -> f64 {
        parsed(name, default).parse().unwrap_or_else(|_| panic!("{name} takes a number"))
    };
    let engine = parsed("--engine", "file");
    let segment = parsed("--segment", "prealloc");
    let log = match engine.as_str() {
        "file" => Log::File(segment.parse::<Segment>().unwrap_or_else(|e| panic!("--segment: {e}"))),
        "redb" => Log::Redb,
        other => panic!("--engine file|redb, not {other}"),
    };
    let cfg = CeilingConfig {
        clients: number("--clients", "16") as usize,
        duration: Duration::from_secs(number("--seconds", "5") as u64),
        log,
        members: number("--members", "1") as usize,
        writers: number("--writers", "1") as usize,
        linger: Duration::from_micros(number("--linger-us", "0") as u64),
        linger_frac: number("--linger-frac", "0"),
        dir: PathBuf::from(parsed("--dir", ".")),
    };
    let c = measure(&cfg)?;
    println!(
        "{{\"engine\":\"{engine}\",\"segment\":\"{segment}\",\"writers\":{},\"linger_frac\":{},\"members\":{},\"clients\":{},\"linger_us\":{},\"cycles_per_s\":{:.0},\"groups_per_s\":{:.0},\"commits_per_group\":{:.2},\"group_us\":{:.0}}}",
        cfg.writers,
        cfg.linger_frac,
        cfg.members,
        cfg.clients,
        cfg.linger.as_micros(),
        c.cycles_per_s,
        c.groups_per_s,
        c.commits_per_group,
        c.group_us,
    );
    Ok(())
}
