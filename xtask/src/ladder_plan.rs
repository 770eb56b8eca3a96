//! What the cost ladder runs (crate::ladder) and reports (crate::ladder_doc): the rungs, the
//! workloads and the sizes of a full and a quick run. Kept apart so that the runner and the
//! report both depend on it and not on each other.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    Off,
    /// Empty programs (`r0 = 0; exit`) on every tracepoint the recorder attaches to, and no
    /// recorder: the dispatch floor any tracer on these hooks pays.
    EmptyPrograms,
    FilteredOut,
    Sampled,
    TracingAll,
}

impl Rung {
    pub const ALL: [Rung; 5] = [
        Rung::Off,
        Rung::EmptyPrograms,
        Rung::FilteredOut,
        Rung::Sampled,
        Rung::TracingAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rung::Off => "no recorder",
            Rung::EmptyPrograms => "empty programs, same hooks",
            Rung::FilteredOut => "attached, filtering out",
            Rung::Sampled => "sampling 1/100 messages",
            Rung::TracingAll => "tracing all",
        }
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
    pub rate_steps: &'static [u64],
    pub workloads: &'static [Workload],
}

pub const FULL: Sizes = Sizes {
    rounds: 5,
    echo_seconds: 3,
    redis_requests: 60_000,
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
    rate_steps: &[5_000],
    // Each recorder start loads and verifies every program (~2 s here): the smoke test keeps
    // one echo workload and redis, which still exercise every code path.
    workloads: &[
        Workload::Echo { concurrency: 1 },
        Workload::Redis { clients: 1 },
    ],
};
