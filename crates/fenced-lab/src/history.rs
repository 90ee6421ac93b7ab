//! A torture run's history, and its analysis by the core's checker.
//!
//! Workers record every operation with the real time it was invoked and completed
//! (microseconds since the Unix epoch: one clock for every process on the machine).
//! The nemesis records its faults. [`analyse`] turns the lot into the checker's events,
//! placed so that every finding is certain rather than likely:
//!
//! - a read or write raises the resource's mark when it *completed* (it had reached the
//!   resource by then), and a write is judged when it was *invoked* (it reached the
//!   resource after that). A write is a zombie only if an operation under a newer token
//!   had completed before the write was even sent.
//! - lost updates are Jepsen's: acknowledged increments missing from the final counter.
//! - tokens must respect real time: a grant that completed before another was asked for
//!   carries the lower token, across restarts too; no token is granted twice.
//! - no two holders at once, as the service promised them ([`overlapping_holders`]).

use std::collections::HashMap;

use fenced_core::checker::{Checker, Event, EventKind, Finding, FindingKind, Outcome as CheckOutcome};
use fenced_core::Token;
use serde::{Deserialize, Serialize};

/// What a recorded operation was.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Acquire,
    Read,
    Write,
    Release,
    /// A plain read of the counter, no lock, no token (a cluster run's readers,
    /// [`crate::reader`]): judged by the linearizability check only.
    Get,
}

/// How it ended, as the worker saw it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpResult {
    /// Done (a grant, a value read, a write acknowledged).
    Ok,
    /// Refused by the resource for a stale token.
    Rejected,
    /// Definitely not done (a lock not granted).
    Failed,
    /// May or may not have happened (a time-out, a dropped connection).
    Unknown,
}

/// One operation of one worker.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Op {
    pub worker: u32,
    /// The worker's lock cycle this operation belongs to.
    pub cycle: u64,
    pub kind: OpKind,
    pub start_us: u64,
    pub end_us: u64,
    pub result: OpResult,
    /// The lock service's token for the cycle's grant, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The value read or written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// On a write: until when the client library promised the holder its lock as the
    /// write started (the send time of its last acknowledged keepalive plus the TTL
    /// less its margin), Unix microseconds; for the targets whose client keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promised_until_us: Option<u64>,
    /// On a write: whether the client library had signalled the lock lost as the write
    /// started (the worker writes anyway: the resource must refuse it); for the
    /// targets whose client has the signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_signalled: Option<bool>,
}

/// A fault the nemesis injected.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// SIGSTOP of a worker at `start_us`, SIGCONT at `end_us`.
    Pause { worker: u32, start_us: u64, end_us: u64 },
    /// kill -9 of the lock service at `start_us`, listening again at `end_us`.
    Restart { start_us: u64, end_us: u64 },
    /// Every byte between workers and lock service held `delay_ms`, from `start_us` to `end_us`.
    Delay { delay_ms: u64, start_us: u64, end_us: u64 },
    /// kill -9 of these cluster members (by node id), all listening again at `end_us`.
    Kill { nodes: Vec<u64>, start_us: u64, end_us: u64 },
    /// SIGSTOP of a cluster member, SIGCONT at `end_us`.
    NodePause { node: u64, start_us: u64, end_us: u64 },
    /// The directed links between members `(from, to)` cut (`kind`: isolated leader,
    /// split, bridge, one-way).
    Partition { kind: String, cut: Vec<(u64, u64)>, start_us: u64, end_us: u64 },
    /// Every byte on a member's links held `delay_ms`.
    LinkDelay { node: u64, delay_ms: u64, start_us: u64, end_us: u64 },
    /// A member's clock ran at `rate_permille` / 1000 of real time.
    Clock { node: u64, rate_permille: u64, start_us: u64, end_us: u64 },
    /// SIGSTOP of a cluster's leading member at `start_us`, SIGCONT at `end_us`.
    LeaderFreeze { member: u32, start_us: u64, end_us: u64 },
}

/// What the history shows.
#[derive(Clone, Default, PartialEq, Eq, Debug, Serialize)]
pub struct Analysis {
    pub grants: u64,
    pub writes_attempted: u64,
    /// Increments acknowledged to their worker.
    pub acknowledged: u64,
    /// Writes whose outcome the worker never learned.
    pub writes_indeterminate: u64,
    pub lost_updates: u64,
    pub zombie_writes: u64,
    pub stale_writes_rejected: u64,
    pub stale_reads_rejected: u64,
    /// `None` where the lock service mints no tokens.
    pub token_regressions: Option<u64>,
    /// Of the token regressions, the tokens granted twice; `None` without tokens.
    pub duplicate_tokens: Option<u64>,
    /// Each violation, with the operations that prove it, for a person.
    pub proofs: Vec<String>,
}

/// The most proofs written out.
const PROOFS_MAX: usize = 20;

/// Analyses a history: `ops` from every worker, `faults` from the nemesis, the counter's
/// `final_value` read after the run, `tokens` whether the lock service mints tokens
/// (when not, grants are ranked by completion time to give each holder an order).
pub fn analyse(ops: &[Op], faults: &[Fault], final_value: u64, tokens: bool, fenced: bool) -> Analysis {
    let mut a = Analysis::default();
    let mut grants: Vec<&Op> = ops.iter().filter(|o| o.kind == OpKind::Acquire && o.result == OpResult::Ok).collect();
    grants.sort_by_key(|o| (o.end_us, o.worker));
    let tokens_of = TokensOf::new(&grants, tokens);
    a.grants = grants.len() as u64;
    if tokens {
        let (n, duplicates, proofs) = regressions(&grants);
        a.token_regressions = Some(n);
        a.duplicate_tokens = Some(duplicates);
        a.proofs.extend(proofs);
    }
    a.stale_reads_rejected =
        ops.iter().filter(|o| o.kind == OpKind::Read && o.result == OpResult::Rejected).count() as u64;
    let events = checker_events(ops, faults, &tokens_of, fenced);
    let mut checker = Checker::new();
    for (_, _, e, _) in &events {
        checker.observe(e);
    }
    let report = checker.finish();
    a.writes_attempted = report.writes_attempted;
    a.zombie_writes = report.zombie_writes;
    a.stale_writes_rejected = report.stale_writes_rejected;
    a.acknowledged = ops.iter().filter(|o| o.kind == OpKind::Write && o.result == OpResult::Ok).count() as u64;
    a.writes_indeterminate =
        ops.iter().filter(|o| o.kind == OpKind::Write && o.result == OpResult::Unknown).count() as u64;
    a.lost_updates = a.acknowledged.saturating_sub(final_value);
    if a.lost_updates > 0 {
        a.proofs.push(format!(
            "lost updates: {} increments were acknowledged but the counter ends at {final_value}, {} short",
            a.acknowledged, a.lost_updates
        ));
    }
    for f in report.findings.iter().filter(|f| matches!(f.kind, FindingKind::ZombieWrite { .. })) {
        if a.proofs.len() >= PROOFS_MAX {
            break;
        }
        a.proofs.extend(zombie_proof(f, &events, &tokens_of));
    }
    a
}

/// The token each (worker, cycle) acted under: the grant's, or without tokens its rank
/// in completion order.
struct TokensOf(HashMap<(u32, u64), u64>);

impl TokensOf {
    fn new(grants: &[&Op], tokens: bool) -> TokensOf {
        let ranked = grants.iter().enumerate();
        TokensOf(
            ranked
                .map(|(rank, g)| ((g.worker, g.cycle), if tokens { g.token.unwrap_or(0) } else { rank as u64 + 1 }))
                .collect(),
        )
    }

    fn of(&self, o: &Op) -> Option<Token> {
        self.0.get(&(o.worker, o.cycle)).copied().and_then(Token::new)
    }
}

/// A checker's event at its time, with its order at one instant and the operation it
/// came from (none for a fault).
type Timed<'a> = (u64, u8, Event, Option<&'a Op>);

/// The checker's events, in order, each with the operation it came from.
fn checker_events<'a>(ops: &'a [Op], faults: &[Fault], tokens_of: &TokensOf, fenced: bool) -> Vec<Timed<'a>> {
    let mut events: Vec<Timed<'a>> = Vec::with_capacity(ops.len() + faults.len());
    for o in ops {
        let held = tokens_of.of(o);
        let outcome = match o.result {
            OpResult::Ok => CheckOutcome::Accepted,
            OpResult::Rejected => CheckOutcome::Rejected,
            OpResult::Failed | OpResult::Unknown => CheckOutcome::Unknown,
        };
        let value = o.value.unwrap_or(0);
        let (t, kind) = match o.kind {
            OpKind::Acquire if o.result == OpResult::Ok => match held {
                Some(token) => (o.end_us, EventKind::Granted { token }),
                None => continue,
            },
            OpKind::Read if o.result == OpResult::Ok => {
                (o.end_us, EventKind::Read { held, fenced, value, outcome: CheckOutcome::Accepted })
            }
            OpKind::Write => (o.start_us, EventKind::Write { held, fenced, value, value_before: None, outcome }),
            _ => continue,
        };
        // At one instant, completions (which raise the mark) before invocations.
        let order = if matches!(kind, EventKind::Write { .. }) { 1 } else { 0 };
        events.push((t, order, Event { t_ms: t / 1000, client: o.worker, kind }, Some(o)));
    }
    for f in faults {
        if let Fault::Pause { worker, start_us, end_us } = *f {
            let kind = EventKind::Paused { duration_ms: (end_us - start_us) / 1000 };
            events.push((start_us, 0, Event { t_ms: start_us / 1000, client: worker, kind }, None));
        }
    }
    events.sort_by_key(|(t, order, ..)| (*t, *order));
    events
}

/// A zombie write's proof, for a person: the write, and the operation under the newer
/// token that completed before it was sent.
fn zombie_proof(f: &Finding, events: &[Timed<'_>], tokens_of: &TokensOf) -> Option<String> {
    let FindingKind::ZombieWrite { token, highest_seen, pause_ms } = f.kind else { return None };
    let write = events[f.event].3?;
    let newer = events[..f.event]
        .iter()
        .rev()
        .filter_map(|(_, _, e, op)| op.filter(|_| matches!(e.kind, EventKind::Read { .. } | EventKind::Write { .. })))
        .find(|o| tokens_of.of(o).map(Token::get) == Some(highest_seen.get()));
    let mut proof = format!(
        "zombie write: worker {} wrote {} under token {} at {} (after a {} ms pause), accepted",
        write.worker,
        write.value.unwrap_or(0),
        token.get(),
        us(write.start_us),
        pause_ms
    );
    if let Some(n) = newer {
        proof += &format!(
            "; worker {} had already {} under the newer token {} at {}",
            n.worker,
            if n.kind == OpKind::Read { "read" } else { "written" },
            highest_seen.get(),
            us(n.end_us)
        );
    }
    Some(proof)
}

/// Token order against real time: for every grant, every grant that completed before it
/// was asked for must carry a lower token (a sweep in start order); and no two grants
/// share a token, whenever they happened. Counts every violation, and the duplicates
/// among them apart.
fn regressions(grants: &[&Op]) -> (u64, u64, Vec<String>) {
    let (mut n, mut duplicates, mut proofs) = (0u64, 0u64, Vec::new());
    let mut by_token: Vec<&Op> = grants.to_vec();
    by_token.sort_by_key(|o| (o.token, o.end_us));
    for pair in by_token.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.token == b.token {
            n += 1;
            duplicates += 1;
            if proofs.len() < PROOFS_MAX {
                proofs.push(format!(
                    "token regression: token {} granted twice, to worker {} at {} and to worker {} at {}",
                    a.token.unwrap_or(0),
                    a.worker,
                    us(a.end_us),
                    b.worker,
                    us(b.end_us)
                ));
            }
        }
    }
    let mut by_end: Vec<&Op> = grants.to_vec();
    by_end.sort_by_key(|o| o.end_us);
    let mut by_start: Vec<&Op> = grants.to_vec();
    by_start.sort_by_key(|o| o.start_us);
    let mut highest: Option<&Op> = None;
    let mut i = 0;
    for g in by_start {
        while i < by_end.len() && by_end[i].end_us < g.start_us {
            if highest.is_none_or(|h| by_end[i].token > h.token) {
                highest = Some(by_end[i]);
            }
            i += 1;
        }
        if let Some(h) = highest.filter(|h| h.token > g.token) {
            n += 1;
            if proofs.len() < PROOFS_MAX {
                proofs.push(format!(
                    "token regression: worker {} was granted {} at {}, after worker {} had been granted {} at {}",
                    g.worker,
                    g.token.unwrap_or(0),
                    us(g.end_us),
                    h.worker,
                    h.token.unwrap_or(0),
                    us(h.end_us)
                ));
            }
        }
    }
    (n, duplicates, proofs)
}

/// Two holders of the lock at once, as the service promised them: each grant is
/// certainly held from its acknowledgement until the earlier of the holder's release
/// request and the client-side deadline the service's promise gives it: the send time
/// of the acquire plus the TTL less the client's default margin (a tenth), or later
/// where a write recorded a later promise (the library's deadline from its last
/// acknowledged keepalive). Keepalives not recorded would only extend that, so leaving
/// them out can only miss an overlap, never invent one. Two such windows that intersect
/// are two holders at one instant, whatever order the grants took effect in: a
/// violation of mutual exclusion. Returns the number of grants whose window opened
/// inside an earlier one, and proofs.
pub fn overlapping_holders(ops: &[Op], ttl_ms: u64) -> (u64, Vec<String>) {
    let promised_us = (ttl_ms - ttl_ms / 10) * 1000;
    let mut released: HashMap<(u32, u64), u64> = HashMap::new();
    let mut promised: HashMap<(u32, u64), u64> = HashMap::new();
    for o in ops {
        if o.kind == OpKind::Release {
            let t = released.entry((o.worker, o.cycle)).or_insert(o.start_us);
            *t = (*t).min(o.start_us);
        }
        if let Some(p) = o.promised_until_us {
            let t = promised.entry((o.worker, o.cycle)).or_insert(p);
            *t = (*t).max(p);
        }
    }
    // (from, until, grant) for every acknowledged grant.
    let mut windows: Vec<(u64, u64, &Op)> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Acquire && o.result == OpResult::Ok)
        .map(|g| {
            let key = (g.worker, g.cycle);
            let deadline = promised.get(&key).map_or(0, |p| *p).max(g.start_us + promised_us);
            let until = released.get(&key).map_or(deadline, |r| (*r).min(deadline));
            (g.end_us, until, g)
        })
        .filter(|(from, until, _)| from < until)
        .collect();
    windows.sort_by_key(|(from, until, g)| (*from, *until, g.worker));
    let (mut n, mut proofs) = (0u64, Vec::new());
    let mut longest: Option<(u64, &Op)> = None;
    for (from, until, g) in windows {
        if let Some((held_until, h)) = longest.filter(|(held_until, _)| from < *held_until) {
            n += 1;
            if proofs.len() < PROOFS_MAX {
                proofs.push(format!(
                    "overlapping holders: worker {} was granted token {} at {}, while worker {} (token {}, granted \
                     at {}) was promised the lock until {}",
                    g.worker,
                    g.token.map_or_else(|| "-".into(), |t| t.to_string()),
                    us(from),
                    h.worker,
                    h.token.map_or_else(|| "-".into(), |t| t.to_string()),
                    us(h.end_us),
                    us(held_until)
                ));
            }
        }
        if longest.is_none_or(|(held_until, _)| until > held_until) {
            longest = Some((until, g));
        }
    }
    (n, proofs)
}

/// Writes begun after another worker had been granted the lock by a holder whose client
/// library had not signalled the loss yet: the lost signal came late. A service grants
/// the lock again only once the holder's lease has expired, which is after the
/// library's own deadline (the send time of the last acknowledged keepalive plus the
/// TTL less a margin), so an honest library has signalled by then, even in a process
/// frozen across that moment: its signal reads the clock. Only writes that recorded
/// the signal count (`None` when none did). Returns the count, and proofs.
pub fn late_lost_signals(ops: &[Op]) -> (Option<u64>, Vec<String>) {
    if !ops.iter().any(|o| o.lost_signalled.is_some()) {
        return (None, Vec::new());
    }
    let mut grants: Vec<&Op> = ops.iter().filter(|o| o.kind == OpKind::Acquire && o.result == OpResult::Ok).collect();
    grants.sort_by_key(|g| g.end_us);
    let own: HashMap<(u32, u64), u64> = grants.iter().map(|g| ((g.worker, g.cycle), g.end_us)).collect();
    let (mut n, mut proofs) = (0u64, Vec::new());
    for w in ops.iter().filter(|o| o.kind == OpKind::Write && o.lost_signalled == Some(false)) {
        let Some(&granted_us) = own.get(&(w.worker, w.cycle)) else { continue };
        let first = grants.partition_point(|g| g.end_us <= granted_us);
        // A grant with a lower token than the writer's was issued before the writer's own
        // (its answer only arrived later, to a holder that was slow to hear it): it does
        // not supersede the writer. Without tokens, the order of the answers decides.
        let newer = |g: &&&Op| match (g.token, w.token) {
            (Some(theirs), Some(mine)) => theirs > mine,
            _ => true,
        };
        let next =
            grants[first..].iter().take_while(|g| g.end_us < w.start_us).filter(|g| g.worker != w.worker).find(newer);
        if let Some(g) = next {
            n += 1;
            if proofs.len() < PROOFS_MAX {
                proofs.push(format!(
                    "late lost signal: worker {} (token {}) began a write at {} with its lock not signalled lost, \
                     after worker {} had been granted token {} at {}",
                    w.worker,
                    w.token.map_or_else(|| "-".into(), |t| t.to_string()),
                    us(w.start_us),
                    g.worker,
                    g.token.map_or_else(|| "-".into(), |t| t.to_string()),
                    us(g.end_us)
                ));
            }
        }
    }
    (Some(n), proofs)
}

/// Whether the counter's history in the Fenced store (its fenced reads and writes, and
/// the plain reads of a cluster run's readers) is linearizable, by the core's Wing-Gong search ([`fenced_core::checker::linearizable`]):
/// `None` when the search ran out of its budget; with a proof when it is not. For the
/// targets whose counter is the Fenced store with tokens (`fenced`, `fenced-cluster`).
pub fn store_linearizable(ops: &[Op]) -> (Option<bool>, Option<String>) {
    use fenced_core::checker::linearizable::{check, Call, Operation, Ret, Verdict, STEPS_MAX_DEFAULT};
    let mut history = Vec::new();
    for o in ops {
        let token = o.token.and_then(Token::new);
        let ret = match (o.kind, o.result) {
            // Certainly without effect: left out, as the checker asks.
            (_, OpResult::Failed) => continue,
            (_, OpResult::Unknown) => Ret::Unknown,
            (_, OpResult::Rejected) => Ret::Stale { highest_seen: None },
            // The worker reads an absent counter as 0; it never writes 0.
            (OpKind::Read | OpKind::Get, OpResult::Ok) => Ret::Value(o.value.filter(|v| *v != 0)),
            (OpKind::Write, OpResult::Ok) => Ret::Done,
            _ => continue,
        };
        let call = match o.kind {
            OpKind::Read => Call::Read { token },
            OpKind::Get => Call::Read { token: None },
            OpKind::Write => Call::Write { token, value: o.value.unwrap_or(0) },
            _ => continue,
        };
        history.push(Operation { process: o.worker, key: (), call, ret, invoke: o.start_us, complete: o.end_us });
    }
    match check(&history, STEPS_MAX_DEFAULT) {
        Verdict::Linearizable => (Some(true), None),
        Verdict::NotLinearizable(v) => {
            let o = &history[v.stuck];
            let proof = format!(
                "not linearizable: worker {}'s {:?} answered {:?} (sent at {}, answered at {}) fits no order of the \
                 counter's operations ({:?}; {} linearized before it)",
                o.process,
                o.call,
                o.ret,
                us(o.invoke),
                us(o.complete),
                v.cause,
                v.linearized.len()
            );
            (Some(false), Some(proof))
        }
        Verdict::Unknown { .. } | Verdict::Malformed { .. } => (None, None),
    }
}

/// A timestamp for a person: seconds with milliseconds, Unix time.
fn us(t: u64) -> String {
    format!("{}.{:06}s", t / 1_000_000, t % 1_000_000)
}

#[cfg(test)]
mod tests;
