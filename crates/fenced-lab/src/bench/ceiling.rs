//! What this disk allows a durable lock service: N closed-loop clients, each cycle two
//! commits (acquire, release) that must be on disk before they are answered, one
//! writer that group-commits every commit queued meanwhile, and no other work at all
//! (no network, no parsing, no lock table, no consensus). The cycles per second it
//! measures are a ceiling for any service that fsyncs before it answers, Fenced's
//! cluster of one included, on this disk with this many clients. `fenced bench` runs
//! it beside each Fenced row ([`CeilingConfig::server_log`]: the log Fenced writes, a
//! preallocated segment with one write and one `fdatasync` per group, as
//! `fenced_raft::segment_log` writes it); `examples/disk_ceiling.rs` runs every variant
//! below.
//!
//! [`Log::File`]: each group is one `write` into the log file and one `fdatasync` (the
//! least any write-ahead log does), the file as its [`Segment`] says before the run.
//! [`Log::Redb`]: each group is one redb transaction of one row per commit, as Fenced's
//! log wrote them until data directory format 5 (`raft.redb`, default durability). `writers: 2`: two writer
//! threads, so that the next group is written and synced while the one before is still
//! in its `fdatasync`; a commit is answered once it and every commit before it are on
//! disk (one member, a file only). `members: 3`: the leader's writer hands each group
//! to two follower writers (each its own file on the same disk, group-committing what
//! reached it meanwhile) as it starts its own commit, and a commit is answered once a
//! majority has it on disk: a three-member cluster with a network that costs nothing.
//! `linger`: the leader's writer waits this long before it takes a group.
//! `linger_frac`: adaptive instead: it gathers the wave of arrivals, waiting while they
//! come (each new one within 10% of the last group's `fdatasync` time) up to that
//! fraction of that time, and no longer once every client is waiting.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The bytes of one commit (about a lock command's log entry).
const ROW: usize = 200;

/// What the log file is before the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Written with zeros and synced (etcd's WAL preallocates its segments).
    Prealloc,
    /// `posix_fallocate`d: allocated, never written, so the file system marks each
    /// extent written at the `fdatasync`.
    Falloc,
    /// Empty: each `fdatasync` also writes the file's new size, as an append-only file
    /// such as Redis's AOF does.
    Grow,
    /// An old segment full of earlier records, overwritten (PostgreSQL recycles its WAL
    /// segments so).
    Recycle,
}

impl std::str::FromStr for Segment {
    type Err = String;
    fn from_str(s: &str) -> Result<Segment, String> {
        match s {
            "prealloc" => Ok(Segment::Prealloc),
            "falloc" => Ok(Segment::Falloc),
            "grow" => Ok(Segment::Grow),
            "recycle" => Ok(Segment::Recycle),
            other => Err(format!("a segment is prealloc, falloc, grow or recycle, not {other}")),
        }
    }
}

/// The log the writers commit to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Log {
    File(Segment),
    Redb,
}

/// One measurement.
#[derive(Clone, Debug)]
pub struct CeilingConfig {
    pub clients: usize,
    pub duration: Duration,
    pub log: Log,
    /// 1, 3 or 5: members on this disk, a commit answered once a majority has it.
    pub members: usize,
    /// 1, or 2 with overlapping syncs (one member, a file only).
    pub writers: usize,
    /// A fixed wait before each group (0: none).
    pub linger: Duration,
    /// The adaptive wait, as a fraction of the last sync (0: none).
    pub linger_frac: f64,
    /// Where the log files go (a directory of the run's own is made in it, then removed).
    pub dir: PathBuf,
}

impl CeilingConfig {
    /// The log a Fenced server of one writes: a zero-filled, preallocated segment, one
    /// write and one `fdatasync` per group, with the server's default linger
    /// (`log_linger_percent` 0: none).
    pub fn server_log(clients: usize, duration: Duration, dir: &Path) -> CeilingConfig {
        CeilingConfig {
            clients,
            duration,
            log: Log::File(Segment::Prealloc),
            members: 1,
            writers: 1,
            linger: Duration::ZERO,
            linger_frac: 0.0,
            dir: dir.to_path_buf(),
        }
    }
}

/// What the run found.
#[derive(Clone, Copy, Debug)]
pub struct Ceiling {
    /// Acquire-release cycles (two commits each) per second.
    pub cycles_per_s: f64,
    pub groups_per_s: f64,
    pub commits_per_group: f64,
    /// The mean time of one group, from its start to the next's.
    pub group_us: f64,
}

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
    /// `Queue::stop`, readable by the clients without taking the queue's lock.
    stopped: AtomicBool,
    queued: Condvar,
    committed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The leader wrote the group `first..upto`: on disk once every group before it is.
    fn leader_wrote(&self, first: u64, upto: u64) {
        let mut q = self.lock();
        q.done.insert(first, upto);
        let mut mark = q.on_disk[0];
        while let Some(next) = q.done.remove(&mark) {
            mark = next;
        }
        self.mark(&mut q, 0, mark);
    }

    /// Member `m` has the commits up to `upto` on disk.
    fn on_disk(&self, m: usize, upto: u64) {
        let mut q = self.lock();
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

    /// One client's commit: queued, then answered once a majority has it on disk.
    fn commit(&self) {
        let mut q = self.lock();
        q.queued += 1;
        let ticket = q.queued;
        self.queued.notify_one();
        while q.committed < ticket && !q.stop {
            q = self.committed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.stopped.store(true, Relaxed);
        self.queued.notify_all();
        self.committed.notify_all();
    }
}

enum Engine {
    /// The log file, written at each commit's own offset (two writers may overlap).
    File(std::fs::File),
    Redb(redb::Database),
}

const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");

impl Engine {
    fn open(log: Log, path: &Path, duration: Duration) -> io::Result<Engine> {
        match log {
            Log::File(kind) => Ok(Engine::File(segment(path, duration, kind)?)),
            Log::Redb => {
                redb::Database::create(path.with_extension("redb")).map(Engine::Redb).map_err(io::Error::other)
            }
        }
    }

    fn commit(&self, first: u64, n: u64) -> io::Result<()> {
        let row = [b'x'; ROW];
        match self {
            Engine::File(f) => {
                use std::os::unix::fs::FileExt;
                let buf: Vec<u8> = (0..n).flat_map(|_| row).collect();
                f.write_all_at(&buf, first * ROW as u64)?;
                f.sync_data()
            }
            Engine::Redb(db) => {
                let txn = db.begin_write().map_err(io::Error::other)?;
                {
                    let mut t = txn.open_table(LOG).map_err(io::Error::other)?;
                    for i in first..first + n {
                        t.insert(i, row.as_slice()).map_err(io::Error::other)?;
                    }
                    // Purged as Fenced's log is (it keeps the entries since a recent
                    // snapshot), so the file stops growing.
                    if first / 1000 != (first + n) / 1000 && first > 2000 {
                        t.retain_in(..first - 1000, |_, _| false).map_err(io::Error::other)?;
                    }
                }
                txn.commit().map_err(io::Error::other)
            }
        }
    }
}

/// The log file as `kind` says it is before the run, synced.
fn segment(path: &Path, duration: Duration, kind: Segment) -> io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(path)?;
    // Room for 100,000 commits a second of ROW bytes each.
    let bytes = (duration.as_secs() + 1) * 100_000 * ROW as u64;
    let fill = |byte: u8| -> io::Result<()> {
        let chunk = vec![byte; 1 << 20];
        for _ in 0..bytes / chunk.len() as u64 + 1 {
            (&f).write_all(&chunk)?;
        }
        Ok(())
    };
    match kind {
        Segment::Prealloc => fill(0)?,
        Segment::Recycle => fill(b'o')?,
        Segment::Falloc => {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor and a length in range.
            let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, bytes as libc::off_t) };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        Segment::Grow => {}
    }
    f.sync_all()?;
    Ok(f)
}

/// The next group for a leader's writer: waits for a commit, lingers as told, takes
/// every commit queued; `None` once stopped.
fn take_group(s: &Shared, cfg: &CeilingConfig) -> Option<(u64, u64)> {
    let mut q = s.lock();
    while q.queued == q.taken && !q.stop {
        q = s.queued.wait(q).unwrap_or_else(|p| p.into_inner());
    }
    if q.stop {
        return None;
    }
    if cfg.linger > Duration::ZERO {
        drop(q);
        std::thread::sleep(cfg.linger);
        q = s.lock();
    } else if cfg.linger_frac > 0.0 {
        // The wave: wait while arrivals keep coming, each within a tenth of the last
        // sync, up to `linger_frac` of it, and not once every client waits.
        let until = Instant::now() + q.last_sync.mul_f64(cfg.linger_frac);
        let gap = q.last_sync / 10;
        while (q.queued - q.taken) < cfg.clients as u64 && !q.stop {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let before = q.queued;
            let (next, _) = s.queued.wait_timeout(q, gap.min(until - now)).unwrap_or_else(|p| p.into_inner());
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

/// The followers' queues (a group's first and next commit) and their threads.
type Followers = (Vec<mpsc::Sender<(u64, u64)>>, Vec<JoinHandle<io::Result<()>>>);

/// Followers: each commits every group that reached it meanwhile as one.
fn start_followers(s: &Arc<Shared>, cfg: &CeilingConfig, dir: &Path) -> io::Result<Followers> {
    let (mut senders, mut threads) = (Vec::new(), Vec::new());
    for m in 1..cfg.members {
        let (tx, rx) = mpsc::channel::<(u64, u64)>();
        senders.push(tx);
        let (s, engine) = (s.clone(), Engine::open(cfg.log, &dir.join(format!("log-{m}")), cfg.duration)?);
        threads.push(std::thread::spawn(move || {
            while let Ok((first, mut upto)) = rx.recv() {
                while let Ok((_, u)) = rx.try_recv() {
                    upto = u;
                }
                engine.commit(first, upto - first)?;
                s.on_disk(m, upto);
            }
            Ok(())
        }));
    }
    Ok((senders, threads))
}

/// The leader's writers: each takes a group, hands it to the followers, commits it.
/// Each returns its groups and commits.
fn start_leaders(
    s: &Arc<Shared>,
    cfg: &CeilingConfig,
    engine: Engine,
    followers: Vec<mpsc::Sender<(u64, u64)>>,
) -> Vec<JoinHandle<io::Result<(u64, u64)>>> {
    let (engine, followers) = (Arc::new(engine), Arc::new(followers));
    (0..cfg.writers)
        .map(|_| {
            let (s, cfg, engine, followers) = (s.clone(), cfg.clone(), engine.clone(), followers.clone());
            std::thread::spawn(move || {
                let (mut groups, mut commits) = (0u64, 0u64);
                while let Some((first, upto)) = take_group(&s, &cfg) {
                    for f in followers.iter() {
                        let _ = f.send((first, upto));
                    }
                    let synced = Instant::now();
                    if let Err(e) = engine.commit(first, upto - first) {
                        s.stop();
                        return Err(e);
                    }
                    s.lock().last_sync = synced.elapsed();
                    s.leader_wrote(first, upto);
                    groups += 1;
                    commits += upto - first;
                }
                Ok((groups, commits))
            })
        })
        .collect()
}

fn joined<T>(h: JoinHandle<io::Result<T>>) -> io::Result<T> {
    h.join().map_err(|_| io::Error::other("a disk ceiling thread panicked"))?
}

/// Runs the clients for `cfg.duration` against the writers and returns what they did.
pub fn measure(cfg: &CeilingConfig) -> io::Result<Ceiling> {
    if cfg.members.is_multiple_of(2) || cfg.clients == 0 || !(cfg.writers == 1 || cfg.writers == 2 && cfg.members == 1)
    {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "odd members, some clients, two writers only alone"));
    }
    if cfg.writers == 2 && cfg.log == Log::Redb {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "two writers need a file log"));
    }
    let dir = cfg.dir.join(format!("disk-ceiling-{}-{}", std::process::id(), RUN.fetch_add(1, Relaxed)));
    std::fs::create_dir_all(&dir)?;
    let result = measure_in(cfg, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

static RUN: AtomicU64 = AtomicU64::new(0);

fn measure_in(cfg: &CeilingConfig, dir: &Path) -> io::Result<Ceiling> {
    let shared = Arc::new(Shared {
        q: Mutex::new(Queue { on_disk: vec![0; cfg.members], ..Queue::default() }),
        stopped: AtomicBool::new(false),
        queued: Condvar::new(),
        committed: Condvar::new(),
    });
    let (to_followers, followers) = start_followers(&shared, cfg, dir)?;
    let leaders = start_leaders(&shared, cfg, Engine::open(cfg.log, &dir.join("log-0"), cfg.duration)?, to_followers);
    let start = Instant::now();
    let deadline = start + cfg.duration;
    let clients: Vec<_> = (0..cfg.clients)
        .map(|_| {
            let s = shared.clone();
            std::thread::spawn(move || {
                let mut cycles = 0u64;
                while Instant::now() < deadline && !s.stopped.load(Relaxed) {
                    s.commit();
                    s.commit();
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let cycles: u64 = clients.into_iter().map(|c| c.join().unwrap_or(0)).sum();
    let elapsed = start.elapsed().as_secs_f64();
    shared.stop();
    let mut totals = (0u64, 0u64);
    for l in leaders {
        let (g, c) = joined(l)?;
        totals = (totals.0 + g, totals.1 + c);
    }
    // The followers end once every sender (held by the leaders) is gone.
    for f in followers {
        joined(f)?;
    }
    let (groups, commits) = totals;
    Ok(Ceiling {
        cycles_per_s: cycles as f64 / elapsed,
        groups_per_s: groups as f64 / elapsed,
        commits_per_group: commits as f64 / groups.max(1) as f64,
        group_us: elapsed * 1e6 / groups.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(log: Log, members: usize) -> CeilingConfig {
        let mut cfg = CeilingConfig::server_log(4, Duration::from_millis(300), &std::env::temp_dir());
        (cfg.log, cfg.members) = (log, members);
        cfg
    }

    #[test]
    fn every_log_commits_and_leaves_nothing_behind() {
        for (log, members) in [(Log::Redb, 1), (Log::File(Segment::Grow), 3), (Log::File(Segment::Prealloc), 1)] {
            let c = measure(&short(log, members)).unwrap();
            assert!(c.cycles_per_s > 0.0 && c.groups_per_s > 0.0, "{log:?}: {c:?}");
            // A group holds at least one commit, and no more than every client's.
            assert!((1.0..=4.0).contains(&c.commits_per_group), "{log:?}: {c:?}");
        }
        let ours = format!("disk-ceiling-{}-", std::process::id());
        let left = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&ours))
            .count();
        assert_eq!(left, 0, "the run's directories are removed");
    }

    #[test]
    fn a_configuration_it_cannot_run_is_refused() {
        let mut even = short(Log::Redb, 2);
        assert_eq!(measure(&even).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        even.members = 1;
        even.writers = 2;
        assert_eq!(measure(&even).unwrap_err().kind(), io::ErrorKind::InvalidInput, "two writers on redb");
    }
}
