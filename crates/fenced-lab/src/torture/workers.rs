//! The worker processes of a run, and the operations they stream in.

use super::*;

/// The command of one worker process, its spec to follow as the last argument: this
/// binary's `torture-worker`, or the worker written with the target's client library.
fn worker_command(cfg: &TortureConfig) -> Command {
    match cfg.target.client_language() {
        None => {
            let mut c = Command::new(&cfg.fenced_bin);
            c.arg("torture-worker");
            c
        }
        Some(ClientLanguage::Python) => {
            let mut c = Command::new(&cfg.python);
            c.args(["-u", "-m", "fenced._torture_worker"]);
            c
        }
        Some(ClientLanguage::Node) => {
            let mut c = Command::new("node");
            c.arg(node_worker(&cfg.node_client));
            c
        }
    }
}

/// The TypeScript client's built worker under its package directory.
fn node_worker(package: &std::path::Path) -> PathBuf {
    package.join("dist/src/torture-worker.js")
}

/// Before anything starts: whether the target's client library can run its workers,
/// with what to do when it cannot.
pub(super) async fn check_client(cfg: &TortureConfig) -> Result<()> {
    let (mut probe, what) = match cfg.target.client_language() {
        None => return Ok(()),
        Some(ClientLanguage::Python) => {
            let mut c = Command::new(&cfg.python);
            c.args(["-c", "import fenced._torture_worker"]);
            (
                c,
                format!(
                    "the {} target needs a Python that imports the client: `{}` could not \
                     (pip install ./clients/python, then --python or FENCED_PYTHON names that interpreter)",
                    cfg.target,
                    cfg.python.display()
                ),
            )
        }
        Some(ClientLanguage::Node) => {
            let worker = node_worker(&cfg.node_client);
            if !worker.is_file() {
                bail!(
                    "the {} target needs the TypeScript client built: no {} (npm ci && npm run build in \
                     clients/typescript, then --node-client or FENCED_NODE_CLIENT names that directory)",
                    cfg.target,
                    worker.display()
                );
            }
            let mut c = Command::new("node");
            c.args(["-e", "if (+process.versions.node.split('.')[0] < 20) process.exit(3)"]);
            (c, format!("the {} target needs Node 20 or later on the PATH", cfg.target))
        }
    };
    let ok = timeout(
        Duration::from_secs(20),
        probe.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status(),
    )
    .await
    .is_ok_and(|s| s.is_ok_and(|s| s.success()));
    if !ok {
        bail!("{what}");
    }
    Ok(())
}

/// A worker process; killed when dropped.
struct Worker {
    child: Child,
    pid: u32,
}

/// Operations the workers streamed in and the nemesis has not taken yet. It takes
/// them at least every 50 ms, except while it holds a pause or restarts a service (a
/// few TTLs at most), when a fast target's workers send a few thousand. Past the bound
/// a worker's reader waits, and so does the worker on its stdout pipe: the run slows,
/// but no operation is dropped (the checkers judge the whole history).
const OPS_QUEUED_MAX: usize = 65_536;

/// The workers of a run and the operations they stream in.
pub(crate) struct Workers {
    procs: Vec<Worker>,
    stderr: Vec<tokio::task::JoinHandle<String>>,
    rx: mpsc::Receiver<Op>,
    /// Workers that completed a read since the last look (the pause's victims).
    pending_reads: Vec<u32>,
    pub(crate) history: Vec<Op>,
    pub(crate) faults: Vec<Fault>,
    start_us: u64,
    progress: watch::Sender<Progress>,
}

impl Workers {
    /// Starts `cfg.workers` worker processes against `endpoints`, running until `until_us`.
    pub(crate) fn spawn(
        cfg: &TortureConfig,
        endpoints: &Endpoints,
        start_us: u64,
        until_us: u64,
        progress: watch::Sender<Progress>,
    ) -> Result<Workers> {
        let (ops_tx, rx) = mpsc::channel::<Op>(OPS_QUEUED_MAX);
        let mut procs = Vec::new();
        let mut stderr_tasks = Vec::new();
        for w in 0..cfg.workers {
            let spec = WorkerSpec {
                target: cfg.target,
                endpoints: endpoints.clone(),
                worker: w,
                seed: cfg.seed,
                until_us,
                ttl_ms: cfg.ttl.as_millis() as u64,
                work_ms: cfg.work.as_millis() as u64,
                op_timeout_ms: cfg.op_timeout().as_millis() as u64,
                lock: LOCK.to_owned(),
                counter_key: cfg.target.counter_key(),
                workload: cfg.workload,
            };
            let mut child = worker_command(cfg)
                .arg(serde_json::to_string(&spec)?)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("start worker {w} of {}", cfg.target))?;
            let pid = child.id().context("a worker without a pid")?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let mut stderr = child.stderr.take().context("worker stderr")?;
            let tx = ops_tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(op) = serde_json::from_str::<Op>(&line) {
                        let _ = tx.send(op).await;
                    }
                }
            });
            stderr_tasks.push(tokio::spawn(async move {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s).await;
                s
            }));
            procs.push(Worker { child, pid });
        }
        Ok(Workers {
            procs,
            stderr: stderr_tasks,
            rx,
            pending_reads: Vec::new(),
            history: Vec::new(),
            faults: Vec::new(),
            start_us,
            progress,
        })
    }

    /// Takes in the operations streamed so far, and reports progress.
    pub(crate) fn pump(&mut self) {
        while let Ok(op) = self.rx.try_recv() {
            if op.kind == OpKind::Read && op.result == OpResult::Ok {
                self.pending_reads.push(op.worker);
            }
            self.history.push(op);
        }
        let _ = self.progress.send(Progress {
            elapsed_ms: now_us().saturating_sub(self.start_us) / 1000,
            ops: self.history.len() as u64,
            faults: self.faults.len() as u64,
        });
    }

    /// Sleeps until `until`, taking operations in meanwhile.
    pub(crate) async fn pump_until(&mut self, until: Instant) {
        while Instant::now() < until {
            sleep(Duration::from_millis(50).min(until - Instant::now())).await;
            self.pump();
        }
    }

    /// Freezes the next worker that has just read (it holds the lock and is about to
    /// write) for longer than the TTL; false when none read within two TTLs.
    pub(crate) async fn pause_one(&mut self, ttl: Duration, rng: &mut ChaCha8Rng) -> bool {
        let Some(w) = self.next_read(ttl * 2).await else { return false };
        let pid = self.procs[w as usize].pid;
        if signal(pid, libc::SIGSTOP).is_err() {
            return false;
        }
        let from = now_us();
        let ttl_ms = ttl.as_millis() as u64;
        let hold = ttl_ms + ttl_ms / 5 + rng.next_u64() % (ttl_ms * 3 / 2 + 1);
        sleep(Duration::from_millis(hold)).await;
        let _ = signal(pid, libc::SIGCONT);
        self.faults.push(Fault::Pause { worker: w, start_us: from, end_us: now_us() });
        true
    }

    /// The next worker to complete a read from now (it holds the lock and is about to
    /// work), waiting up to `within`.
    pub(crate) async fn next_read(&mut self, within: Duration) -> Option<u32> {
        self.pending_reads.clear();
        let deadline = Instant::now() + within;
        loop {
            self.pump();
            if let Some(w) = self.pending_reads.first() {
                return Some(*w);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits for every worker to finish its last cycle (they stop by themselves at the
    /// end), taking the rest of the history.
    pub(crate) async fn finish(&mut self, cfg: &TortureConfig, until_us: u64) -> Result<()> {
        let grace = cfg.op_timeout() * 4 + cfg.ttl * 6;
        let exit_by = Instant::now() + Duration::from_micros(until_us.saturating_sub(now_us())) + grace;
        for w in 0..self.procs.len() {
            let status = loop {
                self.pump();
                match timeout(Duration::from_millis(100), self.procs[w].child.wait()).await {
                    Ok(status) => break status?,
                    Err(_) if Instant::now() > exit_by => {
                        bail!("worker {w} did not finish within {grace:?} of the end")
                    }
                    Err(_) => {}
                }
            };
            let err = self.stderr.remove(0);
            if !status.success() {
                let err = err.await.unwrap_or_default();
                bail!("worker {w} failed ({status}): {}", err.trim());
            }
        }
        while let Some(op) = self.rx.recv().await {
            self.history.push(op);
        }
        Ok(())
    }
}
