//! The "meshlab's own cost" section of the terminal report (figures: report/own_cost.rs).

use std::io::{self, Write};

use crate::schema::BpfStatsState;

use super::own_cost::{NodeOwnCost, OwnCost};
use super::table::{Align, Table, percent};

/// Nanoseconds with no decimals, or "-" when there is no figure.
fn ns(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

/// A share, or "-" when there is no figure.
fn share(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), percent)
}

pub fn write_own_cost(c: &OwnCost, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "meshlab's own cost (its BPF programs' run time, kernel BPF statistics; the recorder's \
         CPU, getrusage; per request: over the {} requests of this report)",
        c.requests
    )?;
    if c.nodes.is_empty() {
        return writeln!(
            out,
            "  not recorded: the merge summary has no self_cost (recordings made before \
             self-accounting, or merged from probe files only)"
        );
    }
    let mut t = Table::new(&[
        ("node", Align::Left),
        ("bpf stats", Align::Left),
        ("bpf ns total", Align::Right),
        ("bpf ns/req", Align::Right),
        ("cpu user ns", Align::Right),
        ("cpu sys ns", Align::Right),
        ("events", Align::Right),
        ("cpu ns/event", Align::Right),
        ("cpu ns/req", Align::Right),
    ]);
    for n in &c.nodes {
        let measured = n.bpf_stats == BpfStatsState::Measured;
        t.row(vec![
            n.node.clone(),
            n.bpf_stats.as_str().replace('_', " "),
            if measured {
                n.bpf_total_ns.to_string()
            } else {
                "-".into()
            },
            ns(n.bpf_ns_per_request),
            n.user_cpu_ns.to_string(),
            n.sys_cpu_ns.to_string(),
            n.events.to_string(),
            ns(n.cpu_ns_per_event),
            ns(n.cpu_ns_per_request),
        ]);
    }
    t.write(out, "  ")?;
    for n in &c.nodes {
        if let Some(missed) = n.missed_runs_line() {
            writeln!(
                out,
                "  {}: EVENTS LOST, the kernel skipped programs already running on that CPU \
                 (not in dropped): {missed}",
                n.node
            )?;
        }
        write_programs(n, out)?;
    }
    write_stages(c, out)
}

fn write_programs(n: &NodeOwnCost, out: &mut dyn Write) -> io::Result<()> {
    if n.bpf_stats == BpfStatsState::NotMeasured {
        return writeln!(
            out,
            "  {}: BPF run time not measured (kernel.bpf_stats_enabled was 0; record with \
             --bpf-stats)",
            n.node
        );
    }
    writeln!(out, "  {}: per program", n.node)?;
    let mut t = Table::new(&[
        ("program", Align::Left),
        ("hook", Align::Left),
        ("runs", Align::Right),
        ("ns/run", Align::Right),
        ("total ns", Align::Right),
        ("events", Align::Right),
        ("ns/event <=", Align::Right),
    ]);
    for p in &n.programs {
        t.row(vec![
            p.program.clone(),
            p.hook.clone(),
            p.runs.to_string(),
            ns(p.ns_per_run),
            p.total_ns.to_string(),
            p.events.to_string(),
            ns(p.ns_per_event_max),
        ]);
    }
    t.write(out, "    ")
}

fn write_stages(c: &OwnCost, out: &mut dyn Write) -> io::Result<()> {
    if c.stages.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "  per stage: meshlab's own programs in one occurrence, from the programs at the stage's \
         ends: one average run each (est) and each one's run time per event it emitted (<=, a \
         bound); docs/report.md"
    )?;
    let mut t = Table::new(&[
        ("node", Align::Left),
        ("stage", Align::Left),
        ("stage p50 ns", Align::Right),
        ("own ns est", Align::Right),
        ("share est", Align::Right),
        ("own ns <=", Align::Right),
        ("share <=", Align::Right),
        ("programs of", Align::Left),
    ]);
    for s in &c.stages {
        t.row(vec![
            s.node.clone(),
            s.stage.clone(),
            s.stage_p50_ns.to_string(),
            ns(Some(s.own_ns_est)),
            percent(s.share_of_p50_est),
            ns(s.own_ns_max),
            share(s.share_of_p50_max),
            s.hooks.join(", "),
        ]);
    }
    t.write(out, "    ")
}
