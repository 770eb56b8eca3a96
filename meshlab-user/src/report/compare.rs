//! `--compare A B [C...]`: the seed's ladder. p50 of end-to-end and of every segment per run,
//! the step over the first run (absolute and %), and a flag when a step exceeds the noise.
//!
//! Noise of a run, per row: |p50(first half of its requests) - p50(second half)|, halves in
//! file order (time order of the run), so it holds both sampling spread and drift during the
//! run. A step is flagged when |step| > noise(first run) + noise(this run). See docs/report.md.

use std::io::{self, Write};

use serde::Serialize;

use super::aggregate::{Aggregate, SegmentKey, node_label};
use super::table::{Align, Table, us, us_signed};

#[derive(Debug, Serialize)]
pub struct Ladder {
    pub runs: Vec<RunMeta>,
    pub rule: &'static str,
    pub rows: Vec<LadderRow>,
}

pub const NOISE_RULE: &str = "noise = |p50(first half of the run's requests) - p50(second half)|; \
a step is flagged when |step| > noise(first run) + noise(this run)";

#[derive(Debug, Serialize)]
pub struct RunMeta {
    pub label: String,
    pub file: String,
    pub requests: u64,
    pub complete: u64,
}

#[derive(Debug, Serialize)]
pub struct LadderRow {
    /// `end-to-end` or the segment name.
    pub segment: String,
    /// Node, `derived`, or empty for end-to-end.
    pub node: String,
    /// One per run; `None` when the run has no such segment.
    pub cells: Vec<Option<Cell>>,
}

#[derive(Debug, Serialize)]
pub struct Cell {
    pub n: u64,
    pub p50_ns: u64,
    /// None with fewer than two samples.
    pub noise_ns: Option<u64>,
    /// Over the first run (absent in the first run's own cell or when the first run lacks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ns: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_pct: Option<f64>,
    pub flagged: bool,
}

/// Builds the ladder from finished aggregates, `labels[i]` naming `runs[i]`.
pub fn ladder(runs: &[Aggregate], labels: &[String]) -> Ladder {
    let mut order: Vec<SegmentKey> = Vec::new();
    for run in runs {
        let mut previous: Option<&SegmentKey> = None;
        for key in &run.catalog {
            if !order.contains(key) {
                let at = previous
                    .and_then(|p| order.iter().position(|k| k == p))
                    .map_or(if previous.is_some() { order.len() } else { 0 }, |i| i + 1);
                order.insert(at, key.clone());
            }
            previous = Some(key);
        }
    }
    let e2e_cells: Vec<RawCell> = runs
        .iter()
        .map(|r| Some((r.e2e.len() as u64, r.e2e.quantile(500), r.e2e_half_medians)))
        .collect();
    let mut rows = vec![row("end-to-end".into(), String::new(), &e2e_cells)];
    for key in &order {
        let cells: Vec<_> = runs
            .iter()
            .map(|r| {
                r.segments.get(key).filter(|s| !s.is_empty()).map(|s| {
                    (
                        s.len() as u64,
                        s.quantile(500),
                        r.half_medians.get(key).copied(),
                    )
                })
            })
            .collect();
        rows.push(row(key.name.clone(), node_label(key).to_owned(), &cells));
    }
    Ladder {
        runs: runs
            .iter()
            .zip(labels)
            .map(|(r, l)| RunMeta {
                label: l.clone(),
                file: r.file.display().to_string(),
                requests: r.completeness.requests,
                complete: r.completeness.complete,
            })
            .collect(),
        rule: NOISE_RULE,
        rows,
    }
}

/// (samples, p50, half medians) of one run's row, `None` when the run lacks it.
type RawCell = Option<(u64, u64, Option<(u64, u64)>)>;

fn row(segment: String, node: String, raw: &[RawCell]) -> LadderRow {
    let noise = |h: Option<(u64, u64)>| h.map(|(a, b)| a.abs_diff(b));
    let first = raw[0].map(|(_, p50, h)| (p50, noise(h)));
    let cells = raw
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (n, p50, halves) = (*c)?;
            let own_noise = noise(halves);
            let mut cell = Cell {
                n,
                p50_ns: p50,
                noise_ns: own_noise,
                step_ns: None,
                step_pct: None,
                flagged: false,
            };
            if let (true, Some((base, base_noise))) = (i > 0, first) {
                let step = i128::from(p50) - i128::from(base);
                cell.step_ns = Some(step);
                cell.step_pct = (base > 0).then(|| step as f64 * 100.0 / base as f64);
                cell.flagged = match (base_noise, own_noise) {
                    (Some(a), Some(b)) => step.unsigned_abs() > (u128::from(a) + u128::from(b)),
                    _ => false,
                };
            }
            Some(cell)
        })
        .collect();
    LadderRow {
        segment,
        node,
        cells,
    }
}

pub fn write_ladder(l: &Ladder, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "ladder: p50 per run (us); step = over {}; * = moved more than the runs' noise",
        l.runs[0].label
    )?;
    for r in &l.runs {
        writeln!(
            out,
            "  {}: {} ({} requests, {} complete)",
            r.label, r.file, r.requests, r.complete
        )?;
    }
    writeln!(out)?;
    let mut columns: Vec<(String, Align)> = vec![
        ("segment".into(), Align::Left),
        ("node".into(), Align::Left),
    ];
    for (i, r) in l.runs.iter().enumerate() {
        columns.push((r.label.clone(), Align::Right));
        if i > 0 {
            columns.push(("step".into(), Align::Right));
            columns.push(("%".into(), Align::Right));
        }
    }
    let refs: Vec<(&str, Align)> = columns.iter().map(|(h, a)| (h.as_str(), *a)).collect();
    let mut t = Table::new(&refs);
    for row in &l.rows {
        let mut cells = vec![row.segment.clone(), row.node.clone()];
        for (i, c) in row.cells.iter().enumerate() {
            cells.push(c.as_ref().map_or("-".into(), |c| us(c.p50_ns)));
            if i == 0 {
                continue;
            }
            let step = c
                .as_ref()
                .and_then(|c| c.step_ns.map(|s| (s, c.step_pct, c.flagged)));
            let step_text = match (step, c, &row.cells[0]) {
                (Some((s, _, flagged)), _, _) => {
                    format!("{}{}", us_signed(s), if flagged { "*" } else { "" })
                }
                (None, Some(_), _) => "new".into(),
                (None, None, Some(_)) => "gone".into(),
                (None, None, None) => "-".into(),
            };
            cells.push(step_text);
            cells.push(
                step.and_then(|(_, pct, _)| pct)
                    .map_or("-".into(), |p| format!("{p:+.1}%")),
            );
        }
        t.row(cells);
    }
    t.write(out, "  ")?;
    writeln!(out)?;
    writeln!(out, "{}", l.rule)?;
    let noise: Vec<String> = l
        .runs
        .iter()
        .zip(&l.rows[0].cells)
        .map(|(r, c)| {
            format!(
                "{} {}",
                r.label,
                c.as_ref().and_then(|c| c.noise_ns).map_or("n/a".into(), us)
            )
        })
        .collect();
    writeln!(out, "end-to-end noise (us): {}", noise.join(", "))
}
