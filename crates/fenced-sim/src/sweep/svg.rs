//! A sweep's rows as a line chart (SVG): zombie writes against the knob, fencing off and on.

use std::fmt::Write as _;

use super::table::knob_ms;
use super::{Axis, Row};

/// A line chart of zombie writes against the knob, fencing off and on.
pub fn to_svg(rows: &[Row], title: &str) -> String {
    let axis = rows.first().map_or(Axis::Lease, |r| r.axis);
    let (x_label, note) = match axis {
        Axis::Lease => ("lease length", ["longer leases:", "rarer, never zero"]),
        Axis::LockDelay => ("lock-delay", ["longer delays:", "rarer, never zero"]),
        Axis::ClockStep => ("wall-clock step", ["bigger steps:", "more zombie writes"]),
    };
    let off: Vec<&Row> = rows.iter().filter(|r| !r.fencing).collect();
    let on: Vec<&Row> = rows.iter().filter(|r| r.fencing).collect();
    let y_max = rows.iter().map(|r| r.zombie_writes).max().unwrap_or(0).max(1) as f64;
    let c = Chart { w: 720.0, h: 420.0, left: 70.0, right: 180.0, top: 50.0, bottom: 60.0, n: off.len().max(1), y_max };
    let (w, h, left) = (c.w, c.h, c.left);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{left}" y="28" font-size="15" font-weight="bold">{}</text>"#, escape(title));
    c.axes(&mut s, &off, x_label);
    for (series, color, label) in [(&off, "#d62728", "fencing off"), (&on, "#2ca02c", "fencing on")] {
        c.series(&mut s, series, color, label, x_label);
    }
    c.legend(&mut s, note);
    s.push_str("</svg>\n");
    s
}

/// The chart's size, margins and scales.
struct Chart {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    /// Points on the x axis.
    n: usize,
    /// The top of the y axis.
    y_max: f64,
}

impl Chart {
    fn x(&self, i: usize) -> f64 {
        let n = self.n;
        self.left + (self.w - self.left - self.right) * if n == 1 { 0.5 } else { i as f64 / (n - 1) as f64 }
    }

    fn y(&self, v: u64) -> f64 {
        self.top + (self.h - self.top - self.bottom) * (1.0 - v as f64 / self.y_max)
    }

    /// The grid, the y axis's figures and label, and the knob's values under the x axis.
    fn axes(&self, s: &mut String, off: &[&Row], x_label: &str) {
        let (w, h, left, right, bottom) = (self.w, self.h, self.left, self.right, self.bottom);
        for k in 0..=4 {
            let v = (self.y_max * k as f64 / 4.0).round() as u64;
            let yy = self.y(v);
            let _ =
                writeln!(s, r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##, w - right);
            let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"#, left - 8.0, yy + 4.0);
        }
        let _ = writeln!(
            s,
            r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">zombie writes (all seeds)</text>"#,
            h / 2.0,
            h / 2.0
        );
        for (i, r) in off.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} ms</text>"#,
                self.x(i),
                h - bottom + 20.0,
                knob_ms(r)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{x_label}</text>"#,
            (left + w - right) / 2.0,
            h - 14.0
        );
    }

    /// One series: its line, a point per row with its figures, and (fencing off) its
    /// count above each point.
    fn series(&self, s: &mut String, series: &[&Row], color: &str, label: &str, x_label: &str) {
        let points: Vec<String> = series
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{:.1},{:.1}", self.x(i), self.y(r.zombie_writes)))
            .collect();
        let _ =
            writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2.5" points="{}"/>"#, points.join(" "));
        for (i, r) in series.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{label}, {x_label} {} ms: {} zombie writes, {} lost updates</title></circle>"#,
                self.x(i),
                self.y(r.zombie_writes),
                knob_ms(r),
                r.zombie_writes,
                r.lost_updates
            );
            if !r.fencing {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{color}">{}</text>"#,
                    self.x(i),
                    self.y(r.zombie_writes) - 9.0,
                    r.zombie_writes
                );
            }
        }
    }

    /// The legend, right of the plot, and the note under it.
    fn legend(&self, s: &mut String, note: [&str; 2]) {
        let (lx, top) = (self.w - self.right + 16.0, self.top);
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{top}" width="14" height="4" fill="#d62728"/><text x="{:.1}" y="{:.1}">fencing off</text>"##,
            lx + 20.0,
            top + 6.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{:.1}" width="14" height="4" fill="#2ca02c"/><text x="{:.1}" y="{:.1}">fencing on: 0</text>"##,
            top + 22.0,
            lx + 20.0,
            top + 28.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{lx}" y="{:.1}" fill="#555">{}</text><text x="{lx}" y="{:.1}" fill="#555">{}</text>"##,
            top + 60.0,
            note[0],
            top + 76.0,
            note[1]
        );
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
