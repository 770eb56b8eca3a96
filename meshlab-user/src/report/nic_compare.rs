//! `report --compare A B ... --nic`: the NIC reports of the runs side by side, stage by stage
//! and queue by queue, each step over the first run, with the device-context differences of
//! each node (startup `devices`) listed next to them.
//!
//! Rows are matched by (node, direction, queue, stage), not by device name, so two different
//! NICs in the same slot of the set-up (`eth0` in A, `ens1f0` in B) line up; each cell names
//! its device. Device contexts are paired the same way: by name when both runs have the
//! device, else the only device of the node in each run.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use crate::schema::{DeviceContext, Startup};

use super::nic::NicReport;
use super::table::{Align, Table, us, us_signed};
use crate::schema::Direction;

#[derive(Debug, Serialize)]
pub struct NicCompare {
    pub runs: Vec<String>,
    pub nodes: Vec<NodeCompare>,
}

#[derive(Debug, Serialize)]
pub struct NodeCompare {
    pub node: String,
    /// Device settings that differ between the runs (all runs' values, `null` = absent).
    pub context_diffs: Vec<ContextDiff>,
    pub rows: Vec<CompareRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextDiff {
    /// `DEV field.path`, e.g. `eth0 rings.rx`.
    pub field: String,
    pub values: Vec<Option<String>>,
}

#[derive(Debug, Serialize)]
pub struct CompareRow {
    pub dir: Direction,
    pub queue: Option<u32>,
    /// A stage name, or a raw-stream figure (`raw: hard_irq`, `raw: irq_to_softirq`).
    pub stage: String,
    pub cells: Vec<Option<CompareCell>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareCell {
    pub dev: String,
    pub n: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// p50 over the first run's (absent in the first run, or when it lacks the row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_p50_ns: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_pct: Option<f64>,
}

type RowKey = (String, Direction, Option<u32>, String);

/// Every (node, dir, queue, stage) cell of one run's report, raw figures included.
fn cells(report: &NicReport) -> BTreeMap<RowKey, CompareCell> {
    let mut out = BTreeMap::new();
    for node in &report.nodes {
        for q in &node.queues {
            let cell = |n, p50, p99| CompareCell {
                dev: q.dev.clone(),
                n,
                p50_ns: p50,
                p99_ns: p99,
                step_p50_ns: None,
                step_pct: None,
            };
            let key = |stage: &str| (node.node.clone(), q.dir, q.queue, stage.to_owned());
            for s in &q.stages {
                let c = cell(s.stats.n, s.stats.p50_ns, s.stats.p99_ns);
                out.insert(key(&s.stage), c);
            }
            let Some(raw) = &q.raw else { continue };
            for (name, stats) in [
                ("raw: hard_irq", &raw.hard_irq_ns),
                ("raw: irq_to_softirq", &raw.irq_to_softirq_ns),
            ] {
                if let Some(s) = stats {
                    out.insert(key(name), cell(s.n, s.p50_ns, s.p99_ns));
                }
            }
        }
    }
    out
}

/// Lines the runs' NIC reports up; `startups[i]` are run i's nodes (merge_info).
pub fn compare(labels: &[String], reports: &[NicReport], startups: &[Vec<Startup>]) -> NicCompare {
    let per_run: Vec<_> = reports.iter().map(cells).collect();
    let mut keys: Vec<&RowKey> = per_run.iter().flat_map(|m| m.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut nodes: BTreeMap<String, NodeCompare> = BTreeMap::new();
    for key in keys {
        let base = per_run[0].get(key);
        let cells = (per_run.iter().enumerate())
            .map(|(i, run)| {
                let mut c = run.get(key)?.clone();
                if let (true, Some(b)) = (i > 0, base) {
                    let step = i128::from(c.p50_ns) - i128::from(b.p50_ns);
                    c.step_p50_ns = Some(step);
                    c.step_pct = (b.p50_ns > 0).then(|| step as f64 * 100.0 / b.p50_ns as f64);
                }
                Some(c)
            })
            .collect();
        let (node, dir, queue, stage) = key.clone();
        node_entry(&mut nodes, &node).rows.push(CompareRow {
            dir,
            queue,
            stage,
            cells,
        });
    }
    for name in all_nodes(startups) {
        let contexts: Vec<Vec<DeviceContext>> = (startups.iter())
            .map(|run| {
                let s = run.iter().find(|s| s.node == name);
                s.map(|s| s.devices.clone()).unwrap_or_default()
            })
            .collect();
        node_entry(&mut nodes, &name).context_diffs = context_diffs(&contexts);
    }
    NicCompare {
        runs: labels.to_vec(),
        nodes: nodes.into_values().collect(),
    }
}

fn all_nodes(startups: &[Vec<Startup>]) -> Vec<String> {
    let mut names: Vec<String> = startups.iter().flatten().map(|s| s.node.clone()).collect();
    names.sort();
    names.dedup();
    names
}

fn node_entry<'a>(nodes: &'a mut BTreeMap<String, NodeCompare>, node: &str) -> &'a mut NodeCompare {
    nodes.entry(node.to_owned()).or_insert_with(|| NodeCompare {
        node: node.to_owned(),
        context_diffs: Vec::new(),
        rows: Vec::new(),
    })
}

/// Leaf fields of a device context as `path -> value` (arrays by index).
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| {
            let p = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            flatten(&p, v, out);
        }),
        serde_json::Value::Array(a) if a.iter().any(|v| v.is_object()) => {
            (a.iter().enumerate()).for_each(|(i, v)| flatten(&format!("{prefix}[{i}]"), v, out));
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

/// The device each run has in the slot of `name` (see the module doc).
fn paired<'a>(run: &'a [DeviceContext], name: &str) -> Option<&'a DeviceContext> {
    (run.iter().find(|d| d.dev == name)).or_else(|| (run.len() == 1).then(|| &run[0]))
}

/// Fields whose values differ between the runs, per device slot (the first run's names).
pub fn context_diffs(runs: &[Vec<DeviceContext>]) -> Vec<ContextDiff> {
    let mut slots: Vec<String> = Vec::new();
    for d in runs.iter().flatten() {
        if !slots.contains(&d.dev) {
            slots.push(d.dev.clone());
        }
    }
    if runs.iter().all(|r| r.len() <= 1) {
        slots.truncate(1);
    }
    let mut diffs = Vec::new();
    for slot in slots {
        let flat: Vec<BTreeMap<String, String>> = (runs.iter())
            .map(|run| {
                let mut out = BTreeMap::new();
                if let Some(d) = paired(run, &slot) {
                    let v = serde_json::to_value(d).expect("a device context serializes");
                    flatten("", &v, &mut out);
                }
                out
            })
            .collect();
        let mut fields: Vec<&String> = flat.iter().flat_map(|m| m.keys()).collect();
        fields.sort();
        fields.dedup();
        for field in fields {
            let values: Vec<Option<String>> = flat.iter().map(|m| m.get(field).cloned()).collect();
            if values.windows(2).any(|w| w[0] != w[1]) {
                diffs.push(ContextDiff {
                    field: format!("{slot} {field}"),
                    values,
                });
            }
        }
    }
    diffs
}

pub fn write_nic_compare(c: &NicCompare, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nNIC comparison (steps of the p50 over {}):",
        c.runs[0]
    )?;
    for node in &c.nodes {
        writeln!(out, "\nnode {}: device settings that differ", node.node)?;
        let mut cols = vec![("field", Align::Left)];
        cols.extend(c.runs.iter().map(|r| (r.as_str(), Align::Left)));
        let mut t = Table::new(&cols);
        for d in &node.context_diffs {
            let mut row = vec![d.field.clone()];
            row.extend(
                d.values
                    .iter()
                    .map(|v| v.clone().unwrap_or_else(|| "-".into())),
            );
            t.row(row);
        }
        if node.context_diffs.is_empty() {
            writeln!(out, "  (none)")?;
        } else {
            t.write(out, "  ")?;
        }
        writeln!(
            out,
            "\nnode {}: stages per queue (p50 / p99 us, step of the p50)",
            node.node
        )?;
        write_rows(c, node, out)?;
    }
    Ok(())
}

fn write_rows(c: &NicCompare, node: &NodeCompare, out: &mut dyn Write) -> io::Result<()> {
    let mut cols = vec![
        ("dir", Align::Left),
        ("queue", Align::Right),
        ("stage", Align::Left),
    ];
    cols.extend(c.runs.iter().map(|r| (r.as_str(), Align::Right)));
    let mut t = Table::new(&cols);
    for r in &node.rows {
        let mut row = vec![
            r.dir.as_str().to_owned(),
            r.queue.map_or_else(|| "?".into(), |q| q.to_string()),
            r.stage.clone(),
        ];
        row.extend(r.cells.iter().map(|cell| match cell {
            None => "-".to_owned(),
            Some(x) => {
                let step = x
                    .step_p50_ns
                    .map_or_else(String::new, |s| format!(" ({})", us_signed(s)));
                format!("{} {} / {}{step}", x.dev, us(x.p50_ns), us(x.p99_ns))
            }
        }));
        t.row(row);
    }
    t.write(out, "  ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Rings;

    fn dev(name: &str, rx_ring: u32) -> DeviceContext {
        DeviceContext {
            dev: name.into(),
            ifindex: 2,
            driver: Some("virtio_net".into()),
            rings: Some(Rings {
                rx: rx_ring,
                tx: 256,
                rx_max: 1024,
                tx_max: 1024,
            }),
            ..DeviceContext::default()
        }
    }

    #[test]
    fn only_differing_settings_are_listed_and_single_devices_pair_across_names() {
        let a = vec![dev("eth0", 256)];
        let mut b = dev("ens1", 1024);
        b.driver = Some("mlx5_core".into());
        let diffs = context_diffs(&[a.clone(), vec![b]]);
        let fields: Vec<&str> = diffs.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(fields, ["eth0 dev", "eth0 driver", "eth0 rings.rx"]);
        assert_eq!(
            diffs[2].values,
            [Some("256".to_owned()), Some("1024".to_owned())]
        );
        assert!(context_diffs(&[a.clone(), a]).is_empty());
    }
}
