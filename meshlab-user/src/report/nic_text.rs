//! `report --nic` as tables: the same rows for the terminal ([`write_nic`]) and the HTML
//! section (super::html::nic).

use std::io::{self, Write};

use super::nic::{NicReport, NodeNicReport, StageStats};
use super::table::{Align, Table, us};

/// One table: title, columns, rows.
pub struct NicTable {
    pub title: String,
    pub columns: Vec<(&'static str, Align)>,
    pub rows: Vec<Vec<String>>,
}

const L: Align = Align::Left;
const R: Align = Align::Right;

fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "?".into(), |v| v.to_string())
}

fn stage_cells(s: &StageStats) -> [String; 4] {
    [
        s.stage.clone(),
        s.stats.n.to_string(),
        us(s.stats.p50_ns),
        us(s.stats.p99_ns),
    ]
}

fn queue_stages(node: &NodeNicReport) -> NicTable {
    let mut rows = Vec::new();
    for q in &node.queues {
        let head = [
            q.dev.clone(),
            q.dir.as_str().into(),
            opt(q.queue),
            opt(q.irq),
            q.requests.to_string(),
        ];
        for s in &q.stages {
            rows.push(head.iter().cloned().chain(stage_cells(s)).collect());
        }
    }
    NicTable {
        title: format!("node {}: kernel stages per queue", node.node),
        columns: vec![
            ("dev", L),
            ("dir", L),
            ("queue", R),
            ("irq", R),
            ("requests", R),
            ("stage", L),
            ("n", R),
            ("p50 us", R),
            ("p99 us", R),
        ],
        rows,
    }
}

fn queue_raw(node: &NodeNicReport) -> NicTable {
    let p = |s: &Option<super::quantile::Stats>| {
        s.as_ref()
            .map_or(["-".into(), "-".into()], |s| [us(s.p50_ns), us(s.p99_ns)])
    };
    let mut rows = Vec::new();
    for q in &node.queues {
        let Some(raw) = &q.raw else { continue };
        let [irq50, irq99] = p(&raw.hard_irq_ns);
        let [d50, d99] = p(&raw.irq_to_softirq_ns);
        let polls = raw.packets_per_poll.as_ref();
        rows.push(vec![
            q.dev.clone(),
            opt(q.queue),
            opt(q.irq),
            raw.hard_irqs.to_string(),
            irq50,
            irq99,
            d50,
            d99,
            polls.map_or(0, |p| p.polls).to_string(),
            polls.map_or_else(|| "-".into(), |p| p.p50.to_string()),
            polls.map_or_else(|| "-".into(), |p| p.max.to_string()),
            raw.budget_exhausted.to_string(),
        ]);
    }
    NicTable {
        title: format!(
            "node {}: raw IRQ/NAPI stream per RX queue ({})",
            node.node, node.raw_stream
        ),
        columns: vec![
            ("dev", L),
            ("queue", R),
            ("irq", R),
            ("hard irqs", R),
            ("irq p50 us", R),
            ("irq p99 us", R),
            ("irq->softirq p50 us", R),
            ("p99 us", R),
            ("polls", R),
            ("pkts/poll p50", R),
            ("max", R),
            ("budget exhausted", R),
        ],
        rows,
    }
}

fn cpus(node: &NodeNicReport) -> NicTable {
    let mut rows = Vec::new();
    let count = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    for c in &node.cpus {
        let head = [
            c.cpu.to_string(),
            c.requests.to_string(),
            count(c.hard_irqs),
            count(c.net_rx_softirqs),
        ];
        let empty = ["-".to_owned(), "0".into(), "-".into(), "-".into()];
        let stages: Vec<[String; 4]> = c.stages.iter().map(stage_cells).collect();
        for s in if stages.is_empty() {
            vec![empty]
        } else {
            stages
        } {
            rows.push(head.iter().cloned().chain(s).collect());
        }
    }
    NicTable {
        title: format!("node {}: kernel stages per CPU", node.node),
        columns: vec![
            ("cpu", R),
            ("requests", R),
            ("hard irqs", R),
            ("NET_RX runs", R),
            ("stage", L),
            ("n", R),
            ("p50 us", R),
            ("p99 us", R),
        ],
        rows,
    }
}

/// Every table of the report, node by node.
pub fn tables(report: &NicReport) -> Vec<NicTable> {
    (report.nodes.iter())
        .flat_map(|n| [queue_stages(n), queue_raw(n), cpus(n)])
        .collect()
}

pub fn write_nic(report: &NicReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "NIC report: {}", report.file)?;
    if let Some([a, b]) = report.raw_window_ns {
        writeln!(
            out,
            "raw stream counted from {a} to {b} ns (node CLOCK_MONOTONIC)"
        )?;
    }
    for node in &report.nodes {
        for (dev, verdict) in &node.timestamps {
            writeln!(out, "{} {dev} timestamps: {verdict}", node.node)?;
        }
    }
    for t in tables(report) {
        writeln!(out, "\n{}", t.title)?;
        if t.rows.is_empty() {
            writeln!(out, "  (none)")?;
            continue;
        }
        let mut table = Table::new(&t.columns);
        t.rows.into_iter().for_each(|r| table.row(r));
        table.write(out, "  ")?;
    }
    Ok(())
}
