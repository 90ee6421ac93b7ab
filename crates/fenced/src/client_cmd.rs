//! Client commands: `exec`, `lock`, `locks`, `put`, `get`. Each turns its arguments into
//! calls on `fenced-client` and prints human text, or one JSON object with `--json`.

mod exec;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use fenced_client::{Client, Error, Fenced, LockName, Token};
use serde_json::json;

use crate::args::{duration_ms, BadArgument, Global};

/// Exit status when the lock was not acquired within the wait, or a fenced operation
/// was refused.
const EXIT_NOT_ACQUIRED: u8 = 1;
/// Exit status when the lock was lost while held.
const EXIT_LOST: u8 = 3;

#[derive(Subcommand, Debug)]
pub enum ClientCmd {
    /// Run a command while holding a lock; stop it if the lock is lost.
    ///
    /// Nothing the command starts outlives the lock. When the lock is lost, and when the
    /// command exits, its process group and (on Linux) every other descendant, even one
    /// that left the group with setsid or a double fork, get SIGTERM, then SIGKILL after
    /// --grace but no later than the lease's client-side deadline; the lock is released
    /// only once all of them are gone. If fenced exec itself dies, even by kill -9, the
    /// watchdog that is the command's parent SIGKILLs everything below it. Elsewhere than
    /// on Linux only the process group is followed. See docs/client.md.
    Exec(exec::ExecArgs),
    /// Campaign for leadership of NAME and run a command while leader (exec's rules: it
    /// is stopped when leadership is lost; FENCED_TOKEN is the leadership's token).
    /// Waits as long as it takes to be elected; the command's exit resigns.
    Elect(ElectArgs),
    /// The leader of election NAME (its holder label, token and lease), and with
    /// --watch every change as it happens.
    Leader(LeaderArgs),
    /// Acquire a lock, print the grant, hold it until interrupted, then release.
    Lock(LockArgs),
    /// List the locks on the server.
    Locks(LocksArgs),
    /// Take a lock from its holder, whoever it is (an operator's release; needs the
    /// admin right on the name). The next waiter is granted with a higher token.
    Revoke(RevokeArgs),
    /// Print the events of locks and store keys as they happen (granted, released,
    /// expired, store accepted/rejected), resuming across reconnects without a gap.
    Watch(WatchArgs),
    /// Write a value to the server's fenced store.
    Put(PutArgs),
    /// Read a value from the server's fenced store.
    Get(GetArgs),
    /// The cluster: its members, leader and commit index; add or remove a member.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// The parent of `exec`'s command (started by `exec`, not by hand).
    #[command(hide = true)]
    ExecWatchdog(exec::watchdog::WatchdogArgs),
}

/// How long to hold and to wait, shared by `exec` and `lock`.
#[derive(Args, Debug, Clone)]
pub struct HoldArgs {
    /// The lease's TTL: how long the lock outlives this process if it goes silent.
    #[arg(long, default_value = "10s", value_parser = duration_ms)]
    pub ttl: u64,
    /// How long to wait for the lock; 0s tries once.
    #[arg(long, default_value = "30s", value_parser = duration_ms)]
    pub wait: u64,
    /// Name the holder in the lock's views and events (a host, a process, a job; not a
    /// secret; 1 to 256 bytes). Fenced locks only.
    #[arg(long)]
    pub holder: Option<String>,
}

#[derive(Args, Debug)]
pub struct LockArgs {
    /// The lock's name (UTF-8, 1 to 256 bytes, `/` allowed).
    pub name: String,
    #[command(flatten)]
    pub hold: HoldArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Members (id, URL, role, last log index), leader, term and commit index, as the
    /// member that answers sees them.
    Status,
    /// Add member ID reachable at URL (started with --node-id ID and the cluster's
    /// --peers): it catches up, then votes.
    Add { id: u64, url: String },
    /// Remove member ID from the voters.
    Remove { id: u64 },
}

#[derive(Args, Debug)]
pub struct LocksArgs {
    /// Only locks whose names start with this.
    #[arg(long)]
    pub prefix: Option<String>,
}

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's name (a lock name).
    pub name: String,
    /// Who campaigns, shown to observers (`fenced leader`): a host, a process.
    #[arg(long)]
    pub holder: String,
    /// The leadership's lease TTL: how long it outlives this process if it goes silent.
    #[arg(long, default_value = "10s", value_parser = duration_ms)]
    pub ttl: u64,
    /// Between SIGTERM and SIGKILL when leadership is lost (exec's --grace).
    #[arg(long, default_value = "5s", value_parser = duration_ms)]
    pub grace: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// The election's name.
    pub name: String,
    /// Then print every change of leader as it happens (until interrupted).
    #[arg(long)]
    pub watch: bool,
}

#[derive(Args, Debug)]
pub struct RevokeArgs {
    /// The lock's name.
    pub name: String,
    /// Take it only while this token holds it (default: the current holder's token,
    /// read first, so a retry never takes it from the next holder).
    #[arg(long)]
    pub token: Option<u64>,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Only events of names and keys that start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Start exactly after this event index (a position printed by an earlier watch);
    /// default: from now.
    #[arg(long)]
    pub since: Option<u64>,
    /// Stop after this many events (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

#[derive(Args, Debug)]
pub struct PutArgs {
    pub key: String,
    pub value: String,
    /// The fencing token of the lock you hold.
    #[arg(long)]
    pub token: u64,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    pub key: String,
    /// Make it a fenced read: refused if the key has seen a newer token, and the key's
    /// mark advances to this one.
    #[arg(long)]
    pub token: Option<u64>,
}

pub fn run(cmd: ClientCmd, global: &Global) -> anyhow::Result<ExitCode> {
    // No client and no runtime: the watchdog only waits, reaps and kills.
    let cmd = match cmd {
        ClientCmd::ExecWatchdog(a) => return exec::watchdog::run(a),
        other => other,
    };
    let client = client(global)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        match cmd {
            ClientCmd::Exec(a) => exec::run(&client, a, global).await,
            ClientCmd::Lock(a) => lock(&client, a, global).await,
            ClientCmd::Locks(a) => locks(&client, a, global).await,
            ClientCmd::Elect(a) => {
                let hold = HoldArgs { ttl: a.ttl, wait: 30_000, holder: Some(a.holder) };
                let exec = exec::ExecArgs {
                    name: a.name,
                    hold,
                    grace: a.grace,
                    lock_service: None,
                    command: a.command,
                    campaign: true,
                };
                exec::run(&client, exec, global).await
            }
            ClientCmd::Leader(a) => leader(&client, a, global).await,
            ClientCmd::Revoke(a) => revoke(&client, a, global).await,
            ClientCmd::Watch(a) => watch(&client, a, global).await,
            ClientCmd::Put(a) => put(&client, a, global).await,
            ClientCmd::Get(a) => get(&client, a, global).await,
            ClientCmd::Cluster(c) => cluster(&client, c, global).await,
            ClientCmd::ExecWatchdog(_) => unreachable!("handled before the runtime starts"),
        }
    })
}

/// The client of `--endpoint` (FENCED_AUTH_TOKEN and the TLS files from the environment).
pub fn client(global: &Global) -> anyhow::Result<Client> {
    let attempt_timeout = std::time::Duration::from_millis(global.attempt_timeout);
    if attempt_timeout < fenced_client::ATTEMPT_TIMEOUT_MIN {
        let min = fenced_client::ATTEMPT_TIMEOUT_MIN.as_millis();
        return Err(BadArgument::error("--attempt-timeout", format!("must be at least {min}ms")));
    }
    let client = Client::builder().endpoint(&global.endpoint).attempt_timeout(attempt_timeout).build();
    client.map_err(|e| match e {
        Error::BadRequest(m) => BadArgument::error("--endpoint", m),
        e => e.into(),
    })
}

/// Checks what the server would refuse anyway, so that it exits with status 2.
fn hold_options(name: &str, hold: &HoldArgs) -> anyhow::Result<(Duration, Duration)> {
    LockName::new(name).map_err(|e| BadArgument::error("NAME", e.to_string()))?;
    if hold.ttl == 0 {
        return Err(BadArgument::error("--ttl", "the TTL must be more than 0"));
    }
    Ok((Duration::from_millis(hold.ttl), Duration::from_millis(hold.wait)))
}

fn token_arg(raw: u64) -> anyhow::Result<Token> {
    Token::new(raw).ok_or_else(|| BadArgument::error("--token", "0 is never a fencing token"))
}

/// Prints a grant the way `lock` and `exec -v` show it.
fn grant_json(guard: &fenced_client::LockGuard) -> serde_json::Value {
    json!({
        "name": guard.name().as_str(),
        "token": guard.token().get(),
        "lease_id": guard.lease_id().to_hex(),
        "ttl_ms": guard.ttl().as_millis() as u64,
    })
}

async fn lock(client: &Client, a: LockArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (ttl, wait) = hold_options(&a.name, &a.hold)?;
    let mut request = client.lock(&a.name).ttl(ttl).wait(wait);
    if let Some(h) = &a.hold.holder {
        request = request.holder(h);
    }
    let guard = match request.acquire().await {
        Ok(g) => g,
        Err(Error::LockHeld { name }) => {
            eprintln!("lock '{name}' was not acquired within {} ms", wait.as_millis());
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
        Err(e) => return Err(e.into()),
    };
    // Before the grant is printed: a Ctrl-C right after it must release, not kill.
    let interrupted = crate::term::interrupt();
    if global.json() {
        println!("{}", grant_json(&guard));
    } else {
        println!(
            "holding lock '{}' with token {} (lease {}, ttl {} ms); Ctrl-C releases it",
            guard.name(),
            guard.token(),
            guard.lease_id(),
            guard.ttl().as_millis()
        );
    }
    let lost = guard.lost();
    tokio::select! {
        reason = lost => {
            eprintln!("lock '{}' lost: {reason}", a.name);
            let _ = guard.release().await;
            Ok(ExitCode::from(EXIT_LOST))
        }
        _ = interrupted => {
            match guard.release().await {
                Ok(()) => {
                    if !global.json() {
                        println!("released lock '{}'", a.name);
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(Error::Lost(reason)) => {
                    eprintln!("lock '{}' lost: {reason}", a.name);
                    Ok(ExitCode::from(EXIT_LOST))
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

async fn cluster(client: &Client, c: ClusterCmd, global: &Global) -> anyhow::Result<ExitCode> {
    let status = match c {
        ClusterCmd::Status => client.cluster().await?,
        ClusterCmd::Add { id, url } => client.add_member(id, &url).await?,
        ClusterCmd::Remove { id } => client.remove_member(id).await?,
    };
    if global.json() {
        println!("{status}");
        return Ok(ExitCode::SUCCESS);
    }
    let n = |k: &str| status.get(k).and_then(|v| v.as_u64()).map_or("-".to_string(), |v| v.to_string());
    println!("leader {}, term {}, commit index {}", n("leader_id"), n("term"), n("commit_index"));
    for m in status.get("members").and_then(|m| m.as_array()).cloned().unwrap_or_default() {
        let id = m.get("id").and_then(|v| v.as_u64()).unwrap_or(0);
        let url = m.get("url").and_then(|v| v.as_str()).unwrap_or("?");
        let role = m.get("role").and_then(|v| v.as_str()).unwrap_or("?");
        let index = m.get("last_log_index").and_then(|v| v.as_u64()).map_or("-".to_string(), |v| v.to_string());
        println!("{id}\t{role}\t{url}\tlast log index {index}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn locks(client: &Client, a: LocksArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let answer = client.locks(a.prefix.as_deref()).await?;
    if global.json() {
        println!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    let list = answer.get("locks").and_then(|l| l.as_array()).cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no locks");
    }
    for l in list {
        let name = l.get("name").and_then(|v| v.as_str()).unwrap_or("?");
        let waiters = l.get("waiters").and_then(|v| v.as_u64()).unwrap_or(0);
        match l.get("token").and_then(|v| v.as_u64()) {
            Some(t) if l.get("held").and_then(|v| v.as_bool()).unwrap_or(true) => {
                let expires = l.get("expires_in_ms").and_then(|v| v.as_u64());
                let expires = expires.map(|ms| format!(", lease expires in {ms} ms")).unwrap_or_default();
                let by = l.get("holder").and_then(|v| v.as_str()).map(|h| format!(" by {h}")).unwrap_or_default();
                println!("{name}\theld{by}, token {t}{expires}, {waiters} waiting");
            }
            _ => println!("{name}\tfree, {waiters} waiting"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn leader(client: &Client, a: LeaderArgs, global: &Global) -> anyhow::Result<ExitCode> {
    use fenced_client::LeaderChange as C;
    // Watching from before the read: no change between the two is missed.
    let mut observe = a.watch.then(|| client.observe(&a.name, None));
    if let Some(o) = observe.as_mut() {
        o.ready().await?;
    }
    let now = client.leader(&a.name).await?;
    if global.json() {
        println!("{}", json!({ "name": a.name, "leader": now }));
    } else {
        match &now {
            Some(l) => {
                let who = l.holder.as_deref().unwrap_or("(no label)");
                let left = l.expires_in_ms.map(|ms| format!(", lease expires in {ms} ms")).unwrap_or_default();
                println!("{}: leader {who}, token {}{left}", a.name, l.token);
            }
            None => println!("{}: no leader", a.name),
        }
    }
    let Some(observe) = observe.as_mut() else {
        return Ok(ExitCode::from(if now.is_some() { 0 } else { EXIT_NOT_ACQUIRED }));
    };
    loop {
        let change = observe.next().await?;
        if global.json() {
            println!("{}", serde_json::to_string(&change)?);
            continue;
        }
        match change {
            C::Elected { index, token, holder } => {
                let who = holder.as_deref().unwrap_or("(no label)");
                println!("{index:>8}  elected  {who}, token {token}");
            }
            C::Vacated { index, token, reason } => println!("{index:>8}  vacated  token {token} ({reason})"),
        }
    }
}

async fn revoke(client: &Client, a: RevokeArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let token = a.token.map(token_arg).transpose()?;
    match client.revoke_lock(&a.name, token).await {
        Ok(t) => {
            if global.json() {
                println!("{}", json!({ "name": a.name, "token": t.get(), "revoked": true }));
            } else {
                println!("revoked: {} taken from token {t}", a.name);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(Error::Refused(fenced_core::Error::NotHolder { holder })) => {
            let why = match holder {
                Some(h) => format!("{} is held by token {h}, not the one named", a.name),
                None => format!("nobody holds {}", a.name),
            };
            if global.json() {
                println!("{}", json!({ "name": a.name, "revoked": false, "holder_token": holder.map(|t| t.get()) }));
            } else {
                println!("not revoked: {why}");
            }
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
        Err(e) => Err(e.into()),
    }
}

async fn watch(client: &Client, a: WatchArgs, global: &Global) -> anyhow::Result<ExitCode> {
    use fenced_client::EventKind as K;
    let mut w = client.watch(&a.prefix, a.since);
    let mut n = 0;
    while a.count.is_none_or(|c| n < c) {
        let e = match w.next().await {
            Ok(e) => e,
            Err(e @ Error::Missed { .. }) => {
                let at = w.position().map_or("the start".to_string(), |p| format!("index {p}"));
                return Err(anyhow::anyhow!("{e} (after {at}); list the locks again and watch from now"));
            }
            Err(e) => return Err(e.into()),
        };
        n += 1;
        if global.json() {
            println!("{}", serde_json::to_string(&e)?);
            continue;
        }
        let what = match &e.kind {
            K::Granted { name, token, holder, .. } => {
                let by = holder.as_deref().map(|h| format!(" to {h}")).unwrap_or_default();
                format!("granted   {name} token {token}{by}")
            }
            K::Released { name, token, reason } => format!("released  {name} token {token} ({reason})"),
            K::Expired { name, token } => format!("expired   {name} token {token}"),
            K::StoreAccepted { key, token, op } => format!("accepted  {op} {key} token {token}"),
            K::StoreRejected { key, token, highest_seen, op } => {
                format!("rejected  {op} {key} token {token} (it has seen {highest_seen})")
            }
            K::Other => "an event this client does not know".to_string(),
        };
        println!("{:>8}  {what}", e.index);
    }
    Ok(ExitCode::SUCCESS)
}

async fn put(client: &Client, a: PutArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let token = token_arg(a.token)?;
    match client.store().put(&a.key, token, a.value.as_bytes()).await? {
        Fenced::Accepted(mark) => {
            if global.json() {
                println!(
                    "{}",
                    json!({ "key": a.key, "accepted": true, "token": token.get(), "highest_seen": mark.get() })
                );
            } else {
                println!("accepted: {} = {} with token {token}", a.key, a.value);
            }
            Ok(ExitCode::SUCCESS)
        }
        Fenced::Rejected { token, highest_seen } => {
            rejected(global, &a.key, token, highest_seen);
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
    }
}

async fn get(client: &Client, a: GetArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let token = a.token.map(token_arg).transpose()?;
    match client.store().get(&a.key, token).await? {
        Fenced::Accepted(read) => {
            let mark = read.highest_seen.map(Token::get);
            if global.json() {
                let value = read.value.as_deref().map(String::from_utf8_lossy);
                println!("{}", json!({ "key": a.key, "found": value.is_some(), "value": value, "highest_seen": mark }));
            } else {
                match &read.value {
                    Some(v) => println!("{}", String::from_utf8_lossy(v)),
                    None => eprintln!("no value under '{}'", a.key),
                }
            }
            Ok(if read.value.is_some() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_NOT_ACQUIRED) })
        }
        Fenced::Rejected { token, highest_seen } => {
            rejected(global, &a.key, token, highest_seen);
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
    }
}

fn rejected(global: &Global, key: &str, token: Token, highest_seen: Token) {
    if global.json() {
        println!(
            "{}",
            json!({ "key": key, "accepted": false, "token": token.get(), "highest_seen": highest_seen.get() })
        );
    } else {
        println!("rejected: '{key}' has already seen token {highest_seen}, newer than {token}");
    }
}
