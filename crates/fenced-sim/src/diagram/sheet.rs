//! The sheet a sequence diagram is drawn on: lanes side by side, one row per event.

use std::fmt::Write as _;

use super::{LANE_W, TIME_W};

/// A text sequence diagram under construction: named lanes side by side, time in ms on
/// the left, one row per event. The simulator's story and `fenced demo` both draw with
/// it, so the two look alike.
pub struct Sheet {
    /// How many lanes there are.
    lanes: usize,
    /// The text drawn so far.
    out: String,
}

impl Sheet {
    /// A sheet with one lane per name, left to right, and its header row.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Sheet {
        let mut line = format!("{:>TIME_W$}  ", "t (ms)");
        for name in names {
            let _ = write!(line, "{:<LANE_W$}", name.as_ref());
        }
        let mut out = String::new();
        let _ = writeln!(out, "{}", line.trim_end());
        Sheet { lanes: names.len(), out }
    }

    /// One row at `t_ms`: an arrow from lane `from` to lane `to` carrying `label`, or,
    /// when `to` is `None` (or `from`), a note beside lane `from`. A label too long for
    /// its place goes to the end of the row. Lane `dashed` is drawn `┆` (a process that
    /// is stopped).
    pub fn row(&mut self, t_ms: u64, from: usize, to: Option<usize>, label: &str, dashed: Option<usize>) {
        let width = self.lanes * LANE_W;
        let mut cells: Vec<char> = vec![' '; width];
        for i in 0..self.lanes {
            cells[i * LANE_W] = if dashed == Some(i) { '┆' } else { '│' };
        }
        let mut note = String::new();
        match to {
            Some(to) if to != from => arrow(&mut cells, from * LANE_W, to * LANE_W, label, &mut note),
            _ => {
                // A note beside its lane, written over empty space only.
                let x = from * LANE_W + 2;
                let text: Vec<char> = label.chars().collect();
                if x + text.len() < width && cells[x..x + text.len()].iter().all(|c| *c == ' ' || *c == '│') {
                    cells[x..x + text.len()].copy_from_slice(&text);
                } else {
                    note = label.to_string();
                }
            }
        }
        let line: String = cells.into_iter().collect();
        let line = if note.is_empty() { line.trim_end().to_string() } else { format!("{}  {note}", line.trim_end()) };
        let _ = writeln!(self.out, "{t_ms:>TIME_W$}  {line}");
    }

    /// A row saying that rows were left out here.
    pub fn gap(&mut self) {
        let _ = writeln!(self.out, "{:>TIME_W$}  (rows left out)", "...");
    }

    /// The diagram as text, one line per row.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Draws `──label──▶` from column `a` to column `b`; a label too long for the gap goes
/// into `note` instead.
fn arrow(cells: &mut [char], a: usize, b: usize, label: &str, note: &mut String) {
    let (lo, hi) = (a.min(b), a.max(b));
    for c in cells.iter_mut().take(hi).skip(lo + 1) {
        *c = '─';
    }
    if b > a {
        cells[hi - 1] = '▶';
    } else {
        cells[lo + 1] = '◀';
    }
    let text: Vec<char> = format!(" {label} ").chars().collect();
    let room = hi - lo - 3;
    if text.len() <= room {
        let x = lo + 2 + (room - text.len()) / 2;
        cells[x..x + text.len()].copy_from_slice(&text);
    } else {
        *note = label.to_string();
    }
}
