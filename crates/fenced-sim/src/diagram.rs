//! A text sequence diagram of the run's story: the first zombie write (fencing off), or
//! the first write that lost an update without being one (two holders of one token, a
//! replicated lock service's split brain), or the first write the gate refused
//! (fencing on), from the writer's grant to its write.
//!
//! Lanes: the writer, the lock service, the resource, and the clients that held the
//! lock in between. Arrows carry tokens; pauses shade the paused client's lane.

use std::fmt::Write as _;

use crate::trace::{Detail, Kind, Record};
use crate::Summary;

mod narrate;
mod sheet;

use narrate::narrate;
pub use sheet::Sheet;

/// Width of one lane, in characters.
const LANE_W: usize = 22;
/// Width of the time column.
const TIME_W: usize = 9;
/// Other holders drawn at most.
const OTHERS_MAX: usize = 3;
/// Rows drawn at most (the story is short; a long window is cut in the middle).
const ROWS_MAX: usize = 60;

/// Renders the story of `summary` from the run's records.
pub fn render(records: &[Record], summary: &Summary) -> String {
    // Without a zombie write, an accepted write can still lose increments only when
    // another holder had the same token: that story comes before a refusal's.
    let lost = || {
        records.iter().find(|r| {
            matches!(r.detail, Detail::Write { accepted: true, value, value_before, .. } if value < value_before + 1)
        })
    };
    let focus = summary
        .zombies
        .first()
        .map(|z| z.seq)
        .or_else(|| lost().map(|r| r.seq))
        .or(summary.first_rejection.map(|(_, seq)| seq));
    let Some(focus) = focus.and_then(|seq| records.iter().position(|r| r.seq == seq)) else {
        return "No zombie write and no rejected write in this run: no story to draw. Try another seed, a \
                longer --duration, or --scenario default.\n"
            .to_string();
    };
    let write = records[focus];
    let writer = write.client;
    let token = write.token;
    // The story starts when the writer asked for the lock it is writing under.
    let grant = records[..focus]
        .iter()
        .rposition(|r| r.kind == Kind::Granted && r.client == writer && r.token == token)
        .unwrap_or(0);
    let start = records[..grant].iter().rposition(|r| r.kind == Kind::Acquire && r.client == writer).unwrap_or(grant);
    let window = &records[start..=focus];
    let granted_at = grant - start;
    let mut others: Vec<u32> = Vec::new();
    for r in &window[granted_at..] {
        if r.kind == Kind::Granted && r.client != writer && r.lock == write.lock && !others.contains(&r.client) {
            others.push(r.client);
        }
    }
    // Keep the holders closest to the write: they are the ones it interleaves with.
    if others.len() > OTHERS_MAX {
        others.drain(..others.len() - OTHERS_MAX);
    }
    let mut lanes = vec![Lane::Client(writer), Lane::Lock, Lane::Resource];
    lanes.extend(others.iter().map(|c| Lane::Client(*c)));
    // The writer from its acquire on; the others once the writer holds the lock.
    let rows: Vec<&Record> = window
        .iter()
        .enumerate()
        .filter(|(i, r)| (r.client == writer || *i >= granted_at) && shown(r, writer, &others))
        .map(|(_, r)| r)
        .collect();
    let mut sheet = Sheet::new(&lane_names(&lanes));
    let pause = window.iter().find(|r| r.kind == Kind::Pause && r.client == writer);
    let paused = |t: u64| {
        pause.is_some_and(
            |p| matches!(p.detail, Detail::Pause { duration_ms, .. } if t >= p.t_ms && t < p.t_ms + duration_ms),
        )
    };
    let cut = rows.len() > ROWS_MAX;
    for (i, r) in rows.iter().enumerate() {
        if cut && i == ROWS_MAX / 2 {
            sheet.gap();
        }
        if cut && i >= ROWS_MAX / 2 && i < rows.len() - ROWS_MAX / 2 {
            continue;
        }
        row(&mut sheet, &lanes, r, paused(r.t_ms) && !(r.kind == Kind::Pause && r.client == writer));
    }
    let mut out = sheet.finish();
    let _ = writeln!(out);
    out.push_str(&narrate(&window[granted_at..], &write, summary));
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    Client(u32),
    Lock,
    Resource,
}

fn lane_of(lanes: &[Lane], l: Lane) -> Option<usize> {
    lanes.iter().position(|x| *x == l)
}

fn shown(r: &Record, writer: u32, others: &[u32]) -> bool {
    // What happened to the lock service itself (a clock step, a crash, a failover)
    // concerns every client.
    let involved = r.kind.is_service_wide() || r.client == writer || others.contains(&r.client);
    involved
        && match r.kind {
            Kind::Keepalive => matches!(r.detail, Detail::Keepalive { ok: false }),
            Kind::Acquire => r.client == writer,
            _ => true,
        }
}

fn lane_names(lanes: &[Lane]) -> Vec<String> {
    lanes
        .iter()
        .map(|l| match l {
            Lane::Client(c) => format!("c{c}"),
            Lane::Lock => "lock service".into(),
            Lane::Resource => "resource".into(),
        })
        .collect()
}

/// One event as a row: an arrow between two lanes, or a note on one.
fn row(sheet: &mut Sheet, lanes: &[Lane], r: &Record, writer_paused: bool) {
    let tok = |r: &Record| r.token.map_or(String::new(), |t| format!(" #{t}"));
    let client = lane_of(lanes, Lane::Client(r.client)).unwrap_or(0);
    let lock = lane_of(lanes, Lane::Lock).expect("lock lane");
    let resource = lane_of(lanes, Lane::Resource).expect("resource lane");
    let (from, to, label) = match (r.kind, r.detail) {
        (Kind::Acquire, _) => (client, Some(lock), "acquire".to_string()),
        (Kind::Granted, _) => (lock, Some(client), format!("granted{}", tok(r))),
        (Kind::Expired, _) => (lock, None, format!("✗ lease{} expired", tok(r))),
        (Kind::Released, _) => (lock, None, format!("released{}", tok(r))),
        (Kind::WaitEnded, _) => (lock, None, "wait ended".to_string()),
        (Kind::Keepalive, _) => (lock, None, format!("keepalive{}: lease gone", tok(r))),
        (Kind::Pause, Detail::Pause { duration_ms, cause }) => {
            (client, None, format!("⏸ paused {duration_ms} ms ({cause})"))
        }
        (Kind::Read, Detail::Read { value, accepted, fenced }) => {
            let how = if fenced { "fenced read" } else { "read" };
            let verdict = if accepted { format!("= {value}") } else { "REFUSED".into() };
            (client, Some(resource), format!("{how}{} {verdict}", tok(r)))
        }
        (Kind::Write, Detail::Write { value, accepted, zombie, .. }) => {
            let verdict = match (accepted, zombie) {
                (true, true) => "ZOMBIE WRITE accepted",
                (true, false) => "ok",
                (false, _) => "✗ REJECTED: stale token",
            };
            (client, Some(resource), format!("write {value}{} {verdict}", tok(r)))
        }
        (Kind::Aborted, _) => (client, None, "knows its lease is gone: no write".to_string()),
        (Kind::Crash, _) => (client, None, "crashed".to_string()),
        (Kind::Restart, _) => (client, None, "restarted".to_string()),
        (Kind::ClockStep, Detail::Step { step_ms }) => (lock, None, format!("⏩ wall clock +{step_ms} ms")),
        (Kind::ServiceCrash, _) => (lock, None, "☠ service crashed".to_string()),
        (Kind::ServiceRestart, _) => (lock, None, "↻ service restarted".to_string()),
        (Kind::Partition, _) => (lock, None, "⚡ replicas cut apart".to_string()),
        (Kind::Failover, Detail::Replica { replica }) => (lock, None, format!("⇆ replica {replica} takes over")),
        (Kind::Heal, _) => (lock, None, "✓ cut healed".to_string()),
        (Kind::Duplicate, _) => (resource, None, "= duplicate absorbed".to_string()),
        _ => (client, None, r.kind.name().to_string()),
    };
    sheet.row(r.t_ms, from, to, &label, writer_paused.then_some(0));
}
