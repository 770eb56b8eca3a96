//! Latency quantiles from an HDR histogram of nanoseconds.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// 1 ns .. 60 s at 3 significant digits (0.1 % relative error).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// What `meshlab lab client --json` prints (one JSON object on stdout).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub proto: String,
    pub endpoint: String,
    pub payload: usize,
    pub concurrency: usize,
    /// Requests measured (after warm-up).
    pub requests: u64,
    /// All requests sent, warm-up included.
    pub requests_total: u64,
    pub duration_s: f64,
    pub qps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// Quantiles of `hist` (ns) in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantiles {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

pub fn quantiles(hist: &Histogram<u64>) -> Quantiles {
    let us = |ns: u64| ns as f64 / 1000.0;
    Quantiles {
        p50_us: us(hist.value_at_quantile(0.50)),
        p90_us: us(hist.value_at_quantile(0.90)),
        p99_us: us(hist.value_at_quantile(0.99)),
        p999_us: us(hist.value_at_quantile(0.999)),
        max_us: us(hist.max()),
        mean_us: hist.mean() / 1000.0,
    }
}

impl LatencySummary {
    /// The one-line human summary printed on stderr.
    pub fn line(&self) -> String {
        format!(
            "{} {} c={} payload={}B: {} requests in {:.2}s ({:.0} qps) p50={:.1}us p90={:.1}us p99={:.1}us p999={:.1}us max={:.1}us",
            self.proto,
            self.endpoint,
            self.concurrency,
            self.payload,
            self.requests,
            self.duration_s,
            self.qps,
            self.p50_us,
            self.p90_us,
            self.p99_us,
            self.p999_us,
            self.max_us
        )
    }
}
