//! The prose under a diagram: what the story shows, in the run's numbers.

use std::fmt::Write as _;

use crate::trace::{Detail, Kind, Record};
use crate::Summary;

/// The story in sentences, with the run's own numbers.
pub(super) fn narrate(window: &[Record], write: &Record, s: &Summary) -> String {
    let c = write.client;
    let t = write.token.unwrap_or(0);
    let mut o = String::new();
    let read = window.iter().find(|r| r.kind == Kind::Read && r.client == c);
    let pause = window.iter().find(|r| r.kind == Kind::Pause && r.client == c);
    let expired = window.iter().find(|r| r.kind == Kind::Expired && r.client == c && r.token == write.token);
    let newer = expired.and_then(|e| {
        window.iter().find(|r| r.kind == Kind::Granted && r.client != c && r.lock == write.lock && r.t_ms >= e.t_ms)
    });
    let _ = write!(o, "c{c} took the lock with token {t}");
    if let Some(Detail::Read { value, .. }) = read.map(|r| r.detail) {
        let _ = write!(o, ", read {value}");
    }
    if let Some(Detail::Pause { duration_ms, cause }) = pause.map(|r| r.detail) {
        let _ = write!(o, " and stopped for {duration_ms} ms ({cause})");
    }
    let _ = writeln!(o, ".");
    if let Some(e) = expired {
        let _ = write!(o, "Its {} ms lease expired at t={} ms", s.lease_ms, e.t_ms);
        let step = window.iter().find(|r| r.kind == Kind::ClockStep && r.t_ms == e.t_ms);
        if let Some(Detail::Step { step_ms }) = step.map(|r| r.detail) {
            let _ = write!(o, ", early: the lock service's wall clock had just stepped forward {step_ms} ms");
        }
        if let Some(n) = newer {
            let _ = write!(
                o,
                "; the lock service granted token {} to c{} at t={} ms",
                n.token.unwrap_or(0),
                n.client,
                n.t_ms
            );
        }
        let _ = writeln!(o, ".");
    }
    let Detail::Write { value, accepted, zombie, value_before, .. } = write.detail else { return o };
    // A writer that never stopped (the lease ended early, or a split brain) did not
    // wake; the seed's own runs keep the words they always printed.
    let how = if pause.is_some() || seed_run(s) { "woke up and wrote" } else { "wrote" };
    let _ = write!(o, "At t={} ms c{c} {how} {value} with token {t}: ", write.t_ms);
    if zombie {
        let seen = s.zombies.first().map_or(0, |z| z.highest_seen);
        let _ = writeln!(
            o,
            "the resource accepted it (the counter held {value_before}), although it had already seen token {seen}. \
             A zombie write: two clients inside the critical section at once, and an increment lost."
        );
        // The seed's own runs compare against the fencing scenario; the others against
        // themselves with fencing on.
        let hint = if seed_run(s) { "--scenario fencing" } else { "--fencing on" };
        let _ = writeln!(o, "Run the same seed with {hint} to see the resource refuse it.");
    } else if !accepted {
        let _ = writeln!(
            o,
            "the resource had already seen a newer token and refused it. Nothing about the lock changed; the resource did."
        );
    } else if value < value_before + 1 {
        let twin = window.iter().rev().find(|r| r.kind == Kind::Granted && r.client != c && r.token == write.token);
        let _ = write!(o, "the resource accepted it (the counter held {value_before}): it had seen no token above {t}");
        if let Some(g) = twin {
            let _ = write!(o, ", and c{} had been granted token {t} too, at t={} ms", g.client, g.t_ms);
        }
        let _ = writeln!(
            o,
            ". Two holders of one token: the gate cannot tell them apart, and an increment is lost with fencing on."
        );
    } else {
        let _ = writeln!(o, "accepted.");
    }
    o
}

/// The first seed's runs and `occ`, whose stories print what they always printed.
fn seed_run(s: &Summary) -> bool {
    use crate::Scenario::{Default, Fencing, LongLease, Occ, Renewal};
    matches!(s.scenario, Default | Fencing | LongLease | Renewal | Occ)
}
