//! What this disk allows a durable lock service: N closed-loop clients, each cycle two
//! commits (acquire, release) that must be on disk before they are answered, one
//! writer that group-commits every commit queued meanwhile, and no other work at all
//! (no network, no parsing, no lock table, no consensus). The cycles per second it
//! prints are a ceiling for any service that fsyncs before it answers, Fenced's cluster
//! of one included, on this disk with this many clients.
//!
//! ```text
//! cargo run --release -p fenced-raft --example disk_ceiling -- \
//!     [--clients 16] [--seconds 5] [--engine file|redb] [--members 1|3|5] \
//!     [--linger-us 0] [--dir DIR]
//! ```
//!
//! `file`: each group is one `write` into a preallocated file and one `fdatasync` (the
//! least any write-ahead log does). `redb`: each group is one redb transaction of one
//! row per commit, as Fenced's log writes them (`raft.redb`, default durability).
//!
//! `--members 3`: the leader's writer hands each group to two follower writers (each
//! its own file on the same disk, group-committing what reached it meanwhile) as it
//! starts its own commit, and a commit is answered once a majority has it on disk: a
//! three-member cluster with a network that costs nothing. `--linger-us`: the leader's
//! writer waits this long before it takes a group (more commits a group, later ones).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const ROW: usize = 200;

#[derive(Default)]
struct Queue {
    /// Commits queued so far (each commit's ticket is the count after it).
    queued: u64,
    /// Commits taken into a group so far.
    taken: u64,
    /// Commits on disk at each member so far.
    on_disk: Vec<u64>,
    /// Commits on disk at a majority: a commit is answered once this reaches its ticket.
    committed: u64,
    stop: bool,
}

struct Shared {
    q: Mutex<Queue>,
    queued: Condvar,
    committed: Condvar,
}

impl Shared {
    /// Member `m` has the commits up to `upto` on disk.
    fn on_disk(&self, m: usize, upto: u64) {
        let mut q = self.q.lock().unwrap();
        q.on_disk[m] = upto;
        let mut marks = q.on_disk.clone();
        marks.sort_unstable_by(|a, b| b.cmp(a));
        let majority = marks[marks.len() / 2];
        if majority > q.committed {
            q.committed = majority;
            self.committed.notify_all();
        }
    }
}

enum Engine {
    File(std::fs::File),
    Redb(redb::Database),
}

const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");

impl Engine {
    fn commit(&mut self, first: u64, n: u64) {
        let row = [b'x'; ROW];
        match self {
            Engine::File(f) => {
                let buf: Vec<u8> = (0..n).flat_map(|_| row).collect();
                f.write_all(&buf).expect("write");
                f.sync_data().expect("fdatasync");
            }
            Engine::Redb(db) => {
                let txn = db.begin_write().expect("begin");
                {
                    let mut t = txn.open_table(LOG).expect("table");
                    for i in first..first + n {
                        t.insert(i, row.as_slice()).expect("insert");
                    }
                    // Purged as Fenced's log is (it keeps the entries since a recent
                    // snapshot), so the file stops growing.
                    if first / 1000 != (first + n) / 1000 && first > 2000 {
                        t.retain_in(..first - 1000, |_, _| false).expect("purge");
                    }
                }
                txn.commit().expect("commit");
            }
        }
    }
}

/// A log file written with zeros and synced before the run, then overwritten from its
/// start (as etcd's WAL preallocates its segments): each `fdatasync` then flushes data
/// only, never the file's size or its block map.
fn preallocated(path: &std::path::Path, seconds: u64) -> std::fs::File {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .expect("create the log file");
    let chunk = vec![0u8; 1 << 20];
    // Room for 100,000 commits a second of ROW bytes each.
    for _ in 0..(seconds + 1) * 100_000 * ROW as u64 / chunk.len() as u64 + 1 {
        f.write_all(&chunk).expect("preallocate the log file");
    }
    f.sync_all().expect("sync the log file");
    f.seek(SeekFrom::Start(0)).expect("seek");
    f
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let clients: usize = arg(&args, "--clients").map_or(16, |s| s.parse().expect("--clients N"));
    let seconds: u64 = arg(&args, "--seconds").map_or(5, |s| s.parse().expect("--seconds N"));
    let members: usize = arg(&args, "--members").map_or(1, |s| s.parse().expect("--members N"));
    assert!(members % 2 == 1, "--members must be odd");
    let engine_name = arg(&args, "--engine").unwrap_or_else(|| "file".into());
    let linger = Duration::from_micros(arg(&args, "--linger-us").map_or(0, |s| s.parse().expect("--linger-us N")));
    let dir = PathBuf::from(arg(&args, "--dir").unwrap_or_else(|| ".".into()))
        .join(format!("disk-ceiling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the directory");
    let open = |m: usize| match engine_name.as_str() {
        "file" => Engine::File(preallocated(&dir.join(format!("log-{m}")), seconds)),
        "redb" => {
            Engine::Redb(redb::Database::create(dir.join(format!("log-{m}.redb"))).expect("create the redb file"))
        }
        other => panic!("--engine file|redb, not {other}"),
    };

    let shared = Arc::new(Shared {
        q: Mutex::new(Queue { on_disk: vec![0; members], ..Queue::default() }),
        queued: Condvar::new(),
        committed: Condvar::new(),
    });
    // Followers: commit every group that reached them meanwhile as one.
    let mut to_followers = Vec::new();
    let mut followers = Vec::new();
    for m in 1..members {
        let (tx, rx) = mpsc::channel::<(u64, u64)>();
        to_followers.push(tx);
        let (s, mut engine) = (shared.clone(), open(m));
        followers.push(std::thread::spawn(move || {
            while let Ok((mut first, mut upto)) = rx.recv() {
                while let Ok((f, u)) = rx.try_recv() {
                    first = first.min(f);
                    upto = u;
                }
                engine.commit(first, upto - first);
                s.on_disk(m, upto);
            }
        }));
    }
    let leader = {
        let (s, mut engine) = (shared.clone(), open(0));
        std::thread::spawn(move || {
            let (mut groups, mut commits) = (0u64, 0u64);
            loop {
                let (first, upto) = {
                    let mut q = s.q.lock().unwrap();
                    while q.queued == q.taken && !q.stop {
                        q = s.queued.wait(q).unwrap();
                    }
                    if q.stop {
                        return (groups, commits);
                    }
                    if linger > Duration::ZERO {
                        drop(q);
                        std::thread::sleep(linger);
                        q = s.q.lock().unwrap();
                    }
                    let first = q.taken;
                    q.taken = q.queued;
                    (first, q.taken)
                };
                for f in &to_followers {
                    let _ = f.send((first, upto));
                }
                engine.commit(first, upto - first);
                s.on_disk(0, upto);
                groups += 1;
                commits += upto - first;
            }
        })
    };
    let commit = |s: &Shared| {
        let mut q = s.q.lock().unwrap();
        q.queued += 1;
        let ticket = q.queued;
        s.queued.notify_one();
        while q.committed < ticket && !q.stop {
            q = s.committed.wait(q).unwrap();
        }
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let s = shared.clone();
            std::thread::spawn(move || {
                let mut cycles = 0u64;
                while Instant::now() < deadline {
                    commit(&s);
                    commit(&s);
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let cycles: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let elapsed = start.elapsed().as_secs_f64();
    shared.q.lock().unwrap().stop = true;
    shared.queued.notify_all();
    let (groups, commits) = leader.join().unwrap();
    for f in followers {
        f.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{{\"engine\":\"{engine_name}\",\"members\":{members},\"clients\":{clients},\"linger_us\":{},\"cycles_per_s\":{:.0},\"groups_per_s\":{:.0},\"commits_per_group\":{:.2},\"group_us\":{:.0}}}",
        linger.as_micros(),
        cycles as f64 / elapsed,
        groups as f64 / elapsed,
        commits as f64 / groups.max(1) as f64,
        elapsed * 1e6 / groups.max(1) as f64,
    );
}
