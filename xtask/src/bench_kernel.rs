//! `cargo xtask bench kernel-ab --baseline OLD_MESHLAB`: per-program BPF cost of two builds of
//! the recorder side by side (issue 10's kernel hot path). The cost ladder (crate::ladder)
//! measures one build per run; on this noisy 2-core machine a before/after across runs says
//! little, so here the two builds alternate round by round (order rotated) under the same
//! workload, and each program's ns/run is the median over rounds.
//!
//! Workload: redis PING across two namespaces, as the ladder's per-program pass. Rungs:
//! attached but filtering out, sampling 1/100 messages, tracing all. An empty program on
//! netif_receive_skb gives the floor (crate::bpffloor). Markdown to stdout, with each hot
//! program's helper call sites in both builds (`bpftool prog dump xlated`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::bench_merge::machine;
use crate::bpffloor;
use crate::bpfstats::{self, ProgramCost, StatsEnabled};
use crate::ladder::{median_costs, record_args, spawn_recorder};
use crate::ladder_plan::{Rung, Workload};
use crate::machine_cpu::loadavg;
use crate::procs::tempdir;
use crate::redis_lab::{REDIS_PORT, RedisLab};

#[derive(clap::Args)]
pub struct KernelAbArgs {
    /// The `meshlab` binary to compare against (e.g. built from main); its eBPF object is
    /// embedded in it.
    #[arg(long)]
    baseline: PathBuf,
    /// The candidate; default: target/debug/meshlab of this tree (`cargo build` first).
    #[arg(long)]
    candidate: Option<PathBuf>,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// redis-benchmark PING requests per measured run.
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// An extra `meshlab record` argument for the candidate only (repeatable), e.g.
    /// `--candidate-arg=--tx-timestamps` with the same binary as baseline: the cost of a
    /// recording option rather than of a build.
    #[arg(long = "candidate-arg", allow_hyphen_values = true)]
    candidate_args: Vec<String>,
    /// Measure only this rung (repeatable); default: all three, in this order.
    #[arg(long = "rung", value_enum)]
    rungs: Vec<AbRung>,
}

/// The rungs kernel-ab can measure.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AbRung {
    FilteredOut,
    Sampled,
    TracingAll,
}

impl AbRung {
    fn rung(self) -> Rung {
        match self {
            AbRung::FilteredOut => Rung::FilteredOut,
            AbRung::Sampled => Rung::Sampled,
            AbRung::TracingAll => Rung::TracingAll,
        }
    }
}

const ALL_RUNGS: [AbRung; 3] = [AbRung::FilteredOut, AbRung::Sampled, AbRung::TracingAll];
const CLIENTS: usize = 1;
const WORKLOAD: Workload = Workload::Redis { clients: CLIENTS };

pub fn run(args: KernelAbArgs) -> Result<()> {
    let candidate = args
        .candidate
        .unwrap_or_else(|| crate::target_dir().join("debug/meshlab"));
    // The candidate's label carries its extra record arguments into the report.
    let candidate_label = format!("{} {}", candidate.display(), args.candidate_args.join(" "));
    let rungs: Vec<Rung> = ALL_RUNGS
        .iter()
        .filter(|r| args.rungs.is_empty() || args.rungs.contains(r))
        .map(|r| r.rung())
        .collect();
    let builds = [("baseline", args.baseline), ("candidate", candidate)];
    for (_, exe) in &builds {
        anyhow::ensure!(exe.exists(), "{}: no such recorder binary", exe.display());
    }
    let load_before = loadavg();
    let dir = tempdir()?;
    let redis = RedisLab::start()?;
    let _stats = StatsEnabled::on()?;
    let _floor = bpffloor::attach_empty("netif_receive_skb")?;
    // (rung, build) -> per-round costs
    let mut rounds: BTreeMap<(usize, usize), Vec<Vec<ProgramCost>>> = BTreeMap::new();
    let mut calls: [CallSites; 2] = Default::default();
    for round in 0..args.rounds {
        for (r, &rung) in rungs.iter().enumerate() {
            for k in 0..builds.len() {
                let b = (round + k) % builds.len();
                let want_calls = calls[b].is_empty();
                let extra: &[String] = if b == 1 { &args.candidate_args } else { &[] };
                let run = Run {
                    rung,
                    requests: args.requests,
                    extra,
                };
                let (costs, sites) = measure(&builds[b].1, &dir, &redis, &run, want_calls)?;
                if want_calls {
                    calls[b] = sites;
                }
                eprintln!(
                    "bench kernel-ab: round {round} {:<24} {}",
                    rung.name(),
                    builds[b].0
                );
                rounds.entry((r, b)).or_default().push(costs);
            }
        }
    }
    let load = format!("{load_before} before, {} after", loadavg());
    let labels = [builds[0].1.display().to_string(), candidate_label];
    let report = Report {
        builds: &labels,
        rungs: &rungs,
        rounds: &rounds,
        calls: &calls,
        load: &load,
        round_count: args.rounds,
        requests: args.requests,
    };
    print_report(&report)
}

/// What one kernel-ab run measured.
struct Report<'a> {
    builds: &'a [String; 2],
    rungs: &'a [Rung],
    /// (rung index, build) -> per-round costs
    rounds: &'a BTreeMap<(usize, usize), Vec<Vec<ProgramCost>>>,
    calls: &'a [CallSites; 2],
    load: &'a str,
    round_count: usize,
    requests: u64,
}

/// Program name -> helper name -> call sites in its translated code (all paths).
type CallSites = BTreeMap<String, BTreeMap<String, u32>>;

/// Helper call sites of every program process `pid` holds, from `bpftool prog dump xlated`
/// (lines like `call bpf_probe_read_kernel#123`).
fn call_sites(pid: u32) -> Result<CallSites> {
    let mut out = CallSites::new();
    for (id, name) in bpfstats::programs_held_by(pid)? {
        let dump = std::process::Command::new("bpftool")
            .args(["prog", "dump", "xlated", "id", &id.to_string()])
            .output()
            .context("running bpftool prog dump xlated")?;
        let mut helpers = BTreeMap::new();
        for line in String::from_utf8_lossy(&dump.stdout).lines() {
            // `call pc+N` is a call of a BPF subprogram, not a helper.
            if let Some(call) = line.split("call ").nth(1).filter(|c| !c.starts_with("pc")) {
                let helper = call.split('#').next().unwrap_or(call).trim().to_owned();
                *helpers.entry(helper).or_insert(0) += 1;
            }
        }
        out.insert(name, helpers);
    }
    Ok(out)
}

/// What one measured run records and sends.
struct Run<'a> {
    rung: Rung,
    requests: u64,
    /// Extra `meshlab record` arguments (the candidate's `--candidate-arg`s).
    extra: &'a [String],
}

/// One recorder run: the recorder's programs and the floor, deltas over the workload.
fn measure(
    exe: &std::path::Path,
    dir: &std::path::Path,
    redis: &RedisLab,
    run: &Run,
    want_calls: bool,
) -> Result<(Vec<ProgramCost>, CallSites)> {
    let mut args = record_args(run.rung, REDIS_PORT).context("every kernel-ab rung records")?;
    args.extend(run.extra.iter().cloned());
    let recorder = spawn_recorder(exe, dir, &args)?;
    let sites = if want_calls {
        call_sites(recorder.0.id())?
    } else {
        CallSites::new()
    };
    let costs = bpfstats::costs_over(recorder.0.id(), || redis.ping(CLIENTS, run.requests))?;
    Ok((costs, sites))
}

fn print_report(report: &Report) -> Result<()> {
    use std::io::Write;
    let Report {
        builds,
        rungs,
        rounds,
        calls,
        load,
        round_count,
        requests,
    } = report;
    let mut out = std::io::stdout().lock();
    let mut text = format!(
        "Workload: {} ({requests} requests per run); {round_count} rounds, builds alternated \
         per round; median ns/run per program (`kernel.bpf_stats_enabled`). baseline = {}, \
         candidate = {}. On {}, load average {load}.\n",
        WORKLOAD.name(),
        builds[0],
        builds[1].trim_end(),
        machine()
    );
    for (r, rung) in rungs.iter().enumerate() {
        let medians: [BTreeMap<String, ProgramCost>; 2] = [0, 1].map(|b| {
            median_costs(rounds.get(&(r, b)).map_or(&[][..], |v| v.as_slice()))
                .into_iter()
                .map(|c| (c.name.clone(), c))
                .collect()
        });
        text += &rung_table(*rung, &medians);
    }
    text += &call_table(calls);
    match out.write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the report to stdout"),
    }
}

/// One rung's table: each program's median ns/run in both builds and their ratio.
fn rung_table(rung: Rung, medians: &[BTreeMap<String, ProgramCost>; 2]) -> String {
    let mut text = format!(
        "\n### {}\n\n| program | runs per run | baseline ns/run | candidate ns/run | \
         candidate / baseline | candidate - floor ns | xlated B baseline / candidate |\n\
         |---|---|---|---|---|---|---|\n",
        rung.name()
    );
    // What a program costs above the empty program's run of the same build and rung.
    let floor = medians[1]
        .get(bpffloor::FLOOR_PROGRAM)
        .map(|c| c.ns_per_run);
    let names: std::collections::BTreeSet<&String> =
        medians.iter().flat_map(|m| m.keys()).collect();
    let ns = |c: Option<&ProgramCost>| c.map_or("-".into(), |c| format!("{:.1}", c.ns_per_run));
    let size = |c: Option<&ProgramCost>| c.map_or("-".into(), |c| c.bytes_xlated.to_string());
    for name in names {
        let (a, b) = (medians[0].get(name), medians[1].get(name));
        let ratio = match (a, b) {
            (Some(a), Some(b)) if a.ns_per_run > 0.0 => {
                format!("{:.2}", b.ns_per_run / a.ns_per_run)
            }
            _ => "-".into(),
        };
        let runs = b.or(a).map_or(0, |c| c.runs);
        let above = match (b, floor) {
            (Some(b), Some(floor)) => format!("{:+.1}", b.ns_per_run - floor),
            _ => "-".into(),
        };
        text += &format!(
            "| {name} | {runs} | {} | {} | {ratio} | {above} | {} / {} |\n",
            ns(a),
            ns(b),
            size(a),
            size(b)
        );
    }
    text
}

/// Helper call sites per program, baseline -> candidate, one column per helper.
fn call_table(calls: &[CallSites; 2]) -> String {
    let helpers: std::collections::BTreeSet<&String> = calls
        .iter()
        .flat_map(|c| c.values().flat_map(|h| h.keys()))
        .collect();
    let mut text = String::from(
        "\n### Helper call sites (all paths of the translated code; baseline -> candidate)\n\n| program |",
    );
    for helper in &helpers {
        text += &format!(" {helper} |");
    }
    text += "\n|---|";
    text += &"---|".repeat(helpers.len());
    text += "\n";
    let programs: std::collections::BTreeSet<&String> =
        calls.iter().flat_map(|c| c.keys()).collect();
    for program in programs {
        text += &format!("| {program} |");
        for helper in &helpers {
            let n = |b: usize| calls[b].get(program).and_then(|h| h.get(*helper)).copied();
            text += &match (n(0), n(1)) {
                (None, None) => " |".to_owned(),
                (a, b) => format!(" {} -> {} |", a.unwrap_or(0), b.unwrap_or(0)),
            };
        }
        text += "\n";
    }
    text
}
