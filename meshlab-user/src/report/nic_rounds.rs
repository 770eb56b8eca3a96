//! `report --compare ... --labels A,B,A,B,... --nic`: the per-queue comparison of interleaved
//! rounds. Each (node, direction, queue, stage) row of the run-by-run NIC comparison
//! ([`super::nic_compare`]) becomes one row per configuration: the median of its rounds' p50s,
//! their range, the step over the first configuration and the rank rule of [`super::rounds`].

use std::io::{self, Write};

use serde::Serialize;

use super::nic_compare::NicCompare;
use super::rounds::{RoundsCell, cell_columns, cell_texts, configurations, row_of_runs};
use super::table::{Align, Table};
use crate::schema::Direction;

#[derive(Debug, Serialize)]
pub struct NicRounds {
    /// The configurations' labels, in the order they first appear.
    pub labels: Vec<String>,
    /// Per configuration, its number of rounds.
    pub rounds: Vec<usize>,
    pub nodes: Vec<NodeRounds>,
}

#[derive(Debug, Serialize)]
pub struct NodeRounds {
    pub node: String,
    pub rows: Vec<NicRoundsRow>,
}

#[derive(Debug, Serialize)]
pub struct NicRoundsRow {
    pub dir: Direction,
    pub queue: Option<u32>,
    pub stage: String,
    pub cells: Vec<Option<RoundsCell>>,
}

/// The rounds view of a run-by-run NIC comparison, `labels[i]` naming run `i` (the labels
/// given, with repeats).
pub fn nic_rounds(compare: &NicCompare, labels: &[String]) -> NicRounds {
    let groups = configurations(labels);
    let nodes = (compare.nodes.iter())
        .map(|node| NodeRounds {
            node: node.node.clone(),
            rows: (node.rows.iter())
                .map(|row| {
                    let p50s: Vec<Option<u64>> = (row.cells.iter())
                        .map(|c| c.as_ref().map(|c| c.p50_ns))
                        .collect();
                    NicRoundsRow {
                        dir: row.dir,
                        queue: row.queue,
                        stage: row.stage.clone(),
                        cells: row_of_runs(&groups, &p50s),
                    }
                })
                .collect(),
        })
        .collect();
    NicRounds {
        rounds: groups.iter().map(|(_, runs)| runs.len()).collect(),
        labels: groups.into_iter().map(|(label, _)| label).collect(),
        nodes,
    }
}

pub fn write_nic_rounds(r: &NicRounds, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nNIC rounds (median of the rounds' p50s, us; step over {}; rule as above):",
        r.labels[0]
    )?;
    let labels: Vec<&str> = r.labels.iter().map(String::as_str).collect();
    let mut columns = vec![
        ("dir".to_owned(), Align::Left),
        ("queue".to_owned(), Align::Right),
        ("stage".to_owned(), Align::Left),
    ];
    columns.extend(cell_columns(&labels));
    let refs: Vec<(&str, Align)> = columns.iter().map(|(h, a)| (h.as_str(), *a)).collect();
    for node in &r.nodes {
        writeln!(out, "\nnode {}: stages per queue", node.node)?;
        if node.rows.is_empty() {
            writeln!(out, "  (none)")?;
            continue;
        }
        let mut t = Table::new(&refs);
        for row in &node.rows {
            let mut cells = vec![
                row.dir.as_str().to_owned(),
                row.queue.map_or_else(|| "?".into(), |q| q.to_string()),
                row.stage.clone(),
            ];
            cells.extend(cell_texts(&row.cells, &r.rounds));
            t.row(cells);
        }
        t.write(out, "  ")?;
    }
    Ok(())
}
