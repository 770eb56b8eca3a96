//! Exact quantiles by the nearest-rank method (documented in docs/report.md).
//!
//! For `n` sorted samples the q-quantile (0 < q <= 1) is the sample at 1-based rank
//! `ceil(q * n)`: always a value that was measured, never an interpolation between two
//! requests. p50 of `[1, 2, 3, 4]` is 2, p99 of 100 samples is the 99th smallest.

use serde::Serialize;

/// 1-based nearest rank of quantile `q` among `n` samples, as a 0-based index.
///
/// `q` is given in per-mille (500 = p50, 990 = p99) so the rank is computed in integers and
/// cannot suffer from `0.99 * 100 = 98.99999`.
pub fn nearest_rank_index(per_mille: u32, n: usize) -> usize {
    assert!(n > 0, "quantile of no samples");
    assert!(
        (1..=1000).contains(&per_mille),
        "quantile must be in (0, 1]"
    );
    let rank = (per_mille as usize * n).div_ceil(1000);
    rank.max(1) - 1
}

/// Blocks for [`Samples::median_standard_error`].
pub const BATCHES: usize = 8;

/// Summary figures of one distribution of durations, in nanoseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stats {
    pub n: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub mean_ns: f64,
    pub sum_ns: u128,
}

/// Durations collected in input order; sorted once when the figures are asked for.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    values: Vec<u64>,
    sorted: bool,
}

impl Samples {
    pub fn push(&mut self, ns: u64) {
        self.values.push(ns);
        self.sorted = false;
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Standard error of the p50 by batch medians: the samples, in input order (time order of
    /// the run), are cut into `k = min(BATCHES, n / 2)` consecutive blocks; the spread of the
    /// blocks' p50s (sample standard deviation / sqrt(k)) estimates how far the run's p50 could
    /// move by chance or by drift during the run. `None` below 4 samples. Must be called before
    /// [`Samples::finish`] reorders the values.
    pub fn median_standard_error(&self) -> Option<f64> {
        assert!(!self.sorted, "batch medians need input order");
        let n = self.values.len();
        let k = BATCHES.min(n / 2);
        if k < 2 {
            return None;
        }
        let medians: Vec<f64> = (0..k)
            .map(|i| {
                let mut block = self.values[i * n / k..(i + 1) * n / k].to_vec();
                block.sort_unstable();
                block[nearest_rank_index(500, block.len())] as f64
            })
            .collect();
        let mean = medians.iter().sum::<f64>() / k as f64;
        let var = medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (k - 1) as f64;
        Some(var.sqrt() / (k as f64).sqrt())
    }

    /// Sorts the samples (once) and returns the figures; `None` when there are none.
    pub fn finish(&mut self) -> Option<Stats> {
        if self.values.is_empty() {
            return None;
        }
        if !self.sorted {
            self.values.sort_unstable();
            self.sorted = true;
        }
        let sum: u128 = self.values.iter().map(|&v| u128::from(v)).sum();
        Some(Stats {
            n: self.values.len() as u64,
            p50_ns: self.quantile(500),
            p90_ns: self.quantile(900),
            p99_ns: self.quantile(990),
            mean_ns: sum as f64 / self.values.len() as f64,
            sum_ns: sum,
        })
    }

    /// Nearest-rank quantile; only after [`Samples::finish`].
    pub fn quantile(&self, per_mille: u32) -> u64 {
        assert!(self.sorted, "quantile before finish()");
        self.values[nearest_rank_index(per_mille, self.values.len())]
    }

    /// The sorted values; only after [`Samples::finish`].
    pub fn sorted(&self) -> &[u64] {
        assert!(self.sorted, "sorted() before finish()");
        &self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_matches_the_definition() {
        assert_eq!(nearest_rank_index(500, 4), 1);
        assert_eq!(nearest_rank_index(500, 5), 2);
        assert_eq!(nearest_rank_index(990, 100), 98);
        assert_eq!(nearest_rank_index(990, 101), 99);
        assert_eq!(nearest_rank_index(900, 1), 0);
        assert_eq!(nearest_rank_index(1000, 7), 6);
        assert_eq!(nearest_rank_index(1, 7), 0);
    }

    #[test]
    fn stats_of_a_small_set() {
        let mut s = Samples::default();
        for v in [40, 10, 30, 20] {
            s.push(v);
        }
        // Two blocks [40, 10] and [30, 20]: p50s 10 and 20, sd 7.07, se 5.
        assert!((s.median_standard_error().unwrap() - 5.0).abs() < 1e-9);
        let st = s.finish().unwrap();
        assert_eq!((st.n, st.p50_ns, st.p90_ns, st.p99_ns), (4, 20, 40, 40));
        assert_eq!(st.mean_ns, 25.0);
        assert_eq!(s.sorted(), &[10, 20, 30, 40]);
    }

    #[test]
    fn batch_medians_use_eight_consecutive_blocks() {
        // 16 samples -> 8 blocks of 2; block p50 = the smaller of each pair: 0, 10, ..., 70.
        let mut s = Samples::default();
        for i in 0..8u64 {
            s.push(i * 10 + 5);
            s.push(i * 10);
        }
        let sd = (0..8)
            .map(|i| (f64::from(i) * 10.0 - 35.0).powi(2))
            .sum::<f64>()
            / 7.0;
        assert!((s.median_standard_error().unwrap() - sd.sqrt() / 8f64.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn empty_has_no_stats() {
        assert!(Samples::default().finish().is_none());
        assert!(Samples::default().median_standard_error().is_none());
        let mut three = Samples::default();
        for v in [1, 2, 3] {
            three.push(v);
        }
        assert!(three.median_standard_error().is_none());
    }
}
