//! What `fenced demo` saw: the steps as they happened, the outcome in the design's
//! words (zombie writes, lost updates, stale writes rejected), the sequence diagram and
//! the JSON object.

use std::fmt::Write as _;

use fenced_sim::diagram::Sheet;
use serde_json::{json, Value};

/// Lanes of the diagram, left to right.
const LANE_A: usize = 0;
const LANE_LOCK: usize = 1;
const LANE_B: usize = 2;
const LANE_STORE: usize = 3;

/// One thing that happened, with its real time and token.
#[derive(Clone, Debug, Default)]
pub struct Step {
    /// Milliseconds since the demo started, on the monotonic clock.
    pub t_ms: u64,
    /// Who did it: `A`, `B`, `lock service`, `server`, `demo`.
    pub actor: String,
    /// What: `granted`, `read`, `write`, `released`, `lost`, `expired`, `sigstop`, ...
    pub event: String,
    /// The fencing token involved, if any.
    pub token: Option<u64>,
    /// The counter value read or written, if any.
    pub value: Option<u64>,
    /// For a write: whether the store accepted it.
    pub accepted: Option<bool>,
    /// For a read or a write: whether it carried the token to the store.
    pub sent_token: bool,
    /// The sentence printed for it.
    pub text: String,
}

/// The numbers of the run.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub token_a: Option<u64>,
    pub token_b: Option<u64>,
    /// A's write after the pause: accepted or not.
    pub write_a_accepted: Option<bool>,
    pub writes_accepted: u64,
    pub stale_writes_rejected: u64,
    pub zombie_writes: u64,
    /// Increments the store acknowledged to a worker.
    pub acknowledged: u64,
    pub final_value: u64,
    pub lost_updates: u64,
    /// How long A really stayed frozen.
    pub paused_ms: u64,
}

impl Outcome {
    /// Counts from the steps: a zombie write is an accepted write whose writer's token
    /// is below a token the store had already seen (or, unfenced, would have seen).
    pub fn from_steps(steps: &[Step], final_value: u64, paused_ms: u64) -> Outcome {
        let mut o = Outcome { final_value, paused_ms, ..Outcome::default() };
        for (s, zombie) in steps.iter().zip(zombies(steps)) {
            match (s.actor.as_str(), s.event.as_str()) {
                ("A", "granted") if o.token_a.is_none() => o.token_a = s.token,
                ("B", "granted") if o.token_b.is_none() => o.token_b = s.token,
                (_, "write") if s.accepted == Some(true) => {
                    o.writes_accepted += 1;
                    o.acknowledged += 1;
                    o.zombie_writes += u64::from(zombie);
                }
                (_, "write") => o.stale_writes_rejected += 1,
                _ => {}
            }
            if s.actor == "A" && s.event == "write" && o.write_a_accepted.is_none() {
                o.write_a_accepted = s.accepted;
            }
        }
        o.lost_updates = o.acknowledged.saturating_sub(final_value);
        o
    }

    /// Whether the story played out as designed: with fencing, A's late write refused
    /// and nothing lost; without, the late write accepted and B's increment lost.
    pub fn as_designed(&self, fencing: bool) -> bool {
        if fencing {
            self.write_a_accepted == Some(false) && self.zombie_writes == 0 && self.lost_updates == 0
        } else {
            self.write_a_accepted == Some(true) && self.zombie_writes == 1 && self.lost_updates == 1
        }
    }

    /// The verdict, one line with the numbers.
    pub fn verdict(&self, fencing: bool) -> String {
        let a = self.token_a.unwrap_or(0);
        let b = self.token_b.unwrap_or(0);
        let counts = format!(
            "Writes accepted {}, refused {}; final counter {} for {} increments acknowledged; zombie writes {}, lost \
             updates {}",
            self.writes_accepted,
            self.stale_writes_rejected,
            self.final_value,
            self.acknowledged,
            self.zombie_writes,
            self.lost_updates
        );
        match (fencing, self.write_a_accepted) {
            (true, Some(false)) => format!(
                "verdict: SAFE. A's late write with token {a} was refused (the store had seen {b}); A took the lock \
                 again and redid its increment. {counts}."
            ),
            (false, Some(true)) => format!(
                "verdict: UNSAFE. A's late write (it held token {a}) was accepted after B's (token {b}): a zombie \
                 write, and B's increment is gone. {counts}."
            ),
            _ => format!("verdict: the story did not play out as designed. {counts}."),
        }
    }

    pub fn to_json(&self, fencing: bool, ttl_ms: u64, pause_ms: u64, steps: &[Step]) -> Value {
        json!({
            "fencing": if fencing { "on" } else { "off" },
            "ttl_ms": ttl_ms,
            "pause_ms": pause_ms,
            "paused_ms": self.paused_ms,
            "token_a": self.token_a,
            "token_b": self.token_b,
            "write_a_accepted": self.write_a_accepted,
            "writes_accepted": self.writes_accepted,
            "stale_writes_rejected": self.stale_writes_rejected,
            "zombie_writes": self.zombie_writes,
            "increments_acknowledged": self.acknowledged,
            "final_value": self.final_value,
            "lost_updates": self.lost_updates,
            "as_designed": self.as_designed(fencing),
            "steps": steps.iter().map(|s| json!({
                "t_ms": s.t_ms, "actor": s.actor, "event": s.event, "token": s.token,
                "value": s.value, "accepted": s.accepted, "text": s.text,
            })).collect::<Vec<_>>(),
        })
    }
}

/// For each step, whether it is a zombie write: accepted, and its writer's token is
/// below a token the store had already seen (or, unfenced, would have seen) in a read or
/// an accepted write.
fn zombies(steps: &[Step]) -> Vec<bool> {
    let mut seen = 0;
    steps
        .iter()
        .map(|s| {
            let token = s.token.unwrap_or(0);
            match s.event.as_str() {
                "read" => seen = seen.max(token),
                "write" if s.accepted == Some(true) => {
                    let zombie = token < seen;
                    seen = seen.max(token);
                    return zombie;
                }
                _ => {}
            }
            false
        })
        .collect()
}

/// The steps as a sequence diagram like `fenced sim --diagram`'s; A's lane is dashed
/// while it is frozen.
pub fn diagram(steps: &[Step]) -> String {
    let mut sheet = Sheet::new(&["worker A", "lock service", "worker B", "store"]);
    let mut frozen = false;
    for (s, zombie) in steps.iter().zip(zombies(steps)) {
        let lane = match s.actor.as_str() {
            "A" => LANE_A,
            "B" => LANE_B,
            _ => LANE_LOCK,
        };
        let tok = s.token.map_or(String::new(), |t| format!(" #{t}"));
        let sent = if s.sent_token { tok.as_str() } else { "" };
        let value = s.value.unwrap_or(0);
        let dashed = frozen.then_some(LANE_A);
        match s.event.as_str() {
            "acquire" if s.actor == "B" => sheet.row(s.t_ms, lane, Some(LANE_LOCK), "acquire (waits)", dashed),
            "expired" => sheet.row(s.t_ms, LANE_LOCK, None, &format!("✗ lease{tok} expired"), dashed),
            "granted" => sheet.row(s.t_ms, LANE_LOCK, Some(lane), &format!("granted{tok}"), dashed),
            "read" => sheet.row(s.t_ms, lane, Some(LANE_STORE), &format!("read{sent} = {value}"), dashed),
            "write" => {
                let verdict = match (s.accepted, zombie) {
                    (Some(true), true) => "ZOMBIE WRITE accepted",
                    (Some(true), false) => "ok",
                    _ => "✗ REJECTED: stale token",
                };
                sheet.row(s.t_ms, lane, Some(LANE_STORE), &format!("write {value}{sent} {verdict}"), dashed)
            }
            "released" => sheet.row(s.t_ms, lane, Some(LANE_LOCK), &format!("release{tok}"), dashed),
            "lost" => sheet.row(s.t_ms, lane, None, "guard: lock lost", dashed),
            "sigstop" => {
                sheet.row(s.t_ms, LANE_A, None, "⏸ SIGSTOP: frozen", None);
                frozen = true;
            }
            "sigcont" => {
                frozen = false;
                sheet.row(s.t_ms, LANE_A, None, &format!("▶ SIGCONT after {value} ms"), None);
            }
            _ => {}
        }
    }
    sheet.finish()
}

/// A step as the narration prints it.
pub fn line(s: &Step) -> String {
    let actor = match s.actor.as_str() {
        "A" | "B" => format!("worker {}", s.actor),
        other => other.to_string(),
    };
    let mut out = String::new();
    let _ = write!(out, "{:>7} ms  {actor:<13} {}", s.t_ms, s.text);
    out
}
