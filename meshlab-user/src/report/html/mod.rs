//! `--html FILE`: one self-contained page (inline CSS and SVG; no script, no font, no fetch).
//! Charts are hand-built SVG; docs/report.md says why.

pub mod charts;
mod nic;
pub mod svg;
pub mod waterfall;

mod own_cost;
mod page;

use std::fmt::Write as _;

use crate::schema::{Kind, MergedRequest};

use super::aggregate::{Aggregate, node_label};
use super::key::SegmentKey;
use super::nic::NicReport;
use super::summary::RunReport;
use charts::{Series, StackRow};
use svg::escape;

/// The two requests the waterfalls show.
pub struct Representatives<'a> {
    pub median: &'a MergedRequest,
    pub p99: &'a MergedRequest,
}

pub fn render(
    report: &RunReport,
    agg: &Aggregate,
    reps: &Representatives,
    nic: Option<&NicReport>,
) -> String {
    let mut body = String::new();
    page::header(&mut body, report);
    page::kind_legend(&mut body);
    let _ = write!(
        body,
        "<section id=\"by-kind\"><h2>Where the time goes, by kind</h2><div class=\"scroll\">{}</div>\
         <p class=\"note\">Mean time per request in each kind, for all segments and per node; then the median \
         and the p99 request themselves.</p></section>",
        charts::stacked_bars(&stack_rows(report, reps))
    );
    for (id, title, req) in [
        ("waterfall-median", "Median request", reps.median),
        ("waterfall-p99", "p99 request", reps.p99),
    ] {
        let _ = write!(
            body,
            "<section id=\"{id}\"><h2>{title}: {} µs <span class=\"muted\">trace {}{}</span></h2>\
             <div class=\"scroll\">{}</div><p class=\"note\">Node {client}'s bars are at their true times on \
             {client}'s clock. Another node's bars keep their spacing on that node's own clock; their block is \
             centred in {client}'s wait only for display (clocks of different machines are never subtracted). \
             Hatched bars are derived by the difference method and placed for display only.</p></section>",
            super::table::us(req.e2e_ns),
            escape(&req.trace_id),
            match (req.complete, req.missing.is_empty()) {
                (true, _) => String::new(),
                (false, true) => " · incomplete".to_owned(),
                (false, false) =>
                    format!(" · incomplete, missing {}", escape(&req.missing.join(", "))),
            },
            waterfall::svg(req, &req.client_node),
            client = escape(&req.client_node),
        );
    }
    let _ = write!(
        body,
        "<section id=\"cdf-e2e\"><h2>Distribution of end-to-end</h2><div class=\"scroll\">{}</div></section>",
        charts::cdf(
            &[Series {
                label: "end-to-end".into(),
                sorted: agg.e2e.sorted()
            }],
            "CDF of end-to-end"
        )
    );
    tables(&mut body, report, agg, nic);
    page::wrap(&report.file, &body)
}

/// After the waterfalls: the largest segments' CDF, the segment and hop tables, the NIC
/// section (`--nic`), provenance.
fn tables(body: &mut String, report: &RunReport, agg: &Aggregate, nic: Option<&NicReport>) {
    let largest = largest_segments(agg, 5);
    let _ = write!(
        *body,
        "<section id=\"cdf-segments\"><h2>Distribution of the largest segments</h2><div class=\"scroll\">{}</div>\
         <p class=\"note\">The {} segments holding the most time over all requests (largest share).</p></section>",
        charts::cdf(&largest, "CDF of the largest segments"),
        largest.len()
    );
    page::segment_table(body, report);
    page::hop_table(body, report);
    if let Some(nic) = nic {
        body.push_str(&nic::html_section(nic));
    }
    own_cost::section(body, &report.own_cost);
    page::provenance(body, report, agg);
}

/// Time per segment kind, as mean over all requests of the segments on `node` (every node
/// when `None`).
fn mean_by_kind(report: &RunReport, node: Option<&str>) -> Vec<(Kind, f64)> {
    let n = report.e2e.n as f64;
    svg::KINDS
        .iter()
        .map(|&k| {
            let sum: u128 = report
                .segments
                .iter()
                .filter(|s| s.kind == k && node.is_none_or(|n| s.node == n))
                .map(|s| s.stats.sum_ns)
                .sum();
            (k, sum as f64 / n)
        })
        .collect()
}

/// Time per segment kind of one request.
fn request_by_kind(r: &MergedRequest) -> Vec<(Kind, f64)> {
    svg::KINDS
        .iter()
        .map(|&k| {
            let sum = r.segments.iter().filter(|s| s.kind == k);
            (k, sum.map(|s| s.dur_ns as f64).sum())
        })
        .collect()
}

fn stack_rows(report: &RunReport, reps: &Representatives) -> Vec<StackRow> {
    let mut rows = vec![StackRow {
        label: "all nodes (mean)".into(),
        by_kind: mean_by_kind(report, None),
    }];
    // Measured nodes in path order, derived last.
    let mut nodes: Vec<&str> = Vec::new();
    for s in report.segments.iter().filter(|s| !s.derived) {
        if !nodes.contains(&s.node.as_str()) {
            nodes.push(&s.node);
        }
    }
    if report.segments.iter().any(|s| s.derived) {
        nodes.push("derived");
    }
    for node in nodes {
        rows.push(StackRow {
            label: if node == "derived" {
                "derived across nodes (mean)".into()
            } else {
                format!("node {node} (mean)")
            },
            by_kind: mean_by_kind(report, Some(node)),
        });
    }
    rows.push(StackRow {
        label: "median request".into(),
        by_kind: request_by_kind(reps.median),
    });
    rows.push(StackRow {
        label: "p99 request".into(),
        by_kind: request_by_kind(reps.p99),
    });
    rows
}

/// The `count` segments that hold the most time over all requests (largest share of the
/// end-to-end total), with their sorted samples. By total, not by mean, so that a stage seen
/// once (a merged `a+b` after a drop) does not crowd out the stages every request pays.
pub fn largest_segments(agg: &Aggregate, count: usize) -> Vec<Series<'_>> {
    let total = |k: &SegmentKey| -> u128 {
        agg.segments[k]
            .sorted()
            .iter()
            .map(|&v| u128::from(v))
            .sum()
    };
    let mut keys: Vec<&SegmentKey> = agg.catalog.iter().collect();
    keys.sort_by(|a, b| total(b).cmp(&total(a)).then_with(|| a.cmp(b)));
    keys.into_iter()
        .take(count)
        .map(|k| Series {
            label: format!("{} ({})", k.name, node_label(k)),
            sorted: agg.segments[k].sorted(),
        })
        .collect()
}
