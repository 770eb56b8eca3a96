//! `--compare A B [C...]`: the seed's ladder. p50 of end-to-end and of every segment per run,
//! the step over the first run (absolute and %), and a flag when a step exceeds the noise.
//!
//! Noise: each run's p50 gets a standard error from batch medians (8 consecutive blocks of its
//! requests in file order; see `Samples::median_standard_error`), which holds both sampling
//! spread and drift during the run. A step is flagged when
//! |step| > 3 * sqrt(se(first run)^2 + se(this run)^2). See docs/report.md for why.

use std::io::{self, Write};

use serde::Serialize;

use super::aggregate::{Aggregate, node_label};
use super::key::SegmentKey;
use super::order::PathOrder;
use super::summary::DROPS_NOTE;
use super::table::{Align, Table, step_pct, step_us, us, us_f};

/// Standard errors a step must exceed to be flagged.
pub const Z: f64 = 3.0;

pub const NOISE_RULE: &str = "noise: se = standard error of a run's p50 from the p50s of 8 consecutive blocks \
of its requests (sd / sqrt(8)); * = |step| > 3 * sqrt(se(first)^2 + se(this)^2); runs under 4 requests are never flagged";

#[derive(Debug, Serialize)]
pub struct Ladder {
    pub runs: Vec<RunMeta>,
    pub rule: &'static str,
    pub rows: Vec<LadderRow>,
}

#[derive(Debug, Serialize)]
pub struct RunMeta {
    pub label: String,
    pub file: String,
    pub requests: u64,
    pub complete: u64,
    /// Kernel events the run's recordings dropped, all nodes (`None`: no merge_summary).
    pub kernel_drops: Option<u64>,
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
    /// Standard error of the p50 (batch medians); None with fewer than 4 samples.
    pub p50_se_ns: Option<f64>,
    /// Over the first run (absent in the first run's own cell or when the first run lacks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ns: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_pct: Option<f64>,
    /// The |step| above which the step is flagged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_ns: Option<f64>,
    pub flagged: bool,
}

/// (samples, p50, standard error of the p50) of one run's row; `None` when the run lacks it.
type RawCell = Option<(u64, u64, Option<f64>)>;

/// Builds the ladder from finished aggregates, `labels[i]` naming `runs[i]`.
pub fn ladder(runs: &[Aggregate], labels: &[String]) -> Ladder {
    let mut path = PathOrder::default();
    for run in runs {
        path.merge(&run.order);
    }
    let order: Vec<SegmentKey> = path.sorted();
    let e2e: Vec<RawCell> = runs
        .iter()
        .map(|r| Some((r.e2e.len() as u64, r.e2e.quantile(500), r.e2e_median_se)))
        .collect();
    let mut rows = vec![row("end-to-end".into(), String::new(), &e2e)];
    for key in &order {
        let cells: Vec<RawCell> = runs
            .iter()
            .map(|r| {
                r.segments.get(key).filter(|s| !s.is_empty()).map(|s| {
                    (
                        s.len() as u64,
                        s.quantile(500),
                        r.median_se.get(key).copied(),
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
                kernel_drops: (r.summary.as_ref())
                    .map(|s| s.dropped_per_node.values().sum::<u64>()),
            })
            .collect(),
        rule: NOISE_RULE,
        rows,
    }
}

fn row(segment: String, node: String, raw: &[RawCell]) -> LadderRow {
    let first = raw[0].map(|(_, p50, se)| (p50, se));
    let cells = raw
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (n, p50, se) = (*c)?;
            let mut cell = Cell {
                n,
                p50_ns: p50,
                p50_se_ns: se,
                step_ns: None,
                step_pct: None,
                threshold_ns: None,
                flagged: false,
            };
            if let (true, Some((base, base_se))) = (i > 0, first) {
                let step = i128::from(p50) - i128::from(base);
                cell.step_ns = Some(step);
                cell.step_pct = (base > 0).then(|| step as f64 * 100.0 / base as f64);
                if let (Some(a), Some(b)) = (base_se, se) {
                    let threshold = Z * (a * a + b * b).sqrt();
                    cell.threshold_ns = Some(threshold);
                    cell.flagged = step.unsigned_abs() as f64 > threshold;
                }
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

/// One ladder row: segment, node, then per run its p50 and (after the first run) the step
/// over the first run, absolute and in percent.
fn ladder_cells(row: &LadderRow) -> Vec<String> {
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
            (Some((s, _, flagged)), _, _) => step_us(s, flagged),
            (None, Some(_), _) => "new".into(),
            (None, None, Some(_)) => "gone".into(),
            (None, None, None) => "-".into(),
        };
        cells.push(step_text);
        cells.push(
            step.and_then(|(_, pct, _)| pct)
                .map_or("-".into(), step_pct),
        );
    }
    cells
}

pub fn write_ladder(l: &Ladder, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "ladder: p50 per run (us); step = over {}; * = moved more than the runs' noise",
        l.runs[0].label
    )?;
    for r in &l.runs {
        let drops = r.kernel_drops.map_or("unknown".into(), |d| d.to_string());
        writeln!(
            out,
            "  {}: {} ({} requests, {} complete, kernel drops {drops})",
            r.label, r.file, r.requests, r.complete
        )?;
    }
    if l.runs.iter().any(|r| r.kernel_drops.is_some_and(|d| d > 0)) {
        writeln!(
            out,
            "  runs with kernel drops ({DROPS_NOTE}) may compare different shares of their requests"
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
        t.row(ladder_cells(row));
    }
    t.write(out, "  ")?;
    writeln!(out)?;
    writeln!(out, "{}", l.rule)?;
    let noise: Vec<String> = l
        .runs
        .iter()
        .zip(&l.rows[0].cells)
        .map(|(r, c)| {
            let se = c.as_ref().and_then(|c| c.p50_se_ns);
            format!("{} {}", r.label, se.map_or("n/a".into(), us_f))
        })
        .collect();
    writeln!(out, "end-to-end p50 se (us): {}", noise.join(", "))
}
