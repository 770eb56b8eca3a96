//! Whole-machine CPU time from /proc/stat, sampled around a benchmark run: the cost of a rung
//! in CPU per request even when throughput is bound by something else (a c=1 round trip), and
//! the time the hypervisor stole (a VM's neighbours), which no rung can be blamed for.

use anyhow::{Context, Result};

/// The aggregate `cpu` line of /proc/stat, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    /// user + nice + system + irq + softirq: every CPU doing work (guest time is inside user).
    pub busy: u64,
    /// idle + iowait.
    pub idle: u64,
    pub steal: u64,
}

impl CpuTimes {
    pub fn now() -> Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        parse(&stat).context("/proc/stat: no well-formed `cpu` line")
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            busy: self.busy.saturating_sub(earlier.busy),
            idle: self.idle.saturating_sub(earlier.idle),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }

    /// Busy CPU time in microseconds.
    pub fn busy_us(self) -> f64 {
        self.busy as f64 * 1e6 / ticks_per_second()
    }

    /// Stolen time as a percentage of all time the CPUs had.
    pub fn steal_pct(self) -> f64 {
        let all = self.busy + self.idle + self.steal;
        if all == 0 {
            return 0.0;
        }
        self.steal as f64 * 100.0 / all as f64
    }
}

/// The 1-, 5- and 15-minute load averages (/proc/loadavg), as written there.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`.
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let field = |i: usize| f.get(i).copied();
    Some(CpuTimes {
        busy: field(0)? + field(1)? + field(2)? + field(5)? + field(6)?,
        idle: field(3)? + field(4)?,
        steal: field(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_line_splits_into_busy_idle_and_steal() {
        let stat = "cpu  100 5 50 1000 20 3 7 15 0 0\ncpu0 50 2 25 500 10 1 3 7 0 0\nintr 1\n";
        let t = parse(stat).unwrap();
        assert_eq!(
            t,
            CpuTimes {
                busy: 165,
                idle: 1020,
                steal: 15
            }
        );
        let later = CpuTimes {
            busy: 265,
            idle: 1120,
            steal: 15,
        };
        let d = later.since(t);
        assert_eq!(
            d,
            CpuTimes {
                busy: 100,
                idle: 100,
                steal: 0
            }
        );
        assert_eq!(d.steal_pct(), 0.0);
        assert!(
            (CpuTimes {
                busy: 1,
                idle: 2,
                steal: 1
            }
            .steal_pct()
                - 25.0)
                .abs()
                < 1e-9
        );
        assert!(parse("cpu  1 2\n").is_none());
        assert!(parse("intr 1\n").is_none());
    }
}
