//! Waterfall of one request: a band per node (each on its own clock), one row per segment,
//! bars coloured by kind; derived segments hatched in their own band. Positions come from
//! layout.rs, which is where the display-only placements are decided and documented.

use std::fmt::Write as _;

use crate::schema::MergedRequest;

use super::super::layout::{DERIVED_LANE, Placed, lanes, place};
use super::super::table::us;
use super::svg::{Scale, defs, escape, kind_color, nice_ticks, x_axis};

pub const WIDTH: f64 = 1240.0;
pub const LABEL_W: f64 = 210.0;
pub const RIGHT_PAD: f64 = 110.0;
pub const ROW_H: f64 = 17.0;
pub const BAND_HEAD: f64 = 22.0;
const TOP: f64 = 8.0;

/// One bar as drawn: row number within the chart, pixel x and width.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub row: usize,
    pub x: f64,
    pub w: f64,
    pub placed: Placed,
}

/// Row layout: the lanes with their segment rows, and every bar's pixel geometry.
pub struct Geometry {
    pub scale: Scale,
    /// (lane, y of its band top, segment indices shown as rows in order)
    pub bands: Vec<(String, f64, Vec<usize>)>,
    pub bars: Vec<Bar>,
    pub height: f64,
}

pub fn geometry(req: &MergedRequest) -> Geometry {
    let placed = place(req);
    let x_max = placed
        .iter()
        .map(|p| p.x1)
        .max()
        .unwrap_or(0)
        .max(i128::from(req.e2e_ns));
    let x_min = placed.iter().map(|p| p.x0).min().unwrap_or(0).min(0);
    let scale = Scale::new(
        x_min as f64 / 1000.0,
        x_max as f64 / 1000.0,
        LABEL_W,
        WIDTH - RIGHT_PAD,
    );
    let mut bands = Vec::new();
    let mut bars = Vec::new();
    let mut y = TOP;
    let mut row = 0;
    for lane in lanes(req) {
        let mut rows: Vec<usize> = Vec::new();
        for p in placed.iter().filter(|p| p.lane == lane) {
            if !rows.contains(&p.segment) {
                rows.push(p.segment);
            }
        }
        for p in placed.iter().filter(|p| p.lane == lane) {
            let r = row + rows.iter().position(|&s| s == p.segment).expect("listed");
            let x = scale.at(p.x0 as f64 / 1000.0);
            let w = (scale.at(p.x1 as f64 / 1000.0) - x).max(1.0);
            bars.push(Bar {
                row: r,
                x,
                w,
                placed: p.clone(),
            });
        }
        bands.push((lane, y, rows.clone()));
        y += BAND_HEAD + rows.len() as f64 * ROW_H + 6.0;
        row += rows.len();
    }
    Geometry {
        scale,
        bands,
        bars,
        height: y + 40.0,
    }
}

/// y of a row's bar top, given the bands.
fn row_y(g: &Geometry, row: usize) -> f64 {
    let mut first = 0;
    for (_, top, rows) in &g.bands {
        if row < first + rows.len() {
            return top + BAND_HEAD + (row - first) as f64 * ROW_H;
        }
        first += rows.len();
    }
    unreachable!("row {row} outside every band")
}

pub fn svg(req: &MergedRequest, client_first_note: &str) -> String {
    let g = geometry(req);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"chart waterfall\" viewBox=\"0 0 {WIDTH} {h:.0}\" width=\"{WIDTH}\" height=\"{h:.0}\" \
         xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"waterfall of request {id}\">{defs}",
        h = g.height,
        id = escape(&req.trace_id),
        defs = defs()
    );
    let plot_bottom = g.height - 40.0;
    let (ticks, _) = nice_ticks(g.scale.d1, 10);
    let ticks: Vec<f64> = ticks
        .into_iter()
        .filter(|t| *t >= g.scale.d0 && *t <= g.scale.d1)
        .collect();
    x_axis(
        &mut s,
        &g.scale,
        &ticks,
        TOP,
        plot_bottom,
        "µs after the request's start on the client's clock",
    );
    for (i, (lane, top, rows)) in g.bands.iter().enumerate() {
        let h = BAND_HEAD + rows.len() as f64 * ROW_H;
        let title = if lane == DERIVED_LANE {
            "derived across nodes (difference method) · placed for display only".to_owned()
        } else if *lane == req.client_node {
            format!("node {lane} · client · own clock, exact positions")
        } else {
            format!(
                "node {lane} · own clock · block centred in {client_first_note}'s wait for display"
            )
        };
        let _ = write!(
            s,
            "<rect class=\"band band{}\" x=\"0\" y=\"{top:.1}\" width=\"{WIDTH}\" height=\"{h:.1}\"/>\
             <text class=\"band-title\" x=\"6\" y=\"{:.1}\">{}</text>",
            i % 2,
            top + 15.0,
            escape(&title)
        );
        for (k, &seg) in rows.iter().enumerate() {
            let y = top + BAND_HEAD + k as f64 * ROW_H;
            let _ = write!(
                s,
                "<text class=\"row-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LABEL_W - 8.0,
                y + 12.0,
                escape(&req.segments[seg].name)
            );
        }
    }
    // The end-to-end mark goes under the bars and their labels.
    let end = g.scale.at(req.e2e_ns as f64 / 1000.0);
    let _ = write!(
        s,
        "<line class=\"e2e-mark\" x1=\"{end:.1}\" y1=\"{TOP}\" x2=\"{end:.1}\" y2=\"{plot_bottom:.1}\"/>\
         <text class=\"e2e-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">end-to-end {} µs</text>",
        end - 4.0,
        TOP + 15.0,
        us(req.e2e_ns)
    );
    let mut labelled = Vec::new();
    for bar in &g.bars {
        let seg = &req.segments[bar.placed.segment];
        let y = row_y(&g, bar.row);
        let kind = seg.kind.as_str();
        let fill = if seg.derived.is_some() {
            format!("url(#hatch-{kind})")
        } else {
            kind_color(seg.kind).to_owned()
        };
        let how = if seg.derived.is_some() {
            " (derived, display placement)"
        } else if !bar.placed.exact {
            " (own clock, display placement)"
        } else {
            ""
        };
        let _ = write!(
            s,
            "<rect class=\"bar {kind}\" data-segment=\"{name}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" \
             fill=\"{fill}\"><title>{name}: {} µs, {kind}{how}</title></rect>",
            bar.x,
            y + 2.0,
            bar.w,
            ROW_H - 4.0,
            us(seg.dur_ns),
            name = escape(&seg.name),
        );
        // Duration label after the row's last bar.
        let last = g
            .bars
            .iter()
            .filter(|b| b.row == bar.row)
            .map(|b| b.x + b.w)
            .fold(0.0, f64::max);
        if !labelled.contains(&bar.row) {
            labelled.push(bar.row);
            let text = if seg.derived.is_some() {
                format!("{} µs derived", us(seg.dur_ns))
            } else {
                format!("{} µs", us(seg.dur_ns))
            };
            let _ = write!(
                s,
                "<text class=\"bar-label\" x=\"{:.1}\" y=\"{:.1}\">{text}</text>",
                last + 4.0,
                y + 12.0
            );
        }
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_bands_and_pixels() {
        // A: [0,10) and [130,140) us after start; B: 60 us on its own clock; rtt 60 us (Σ = 140).
        let seg = |name: &str, node: &str, start: u64, dur: u64| {
            json!({"name": name, "node": node, "layer": "kernel", "unit": "u", "kind": "compute",
                   "start_ns": start, "dur_ns": dur})
        };
        let req: MergedRequest = serde_json::from_value(json!({
            "trace_id": "t", "client_node": "A", "join": "offset", "start_ns": 1_000_000,
            "e2e_ns": 140_000, "complete": true, "missing": [],
            "segments": [
                seg("a1", "A", 1_000_000, 10_000),
                {"name": "rtt", "layer": "network", "unit": "wire", "kind": "network", "dur_ns": 60_000,
                 "derived": {"method": "difference", "outer_node": "A", "outer": [], "inner_node": "B", "inner": []}},
                seg("b1", "B", 9_000_000, 60_000),
                seg("a2", "A", 1_130_000, 10_000),
            ]
        }))
        .unwrap();
        let g = geometry(&req);
        let bands: Vec<(&str, usize)> = g
            .bands
            .iter()
            .map(|(l, _, r)| (l.as_str(), r.len()))
            .collect();
        assert_eq!(bands, [("A", 2), ("B", 1), ("derived", 1)]);
        // Band tops: each band is its header plus its rows plus a 6 px gap.
        assert_eq!(g.bands[1].1, TOP + BAND_HEAD + 2.0 * ROW_H + 6.0);
        // 140 us over the plot width: 1 us = (WIDTH - RIGHT_PAD - LABEL_W) / 140 px.
        let px = (WIDTH - RIGHT_PAD - LABEL_W) / 140.0;
        let bar = |name: &str| -> Vec<(usize, f64, f64)> {
            g.bars
                .iter()
                .filter(|b| req.segments[b.placed.segment].name == name)
                .map(|b| {
                    (
                        b.row,
                        ((b.x - LABEL_W) / px * 1000.0).round() / 1000.0,
                        (b.w / px * 1000.0).round() / 1000.0,
                    )
                })
                .collect()
        };
        assert_eq!(bar("a1"), [(0, 0.0, 10.0)]);
        assert_eq!(bar("a2"), [(1, 130.0, 10.0)]);
        // B's 60 us centred in A's 120 us wait: 30 us after a1 ends.
        assert_eq!(bar("b1"), [(2, 40.0, 60.0)]);
        assert_eq!(bar("rtt"), [(3, 10.0, 30.0), (3, 100.0, 30.0)]);
        let svg = svg(&req, "A");
        assert_eq!(svg.matches("<rect class=\"bar ").count(), 5);
        assert!(svg.contains("url(#hatch-network)"));
    }
}
