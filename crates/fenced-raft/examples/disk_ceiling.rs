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
//!     [--segment prealloc|falloc|grow|recycle] [--writers 1|2] \
//!     [--linger-us 0 | --linger-frac F] [--dir DIR]
//! ```
//!
//! `file`: each group is one `write` into the log file and one `fdatasync` (the least
//! any write-ahead log does). `--segment` says what the file is before the run:
//! `prealloc`, written with zeros and synced (etcd's WAL preallocates its segments);
//! `falloc`, `posix_fallocate`d (allocated, never written: the file system must mark
//! each extent written at the `fdatasync`); `grow`, empty (each `fdatasync` also writes
//! the file's new size, as an append-only file such as Redis's AOF does); `recycle`, an
//! old segment full of earlier records, overwritten (PostgreSQL recycles its WAL
//! segments so). `--writers 2`: two writer threads, so that the next group is written
//! and synced while the one before is still in its `fdatasync`; a commit is answered
//! once it and every commit before it are on disk (one member only). `redb`: each group is one redb transaction of one
//! row per commit, as Fenced's log writes them (`raft.redb`, default durability).
//!
//! `--members 3`: the leader's writer hands each group to two follower writers (each
//! its own file on the same disk, group-committing what reached it meanwhile) as it
//! starts its own commit, and a commit is answered once a majority has it on disk: a
//! three-member cluster with a network that costs nothing. `--linger-us`: the leader's
//! writer waits this long before it takes a group (more commits a group, later ones).
//! `--linger-frac F`: adaptive instead: it gathers the wave of arrivals, waiting while
//! they come (each new one within 10% of the last group's `fdatasync` time) up to F
//! times that time, and no longer once every client is waiting.

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
    /// Groups the leader's writers finished out of order: first commit to the next group's.
    done: std::collections::BTreeMap<u64, u64>,
    /// The last group's `fdatasync` time, for the adaptive linger.
    last_sync: Duration,
    stop: bool,
}

struct Shared {
    q: Mutex<Queue>,
    queued: Condvar,
    committed: Condvar,
}

impl Shared {
    /// The leader wrote the group `first..upto`: on disk once every group before it is.
    fn leader_wrote(&self, first: u64, upto: u64) {
        let mut q = self.q.lock().unwrap();
        q.done.insert(first, upto);
        let mut mark = q.on_disk[0];
        while let Some(next) = q.done.remove(&mark) {
            mark = next;
        }
        self.mark(&mut q, 0, mark);
    }

    /// Member `m` has the commits up to `upto` on disk.
    fn on_disk(&self, m: usize, upto: u64) {
        let mut q = self.q.lock().unwrap();
        self.mark(&mut q, m, upto);
    }

    fn mark(&self, q: &mut Queue, m: usize, upto: u64) {
        q.on_disk[m] = q.on_disk[m].max(upto);
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
    /// The log file, written at each commit's own offset (two writers may overlap).
    File(Arc<std::fs::File>),
    Redb(redb::Database),
}

const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");

impl Engine {
    fn commit(&self, first: u64, n: u64) {
        let row = [b'x'; ROW];
        match self {
            Engine::File(f) => {
                use std::os::unix::fs::FileExt;
                let buf: Vec<u8> = (0..n).flat_map(|_| row).collect();
                f.write_all_at(&buf, first * ROW as u64).expect("write");
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

/// The log file as `--segment` says it is before the run, synced.
fn segment(path: &std::path::Path, seconds: u64, kind: &str) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .expect("create the log file");
    // Room for 100,000 commits a second of ROW bytes each.
    let bytes = (seconds + 1) * 100_000 * ROW as u64;
    let fill = |byte: u8| {
        let chunk = vec![byte; 1 << 20];
        for _ in 0..bytes / chunk.len() as u64 + 1 {
            (&f).write_all(&chunk).expect("fill the log file");
        }
    };
    match kind {
        "prealloc" => fill(0),
        "recycle" => fill(b'o'),
        "falloc" => {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor and a length in range.
            let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, bytes as libc::off_t) };
            assert_eq!(rc, 0, "posix_fallocate");
        }
        "grow" => {}
        other => panic!("--segment prealloc|falloc|grow|recycle, not {other}"),
    }
    f.sync_all().expect("sync the log file");
    f
}

/// The next group for a leader's writer: waits for a commit, lingers as told, takes
/// every commit queued; `None` once stopped.
fn take_group(s: &Shared, linger: Duration, linger_frac: f64, clients: usize) -> Option<(u64, u64)> {
    let mut q = s.q.lock().unwrap();
    while q.queued == q.taken && !q.stop {
        q = s.queued.wait(q).unwrap();
    }
    if q.stop {
        return None;
    }
    if linger > Duration::ZERO {
        drop(q);
        std::thread::sleep(linger);
        q = s.q.lock().unwrap();
    } else if linger_frac > 0.0 {
        // The wave: wait while arrivals keep coming, each within a tenth of the last
        // sync, up to `linger_frac` of it, and not once every client waits.
        let until = Instant::now() + q.last_sync.mul_f64(linger_frac);
        let gap = q.last_sync / 10;
        while (q.queued - q.taken) < clients as u64 && !q.stop {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let before = q.queued;
            let (next, _) = s.queued.wait_timeout(q, gap.min(until - now)).unwrap();
            q = next;
            if q.queued == before {
                break; // the wave is over
            }
        }
    }
    let first = q.taken;
    q.taken = q.queued;
    Some((first, q.taken))
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
    let linger_frac: f64 = arg(&args, "--linger-frac").map_or(0.0, |s| s.parse().expect("--linger-frac F"));
    let writers: usize = arg(&args, "--writers").map_or(1, |s| s.parse().expect("--writers N"));
    let segment_kind = arg(&args, "--segment").unwrap_or_else(|| "prealloc".into());
    assert!(writers == 1 || (writers == 2 && members == 1 && engine_name == "file"), "--writers 2: one member, file");
    let dir = PathBuf::from(arg(&args, "--dir").unwrap_or_else(|| ".".into()))
        .join(format!("disk-ceiling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the directory");
    let open = |m: usize| match engine_name.as_str() {
        "file" => Engine::File(Arc::new(segment(&dir.join(format!("log-{m}")), seconds, &segment_kind))),
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
        let (s, engine) = (shared.clone(), open(m));
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
    let engine = Arc::new(open(0));
    let to_followers = Arc::new(to_followers);
    let leaders: Vec<_> = (0..writers)
        .map(|_| {
            let (s, engine, to_followers) = (shared.clone(), engine.clone(), to_followers.clone());
            std::thread::spawn(move || {
                let (mut groups, mut commits) = (0u64, 0u64);
                while let Some((first, upto)) = take_group(&s, linger, linger_frac, clients) {
                    for f in to_followers.iter() {
                        let _ = f.send((first, upto));
                    }
                    let synced = Instant::now();
                    engine.commit(first, upto - first);
                    s.q.lock().unwrap().last_sync = synced.elapsed();
                    s.leader_wrote(first, upto);
                    groups += 1;
                    commits += upto - first;
                }
                (groups, commits)
            })
        })
        .collect();
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
    let (groups, commits) =
        leaders.into_iter().map(|l| l.join().unwrap()).fold((0, 0), |(g, c), (g2, c2)| (g + g2, c + c2));
    // The followers end once every sender is gone.
    drop(to_followers);
    for f in followers {
        f.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{{\"engine\":\"{engine_name}\",\"segment\":\"{segment_kind}\",\"writers\":{writers},\"linger_frac\":{linger_frac},\"members\":{members},\"clients\":{clients},\"linger_us\":{},\"cycles_per_s\":{:.0},\"groups_per_s\":{:.0},\"commits_per_group\":{:.2},\"group_us\":{:.0}}}",
        linger.as_micros(),
        cycles as f64 / elapsed,
        groups as f64 / elapsed,
        commits as f64 / groups.max(1) as f64,
        elapsed * 1e6 / groups.max(1) as f64,
    );
}
