//! `cargo xtask truth --breakdown`: per cause, every segment's figures without and with the
//! cause, to see where an added latency went when the cause's own segments do not hold it.
//!
//! Two views of the same requests: the median over runs of each run's median (absent = 0, as
//! the table's), and the mean pooled over the condition's runs. Means add up: a request's
//! segments sum to its e2e time, so the pooled mean e2e is exactly the sum of the segments'
//! pooled means, and the added mean splits over segments without remainder. A median does
//! not (the median request of one condition is not the other's), which is why a cause that
//! delays a minority of requests a lot shows in the means first.

use std::collections::{BTreeMap, BTreeSet};

use crate::truth_lab::median;

/// One run's per-segment totals over its complete requests.
pub struct RunBreakdown {
    pub requests: usize,
    pub e2e_sum_ns: f64,
    /// "NODE name" -> the sum of its durations over the requests (0 where absent).
    pub sum_ns: BTreeMap<String, f64>,
    /// "NODE name" -> the CPUs its kernel stage ran on (`place.cpu`).
    pub cpus: BTreeMap<String, BTreeSet<u64>>,
    /// Per CPU, the share of the run it was busy with anything (machine-wide, /proc/stat):
    /// where the machine's other work went.
    pub cpu_busy: Vec<f64>,
    /// "NODE name" -> its mean over the requests around the median ([`band_indices`]).
    pub band_ns: BTreeMap<String, f64>,
}

/// One run as the breakdown reads it.
pub struct RunView<'a> {
    pub breakdown: &'a RunBreakdown,
    /// "NODE name" -> the run's median (0 where absent).
    pub p50_ns: &'a BTreeMap<String, f64>,
}

/// Pooled mean of `key` over runs (`None`: the e2e time).
fn pooled_mean(runs: &[RunView], key: Option<&str>) -> f64 {
    let requests: usize = runs.iter().map(|r| r.breakdown.requests).sum();
    let total: f64 = runs
        .iter()
        .map(|r| match key {
            None => r.breakdown.e2e_sum_ns,
            Some(k) => r.breakdown.sum_ns.get(k).copied().unwrap_or(0.0),
        })
        .sum();
    total / requests.max(1) as f64
}

/// The median over runs of `key`'s mean over the requests around the median.
fn median_band_mean(runs: &[RunView], key: &str) -> f64 {
    median(
        runs.iter()
            .map(|r| r.breakdown.band_ns.get(key).copied().unwrap_or(0.0))
            .collect(),
    )
}

fn median_p50(runs: &[RunView], key: &str) -> f64 {
    median(
        runs.iter()
            .map(|r| r.p50_ns.get(key).copied().unwrap_or(0.0))
            .collect(),
    )
}

/// The key of [`RunBreakdown::band_ns`] for the e2e time itself.
pub const E2E: &str = "e2e";

/// How many segments the breakdown lists, the largest mean changes first.
const ROWS: usize = 14;

pub fn print(
    cause: &str,
    without: &[RunView],
    with: &[RunView],
    target: &BTreeSet<String>,
    e2e_p50: (f64, f64),
) {
    let rows = sorted_rows(without, with);
    println!(
        "\nbreakdown: {cause} ({} + {} runs; p50: median over runs of the run's median, absent \
         = 0; mean: pooled over the runs' complete requests; at p50 added: the added mean over \
         the requests around the median, as the table's at p50; * = the cause's target; us)",
        without.len(),
        with.len()
    );
    println!(
        "{:<26} {:>6} {:>9} {:>9} {:>9} {:>9} {:>10} {:>12}",
        "segment", "cpus", "p50 off", "p50 on", "mean off", "mean on", "mean added", "at p50 added"
    );
    let (e2e_off, e2e_on) = (pooled_mean(without, None), pooled_mean(with, None));
    println!(
        "{:<26} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>12.1}",
        "e2e",
        "",
        e2e_p50.0 / 1e3,
        e2e_p50.1 / 1e3,
        e2e_off / 1e3,
        e2e_on / 1e3,
        (e2e_on - e2e_off) / 1e3,
        (median_band_mean(with, E2E) - median_band_mean(without, E2E)) / 1e3
    );
    for (added, key) in rows.iter().take(ROWS) {
        print_row(without, with, target, *added, key);
    }
    println!(
        "CPUs busy with anything (/proc/stat, machine-wide, medians over runs): without {}; \
         with {}",
        cpu_busy(without),
        cpu_busy(with)
    );
    let target_added: f64 = target
        .iter()
        .map(|k| pooled_mean(with, Some(k)) - pooled_mean(without, Some(k)))
        .sum();
    let e2e_added = e2e_on - e2e_off;
    println!(
        "mean: added {:.1} us, {:.1} us of it in the target ({:.0} %)",
        e2e_added / 1e3,
        target_added / 1e3,
        target_added / e2e_added * 100.0
    );
}

/// Every segment with its added mean, the largest change first.
fn sorted_rows<'a>(without: &'a [RunView], with: &'a [RunView]) -> Vec<(f64, &'a String)> {
    let keys: BTreeSet<&String> = without
        .iter()
        .chain(with)
        .flat_map(|r| r.breakdown.sum_ns.keys())
        .collect();
    let mut rows: Vec<(f64, &String)> = keys
        .into_iter()
        .map(|k| {
            (
                pooled_mean(with, Some(k)) - pooled_mean(without, Some(k)),
                k,
            )
        })
        .collect();
    // The largest change first, in the mean or around the median, whichever is larger.
    let size = |(added, key): &(f64, &String)| {
        let band = median_band_mean(with, key) - median_band_mean(without, key);
        added.abs().max(band.abs())
    };
    rows.sort_by(|a, b| size(b).total_cmp(&size(a)));
    rows
}

/// One segment's row: its CPUs, p50s, means and added means.
fn print_row(
    without: &[RunView],
    with: &[RunView],
    target: &BTreeSet<String>,
    added: f64,
    key: &String,
) {
    let cpus: BTreeSet<u64> = without
        .iter()
        .chain(with)
        .filter_map(|r| r.breakdown.cpus.get(key))
        .flatten()
        .copied()
        .collect();
    let cpus: Vec<String> = cpus.iter().map(u64::to_string).collect();
    let mark = if target.contains(key) { "*" } else { "" };
    println!(
        "{:<26} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>12.1}",
        format!("{mark}{key}"),
        cpus.join(","),
        median_p50(without, key) / 1e3,
        median_p50(with, key) / 1e3,
        pooled_mean(without, Some(key)) / 1e3,
        pooled_mean(with, Some(key)) / 1e3,
        added / 1e3,
        (median_band_mean(with, key) - median_band_mean(without, key)) / 1e3
    );
}

/// Each CPU's busy share, median over the runs.
fn cpu_busy(runs: &[RunView]) -> String {
    let cpus = runs
        .iter()
        .map(|r| r.breakdown.cpu_busy.len())
        .max()
        .unwrap_or(0);
    (0..cpus)
        .map(|c| {
            let share = median(
                runs.iter()
                    .filter_map(|r| r.breakdown.cpu_busy.get(c).copied())
                    .collect(),
            );
            format!("cpu{c} {:.0} %", share * 100.0)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The requests around the median e2e time (ranks 45 % to 55 % of the run, at least one):
/// their mean e2e time and mean target sum. Unlike the median of the target sums, this is the
/// target's part of the requests that make the p50, and it adds up (each request's segments
/// sum to its e2e), so the share of an added p50 it gives has a remainder that other segments
/// hold, not the mismatch of two medians over different requests.
pub const BAND: (f64, f64) = (0.45, 0.55);

pub fn median_band(e2e: &[f64], target: &[f64]) -> (f64, f64) {
    let band = band_indices(e2e);
    (band_mean(&band, e2e), band_mean(&band, target))
}

/// The indices of the requests in the [`BAND`] around the median of `e2e`.
pub fn band_indices(e2e: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..e2e.len()).collect();
    order.sort_by(|&a, &b| e2e[a].total_cmp(&e2e[b]));
    let n = order.len();
    let lo = (BAND.0 * n as f64) as usize;
    let hi = ((BAND.1 * n as f64) as usize).max(lo + 1).min(n);
    order[lo.min(n.saturating_sub(1))..hi].to_vec()
}

/// The mean of `values` over the requests `band`.
pub fn band_mean(band: &[usize], values: &[f64]) -> f64 {
    band.iter().map(|&i| values[i]).sum::<f64>() / band.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_band_is_the_middle_tenth_by_e2e() {
        // 20 requests: e2e 0..19 (shuffled), target = e2e / 2. Ranks 9 and 10 are the band.
        let e2e: Vec<f64> = (0..20).map(|i| f64::from((i * 7) % 20)).collect();
        let target: Vec<f64> = e2e.iter().map(|e| e / 2.0).collect();
        assert_eq!(median_band(&e2e, &target), (9.5, 4.75));
        // One request: itself.
        assert_eq!(median_band(&[3.0], &[1.0]), (3.0, 1.0));
        // Bimodal: the median of the target sums (0) is not the median request's target (90).
        let e2e = [10.0, 10.0, 100.0, 100.0, 100.0];
        let target = [0.0, 0.0, 90.0, 0.0, 0.0];
        let (band_e2e, band_target) = median_band(&e2e, &target);
        assert_eq!(band_e2e, 100.0);
        assert_eq!(band_target, 90.0);
    }

    fn run(requests: usize, e2e: f64, sums: &[(&str, f64)]) -> RunBreakdown {
        RunBreakdown {
            requests,
            e2e_sum_ns: e2e,
            sum_ns: sums.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            cpus: BTreeMap::new(),
            cpu_busy: Vec::new(),
            band_ns: BTreeMap::new(),
        }
    }

    #[test]
    fn pooled_means_weigh_runs_by_their_requests() {
        let a = run(1, 100.0, &[("B x", 100.0)]);
        let b = run(3, 900.0, &[("B x", 300.0)]);
        let p50 = BTreeMap::new();
        let views = [
            RunView {
                breakdown: &a,
                p50_ns: &p50,
            },
            RunView {
                breakdown: &b,
                p50_ns: &p50,
            },
        ];
        assert_eq!(pooled_mean(&views, None), 250.0);
        assert_eq!(pooled_mean(&views, Some("B x")), 100.0);
        // A segment absent from every run's sums counts as 0.
        assert_eq!(pooled_mean(&views, Some("A y")), 0.0);
    }
}
