//! The page around the charts: header cards, segment table, provenance, CSS.

use std::fmt::Write as _;

use crate::schema::{AttachEntry, AttachStatus};

use super::super::aggregate::Aggregate;
use super::super::quantile::Stats;
use super::super::summary::{DROPS_NOTE, RunReport};
use super::super::table::{percent, us, us_f};
use super::svg::{escape, kind_color};

pub fn header(out: &mut String, r: &RunReport) {
    let c = &r.completeness;
    let drops: u64 = r.kernel_drops.values().sum();
    let _ = write!(
        out,
        "<header><h1>meshlab report</h1><p class=\"muted\">{} · {} requests · meshlab {}</p></header>\
         <section class=\"cards\" id=\"summary\">",
        escape(&r.file),
        c.requests,
        env!("CARGO_PKG_VERSION")
    );
    for (label, value) in [
        ("end-to-end p50", format!("{} µs", us(r.e2e.p50_ns))),
        ("p90", format!("{} µs", us(r.e2e.p90_ns))),
        ("p99", format!("{} µs", us(r.e2e.p99_ns))),
        ("mean", format!("{} µs", us_f(r.e2e.mean_ns))),
        ("complete", format!("{} / {}", c.complete, c.requests)),
        (
            "kernel drops",
            if r.kernel_drops.is_empty() {
                "unknown".into()
            } else {
                drops.to_string()
            },
        ),
    ] {
        let _ = write!(
            out,
            "<div class=\"card\"><div class=\"label\">{label}</div><div class=\"value\">{value}</div></div>"
        );
    }
    out.push_str(
        "</section><nav class=\"toc\"><a href=\"#by-kind\">by kind</a><a href=\"#waterfall-median\">median \
         request</a><a href=\"#waterfall-p99\">p99 request</a><a href=\"#cdf-e2e\">distributions</a>\
         <a href=\"#segments\">segment table</a><a href=\"#own-cost\">meshlab's own cost</a><a href=\"#provenance\">provenance</a></nav>",
    );
}

/// Colour key for the waterfalls (the stacked bars carry their own).
pub fn kind_legend(out: &mut String) {
    out.push_str("<p class=\"legend-row\" id=\"kinds\">");
    for k in super::svg::KINDS {
        let _ = write!(
            out,
            "<span><span class=\"swatch\" style=\"background:{}\"></span>{}</span>",
            kind_color(k),
            k.as_str()
        );
    }
    out.push_str(
        "<span><span class=\"swatch hatched\"></span>derived across nodes (difference method)</span></p>",
    );
}

pub fn segment_table(out: &mut String, r: &RunReport) {
    out.push_str(
        "<section id=\"segments\"><h2>Segments in path order</h2><table class=\"num\"><thead><tr><th>node</th>\
         <th>layer</th><th>unit</th><th>kind</th><th>segment</th><th>n</th><th>p50 µs</th><th>p90 µs</th>\
         <th>p99 µs</th><th>mean µs</th><th>share</th><th>clock err ≤ µs</th></tr></thead><tbody>",
    );
    for s in &r.segments {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td>\
             <td>{}{}</td>",
            escape(&s.node),
            s.layer.as_str(),
            escape(&s.unit),
            kind_color(s.kind),
            s.kind.as_str(),
            escape(&s.name),
            if s.derived { " <em>(derived)</em>" } else { "" },
        );
        stat_cells(out, &s.stats, s.share);
        let _ = write!(
            out,
            "<td>{}</td></tr>",
            s.max_error_ns
                .map_or(String::new(), |e| format!("±{}", us(e)))
        );
    }
    let _ = write!(
        out,
        "</tbody></table><p class=\"note\">Quantiles: {}. Share: the segment's time over all end-to-end time. Clock err: the largest bound on the error of converting a userland timestamp to the node's monotonic clock.</p></section>",
        r.quantile_method
    );
}

/// The cells under the n, p50 µs, p90 µs, p99 µs, mean µs and share headers of the segment and
/// hop tables.
fn stat_cells(out: &mut String, stats: &Stats, share: f64) {
    let _ = write!(
        out,
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
        stats.n,
        us(stats.p50_ns),
        us(stats.p90_ns),
        us(stats.p99_ns),
        us_f(stats.mean_ns),
        percent(share)
    );
}

/// Each process on the path and each leg between two of them (report/hops.rs).
pub fn hop_table(out: &mut String, r: &RunReport) {
    out.push_str(
        "<section id=\"hops\"><h2>By hop</h2><table class=\"num\"><thead><tr><th>hop</th><th>kind</th>\
         <th>n</th><th>p50 µs</th><th>p90 µs</th><th>p99 µs</th><th>mean µs</th><th>share</th>\
         <th>stages</th></tr></thead><tbody>",
    );
    for h in &r.by_hop {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td>",
            escape(&h.hop),
            h.kind.as_str()
        );
        stat_cells(out, &h.stats, h.share);
        let _ = write!(out, "<td>{}</td></tr>", escape(&h.stages.join(", ")));
    }
    out.push_str(
        "</tbody></table><p class=\"note\">The path cut at its processes, per request: a process's time \
         is all its process segments (a proxy's request and response relays together); a leg is the kernel \
         and network segments between two processes, one per direction (unix when all are uds_*).</p></section>",
    );
}

pub fn provenance(out: &mut String, r: &RunReport, agg: &Aggregate) {
    out.push_str("<section id=\"provenance\"><h2>Provenance</h2><dl>");
    merge_info_items(out, agg);
    let c = &r.completeness;
    let joins: Vec<String> = c.joins.iter().map(|(j, n)| format!("{j} {n}")).collect();
    item(
        out,
        "requests",
        format!(
            "{} ({} complete, {} incomplete); joins: {}",
            c.requests,
            c.complete,
            c.incomplete,
            joins.join(", ")
        ),
    );
    let missing: Vec<String> = c
        .missing
        .iter()
        .map(|(s, n)| format!("{} {n}", escape(s)))
        .collect();
    item(out, "missing stages", or_none(missing, "none"));
    let drops: Vec<String> = r
        .kernel_drops
        .iter()
        .map(|(n, &d)| format!("{} {}", escape(n), r.dropped_figure(n, d)))
        .collect();
    let mut drops = or_none(drops, "unknown (no merge_summary)");
    if r.has_drops() {
        drops = format!("{drops}: {DROPS_NOTE}");
    }
    item(out, "kernel drops", drops);
    item(out, "merge errors", merge_errors(&r.merge_errors));
    item(out, "sums ≠ end-to-end", c.sum_mismatch.to_string());
    out.push_str("</dl>");
    nodes(out, r);
    out.push_str("</section>");
}

fn item(out: &mut String, k: &str, v: String) {
    let _ = write!(out, "<dt>{k}</dt><dd>{v}</dd>");
}

/// The list joined by `, `, or `none` when empty.
fn or_none(list: Vec<String>, none: &str) -> String {
    if list.is_empty() {
        none.into()
    } else {
        list.join(", ")
    }
}

/// The merge command, its inputs and injected skew, from the merge_info record.
fn merge_info_items(out: &mut String, agg: &Aggregate) {
    let Some(info) = &agg.info else {
        item(
            out,
            "merge command",
            "unknown: the file has no merge_info record".into(),
        );
        return;
    };
    item(
        out,
        "merge command",
        format!("<code>{}</code>", escape(&info.command.join(" "))),
    );
    let inputs: Vec<String> = info
        .inputs
        .iter()
        .map(|i| {
            format!(
                "{} ({}, {})",
                escape(&i.file),
                escape(&i.node),
                i.kind.as_str()
            )
        })
        .collect();
    item(out, "inputs", inputs.join("<br>"));
    let skew: Vec<String> = info
        .injected_skew_ns
        .iter()
        .map(|(n, s)| format!("{} {s} ns", escape(n)))
        .collect();
    item(out, "injected skew", or_none(skew, "none"));
}

fn merge_errors(errors: &[String]) -> String {
    if errors.is_empty() {
        return "none".into();
    }
    // A broken run can have thousands; the first ones show the pattern.
    let shown: Vec<String> = errors
        .iter()
        .take(10)
        .map(|e| format!("<li>{}</li>", escape(e)))
        .collect();
    format!(
        "{} (first {} below; all in the merged file's merge_summary)<ul class=\"errors\">{}</ul>",
        errors.len(),
        shown.len(),
        shown.concat()
    )
}

fn nodes(out: &mut String, r: &RunReport) {
    if r.nodes.is_empty() {
        return;
    }
    out.push_str("<h3>Nodes</h3><table><thead><tr><th>node</th><th>host</th><th>kernel</th><th>sampling</th><th>record command</th></tr></thead><tbody>");
    for n in &r.nodes {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>1 connection in {}</td><td><code>{}</code></td></tr>",
            escape(&n.node),
            escape(&n.hostname),
            escape(&n.kernel),
            n.sample_every,
            escape(&n.command.join(" "))
        );
    }
    out.push_str("</tbody></table>");
    attach_plan(out, r);
    attach_failures(out, r);
}

/// One row per hook, one column per node: the tiers tried, in order.
fn attach_plan(out: &mut String, r: &RunReport) {
    out.push_str(
        "<h3 id=\"attach-plan\">Attach plan (tier per hook)</h3><table><thead><tr><th>hook</th>",
    );
    for n in &r.nodes {
        let _ = write!(out, "<th>{}</th>", escape(&n.node));
    }
    out.push_str("</tr></thead><tbody>");
    let mut hooks: Vec<&str> = Vec::new();
    for n in &r.nodes {
        for e in &n.attach_plan {
            if !hooks.contains(&e.hook.as_str()) {
                hooks.push(&e.hook);
            }
        }
    }
    if hooks.is_empty() {
        out.push_str("<tr><td colspan=\"99\" class=\"muted\">none recorded in the nodes' startup records</td></tr>");
    }
    for hook in hooks {
        let _ = write!(out, "<tr><td>{}</td>", escape(hook));
        for n in &r.nodes {
            let cells: Vec<String> = n
                .attach_plan
                .iter()
                .filter(|e| e.hook == hook)
                .map(attach_cell)
                .collect();
            let cell = if cells.is_empty() {
                "-".into()
            } else {
                cells.join(" → ")
            };
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

fn attach_cell(e: &AttachEntry) -> String {
    match e.status {
        AttachStatus::Attached => format!("<span class=\"ok\">{}</span>", escape(e.tier.as_str())),
        AttachStatus::OnDemand => format!(
            "<span class=\"ok\" title=\"attached while a connection is traced\">{} on demand</span>",
            escape(e.tier.as_str())
        ),
        AttachStatus::Failed => format!(
            "<span class=\"failed\" title=\"{}\">{} failed</span>",
            escape(e.error.as_deref().unwrap_or("")),
            escape(e.tier.as_str())
        ),
        AttachStatus::Skipped => {
            format!(
                "<span class=\"muted\">{} skipped</span>",
                escape(e.tier.as_str())
            )
        }
    }
}

/// Every failed tier with the kernel's reason.
fn attach_failures(out: &mut String, r: &RunReport) {
    let failures: Vec<String> = r
        .nodes
        .iter()
        .flat_map(|n| {
            n.attach_plan
                .iter()
                .filter(|e| e.status == AttachStatus::Failed)
                .map(move |e| {
                    format!(
                        "<li>{} {} ({}): {}</li>",
                        escape(&n.node),
                        escape(&e.hook),
                        escape(e.tier.as_str()),
                        escape(e.error.as_deref().unwrap_or("no reason given"))
                    )
                })
        })
        .collect();
    if !failures.is_empty() {
        let _ = write!(
            out,
            "<ul class=\"note failures\">{}</ul>",
            failures.concat()
        );
    }
}

const CSS: &str = "
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--band0:#f8fafc;--band1:#eef2f7}
*{box-sizing:border-box}
body{margin:0;padding:24px 32px;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;color:var(--fg);background:#fff}
h1{font-size:24px;margin:0 0 2px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:15px;margin:18px 0 6px}
.muted{color:var(--muted);font-weight:normal;font-size:13px}
.note{color:var(--muted);font-size:12.5px;max-width:1240px;margin:4px 0}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-top:14px}
.card{border:1px solid var(--line);border-radius:8px;padding:8px 14px;min-width:140px}
.card .label{color:var(--muted);font-size:12px}.card .value{font-size:19px;font-weight:600}
.scroll{overflow-x:auto}
svg.chart{display:block;font-size:11.5px}
svg .grid{stroke:#e5e7eb;stroke-width:1}
svg .tick,svg .axis-label{fill:#6b7280}
svg .band0{fill:var(--band0)}svg .band1{fill:var(--band1)}
svg .band-title{font-weight:600;fill:#374151}
svg .row-label{fill:#374151}
svg .bar-label{fill:#374151;font-size:11px;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg .in-bar{fill:#fff;font-weight:600}
svg .legend{fill:#374151}
svg .cdf-line{fill:none;stroke-width:2}
svg .e2e-mark{stroke:#111827;stroke-dasharray:4 3}
svg .e2e-label{fill:#111827;font-weight:600}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:3px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f9fafb;font-weight:600}
table.num td:nth-child(n+6){text-align:right;font-variant-numeric:tabular-nums}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.swatch.hatched{background:repeating-linear-gradient(45deg,#54a24b 0 3px,#cfe6cb 3px 6px)}
.toc{display:flex;gap:16px;margin:12px 0 0;font-size:13px}.toc a{color:#1d4ed8;text-decoration:none}
.legend-row{display:flex;gap:18px;margin:14px 0 0;font-size:13px;color:#374151}
dl{display:grid;grid-template-columns:170px 1fr;gap:4px 14px;margin:0}dt{color:var(--muted)}dd{margin:0}
code{font-size:12.5px;background:#f3f4f6;padding:1px 4px;border-radius:3px}
.errors{font-size:12px;color:#7f1d1d;margin:4px 0;padding-left:18px;word-break:break-all}
.ok{color:#166534}.failed{color:#b91c1c;font-weight:600}
";

pub fn wrap(file: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>meshlab report — {}</title><style>{CSS}</style></head><body>{body}</body></html>\n",
        escape(file)
    )
}
