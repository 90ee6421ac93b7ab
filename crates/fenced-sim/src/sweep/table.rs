//! A sweep's rows as a table: CSV, JSON and text.

use std::fmt::Write as _;

use super::{Axis, Row};

/// The columns after the knob's own.
const COLUMNS: &str =
    "lease_ms,fencing,seeds,grants,late_writes,zombie_writes,stale_writes_rejected,lost_updates,unsafe_runs";

fn columns(rows: &[Row]) -> String {
    let axis = rows.first().map_or(Axis::Lease, |r| r.axis);
    format!("{},{COLUMNS}", axis.column())
}

fn fields(r: &Row) -> [String; 10] {
    [
        r.value.to_string(),
        r.lease_ms.to_string(),
        if r.fencing { "on" } else { "off" }.to_string(),
        r.seeds.to_string(),
        r.grants.to_string(),
        r.late_writes.to_string(),
        r.zombie_writes.to_string(),
        r.stale_writes_rejected.to_string(),
        r.lost_updates.to_string(),
        r.unsafe_runs.to_string(),
    ]
}

pub fn to_csv(rows: &[Row]) -> String {
    let mut s = format!("{}\n", columns(rows));
    for r in rows {
        let _ = writeln!(s, "{}", fields(r).join(","));
    }
    s
}

pub fn to_json(rows: &[Row]) -> String {
    let columns = columns(rows);
    let names: Vec<&str> = columns.split(',').collect();
    let objects: Vec<String> = rows
        .iter()
        .map(|r| {
            let f = fields(r);
            let pairs: Vec<String> = names
                .iter()
                .zip(f.iter())
                .map(|(k, v)| if *k == "fencing" { format!(r#""{k}":"{v}""#) } else { format!(r#""{k}":{v}"#) })
                .collect();
            format!("{{{}}}", pairs.join(","))
        })
        .collect();
    format!("[{}]\n", objects.join(","))
}

pub fn to_text(rows: &[Row]) -> String {
    let mut s = String::new();
    let axis = rows.first().map_or(Axis::Lease, |r| r.axis);
    let head = match axis {
        Axis::Lease => "lease",
        Axis::LockDelay => "delay",
        Axis::ClockStep => "step",
    };
    let _ = writeln!(
        s,
        "{:>8} {:>9} {:>8} {:>7} {:>12} {:>14} {:>13} {:>12}",
        head, "fencing", "seeds", "grants", "late writes", "zombie writes", "stale refused", "lost updates"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>6}ms {:>9} {:>8} {:>7} {:>12} {:>14} {:>13} {:>12}",
            knob_ms(r),
            if r.fencing { "on" } else { "off" },
            r.seeds,
            r.grants,
            r.late_writes,
            r.zombie_writes,
            r.stale_writes_rejected,
            r.lost_updates
        );
    }
    s
}

/// The knob's value in milliseconds, as the table and the chart show it.
pub(super) fn knob_ms(r: &Row) -> u64 {
    match r.axis {
        Axis::Lease => r.lease_ms,
        Axis::LockDelay | Axis::ClockStep => r.value,
    }
}
