//! What the cost ladder runs (crate::ladder) and reports (crate::ladder_doc): the rungs, the
//! workloads and the sizes of a full and a quick run. Kept apart so that the runner and the
//! report both depend on it and not on each other.

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Rung {
    #[value(name = "off")]
    Off,
    /// Empty programs (`r0 = 0; exit`) on every tracepoint the recorder attaches to, and no
    /// recorder: the dispatch floor any tracer on these hooks pays.
    #[value(name = "empty")]
    EmptyPrograms,
    #[value(name = "filtered-out")]
    FilteredOut,
    /// `record --attach on-demand` whose filters match nothing: only sock_ops is attached.
    #[value(name = "on-demand")]
    OnDemandIdle,
    #[value(name = "sampled")]
    Sampled,
    #[value(name = "all")]
    TracingAll,
}

impl Rung {
    pub const ALL: [Rung; 6] = [
        Rung::Off,
        Rung::EmptyPrograms,
        Rung::FilteredOut,
        Rung::OnDemandIdle,
        Rung::Sampled,
        Rung::TracingAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rung::Off => "no recorder",
            Rung::EmptyPrograms => "empty programs, same hooks",
            Rung::FilteredOut => "attached, filtering out",
            Rung::OnDemandIdle => "attached on demand, nothing traced",
            Rung::Sampled => "sampling 1/100 messages",
            Rung::TracingAll => "tracing all",
        }
    }
}

/// `cargo xtask bench --rungs ... --redis-only --rounds N`: a part of the ladder only (no
/// per-program costs, rate search or merge), written to target/bench-partial/, never docs/.
#[derive(clap::Args, Debug, Default)]
pub struct PartialArgs {
    /// Only these rungs (comma-separated; `off`, the baseline of every ratio, is always run).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub rungs: Vec<Rung>,
    /// Only the redis workload.
    #[arg(long)]
    pub redis_only: bool,
    /// Interleaved rounds (default: the full run's).
    #[arg(long)]
    pub rounds: Option<usize>,
}

impl PartialArgs {
    pub fn is_partial(&self) -> bool {
        !self.rungs.is_empty() || self.redis_only || self.rounds.is_some()
    }

    /// The full run's sizes cut down to what was asked for.
    pub fn sizes(&self) -> Sizes {
        Sizes {
            rounds: self.rounds.unwrap_or(FULL.rounds),
            workloads: if self.redis_only {
                &[Workload::Redis { clients: 1 }]
            } else {
                FULL.workloads
            },
            ..FULL
        }
    }

    /// The rungs to run, `off` first and always.
    pub fn rungs(&self) -> Vec<Rung> {
        Rung::ALL
            .into_iter()
            .filter(|r| *r == Rung::Off || self.rungs.is_empty() || self.rungs.contains(r))
            .collect()
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Workload {
    Echo { concurrency: usize },
    Redis { clients: usize },
}

impl Workload {
    pub fn name(self) -> String {
        match self {
            Workload::Echo { concurrency } => format!("echo RPC loopback c={concurrency}"),
            Workload::Redis { clients } => format!("redis PING two netns c={clients}"),
        }
    }
}

/// Sizes of one bench run.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub rounds: usize,
    pub echo_seconds: u64,
    pub redis_requests: u64,
    /// Seconds of `lab client --redis-ping` per redis run, for its p50 (after the
    /// redis-benchmark run that gives the throughput).
    pub redis_latency_seconds: f64,
    pub rate_steps: &'static [u64],
    pub workloads: &'static [Workload],
}

pub const FULL: Sizes = Sizes {
    rounds: 5,
    echo_seconds: 3,
    redis_requests: 60_000,
    redis_latency_seconds: 2.0,
    rate_steps: &[5_000, 10_000, 20_000, 40_000, 0],
    workloads: &[
        Workload::Echo { concurrency: 1 },
        Workload::Echo { concurrency: 32 },
        Workload::Redis { clients: 1 },
    ],
};

/// `--quick`: a smoke test of every code path (CI), no thresholds, a few minutes.
pub const QUICK: Sizes = Sizes {
    rounds: 1,
    echo_seconds: 1,
    redis_requests: 5_000,
    redis_latency_seconds: 0.5,
    rate_steps: &[5_000],
    // Each recorder start loads and verifies every program (~2 s here): the smoke test keeps
    // one echo workload and redis, which still exercise every code path.
    workloads: &[
        Workload::Echo { concurrency: 1 },
        Workload::Redis { clients: 1 },
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_run_keeps_the_baseline_and_the_asked_rungs_in_ladder_order() {
        let partial = PartialArgs {
            rungs: vec![Rung::OnDemandIdle, Rung::FilteredOut],
            redis_only: true,
            rounds: Some(3),
        };
        assert!(partial.is_partial());
        assert_eq!(
            partial.rungs(),
            [Rung::Off, Rung::FilteredOut, Rung::OnDemandIdle]
        );
        let sizes = partial.sizes();
        assert_eq!(sizes.rounds, 3);
        assert!(matches!(sizes.workloads, [Workload::Redis { clients: 1 }]));
        assert_eq!(sizes.redis_requests, FULL.redis_requests);
    }

    #[test]
    fn without_partial_flags_every_rung_runs() {
        let all = PartialArgs::default();
        assert!(!all.is_partial());
        assert_eq!(all.rungs(), Rung::ALL);
    }
}
