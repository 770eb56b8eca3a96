//! The terminal report of one run.

use std::collections::BTreeSet;
use std::io::{self, Write};

use crate::schema::AttachStatus;

use super::hops::HopRow;
use super::quantile::Stats;
use super::summary::{DROPS_NOTE, GroupRow, RunReport};
use super::table::{Align, Table, percent, us, us_f};

/// The figures of a row of the segment, group and hop tables (us; `share` of all end-to-end
/// time), in the order of [`stat_cells`].
const STAT_COLUMNS: [(&str, Align); 6] = [
    ("n", Align::Right),
    ("p50", Align::Right),
    ("p90", Align::Right),
    ("p99", Align::Right),
    ("mean", Align::Right),
    ("share", Align::Right),
];

/// `stats` and `share` as the cells of [`STAT_COLUMNS`].
fn stat_cells(stats: &Stats, share: f64) -> [String; 6] {
    [
        stats.n.to_string(),
        us(stats.p50_ns),
        us(stats.p90_ns),
        us(stats.p99_ns),
        us_f(stats.mean_ns),
        percent(share),
    ]
}

pub fn write_run(r: &RunReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "meshlab report: {}", r.file)?;
    write_completeness(r, out)?;
    write_nodes(r, out)?;
    writeln!(out)?;
    writeln!(
        out,
        "end-to-end (us): n {}  p50 {}  p90 {}  p99 {}  mean {}",
        r.e2e.n,
        us(r.e2e.p50_ns),
        us(r.e2e.p90_ns),
        us(r.e2e.p99_ns),
        us_f(r.e2e.mean_ns)
    )?;
    write_segments(r, out)?;
    write_groups(out, "by node", &r.by_node)?;
    write_groups(out, "by node / layer / unit", &r.by_unit)?;
    write_groups(out, "by kind", &r.by_kind)?;
    write_hops(out, &r.by_hop)?;
    super::own_cost_text::write_own_cost(&r.own_cost, out)?;
    writeln!(out)?;
    writeln!(out, "quantiles: {}", r.quantile_method)
}

/// The segment table in path order, its share total, and the clock-conversion error bounds.
fn write_segments(r: &RunReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "segments in path order (us; n = requests with the segment; share = its time / all end-to-end time)"
    )?;
    let mut columns = vec![
        ("node", Align::Left),
        ("layer", Align::Left),
        ("unit", Align::Left),
        ("kind", Align::Left),
        ("segment", Align::Left),
    ];
    columns.extend(STAT_COLUMNS);
    let mut t = Table::new(&columns);
    for s in &r.segments {
        let name = if s.derived {
            format!("{} (derived)", s.name)
        } else {
            s.name.clone()
        };
        let mut row = vec![
            s.node.clone(),
            s.layer.as_str().into(),
            s.unit.clone(),
            s.kind.as_str().into(),
            name,
        ];
        row.extend(stat_cells(&s.stats, s.share));
        t.row(row);
    }
    t.write(out, "  ")?;
    let total: f64 = r.segments.iter().map(|s| s.share).sum();
    writeln!(out, "  shares add up to {}", percent(total))?;
    write_error_bounds(r, out)
}

/// The largest clock-conversion error seen per segment that has one.
fn write_error_bounds(r: &RunReport, out: &mut dyn Write) -> io::Result<()> {
    let bounded: Vec<String> = r
        .segments
        .iter()
        .filter_map(|s| {
            s.max_error_ns
                .map(|e| format!("{}@{} ±{}", s.name, s.node, us(e)))
        })
        .collect();
    if !bounded.is_empty() {
        writeln!(
            out,
            "  clock-conversion error bounds (us, largest seen; userland clock to kernel monotonic):"
        )?;
        for line in wrap(&bounded, 96) {
            writeln!(out, "    {line}")?;
        }
    }
    Ok(())
}

fn write_groups(out: &mut dyn Write, title: &str, rows: &[GroupRow]) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "{title} (us; per request, the sum of its segments in the group)"
    )?;
    let mut columns = vec![("group", Align::Left)];
    columns.extend(STAT_COLUMNS);
    let mut t = Table::new(&columns);
    for g in rows {
        let mut row = vec![g.group.clone()];
        row.extend(stat_cells(&g.stats, g.share));
        t.row(row);
    }
    t.write(out, "  ")
}

/// Each process's time and each leg's stages, in path order (report/hops.rs).
fn write_hops(out: &mut dyn Write, rows: &[HopRow]) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "by hop (us; per request, in path order: each process's time, and each leg between two \
         processes with its kernel and network stages)"
    )?;
    let mut columns = vec![("hop", Align::Left), ("kind", Align::Left)];
    columns.extend(STAT_COLUMNS);
    columns.push(("stages", Align::Left));
    let mut t = Table::new(&columns);
    for h in rows {
        let mut row = vec![h.hop.clone(), h.kind.as_str().into()];
        row.extend(stat_cells(&h.stats, h.share));
        row.push(h.stages.join(", "));
        t.row(row);
    }
    t.write(out, "  ")
}

fn write_completeness(r: &RunReport, out: &mut dyn Write) -> io::Result<()> {
    let c = &r.completeness;
    let joins: Vec<String> = c.joins.iter().map(|(j, n)| format!("{j} {n}")).collect();
    writeln!(
        out,
        "requests: {}  complete: {}  incomplete: {}  joins: {}",
        c.requests,
        c.complete,
        c.incomplete,
        joins.join(", ")
    )?;
    // Most frequent first: that is where to look.
    let mut by_count: Vec<(&String, &u64)> = c.missing.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let missing: Vec<String> = by_count.iter().map(|(s, n)| format!("{s} {n}")).collect();
    if missing.is_empty() {
        writeln!(out, "missing stages (requests): none")?;
    } else {
        writeln!(out, "missing stages (requests):")?;
        for line in wrap(&missing, 96) {
            writeln!(out, "  {line}")?;
        }
    }
    let drops: Vec<String> = r
        .kernel_drops
        .iter()
        .map(|(n, &d)| format!("{n} {}", r.dropped_figure(n, d)))
        .collect();
    writeln!(
        out,
        "kernel drops per node: {}",
        if drops.is_empty() {
            "unknown (no merge_summary)".into()
        } else {
            drops.join(", ")
        }
    )?;
    if r.has_drops() {
        writeln!(out, "  {DROPS_NOTE}")?;
    }
    writeln!(
        out,
        "merge errors: {}  requests whose segments do not sum to end-to-end: {}",
        r.merge_errors.len(),
        c.sum_mismatch
    )?;
    for e in r.merge_errors.iter().take(SHOWN_ERRORS) {
        writeln!(out, "  error: {e}")?;
    }
    if r.merge_errors.len() > SHOWN_ERRORS {
        writeln!(
            out,
            "  ... and {} more (all of them in --json and in the merged file's merge_summary)",
            r.merge_errors.len() - SHOWN_ERRORS
        )?;
    }
    Ok(())
}

/// Merge errors printed in full; a broken run can have thousands.
const SHOWN_ERRORS: usize = 5;

/// Joins items with ", " into lines of at most `width` characters (longer items stand alone).
fn wrap(items: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for item in items {
        match lines.last_mut() {
            Some(line) if line.len() + 2 + item.len() <= width => {
                line.push_str(", ");
                line.push_str(item);
            }
            _ => lines.push(item.clone()),
        }
    }
    lines
}

/// Kernel, sampling and command per node, then the attach plan as a hook x node matrix of tiers.
fn write_nodes(r: &RunReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    if r.nodes.is_empty() {
        return writeln!(out, "nodes: unknown (no merge_info record)");
    }
    writeln!(out, "nodes")?;
    let mut t = Table::new(&[
        ("node", Align::Left),
        ("kernel", Align::Left),
        ("sampling", Align::Left),
        ("skew injected", Align::Right),
        ("command", Align::Left),
    ]);
    for n in &r.nodes {
        t.row(vec![
            n.node.clone(),
            n.kernel.clone(),
            format!("1/{}", n.sample_every),
            format!("{} ns", n.injected_skew_ns),
            n.command.join(" "),
        ]);
    }
    t.write(out, "  ")?;
    write_attach_plan(r, out)
}

/// The attach plan as a hook x node matrix of tiers, then why each failed tier failed.
fn write_attach_plan(r: &RunReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "attach plan (tier per hook; FAILED = no tier attached, - = not planned)"
    )?;
    let mut hooks: Vec<&str> = Vec::new();
    for n in &r.nodes {
        for e in &n.attach_plan {
            if !hooks.contains(&e.hook.as_str()) {
                hooks.push(&e.hook);
            }
        }
    }
    if hooks.is_empty() {
        return writeln!(out, "  none recorded in the nodes' startup records");
    }
    let mut columns = vec![("hook", Align::Left)];
    columns.extend(r.nodes.iter().map(|n| (n.node.as_str(), Align::Left)));
    let mut t = Table::new(&columns);
    let mut failures = BTreeSet::new();
    for hook in hooks {
        let mut row = vec![hook.to_owned()];
        for n in &r.nodes {
            let entries: Vec<_> = n.attach_plan.iter().filter(|e| e.hook == hook).collect();
            let cell = match entries.iter().find(|e| e.status.is_chosen()) {
                Some(e) if e.status == AttachStatus::OnDemand => format!("{} on demand", e.tier),
                Some(e) => e.tier.as_str().to_owned(),
                None if entries.iter().any(|e| e.status == AttachStatus::Failed) => {
                    for e in entries.iter().filter(|e| e.status == AttachStatus::Failed) {
                        let why = e.error.as_deref().unwrap_or("no reason given");
                        failures.insert(format!("{} {hook} ({}): {why}", n.node, e.tier));
                    }
                    "FAILED".into()
                }
                None => "-".into(),
            };
            row.push(cell);
        }
        t.row(row);
    }
    t.write(out, "  ")?;
    for f in failures {
        writeln!(out, "  failed: {f}")?;
    }
    Ok(())
}
