//! `fenced demo`: the seeds' story on real processes. A server on a free loopback port,
//! two worker processes running the counter workload under one lock, the holder frozen
//! with SIGSTOP past its lease between its read and its write, the other taking the lock
//! and writing, then the frozen one resumed: its write refused (fencing on) or accepted
//! as a zombie write (fencing off, an unfenced key). Narrated with the real tokens and
//! times, drawn as a sequence diagram, and cleaned up on every way out.

mod procs;
mod report;
pub mod worker;

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use fenced_client::{Client, Fenced};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::args::{duration_ms, on_off, BadArgument, Global};
use procs::{proc_state, Procs};
use report::{Outcome, Step};

/// The lock both workers take.
const LOCK: &str = "demo/counter";
/// The counter's key with fencing on.
const KEY_FENCED: &str = "demo/counter";
/// The server's unfenced prefix, and the counter's key with fencing off.
const UNFENCED_PREFIX: &str = "unfenced/";
const KEY_UNFENCED: &str = "unfenced/counter";
/// Bounds on the arguments: the server's shortest TTL, and what a demo needs.
const TTL_MS_MIN: u64 = 100;
const TTL_MS_MAX: u64 = 60_000;
const PAUSE_MS_MAX: u64 = 600_000;
/// How long anything may take beyond the story's own waits before the demo gives up.
const SLACK: Duration = Duration::from_secs(20);

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// on: the workers send their token and the store refuses the stale one; off: they
    /// write an unfenced key without it, and the zombie write gets through.
    #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub fencing: bool,
    /// The lease's TTL.
    #[arg(long, default_value = "2s", value_parser = duration_ms)]
    pub ttl: u64,
    /// How long worker A stays frozen; longer than --ttl, so that its lease expires.
    #[arg(long, default_value = "3s", value_parser = duration_ms)]
    pub pause: u64,
}

pub fn run(a: DemoArgs, global: &Global) -> anyhow::Result<ExitCode> {
    if !(TTL_MS_MIN..=TTL_MS_MAX).contains(&a.ttl) {
        return Err(BadArgument::error("--ttl", format!("must be between {TTL_MS_MIN}ms and {}s", TTL_MS_MAX / 1000)));
    }
    if a.pause <= a.ttl || a.pause > PAUSE_MS_MAX {
        return Err(BadArgument::error(
            "--pause",
            format!("must be longer than --ttl ({} ms), so that the lease expires, and at most 10m", a.ttl),
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        // Handlers first: from here on SIGINT/SIGTERM end the story, not the process,
        // so that `procs` is dropped and cleans up.
        let mut sigint = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let mut sigterm = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let mut story = Story::new(a.fencing, a.ttl, a.pause, global.json());
        let mut procs = Procs::new()?;
        let result = tokio::select! {
            r = story.play(&mut procs) => r,
            _ = sigint.recv() => Err(Interrupted(libc::SIGINT).into()),
            _ = sigterm.recv() => Err(Interrupted(libc::SIGTERM).into()),
        };
        let dir = procs.dir.clone();
        drop(procs);
        match result {
            Ok(code) => Ok(code),
            Err(e) => match e.downcast::<Interrupted>() {
                Ok(Interrupted(sig)) => {
                    eprintln!(
                        "fenced demo: interrupted; stopped the server and the workers, removed {}",
                        dir.display()
                    );
                    // As a shell reports a process ended by the signal: 130 for SIGINT.
                    Ok(ExitCode::from(128 + sig as u8))
                }
                Err(e) => Err(e.context("fenced demo failed; stopped the server and the workers")),
            },
        }
    })
}

/// The story ended early by this signal.
#[derive(Debug)]
struct Interrupted(libc::c_int);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// The parent's side of the story: what it starts, in which order, and what it saw.
struct Story {
    fencing: bool,
    ttl_ms: u64,
    pause_ms: u64,
    json: bool,
    /// The start, on CLOCK_MONOTONIC, shared with the workers.
    t0_ns: u64,
    steps: Vec<Step>,
}

impl Story {
    fn new(fencing: bool, ttl_ms: u64, pause_ms: u64, json: bool) -> Story {
        Story { fencing, ttl_ms, pause_ms, json, t0_ns: mono_ns(), steps: Vec::new() }
    }

    fn key(&self) -> &'static str {
        if self.fencing {
            KEY_FENCED
        } else {
            KEY_UNFENCED
        }
    }

    async fn play(&mut self, procs: &mut Procs) -> anyhow::Result<ExitCode> {
        let mode = if self.fencing {
            format!("fencing on: the workers send their token, key {}", self.key())
        } else {
            format!("fencing off: the workers write the unfenced key {} without their token", self.key())
        };
        if !self.json {
            println!("fenced demo: {mode}; lease TTL {} ms, pause {} ms\n", self.ttl_ms, self.pause_ms);
        }
        let addr = free_port()?;
        let pid = procs.start_server(addr, UNFENCED_PREFIX)?;
        procs.wait_ready(addr, SLACK).await?;
        let dir = procs.dir.display().to_string();
        self.note("server", "ready", format!("fenced server ready on {addr} (pid {pid}), data in {dir}"));
        let endpoint = format!("http://{addr}");
        let (tx, mut rx) = unbounded_channel();

        // A takes the lock and reads; the demo freezes it in its "work", before it writes.
        let pid_a = procs.start_worker('A', &self.worker_args(&endpoint, true), tx.clone())?;
        self.expect(&mut rx, procs, 'A', "read", SLACK).await?;
        procs::signal(pid_a, libc::SIGSTOP);
        let stopped_at = Instant::now();
        self.wait_stopped(pid_a).await?;
        if let Ok((_, Some(line))) = rx.try_recv() {
            bail!("worker A went on before the SIGSTOP landed ({line}); the timing did not work out, try again");
        }
        let text = format!(
            "SIGSTOP worker A (pid {pid_a}) between its read and its write: state T, frozen, its keepalive with it"
        );
        self.note("demo", "sigstop", text);

        // B asks for the lock; it is granted once A's lease expires; B increments.
        procs.start_worker('B', &self.worker_args(&endpoint, false), tx)?;
        let b_deadline = Duration::from_millis(self.ttl_ms) + SLACK;
        self.expect(&mut rx, procs, 'B', "released", b_deadline).await?;
        self.expect(&mut rx, procs, 'B', "end", SLACK).await?;
        let status = procs.worker_status('B')?;
        if !status.success() {
            bail!("worker B failed ({status}):\n{}", procs.log_tail("worker-B.log"));
        }
        let hold = Duration::from_millis(self.pause_ms).saturating_sub(stopped_at.elapsed());
        tokio::time::sleep(hold).await;

        // A resumes where it stopped, with its old token.
        procs::signal(pid_a, libc::SIGCONT);
        let paused_ms = stopped_at.elapsed().as_millis() as u64;
        let text = format!(
            "SIGCONT worker A after {paused_ms} ms frozen (lease TTL {} ms): it goes on where it stopped, with its old token",
            self.ttl_ms
        );
        let t_ms = mono_ms_since(self.t0_ns);
        self.push(Step {
            t_ms,
            actor: "demo".into(),
            event: "sigcont".into(),
            value: Some(paused_ms),
            text,
            ..Step::default()
        });
        self.expect(&mut rx, procs, 'A', "end", Duration::from_millis(2 * self.ttl_ms) + SLACK).await?;
        let status = procs.worker_status('A')?;
        if !status.success() {
            bail!("worker A failed ({status}):\n{}", procs.log_tail("worker-A.log"));
        }

        let final_value = self.final_value(&endpoint).await?;
        let key = self.key();
        self.note("demo", "final", format!("the counter {key} holds {final_value}"));
        let outcome = Outcome::from_steps(&self.steps, final_value, paused_ms);
        let designed = outcome.as_designed(self.fencing);
        if self.json {
            println!("{}", outcome.to_json(self.fencing, self.ttl_ms, self.pause_ms, &self.steps));
        } else {
            println!("\n{}", report::diagram(&self.steps));
            println!("{}", outcome.verdict(self.fencing));
            if self.fencing {
                println!("Run `fenced demo --fencing off` to see the same pause without the token.");
            } else {
                println!("Run `fenced demo` (fencing on) to see the store refuse the same write.");
            }
        }
        if !designed {
            bail!("the story did not play out as designed (see the steps above); the machine may be too loaded");
        }
        Ok(ExitCode::SUCCESS)
    }

    fn worker_args(&self, endpoint: &str, is_a: bool) -> Vec<String> {
        let mut args = vec![
            format!("--endpoint={endpoint}"),
            format!("--name={}", if is_a { "A" } else { "B" }),
            format!("--lock={LOCK}"),
            format!("--key={}", self.key()),
            format!("--ttl={}", self.ttl_ms),
            format!("--t0-ns={}", self.t0_ns),
        ];
        if self.fencing {
            args.push("--fenced".into());
        }
        if is_a {
            // Long enough for the SIGSTOP to land first, short enough to be over when A
            // resumes: then A writes at once, like a process back from a pause.
            args.push(format!("--work={}", self.pause_ms / 2));
            args.push(format!("--wait={}", SLACK.as_millis()));
            args.push("--retry".into());
        } else {
            args.push(format!("--wait={}", self.ttl_ms + self.pause_ms + SLACK.as_millis() as u64));
        }
        args
    }

    /// Records the workers' reports until `who` reports `event` (`end`: its stdout ended).
    async fn expect(
        &mut self,
        rx: &mut UnboundedReceiver<procs::Line>,
        procs: &mut Procs,
        who: char,
        event: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let next = tokio::time::timeout_at(deadline, rx.recv()).await;
            let Ok(Some((name, line))) = next else {
                bail!("worker {who} did not report '{event}' within {} ms", within.as_millis());
            };
            let Some(line) = line else {
                if name == who && event == "end" {
                    return Ok(());
                }
                let status = procs.worker_status(name)?;
                bail!("worker {name} ended early ({status}):\n{}", procs.log_tail(&format!("worker-{name}.log")));
            };
            let v: Value = serde_json::from_str(&line).with_context(|| format!("worker {name} said: {line}"))?;
            let ev = v["ev"].as_str().unwrap_or("?").to_string();
            self.worker_step(name, &ev, &v);
            if name == who && ev == event {
                return Ok(());
            }
        }
    }

    /// A worker's report as a step, with its sentence.
    fn worker_step(&mut self, name: char, ev: &str, v: &Value) {
        let token = v["token"].as_u64();
        let value = v["value"].as_u64();
        let t = token.unwrap_or(0);
        let n = value.unwrap_or(0);
        let t_ms = v["t_ms"].as_u64().unwrap_or(0);
        let fenced = v["fenced"].as_bool().unwrap_or(false);
        let key = self.key();
        let text = match ev {
            "started" => format!("started (pid {})", v["pid"].as_u64().unwrap_or(0)),
            "acquire" if name == 'B' => format!("asks for lock {LOCK}; A holds it, so B waits"),
            "acquire" => format!("asks for lock {LOCK}"),
            "granted" => {
                if name == 'B' {
                    let a = self.token_of('A');
                    let text =
                        format!("A's lease (token {a}) expired: no keepalive for {} ms, A is frozen", self.ttl_ms);
                    self.push(Step {
                        t_ms,
                        actor: "lock service".into(),
                        event: "expired".into(),
                        token: Some(a),
                        text,
                        ..Step::default()
                    });
                }
                format!(
                    "took lock {LOCK}: token {t}, lease TTL {} ms, keepalive every {} ms",
                    self.ttl_ms,
                    self.ttl_ms / 3
                )
            }
            "read" if fenced => format!("read {key} = {n}, a fenced read with token {t}: the key's mark is now {t}"),
            "read" => format!("read {key} = {n}, without its token (it holds {t}): the store keeps no mark"),
            "write" => match (v["accepted"].as_bool(), fenced) {
                (Some(true), true) => format!("wrote {n} with token {t}: accepted"),
                (Some(true), false) if name == 'A' => format!(
                    "wrote {n} without its token (it holds {t}): ACCEPTED, a zombie write: B (token {}) wrote in \
                     between, and its increment is gone",
                    self.token_of('B')
                ),
                (Some(true), false) => format!("wrote {n} without its token (it holds {t}): accepted"),
                _ => format!(
                    "wrote {n} with token {t}: REFUSED, 409 stale_token (the key has seen token {})",
                    v["highest_seen"].as_u64().unwrap_or(0)
                ),
            },
            "released" => format!("released lock {LOCK} (token {t})"),
            "lost" => format!("releases, and its guard answers: lock lost ({})", v["reason"].as_str().unwrap_or("?")),
            other => other.to_string(),
        };
        let sent = fenced && matches!(ev, "read" | "write");
        let accepted = (ev == "write").then(|| v["accepted"].as_bool().unwrap_or(false));
        self.push(Step {
            t_ms,
            actor: name.to_string(),
            event: ev.into(),
            token,
            value,
            accepted,
            sent_token: sent,
            text,
        });
    }

    /// The first token worker `name` was granted.
    fn token_of(&self, name: char) -> u64 {
        let actor = name.to_string();
        self.steps.iter().find(|s| s.actor == actor && s.event == "granted").and_then(|s| s.token).unwrap_or(0)
    }

    async fn wait_stopped(&self, pid: u32) -> anyhow::Result<()> {
        for _ in 0..100 {
            if proc_state(pid) == Some('T') {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!("worker A (pid {pid}) did not stop after SIGSTOP (state {:?})", proc_state(pid))
    }

    async fn final_value(&self, endpoint: &str) -> anyhow::Result<u64> {
        let client = Client::connect(endpoint)?;
        let read = match client.store().get(self.key(), None).await? {
            Fenced::Accepted(r) => r,
            Fenced::Rejected { .. } => bail!("a plain read was refused"),
        };
        let raw = read.value.context("the counter is absent after the demo")?;
        Ok(String::from_utf8_lossy(&raw).trim().parse()?)
    }

    /// A step of the parent's own, at the current time.
    fn note(&mut self, actor: &str, event: &str, text: String) {
        let t_ms = mono_ms_since(self.t0_ns);
        self.push(Step { t_ms, actor: actor.into(), event: event.into(), text, ..Step::default() });
    }

    /// Records a step and, in text mode, prints it at once.
    fn push(&mut self, s: Step) {
        if !self.json {
            println!("{}", report::line(&s));
        }
        self.steps.push(s);
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(l.local_addr()?)
}

/// CLOCK_MONOTONIC in ns: one clock for the parent and the workers (Linux keeps it per
/// machine, not per process), so every step's time counts from the same start.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds since `t0_ns` on CLOCK_MONOTONIC.
pub fn mono_ms_since(t0_ns: u64) -> u64 {
    mono_ns().saturating_sub(t0_ns) / 1_000_000
}
