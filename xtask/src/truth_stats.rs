//! The statistics of `cargo xtask truth`'s runs and the table that compares them: per run, the
//! medians over the merged file's complete requests (e2e, the cause's segments, every other
//! segment); per condition, the median over its runs; the table of added e2e p50 and the share
//! recovered where the cause lives (docs/truth.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::truth_breakdown::{self, RunBreakdown};
use crate::truth_cause::{ALL_CAUSES, Cause, parse_segment};
use crate::truth_lab::median;
use crate::truth_reference;
use crate::truth_retransmit::{self, Retransmissions, retransmissions};

/// One run's per-request medians (complete requests only).
pub struct RunStats {
    pub e2e_p50_ns: f64,
    pub target_p50_ns: f64,
    /// Mean e2e time and target sum of the requests around the median (`median_band`).
    pub(crate) band_ns: (f64, f64),
    /// Median per (node, segment name), to name where an unrecovered share went.
    pub(crate) per_segment_p50_ns: BTreeMap<String, f64>,
    /// The (node, segment name) keys the cause's target matched.
    pub(crate) target_keys: BTreeSet<String>,
    /// Sums and CPUs per segment, for `--breakdown`.
    pub(crate) breakdown: RunBreakdown,
    /// Median per (node, segment name) over the requests that have the segment: what the
    /// bpftrace reference measures (it times only intervals that happened).
    pub(crate) present_p50_ns: BTreeMap<String, f64>,
    pub requests: usize,
    /// Run time of both recorders' BPF programs over their recordings, per request of the
    /// merged run, as `meshlab report` computes it (`own_cost`): the tracer's own kernel time.
    /// Machine-wide: the scheduler programs run on every context switch of every process, so
    /// a busy machine raises it. `None` when a recording says it was not measured
    /// (`kernel.bpf_stats_enabled` is one switch for the machine: another session may turn it
    /// off during a run).
    pub(crate) bpf_ns_per_request: Option<f64>,
    /// Both recorder processes' own CPU time (user, kernel) over their recordings, per request,
    /// from the same report.
    pub(crate) recorder_cpu_ns_per_request: CpuTimes,
    /// What bpftrace measured, in the runs the reference watched.
    pub(crate) reference: Option<truth_reference::BpftraceRun>,
    /// The report's own-cost estimate per stage on the client's node (reference runs only):
    /// the mean run time of meshlab's programs at the stage's two ends, over the recording.
    pub(crate) client_stage_own_ns: BTreeMap<String, f64>,
    /// Every BPF program loaded on the machine at the end of the run (reference runs only).
    pub(crate) loaded_programs: Vec<String>,
    /// The requests the merge noted retransmitted (host runs; the guests count per boot).
    pub(crate) retransmissions: Retransmissions,
}

/// User and kernel CPU time, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct CpuTimes {
    pub(crate) user_ns: f64,
    pub(crate) kernel_ns: f64,
}

/// Both recorders' own cost per request, as the report's "meshlab's own cost" computes it
/// (report/own_cost.rs, docs/report.md): the sum over the nodes of its `bpf_ns_per_request`
/// (each node's BPF program run time over the report's requests), and the nodes' recorder
/// CPU time (getrusage over the recording) over the same requests. BPF run time is `None`
/// when a node's recording says it was not measured.
pub(crate) fn own_cost_per_request(report: &serde_json::Value) -> Result<(Option<f64>, CpuTimes)> {
    let own = &report["own_cost"];
    let requests = own["requests"]
        .as_u64()
        .filter(|&n| n > 0)
        .context("no requests")?;
    let nodes = own["nodes"].as_array().context("no nodes")?;
    if nodes.is_empty() {
        bail!("no node has a self_cost");
    }
    let (mut bpf, mut cpu) = (Some(0.0), CpuTimes::default());
    for node in nodes {
        let name = node["node"].as_str().unwrap_or("?");
        let field = |key: &str| {
            node[key]
                .as_f64()
                .with_context(|| format!("node {name}: no {key}"))
        };
        bpf = match node["bpf_stats"].as_str() {
            Some("measured") => bpf
                .zip(Some(field("bpf_ns_per_request")?))
                .map(|(a, b)| a + b),
            Some("not_measured") => None,
            other => bail!("node {name}: bpf_stats {other:?}"),
        };
        cpu.user_ns += field("user_cpu_ns")? / requests as f64;
        cpu.kernel_ns += field("sys_cpu_ns")? / requests as f64;
    }
    Ok((bpf, cpu))
}

/// The sum of a merged request's segments where the cause lives.
pub fn target_ns(request: &serde_json::Value, cause: Cause) -> u64 {
    (request["segments"].as_array().into_iter().flatten())
        .filter_map(parse_segment)
        .filter(|seg| cause.is_target(seg))
        .map(|seg| seg.dur_ns)
        .sum()
}

/// Reads a merged file: medians over its complete requests, and its retransmitted requests.
pub(crate) fn run_stats(merged: &Path, cause: Cause) -> Result<RunStats> {
    let records = crate::read_ndjson(merged)?;
    let mut stats =
        request_stats(records.iter(), cause).with_context(|| merged.display().to_string())?;
    let requests = records.iter().filter(|v| v["type"] == "request");
    stats.retransmissions = retransmissions(requests, |r| target_ns(r, cause));
    Ok(stats)
}

/// Medians over the complete requests among `records` (other records are skipped).
pub fn request_stats<'a>(
    records: impl Iterator<Item = &'a serde_json::Value>,
    cause: Cause,
) -> Result<RunStats> {
    let (mut e2e, mut target) = (Vec::new(), Vec::new());
    let mut requests: Vec<BTreeMap<String, u64>> = Vec::new();
    let mut target_keys = BTreeSet::new();
    let mut cpus: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for v in records {
        if v["type"] != "request" || v["complete"] != true {
            continue;
        }
        // A connection's first request (stream offset 0) includes the start of the server's
        // connection thread (its first wait is `rx_socket_queue` of a thread without scheduler
        // events yet, long with the hogs): not the steady state the causes are put into.
        if v["trace_id"].as_str().is_some_and(|t| t.ends_with("@0")) {
            continue;
        }
        let e2e_ns = v["e2e_ns"]
            .as_u64()
            .with_context(|| format!("request without e2e_ns: {}", v["trace_id"]))?;
        let segments = v["segments"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        let mut target_ns = 0;
        for seg in segments.iter().filter_map(parse_segment) {
            let key = format!("{} {}", seg.node, seg.name);
            if let Some(cpu) = seg.cpu {
                cpus.entry(key.clone()).or_default().insert(cpu);
            }
            if cause.is_target(&seg) {
                target_ns += seg.dur_ns;
                target_keys.insert(key.clone());
            }
            *sums.entry(key).or_default() += seg.dur_ns;
        }
        requests.push(sums);
        e2e.push(e2e_ns as f64);
        target.push(target_ns as f64);
    }
    if e2e.is_empty() {
        bail!("no complete request");
    }
    let (per_segment, present) = per_segment_samples(&requests);
    let band = truth_breakdown::band_indices(&e2e);
    let mut band_ns: BTreeMap<String, f64> = per_segment
        .iter()
        .map(|(k, v)| (k.clone(), truth_breakdown::band_mean(&band, v)))
        .collect();
    band_ns.insert(
        truth_breakdown::E2E.to_owned(),
        truth_breakdown::band_mean(&band, &e2e),
    );
    let breakdown = RunBreakdown {
        band_ns,
        requests: e2e.len(),
        e2e_sum_ns: e2e.iter().sum(),
        sum_ns: per_segment
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().sum()))
            .collect(),
        cpus,
        cpu_busy: Vec::new(),
    };
    Ok(RunStats {
        requests: e2e.len(),
        band_ns: truth_breakdown::median_band(&e2e, &target),
        e2e_p50_ns: median(e2e),
        target_p50_ns: median(target),
        bpf_ns_per_request: None,
        recorder_cpu_ns_per_request: CpuTimes::default(),
        reference: None,
        client_stage_own_ns: BTreeMap::new(),
        loaded_programs: Vec::new(),
        per_segment_p50_ns: medians(per_segment),
        target_keys,
        present_p50_ns: medians(present),
        breakdown,
        retransmissions: Retransmissions::default(),
    })
}

/// Per segment key, one duration per request.
type Samples = BTreeMap<String, Vec<f64>>;

/// Per segment its duration in every request (0 where absent: an optional stage) and in the
/// requests that have it.
pub(crate) fn per_segment_samples(requests: &[BTreeMap<String, u64>]) -> (Samples, Samples) {
    let keys: BTreeSet<&String> = requests.iter().flat_map(|r| r.keys()).collect();
    let mut per_segment: Samples = BTreeMap::new();
    let mut present: Samples = BTreeMap::new();
    for key in keys {
        // A segment absent from a request (an optional stage) counts as 0 there.
        let all: Vec<f64> = requests
            .iter()
            .map(|r| r.get(key).copied().unwrap_or(0) as f64)
            .collect();
        let had: Vec<f64> = requests
            .iter()
            .filter_map(|r| r.get(key).map(|&ns| ns as f64))
            .collect();
        per_segment.insert(key.clone(), all);
        present.insert(key.clone(), had);
    }
    (per_segment, present)
}

pub(crate) fn medians(samples: BTreeMap<String, Vec<f64>>) -> BTreeMap<String, f64> {
    samples.into_iter().map(|(k, v)| (k, median(v))).collect()
}

pub(crate) fn condition_median(runs: &[RunStats], f: impl Fn(&RunStats) -> f64) -> f64 {
    median(runs.iter().map(f).collect())
}

/// The segment (other than the cause's own) whose median grew most.
pub(crate) fn largest_other_growth(without: &[RunStats], with: &[RunStats]) -> String {
    let keys: Vec<&String> = with
        .iter()
        .flat_map(|r| r.per_segment_p50_ns.keys())
        .collect();
    let mut best: Option<(f64, &String)> = None;
    for key in keys {
        // A segment that was the cause's target in any run is not "other".
        if with
            .iter()
            .chain(without)
            .any(|r| r.target_keys.contains(key))
        {
            continue;
        }
        let at = |runs: &[RunStats]| {
            condition_median(runs, |r| {
                r.per_segment_p50_ns.get(key).copied().unwrap_or(0.0)
            })
        };
        let growth = at(with) - at(without);
        if best.is_none_or(|(g, _)| growth > g) {
            best = Some((growth, key));
        }
    }
    best.map(|(g, k)| format!("{k} {:+.1}", g / 1e3))
        .unwrap_or_default()
}

/// A share is shown only when the cause added more than this fraction of the p50 without it.
const MIN_ADDED_FRACTION: f64 = 0.1;

/// What the table's title says about the runs, and whether the self-accounting columns were
/// measured (the guest runs do not measure them: "-").
pub struct TableSetting {
    pub title: String,
    pub self_cost: bool,
}

impl TableSetting {
    pub(crate) fn namespaces(rounds: usize, seconds: u64) -> Self {
        Self {
            title: format!(
                "kernel-only recording, two namespaces, c=1, {rounds} interleaved round(s) x \
                 {seconds}s per run"
            ),
            self_cost: true,
        }
    }
}

pub fn print_table(results: &BTreeMap<(Cause, bool), Vec<RunStats>>, setting: &TableSetting) {
    println!("\nattribution truth: {}, medians (us)", setting.title);
    println!(
        "(share: recovered / added, recovered = added median of the per-request target sums; \
         at p50: the same over the requests around the median ({:.0}-{:.0} % by e2e, the added \
         mean target over the added mean e2e); n/a when the cause added less than {:.0} % of the \
         p50; per request, with the cause: BPF = both recorders' BPF program run time, rec \
         usr/sys = the recorder processes' own user/kernel CPU time, over the recordings, as \
         `meshlab report` computes them; * = some runs had BPF statistics off, n/m = all)",
        truth_breakdown::BAND.0 * 100.0,
        truth_breakdown::BAND.1 * 100.0,
        MIN_ADDED_FRACTION * 100.0
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9}  {:<18} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8}  largest other growth",
        "cause",
        "e2e off",
        "e2e on",
        "added",
        "segment",
        "recovered",
        "share",
        "at p50",
        "BPF/req",
        "rec usr",
        "rec sys"
    );
    for cause in ALL_CAUSES {
        let (Some(off), Some(on)) = (results.get(&(cause, false)), results.get(&(cause, true)))
        else {
            continue;
        };
        let e2e = |runs: &[RunStats]| condition_median(runs, |r| r.e2e_p50_ns) / 1e3;
        let target = |runs: &[RunStats]| condition_median(runs, |r| r.target_p50_ns) / 1e3;
        let added = e2e(on) - e2e(off);
        let recovered = target(on) - target(off);
        let band = |runs: &[RunStats], f: fn(&(f64, f64)) -> f64| {
            condition_median(runs, |r| f(&r.band_ns))
        };
        let band_added = band(on, |b| b.0) - band(off, |b| b.0);
        let band_recovered = band(on, |b| b.1) - band(off, |b| b.1);
        // A share of a difference inside the run-to-run noise would be a random number.
        let meaningful = added > e2e(off) * MIN_ADDED_FRACTION;
        let percent = |part: f64, whole: f64| {
            if meaningful {
                format!("{:>6.0}%", part / whole * 100.0)
            } else {
                format!("{:>7}", "n/a")
            }
        };
        let share = percent(recovered, added);
        let at_p50 = percent(band_recovered, band_added);
        let cost = |f: fn(&RunStats) -> Option<f64>| {
            if setting.self_cost {
                cost_cell(&on.iter().map(f).collect::<Vec<_>>())
            } else {
                format!("{:>8}", "-")
            }
        };
        println!(
            "{:<28} {:>9.1} {:>9.1} {:>9.1}  {:<18} {:>9.1} {share} {at_p50} {} {} {}  {}",
            cause.name(),
            e2e(off),
            e2e(on),
            added,
            cause.target_name(),
            recovered,
            cost(|r| r.bpf_ns_per_request),
            cost(|r| Some(r.recorder_cpu_ns_per_request.user_ns)),
            cost(|r| Some(r.recorder_cpu_ns_per_request.kernel_ns)),
            largest_other_growth(off, on)
        );
    }
}

/// A self-cost column's cell, in us: the median over the runs that measured it, marked `*`
/// when some runs did not; `n/m` when none did.
pub(crate) fn cost_cell(per_run_ns: &[Option<f64>]) -> String {
    let measured: Vec<f64> = per_run_ns.iter().flatten().copied().collect();
    if measured.is_empty() {
        format!("{:>8}", "n/m")
    } else if measured.len() < per_run_ns.len() {
        format!("{:>7.1}*", median(measured) / 1e3)
    } else {
        format!("{:>8.1}", median(measured) / 1e3)
    }
}

/// The retransmitted requests of the causes that lose frames, all runs of each condition.
pub(crate) fn print_retransmissions(results: &BTreeMap<(Cause, bool), Vec<RunStats>>) {
    if !results.keys().any(|(cause, _)| cause.loses_frames()) {
        return;
    }
    truth_retransmit::print_header();
    for ((cause, on), runs) in results
        .iter()
        .filter(|((cause, _), _)| cause.loses_frames())
    {
        let mut counts = Retransmissions::default();
        runs.iter().for_each(|run| counts.add(&run.retransmissions));
        truth_retransmit::print_row(cause.name(), cause.target_name(), *on, &counts);
    }
}

pub fn print_breakdowns(results: &BTreeMap<(Cause, bool), Vec<RunStats>>) {
    for cause in ALL_CAUSES {
        let (Some(off), Some(on)) = (results.get(&(cause, false)), results.get(&(cause, true)))
        else {
            continue;
        };
        fn view(runs: &[RunStats]) -> Vec<truth_breakdown::RunView<'_>> {
            runs.iter()
                .map(|r| truth_breakdown::RunView {
                    breakdown: &r.breakdown,
                    p50_ns: &r.per_segment_p50_ns,
                })
                .collect()
        }
        let target: BTreeSet<String> = off
            .iter()
            .chain(on)
            .flat_map(|r| r.target_keys.iter().cloned())
            .collect();
        let e2e = |runs: &[RunStats]| condition_median(runs, |r| r.e2e_p50_ns);
        truth_breakdown::print(
            cause.name(),
            &view(off),
            &view(on),
            &target,
            (e2e(off), e2e(on)),
        );
    }
}
