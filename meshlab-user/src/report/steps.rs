//! The ladder's steps in words (`report --compare`, text output): for each run over the one
//! before it, which segments appeared or disappeared and which grew or shrank beyond the noise,
//! per node and unit, and each process's time (the seed's "inbound 4.1x outbound", "the
//! client's socket work shrinks" are read off these lines).
//!
//! A segment's figure is its p50 in that run; sums of p50s (a process's time) are labelled as
//! such, since a sum of medians is not the median of sums. "Beyond the noise" is the ladder's
//! rule (`compare::Z` standard errors of the two p50s).

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::schema::Layer;

use super::aggregate::{Aggregate, node_label};
use super::compare::Z;
use super::key::SegmentKey;
use super::table::{us, us_signed};

/// At most this many segments are named per category; the rest are counted and summed.
const TOP: usize = 4;

/// One segment's change between two runs: p50 before and after (`None`: absent in that run).
struct Change {
    key: SegmentKey,
    before: Option<u64>,
    after: Option<u64>,
    beyond_noise: bool,
}

impl Change {
    fn delta(&self) -> i128 {
        i128::from(self.after.unwrap_or(0)) - i128::from(self.before.unwrap_or(0))
    }

    fn label(&self) -> String {
        let node = node_label(&self.key);
        let unit = match self.key.layer {
            Layer::Process => format!(", {}", self.key.unit),
            _ => String::new(),
        };
        format!("{} ({node}{unit})", self.key.name)
    }
}

fn p50(run: &Aggregate, key: &SegmentKey) -> Option<(u64, Option<f64>)> {
    let samples = run.segments.get(key).filter(|s| !s.is_empty())?;
    Some((samples.quantile(500), run.median_se.get(key).copied()))
}

fn changes(a: &Aggregate, b: &Aggregate) -> Vec<Change> {
    let mut keys: Vec<&SegmentKey> = a.segments.keys().chain(b.segments.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let (before, after) = (p50(a, key), p50(b, key));
            let beyond_noise = match (before, after) {
                (Some((x, Some(sx))), Some((y, Some(sy)))) => {
                    (i128::from(y) - i128::from(x)).unsigned_abs() as f64
                        > Z * (sx * sx + sy * sy).sqrt()
                }
                _ => false,
            };
            Change {
                key: key.clone(),
                before: before.map(|(v, _)| v),
                after: after.map(|(v, _)| v),
                beyond_noise,
            }
        })
        .collect()
}

/// One line: the largest `TOP` of `items` by |delta|, and the count and sum of the rest.
fn category(out: &mut dyn Write, title: &str, mut items: Vec<&Change>) -> io::Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    items.sort_by_key(|c| std::cmp::Reverse(c.delta().unsigned_abs()));
    let total: i128 = items.iter().map(|c| c.delta()).sum();
    let named: Vec<String> = items
        .iter()
        .take(TOP)
        .map(|c| format!("{} {}", c.label(), us_signed(c.delta())))
        .collect();
    let rest = items.len().saturating_sub(TOP);
    let more = if rest > 0 {
        format!(" and {rest} more")
    } else {
        String::new()
    };
    writeln!(
        out,
        "    {title} ({} us in all): {}{more}",
        us_signed(total),
        named.join(", ")
    )
}

/// Sum of the p50s of each process's segments in a run, per (node, process).
fn process_time(run: &Aggregate) -> BTreeMap<(String, String), u64> {
    let mut per = BTreeMap::new();
    for key in run.segments.keys().filter(|k| k.layer == Layer::Process) {
        if let Some((v, _)) = p50(run, key) {
            let slot = (node_label(key).to_owned(), key.unit.clone());
            *per.entry(slot).or_insert(0) += v;
        }
    }
    per
}

/// Writes the steps of `runs` (labelled `labels`) in words.
pub fn write_steps(runs: &[Aggregate], labels: &[String], out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nsteps in words (segment p50s; each run over the one before):"
    )?;
    for i in 1..runs.len() {
        let (a, b) = (&runs[i - 1], &runs[i]);
        let e2e = i128::from(b.e2e.quantile(500)) - i128::from(a.e2e.quantile(500));
        writeln!(
            out,
            "  {} over {}: end-to-end {} us",
            labels[i],
            labels[i - 1],
            us_signed(e2e)
        )?;
        let all = changes(a, b);
        let pick = |f: &dyn Fn(&Change) -> bool| all.iter().filter(|c| f(c)).collect::<Vec<_>>();
        category(out, "appeared", pick(&|c| c.before.is_none()))?;
        category(out, "gone", pick(&|c| c.after.is_none()))?;
        category(out, "grew", pick(&|c| c.beyond_noise && c.delta() > 0))?;
        category(out, "shrank", pick(&|c| c.beyond_noise && c.delta() < 0))?;
    }
    for (run, label) in runs.iter().zip(labels) {
        let parts: Vec<String> = process_time(run)
            .into_iter()
            .map(|((node, unit), ns)| format!("{unit} on {node} {}", us(ns)))
            .collect();
        writeln!(
            out,
            "  process time in {label} (sum of its segments' p50s, us): {}",
            parts.join(", ")
        )?;
    }
    Ok(())
}
