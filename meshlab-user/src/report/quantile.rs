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

    /// p50 of the first and of the second half of the samples in input order (the first half
    /// gets the odd one out). Used as the run's noise estimate in `--compare`; must be called
    /// before [`Samples::finish`] reorders the values.
    pub fn half_medians(&self) -> Option<(u64, u64)> {
        assert!(!self.sorted, "half medians need input order");
        if self.values.len() < 2 {
            return None;
        }
        let split = self.values.len().div_ceil(2);
        let median = |part: &[u64]| {
            let mut v = part.to_vec();
            v.sort_unstable();
            v[nearest_rank_index(500, v.len())]
        };
        Some((median(&self.values[..split]), median(&self.values[split..])))
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
        assert_eq!(s.half_medians(), Some((10, 20)));
        let st = s.finish().unwrap();
        assert_eq!((st.n, st.p50_ns, st.p90_ns, st.p99_ns), (4, 20, 40, 40));
        assert_eq!(st.mean_ns, 25.0);
        assert_eq!(s.sorted(), &[10, 20, 30, 40]);
    }

    #[test]
    fn empty_has_no_stats() {
        assert!(Samples::default().finish().is_none());
        assert!(Samples::default().half_medians().is_none());
    }
}
