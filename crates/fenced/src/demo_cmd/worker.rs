//! `fenced demo-worker` (hidden): one worker process of `fenced demo`. It runs the
//! counter workload once (take the lock, read the counter, work, write counter + 1,
//! release) with the real client, and reports each step to the parent as one JSON line
//! on stdout, stamped with the parent's clock.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use fenced_client::{Client, Error, Fenced, Token};
use serde_json::{json, Value};

use super::mono_ms_since;
use crate::args::{duration_ms, Global};

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The worker's name in the story ("A" or "B").
    #[arg(long)]
    pub name: String,
    /// The lock that guards the counter.
    #[arg(long)]
    pub lock: String,
    /// The store key of the counter.
    #[arg(long)]
    pub key: String,
    /// Send the token with every read and write; without it, write to an unfenced key.
    #[arg(long)]
    pub fenced: bool,
    /// The lease's TTL.
    #[arg(long, value_parser = duration_ms)]
    pub ttl: u64,
    /// How long to wait for the lock.
    #[arg(long, value_parser = duration_ms)]
    pub wait: u64,
    /// The "work" between the read and the write (the parent freezes the worker in it).
    #[arg(long, value_parser = duration_ms, default_value = "0")]
    pub work: u64,
    /// After a refused write, take the lock again and redo the increment (once).
    #[arg(long)]
    pub retry: bool,
    /// The parent's start on CLOCK_MONOTONIC, in ns: every report counts from it.
    #[arg(long)]
    pub t0_ns: u64,
}

pub fn run(a: WorkerArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = Client::connect(&global.endpoint).context("connecting to the demo's server")?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let w = Worker { client, a };
        w.emit("started", json!({ "pid": std::process::id() }));
        let accepted = w.increment(w.a.work).await?;
        if !accepted && w.a.retry {
            w.increment(0).await?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

struct Worker {
    /// The demo server's client.
    client: Client,
    /// What to do.
    a: WorkerArgs,
}

impl Worker {
    /// One report: `{"ev", "t_ms", ...fields}` on one line (stdout is line-buffered, so
    /// the parent has it before the next step starts).
    fn emit(&self, ev: &str, fields: Value) {
        let mut v = json!({ "ev": ev, "t_ms": mono_ms_since(self.a.t0_ns) });
        if let (Some(o), Value::Object(f)) = (v.as_object_mut(), fields) {
            o.extend(f);
        }
        println!("{v}");
    }

    /// Take the lock, read, work, write counter + 1, release. Returns whether the
    /// write was accepted.
    async fn increment(&self, work_ms: u64) -> anyhow::Result<bool> {
        let ttl = Duration::from_millis(self.a.ttl);
        self.emit("acquire", json!({}));
        let guard = self.client.lock(&self.a.lock).ttl(ttl).wait(Duration::from_millis(self.a.wait)).acquire().await?;
        let token = guard.token();
        self.emit("granted", json!({ "token": token.get(), "ttl_ms": self.a.ttl }));
        let value = self.read(token).await?;
        self.emit("read", json!({ "token": token.get(), "value": value, "fenced": self.a.fenced }));
        // The work. A is frozen here by the parent; when it resumes, this sleep is long
        // over and it writes at once, as a process back from a GC pause would.
        tokio::time::sleep(Duration::from_millis(work_ms)).await;
        let next = value + 1;
        let highest_seen = self.write(token, next).await?;
        let accepted = highest_seen.is_none();
        self.emit(
            "write",
            json!({ "token": token.get(), "value": next, "accepted": accepted, "fenced": self.a.fenced,
                    "highest_seen": highest_seen.map(Token::get) }),
        );
        match guard.release().await {
            Ok(()) => self.emit("released", json!({ "token": token.get() })),
            Err(Error::Lost(reason)) => {
                self.emit("lost", json!({ "token": token.get(), "reason": reason.to_string() }))
            }
            Err(e) => return Err(e).context("releasing the lock"),
        }
        Ok(accepted)
    }

    /// The counter (0 when absent): a fenced read with fencing on, a plain one without.
    async fn read(&self, token: Token) -> anyhow::Result<u64> {
        let sent = self.a.fenced.then_some(token);
        let read = match self.client.store().get(&self.a.key, sent).await? {
            Fenced::Accepted(r) => r,
            Fenced::Rejected { highest_seen, .. } => {
                bail!("the fenced read with token {token} was refused (the key has seen {highest_seen})")
            }
        };
        let Some(raw) = read.value else { return Ok(0) };
        let text = String::from_utf8(raw).context("the counter is not text")?;
        text.trim().parse().with_context(|| format!("the counter holds '{text}', not a number"))
    }

    /// Writes `value`; `None` when accepted, the key's mark when refused.
    async fn write(&self, token: Token, value: u64) -> anyhow::Result<Option<Token>> {
        let store = self.client.store();
        let body = value.to_string();
        if !self.a.fenced {
            store.put_unfenced(&self.a.key, body.as_bytes()).await?;
            return Ok(None);
        }
        Ok(match store.put(&self.a.key, token, body.as_bytes()).await? {
            Fenced::Accepted(_) => None,
            Fenced::Rejected { highest_seen, .. } => Some(highest_seen),
        })
    }
}
