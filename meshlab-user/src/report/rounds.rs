//! `--compare` of interleaved rounds: runs that share a `--labels` name are rounds of one
//! configuration (docs/runbook-nic.md step 3: A, B, A, B, ...). Per configuration and row, the
//! median over its rounds of each round's p50, with the rounds' range; the step of that median
//! over the first configuration's; and whether the two configurations' rounds are separated.
//!
//! Separation is a rank test that needs no model of the noise: every round p50 of this
//! configuration above (or below) every round p50 of the first. When the configurations do
//! not differ, the rounds are exchangeable and that happens with probability
//! 2 / C(n + m, n) (n and m rounds that have the row). A step is flagged when its rounds are
//! separated and that probability is at most [`ALPHA`]: 4 and 4 rounds (p 0.029) or 3 and 5
//! (0.036) can be flagged, 3 and 3 (0.1) cannot. Equal p50s are not "beyond": a tie never
//! separates. Exchangeable only when the rounds were interleaved (A, B, A, B, ...): a list
//! whose neighbours share a label is warned about.

use std::io::{self, Write};

use serde::Serialize;

use super::compare::Ladder;
use super::table::{Align, Table, step_pct, step_us, us};

/// Largest chance of the separation under no difference at which a step is flagged.
pub const ALPHA: f64 = 0.05;

fn rule() -> String {
    format!(
        "rounds: per configuration the median over its rounds of each round's p50 (us), range = \
         [lowest-highest round] (k/n: only k of its n rounds have the row); step = over the first \
         configuration's median; p = chance that every round of one configuration lies beyond \
         every round of the other when they do not differ, 2 / C(n+m, n) for the n and m rounds \
         that have the row, given when they do; * = p <= {ALPHA}"
    )
}

#[derive(Debug, Serialize)]
pub struct Rounds {
    pub configurations: Vec<Configuration>,
    pub rule: String,
    pub rows: Vec<RoundsRow>,
}

#[derive(Debug, Serialize)]
pub struct Configuration {
    pub label: String,
    /// The runs (files) that are its rounds, in the order given.
    pub files: Vec<String>,
    /// Over its rounds: requests, complete ones, and kernel drops (`None`: a round without
    /// a merge_summary).
    pub requests: u64,
    pub complete: u64,
    pub kernel_drops: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct RoundsRow {
    pub segment: String,
    pub node: String,
    /// One per configuration; `None` when none of its rounds has the row.
    pub cells: Vec<Option<RoundsCell>>,
}

#[derive(Debug, Serialize)]
pub struct RoundsCell {
    /// Rounds that have the row (of the configuration's rounds).
    pub rounds: usize,
    /// Median of the rounds' p50s (for an even count the mean of the middle two, rounded down).
    pub median_p50_ns: u64,
    pub lowest_p50_ns: u64,
    pub highest_p50_ns: u64,
    /// Over the first configuration (absent in its own cell or when it lacks the row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ns: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_pct: Option<f64>,
    /// 2 / C(n+m, n) when every round of one configuration lies beyond every round of the
    /// other, else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub separated_p: Option<f64>,
    pub flagged: bool,
}

/// Runs grouped by label, in the order each label first appears: (label, run indices).
pub fn configurations(labels: &[String]) -> Vec<(String, Vec<usize>)> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        match groups.iter_mut().find(|(l, _)| l == label) {
            Some((_, runs)) => runs.push(i),
            None => groups.push((label.clone(), vec![i])),
        }
    }
    groups
}

/// One row's cells per configuration from each run's p50 (`None`: the run lacks the row).
pub fn row_of_runs(
    groups: &[(String, Vec<usize>)],
    p50s: &[Option<u64>],
) -> Vec<Option<RoundsCell>> {
    let per_configuration: Vec<Vec<u64>> = (groups.iter())
        .map(|(_, runs)| runs.iter().filter_map(|&i| p50s[i]).collect())
        .collect();
    cells(&per_configuration)
}

/// The rounds view of a per-run ladder whose labels repeat (`labels[i]` names run `i`);
/// `None` when every label names one run only.
pub fn rounds(ladder: &Ladder) -> Option<Rounds> {
    let labels: Vec<String> = ladder.runs.iter().map(|r| r.label.clone()).collect();
    let groups = configurations(&labels);
    if groups.len() == labels.len() {
        return None;
    }
    warn_not_interleaved(&labels);
    let rows = (ladder.rows.iter())
        .map(|row| {
            let p50s: Vec<Option<u64>> = (row.cells.iter())
                .map(|c| c.as_ref().map(|c| c.p50_ns))
                .collect();
            RoundsRow {
                segment: row.segment.clone(),
                node: row.node.clone(),
                cells: row_of_runs(&groups, &p50s),
            }
        })
        .collect();
    Some(Rounds {
        configurations: (groups.into_iter())
            .map(|(label, runs)| {
                let metas: Vec<_> = runs.iter().map(|&i| &ladder.runs[i]).collect();
                Configuration {
                    label,
                    files: metas.iter().map(|m| m.file.clone()).collect(),
                    requests: metas.iter().map(|m| m.requests).sum(),
                    complete: metas.iter().map(|m| m.complete).sum(),
                    kernel_drops: metas.iter().map(|m| m.kernel_drops).sum(),
                }
            })
            .collect(),
        rule: rule(),
        rows,
    })
}

/// The rank rule's p holds for interleaved rounds; neighbours with one label say they may not
/// have been (or were listed out of their order).
fn warn_not_interleaved(labels: &[String]) {
    if let Some(i) = (1..labels.len()).find(|&i| labels[i] == labels[i - 1]) {
        log::warn!(
            "--compare: runs {} and {} are both {}: the rounds' p assumes rounds interleaved and listed in the order they ran (A,B,A,B,...)",
            i,
            i + 1,
            labels[i]
        );
    }
}

/// One row's cells from each configuration's round p50s.
fn cells(p50s: &[Vec<u64>]) -> Vec<Option<RoundsCell>> {
    let first = &p50s[0];
    let base = (!first.is_empty()).then(|| median(first));
    (p50s.iter().enumerate())
        .map(|(i, these)| {
            let mut cell = summary(these)?;
            if let (true, Some(base)) = (i > 0, base) {
                let step = i128::from(cell.median_p50_ns) - i128::from(base);
                cell.step_ns = Some(step);
                cell.step_pct = (base > 0).then(|| step as f64 * 100.0 / base as f64);
                cell.separated_p = separation_p(first, these);
                cell.flagged = cell.separated_p.is_some_and(|p| p <= ALPHA);
            }
            Some(cell)
        })
        .collect()
}

fn summary(p50s: &[u64]) -> Option<RoundsCell> {
    let (lowest, highest) = (*p50s.iter().min()?, *p50s.iter().max()?);
    Some(RoundsCell {
        rounds: p50s.len(),
        median_p50_ns: median(p50s),
        lowest_p50_ns: lowest,
        highest_p50_ns: highest,
        step_ns: None,
        step_pct: None,
        separated_p: None,
        flagged: false,
    })
}

/// The median of a non-empty list: the middle value, or the mean of the middle two.
fn median(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        ((u128::from(v[n / 2 - 1]) + u128::from(v[n / 2])) / 2) as u64
    }
}

/// 2 / C(n+m, n) when every value of `b` is above every value of `a` or below every one.
fn separation_p(a: &[u64], b: &[u64]) -> Option<f64> {
    let (a_lo, a_hi) = (a.iter().min()?, a.iter().max()?);
    let (b_lo, b_hi) = (b.iter().min()?, b.iter().max()?);
    (b_lo > a_hi || b_hi < a_lo).then(|| 2.0 / binomial(a.len() + b.len(), a.len()))
}

fn binomial(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64)
}

pub fn write_rounds(r: &Rounds, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "rounds: runs with the same label are interleaved rounds of one configuration; step = over {}",
        r.configurations[0].label
    )?;
    for c in &r.configurations {
        let drops = c.kernel_drops.map_or("unknown".into(), |d| d.to_string());
        let rounds = c.files.len();
        writeln!(
            out,
            "  {}: {rounds} round{}, {} requests, {} complete, kernel drops {drops}:",
            c.label,
            if rounds == 1 { "" } else { "s" },
            c.requests,
            c.complete,
        )?;
        for file in &c.files {
            writeln!(out, "    {file}")?;
        }
    }
    writeln!(out)?;
    let labels: Vec<&str> = r.configurations.iter().map(|c| c.label.as_str()).collect();
    let rounds: Vec<usize> = r.configurations.iter().map(|c| c.files.len()).collect();
    let mut columns = vec![
        ("segment".to_owned(), Align::Left),
        ("node".to_owned(), Align::Left),
    ];
    columns.extend(cell_columns(&labels));
    let refs: Vec<(&str, Align)> = columns.iter().map(|(h, a)| (h.as_str(), *a)).collect();
    let mut t = Table::new(&refs);
    for row in &r.rows {
        let mut cells = vec![row.segment.clone(), row.node.clone()];
        cells.extend(cell_texts(&row.cells, &rounds));
        t.row(cells);
    }
    t.write(out, "  ")?;
    writeln!(out)?;
    writeln!(out, "{}", r.rule)
}

/// The columns of a row's cells: per configuration its label (the median) and `range`, and
/// after the first `step`, `%` and `p`.
pub fn cell_columns(labels: &[&str]) -> Vec<(String, Align)> {
    let mut columns = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        columns.push(((*label).to_owned(), Align::Right));
        columns.push(("range".to_owned(), Align::Right));
        if i > 0 {
            columns.extend(["step", "%", "p"].map(|h| (h.to_owned(), Align::Right)));
        }
    }
    columns
}

/// A row's cells under [`cell_columns`]: per configuration its median and its rounds' range
/// (with how many of its `rounds[i]` rounds have the row when not all do), and after the
/// first the step, % and p.
pub fn cell_texts(cells: &[Option<RoundsCell>], rounds: &[usize]) -> Vec<String> {
    let mut texts = Vec::new();
    for (i, (c, &all)) in cells.iter().zip(rounds).enumerate() {
        texts.push(c.as_ref().map_or("-".into(), |c| us(c.median_p50_ns)));
        texts.push(c.as_ref().map_or("-".into(), |c| {
            let range = format!("[{}-{}]", us(c.lowest_p50_ns), us(c.highest_p50_ns));
            match c.rounds == all {
                true => range,
                false => format!("{range} {}/{all}", c.rounds),
            }
        }));
        if i == 0 {
            continue;
        }
        let step = c.as_ref().and_then(|c| c.step_ns.map(|s| (s, c)));
        texts.push(step.map_or("-".into(), |(s, c)| step_us(s, c.flagged)));
        texts.push(
            step.and_then(|(_, c)| c.step_pct)
                .map_or("-".into(), step_pct),
        );
        texts.push(
            step.and_then(|(_, c)| c.separated_p)
                .map_or("-".into(), |p| format!("{p:.3}")),
        );
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[30, 10, 20]), 20);
        assert_eq!(median(&[40, 10, 20, 30]), 25);
        assert_eq!(median(&[7]), 7);
    }

    #[test]
    fn separation_probability_is_two_over_the_arrangements() {
        // 5 rounds each: 2 / C(10, 5) = 2 / 252.
        let a = [10, 11, 12, 13, 14];
        let b = [15, 16, 17, 18, 19];
        let p = separation_p(&a, &b).unwrap();
        assert!((p - 2.0 / 252.0).abs() < 1e-12, "{p}");
        // Below every round counts too; 3 and 2 rounds: 2 / C(5, 3) = 0.2.
        assert!((separation_p(&[10, 11, 12], &[5, 6]).unwrap() - 0.2).abs() < 1e-12);
        // One overlap: not separated.
        assert_eq!(separation_p(&a, &[14, 20, 21, 22, 23]), None);
    }

    #[test]
    fn a_step_is_flagged_only_when_separated_with_enough_rounds() {
        let rows = cells(&[vec![100, 102, 101, 103], vec![110, 111, 112, 113]]);
        let b = rows[1].as_ref().unwrap();
        assert_eq!((b.median_p50_ns, b.step_ns), (111, Some(10))); // medians 101 and 111
        assert!(b.flagged, "4 and 4 separated rounds: p = 2/70");
        let rows = cells(&[vec![100, 102, 101], vec![110, 111, 112]]);
        let b = rows[1].as_ref().unwrap();
        assert!(
            !b.flagged && b.separated_p == Some(0.1),
            "3 and 3: p = 2/20"
        );
        let rows = cells(&[vec![100, 102, 101, 103], vec![110, 101, 112, 113]]);
        assert!(!rows[1].as_ref().unwrap().flagged, "overlapping rounds");
    }

    #[test]
    fn unequal_rounds_and_ties() {
        // 3 and 5 rounds: p = 2 / C(8, 3) = 2 / 56, flagged.
        let rows = cells(&[vec![10, 11, 12], vec![20, 21, 22, 23, 24]]);
        assert!(rows[1].as_ref().unwrap().flagged);
        // A tie between the rounds is not a separation.
        assert_eq!(separation_p(&[10, 11, 12, 13], &[13, 14, 15, 16]), None);
    }

    #[test]
    fn a_configuration_without_the_row_has_no_cell_and_no_step() {
        let rows = cells(&[vec![], vec![5, 6]]);
        assert!(rows[0].is_none());
        let b = rows[1].as_ref().unwrap();
        assert_eq!((b.step_ns, b.separated_p, b.flagged), (None, None, false));
    }
}
