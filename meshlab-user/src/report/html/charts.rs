//! Stacked bars of time by kind, and CDFs. Geometry is computed apart from drawing so the tests
//! can check it.

use std::fmt::Write as _;

use crate::schema::Kind;

use super::super::table::us;
use super::svg::{KINDS, Scale, escape, kind_color, log_ticks, nice_ticks, tick_label, x_axis};

pub const WIDTH: f64 = 1240.0;
const LABEL_W: f64 = 210.0;
const RIGHT_PAD: f64 = 110.0;
const BAR_H: f64 = 22.0;
const BAR_GAP: f64 = 10.0;

/// One stacked bar: a label and nanoseconds per kind.
#[derive(Clone, Debug, PartialEq)]
pub struct StackRow {
    pub label: String,
    pub by_kind: Vec<(Kind, f64)>,
}

impl StackRow {
    pub fn total(&self) -> f64 {
        self.by_kind.iter().map(|(_, v)| v).sum()
    }
}

/// Pixel pieces of one row: (kind, x, width, ns).
pub fn stack_pieces(row: &StackRow, scale: &Scale) -> Vec<(Kind, f64, f64, f64)> {
    let mut acc = 0.0;
    let mut out = Vec::new();
    for k in KINDS {
        let v: f64 = row
            .by_kind
            .iter()
            .filter(|(kk, _)| *kk == k)
            .map(|(_, v)| v)
            .sum();
        if v <= 0.0 {
            continue;
        }
        let x0 = scale.at(acc / 1000.0);
        acc += v;
        out.push((k, x0, scale.at(acc / 1000.0) - x0, v));
    }
    out
}

pub fn stacked_bars(rows: &[StackRow]) -> String {
    let max = rows.iter().map(StackRow::total).fold(0.0, f64::max) / 1000.0;
    let (ticks, _) = nice_ticks(max, 10);
    let scale = Scale::new(
        0.0,
        *ticks.last().expect("ticks"),
        LABEL_W,
        WIDTH - RIGHT_PAD,
    );
    let plot_h = rows.len() as f64 * (BAR_H + BAR_GAP) + 34.0;
    let height = plot_h + 40.0;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"chart stacked\" viewBox=\"0 0 {WIDTH} {height:.0}\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"time by kind\">"
    );
    x_axis(&mut s, &scale, &ticks, 30.0, plot_h, "µs per request");
    legend(&mut s, LABEL_W, 14.0);
    for (i, row) in rows.iter().enumerate() {
        let y = 34.0 + i as f64 * (BAR_H + BAR_GAP);
        let _ = write!(
            s,
            "<text class=\"row-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LABEL_W - 8.0,
            y + 15.0,
            escape(&row.label)
        );
        for (k, x, w, v) in stack_pieces(row, &scale) {
            let name = k.as_str();
            let _ = write!(
                s,
                "<rect class=\"bar {name}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{BAR_H}\" fill=\"{}\">\
                 <title>{}: {name} {} µs</title></rect>",
                kind_color(k),
                escape(&row.label),
                us(v.round() as u64)
            );
            if w > 56.0 {
                let _ = write!(
                    s,
                    "<text class=\"in-bar\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                    x + w / 2.0,
                    y + 15.0,
                    us(v.round() as u64)
                );
            }
        }
        let end = scale.at(row.total() / 1000.0);
        let _ = write!(
            s,
            "<text class=\"bar-label\" x=\"{:.1}\" y=\"{:.1}\">{} µs</text>",
            end + 4.0,
            y + 15.0,
            us(row.total().round() as u64)
        );
    }
    s.push_str("</svg>");
    s
}

fn legend(s: &mut String, x: f64, y: f64) {
    for (i, k) in KINDS.iter().enumerate() {
        let lx = x + i as f64 * 110.0;
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text class=\"legend\" x=\"{:.1}\" y=\"{y:.1}\">{}</text>",
            y - 10.0,
            kind_color(*k),
            lx + 16.0,
            k.as_str()
        );
    }
}

/// One CDF line: label and sorted nanoseconds.
pub struct Series<'a> {
    pub label: String,
    pub sorted: &'a [u64],
}

/// Step points (µs, fraction <= value) of a sorted sample, at most `max_points` of them, always
/// including the first and the last sample.
pub fn cdf_points(sorted: &[u64], max_points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let stride = n.div_ceil(max_points.max(2)).max(1);
    let mut idx: Vec<usize> = (0..n).step_by(stride).collect();
    if *idx.last().expect("n > 0") != n - 1 {
        idx.push(n - 1);
    }
    idx.into_iter()
        .map(|i| (sorted[i] as f64 / 1000.0, (i + 1) as f64 / n as f64))
        .collect()
}

const LINE_COLORS: [&str; 6] = [
    "#1f2937", "#4c78a8", "#f58518", "#e45756", "#54a24b", "#b279a2",
];

/// The x placement of a CDF: log10 of microseconds, padded around the data.
pub fn cdf_x_scale(series: &[Series], r0: f64, r1: f64) -> Scale {
    let lo = series
        .iter()
        .filter_map(|s| s.sorted.first())
        .copied()
        .min()
        .unwrap_or(1)
        .max(1) as f64
        / 1000.0;
    let hi = series
        .iter()
        .filter_map(|s| s.sorted.last())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1000.0;
    Scale::new((lo / 1.15).log10(), (hi * 1.15).log10(), r0, r1)
}

pub fn cdf(series: &[Series], aria: &str) -> String {
    let legend_rows = series.len().div_ceil(4) as f64;
    let top = 22.0 + legend_rows * 16.0;
    let height = top + 300.0;
    let bottom = height - 44.0;
    let x = cdf_x_scale(series, 70.0, WIDTH - 40.0);
    let y = Scale::new(0.0, 1.0, bottom, top);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"chart cdf\" viewBox=\"0 0 {WIDTH} {height}\" width=\"{WIDTH}\" height=\"{height}\" \
         xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"{}\">",
        escape(aria)
    );
    for t in log_ticks(10f64.powf(x.d0), 10f64.powf(x.d1)) {
        let px = x.at(t.log10());
        let _ = write!(
            s,
            "<line class=\"grid\" x1=\"{px:.1}\" y1=\"{top:.1}\" x2=\"{px:.1}\" y2=\"{bottom:.1}\"/>\
             <text class=\"tick\" x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            bottom + 14.0,
            tick_label(t)
        );
    }
    let _ = write!(
        s,
        "<text class=\"axis-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">µs (log scale)</text>",
        x.r1,
        bottom + 30.0
    );
    cdf_y_axis(&mut s, &y);
    for (i, ser) in series.iter().enumerate() {
        cdf_line(&mut s, i, ser, &x, &y);
    }
    let _ = write!(
        s,
        "<text class=\"axis-label\" x=\"14\" y=\"{mid:.1}\" transform=\"rotate(-90 14 {mid:.1})\" \
         text-anchor=\"middle\">fraction of requests ≤ x</text></svg>",
        mid = (top + bottom) / 2.0
    );
    s
}

/// Grid lines at the quartiles, p90 and p99 of the CDF's fraction axis.
fn cdf_y_axis(s: &mut String, y: &Scale) {
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let yy = y.at(q);
        let _ = write!(
            s,
            "<line class=\"grid\" x1=\"70\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\"/>\
             <text class=\"tick\" x=\"64\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - 40.0,
            yy + 4.0,
            tick_label(q)
        );
    }
    let p99 = y.at(0.99);
    let _ = write!(
        s,
        "<line class=\"grid p99\" x1=\"70\" y1=\"{p99:.1}\" x2=\"{:.1}\" y2=\"{p99:.1}\"/>\
         <text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">p99</text>",
        WIDTH - 40.0,
        WIDTH - 42.0,
        p99 - 3.0
    );
}

/// Series `i` as a step line, with its legend entry.
fn cdf_line(s: &mut String, i: usize, ser: &Series, x: &Scale, y: &Scale) {
    let color = LINE_COLORS[i % LINE_COLORS.len()];
    let mut d = String::new();
    let mut prev_y = y.at(0.0);
    for (k, (vx, vy)) in cdf_points(ser.sorted, 400).into_iter().enumerate() {
        let px = x.at(vx.max(0.001).log10());
        let py = y.at(vy);
        if k == 0 {
            let _ = write!(d, "M{px:.1},{prev_y:.1}");
        }
        let _ = write!(d, " L{px:.1},{prev_y:.1} L{px:.1},{py:.1}");
        prev_y = py;
    }
    let _ = write!(
        s,
        "<path class=\"cdf-line\" data-series=\"{label}\" d=\"{d}\" stroke=\"{color}\"/>\
         <rect x=\"{lx:.1}\" y=\"{ly:.1}\" width=\"14\" height=\"3\" fill=\"{color}\"/>\
         <text class=\"legend\" x=\"{tx:.1}\" y=\"{ty:.1}\">{label}</text>",
        label = escape(&ser.label),
        lx = 80.0 + (i % 4) as f64 * 270.0,
        ly = 10.0 + (i / 4) as f64 * 16.0,
        tx = 98.0 + (i % 4) as f64 * 270.0,
        ty = 15.0 + (i / 4) as f64 * 16.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacked_pieces_abut_and_add_up() {
        let row = StackRow {
            label: "r".into(),
            by_kind: vec![
                (Kind::Queue, 20_000.0),
                (Kind::Compute, 60_000.0),
                (Kind::Network, 20_000.0),
            ],
        };
        let scale = Scale::new(0.0, 100.0, 200.0, 1200.0);
        let p = stack_pieces(&row, &scale);
        // Kind order is fixed (compute, wait, queue, network); wait is absent.
        assert_eq!(
            p.iter().map(|x| x.0).collect::<Vec<_>>(),
            [Kind::Compute, Kind::Queue, Kind::Network]
        );
        assert_eq!((p[0].1, p[0].2), (200.0, 600.0));
        assert_eq!((p[1].1, p[1].2), (800.0, 200.0));
        assert_eq!(p[2].1 + p[2].2, 1200.0);
    }

    #[test]
    fn cdf_points_are_monotone_and_end_at_one() {
        let v: Vec<u64> = (1..=1000).map(|i| i * 10).collect();
        let p = cdf_points(&v, 100);
        assert!(p.len() <= 101);
        assert_eq!(p[0], (0.01, 0.001));
        assert_eq!(*p.last().unwrap(), (10.0, 1.0));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(cdf_points(&[5], 10), [(0.005, 1.0)]);
    }
}
