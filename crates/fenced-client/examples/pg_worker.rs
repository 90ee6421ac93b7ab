//! A worker that increments a PostgreSQL row under a Fenced lock, fenced by the lock's
//! token: the example of docs/client.md.
//!
//! ```text
//! cargo run -p fenced-client --features postgres --example pg_worker -- \
//!     --pg "host=/var/run/postgresql user=postgres" --account 1 --times 5 [--pause-ms 0]
//! ```
//!
//! Run two at once with `--pause-ms` longer than the TTL on one of them to watch the
//! paused worker's late update be refused instead of losing the other's increments.

use std::time::Duration;

use fenced_client::resource::postgres::PgFence;
use fenced_client::{Client, Fenced};

/// The worker's settings, from the command line.
struct Args {
    /// tokio-postgres connection string.
    pg: String,
    /// The row of `accounts` to increment.
    account: i64,
    /// How many increments.
    times: u32,
    /// A pause between reading and writing, as a GC pause or a stalled VM would make.
    pause: Duration,
    /// The lock's TTL.
    ttl: Duration,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        pg: "host=/var/run/postgresql user=postgres".into(),
        account: 1,
        times: 5,
        pause: Duration::ZERO,
        ttl: Duration::from_secs(5),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |s: String| s.parse::<u64>().map_err(|_| format!("{flag}: '{s}' is not a number"));
        match flag.as_str() {
            "--pg" => a.pg = value()?,
            "--account" => a.account = number(value()?)? as i64,
            "--times" => a.times = number(value()?)? as u32,
            "--pause-ms" => a.pause = Duration::from_millis(number(value()?)?),
            "--ttl-ms" => a.ttl = Duration::from_millis(number(value()?)?),
            _ => return Err(format!("unknown flag {flag}; flags: --pg --account --times --pause-ms --ttl-ms")),
        }
    }
    Ok(a)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let (db, connection) = tokio_postgres::connect(&args.pg, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    // An ordinary table; the fence column is added to it.
    db.batch_execute("CREATE TABLE IF NOT EXISTS accounts (id bigint PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)")
        .await?;
    db.execute("INSERT INTO accounts (id) VALUES ($1) ON CONFLICT DO NOTHING", &[&args.account]).await?;
    let fence = PgFence::new("accounts", "id")?;
    fence.add_fence_column(&db).await?;

    let client = Client::from_env()?; // FENCED_ENDPOINT, default http://127.0.0.1:7400
    let lock = format!("accounts/{}", args.account);
    for _ in 0..args.times {
        let guard = client.lock(&lock).ttl(args.ttl).wait(Duration::from_secs(60)).acquire().await?;
        let token = guard.token();
        // A fenced read: from here on, every holder older than this one is shut out.
        let balance: i64 = match fence.read(&db, &args.account, token, "balance").await? {
            Fenced::Accepted(Some(row)) => row.get(0),
            Fenced::Accepted(None) => return Err("the account row vanished".into()),
            Fenced::Rejected { highest_seen, .. } => {
                println!("token {token}: read refused, the row has seen token {highest_seen}");
                continue;
            }
        };
        if !args.pause.is_zero() {
            guard.pause_keepalive(true); // the pause is the whole process's, keepalive included
            tokio::time::sleep(args.pause).await;
        }
        let next = balance + 1;
        match fence.update(&db, &args.account, token, "balance = $3", &[&next]).await? {
            Fenced::Accepted(_) => println!("token {token}: balance {balance} -> {next}"),
            Fenced::Rejected { highest_seen, .. } => {
                println!("token {token}: update refused, the row has seen token {highest_seen}; nothing lost")
            }
        }
        match guard.release().await {
            Ok(()) => {}
            Err(fenced_client::Error::Lost(reason)) => println!("token {token}: the lock had been lost ({reason})"),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
