//! The ladder's per-cell figures and how rounds are summarised: (min, median, max) of a value
//! over rounds, and ratios paired round by round, so a slow round (other load on a shared
//! machine) moves both sides of its ratio instead of one median.

use crate::ladder_plan::Rung;
use crate::machine_cpu::CpuTimes;

/// One workload run: what the load generator reported.
pub struct WorkloadRun {
    pub throughput: f64,
    pub p50_us: f64,
    /// Requests the run sent (warm-up included: the machine CPU is sampled around all of it).
    pub requests: f64,
}

/// (min, median, max).
pub type Spread = (f64, f64, f64);

/// One (workload, rung) cell: a value per round, in round order.
pub struct RungResult {
    pub workload: String,
    pub rung: Rung,
    pub throughput: Vec<f64>,
    pub p50_us: Vec<f64>,
    /// Busy CPU of the whole machine (every process and the kernel) per request.
    pub cpu_us_per_req: Vec<f64>,
    /// Share of the run's CPU time the hypervisor stole.
    pub steal_pct: Vec<f64>,
}

impl RungResult {
    pub fn new(workload: String, rung: Rung) -> RungResult {
        RungResult {
            workload,
            rung,
            throughput: Vec::new(),
            p50_us: Vec::new(),
            cpu_us_per_req: Vec::new(),
            steal_pct: Vec::new(),
        }
    }

    pub fn add(&mut self, run: &WorkloadRun, machine: CpuTimes) {
        self.throughput.push(run.throughput);
        self.p50_us.push(run.p50_us);
        self.cpu_us_per_req
            .push(machine.busy_us() / run.requests.max(1.0));
        self.steal_pct.push(machine.steal_pct());
    }
}

/// (min, median, max); NaN for no values.
pub fn spread(v: &[f64]) -> Spread {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    (s[0], s[s.len() / 2], s[s.len() - 1])
}

/// `cell[i] / base[i]` for every round both have, summarised by [`spread`].
pub fn paired(cell: &[f64], base: &[f64]) -> Spread {
    let ratios: Vec<f64> = cell.iter().zip(base).map(|(c, b)| c / b).collect();
    spread(&ratios)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_min_median_max() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 2.0, 3.0));
        assert!(spread(&[]).1.is_nan());
    }

    #[test]
    fn paired_ratios_follow_a_slow_round_on_both_sides() {
        // Round 2 ran on a loaded machine: both sides halve, its ratio does not move.
        let base = [100.0, 100.0, 50.0];
        let cell = [90.0, 92.0, 45.0];
        assert_eq!(paired(&cell, &base), (0.9, 0.9, 0.92));
        assert!(paired(&[1.0], &[]).1.is_nan());
    }
}
