//! `cargo xtask bench`: the recorder's cost ladder (issue 10, item 5 a-c).
//!
//! Rungs: no recorder / empty programs on the recorder's tracepoints / recorder attached but
//! filtering this traffic out / recorder attached on demand with nothing traced / sampling
//! 1/100 of messages / tracing everything. Workloads: the lab echo RPC on loopback (c=1, c=32, unlimited
//! rate) and redis-benchmark PING against redis-server across two network namespaces. Rungs
//! are interleaved round by round (rotated order) and compared by medians. While a recorder
//! runs, the kernel's BPF statistics give each of its programs' ns/run. Finally the highest
//! event rate recorded without a drop is searched on the echo RPC.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result};

use crate::bench_recorder::proc_cpu_s;
use crate::bpffloor;
use crate::bpfstats::{self, ProgramCost, StatsEnabled};
use crate::ladder_doc::{self, LadderReport, RateStep, RungResult};
use crate::ladder_plan::{Rung, Sizes, Workload};
use crate::ladder_stats::WorkloadRun;
use crate::machine_cpu::{CpuTimes, loadavg};
use crate::procs::{Proc, Side, pinned, tempdir, wait_for};
use crate::redis_lab::{REDIS_PORT, RedisLab};

/// `meshlab record` arguments for this rung; `None` = no recorder.
pub fn record_args(rung: Rung, port: u16) -> Option<Vec<String>> {
    // A port no workload uses: the recorder attaches everything and traces nothing.
    let other = FILTERED_OUT_PORT;
    let args = match rung {
        Rung::Off | Rung::EmptyPrograms => return None,
        Rung::FilteredOut => vec!["--port".into(), other.to_string()],
        Rung::OnDemandIdle => vec![
            "--port".into(),
            other.to_string(),
            "--attach".into(),
            "on-demand".into(),
        ],
        Rung::Sampled => vec![
            "--port".into(),
            port.to_string(),
            "--sample-messages".into(),
            "1/100".into(),
        ],
        Rung::TracingAll => vec!["--port".into(), port.to_string()],
    };
    Some(args)
}

/// The port the workload serves on, which a traced recorder filters on.
fn workload_port(workload: Workload) -> u16 {
    match workload {
        Workload::Echo { .. } => echo_port(),
        Workload::Redis { .. } => REDIS_PORT,
    }
}

/// What one bench run covers: `rungs` (of [`Rung::ALL`]), and with `everything` also the
/// per-program costs, the rate search and the merge (a partial run has only the ladder).
pub struct Scope {
    pub rungs: Vec<Rung>,
    pub everything: bool,
}

impl Scope {
    pub fn full() -> Scope {
        Scope {
            rungs: Rung::ALL.to_vec(),
            everything: true,
        }
    }
}

pub fn run(exe: &Path, sizes: Sizes, out_dir: &Path, scope: Scope) -> Result<()> {
    let dir = tempdir()?;
    let _echo = spawn_echo_server(exe, &dir)?;
    let redis = RedisLab::start()?;
    let sampling = record_supports(exe, "--sample-messages")?;
    let on_demand = record_supports(exe, "--attach")?;
    let rungs: Vec<Rung> = (scope.rungs.into_iter())
        .filter(|r| *r != Rung::Sampled || sampling)
        .filter(|r| *r != Rung::OnDemandIdle || on_demand)
        .collect();
    let tracepoints = recorder_tracepoints(exe, &dir)?;
    eprintln!("bench: the recorder attaches to {tracepoints:?}");
    let load_before = loadavg();
    let mut results = Vec::new();
    for &workload in sizes.workloads {
        let plan = LadderPlan {
            workload,
            rungs: &rungs,
            tracepoints: &tracepoints,
        };
        results.extend(ladder(exe, &dir, &redis, &plan, sizes)?);
    }
    let costs_workload = Workload::Redis { clients: 1 };
    let (costs, rate_steps, merge_events_per_cpu_s) = if scope.everything {
        let costs = program_costs(exe, &dir, &redis, costs_workload, &rungs, sizes)?;
        let rate_steps = rate_search(exe, &dir, sizes)?;
        let merge = merge_rate(exe, &dir, &rate_steps)?;
        (costs, rate_steps, Some(merge))
    } else {
        (Vec::new(), Vec::new(), None)
    };
    let report = LadderReport {
        sizes,
        results,
        costs_workload: costs_workload.name(),
        costs,
        rate_steps,
        merge_events_per_cpu_s,
        sampling_implemented: sampling,
        load_before,
        load_after: loadavg(),
    };
    ladder_doc::write(&report, out_dir)
}

/// One workload's ladder: its rungs and the tracepoints of the empty-programs rung.
struct LadderPlan<'a> {
    workload: Workload,
    rungs: &'a [Rung],
    tracepoints: &'a [String],
}

/// What runs beside the workload in one rung; detached, unloaded or stopped on drop.
enum Attached {
    Nothing,
    Recorder(#[allow(dead_code)] Proc),
    Empty(#[allow(dead_code)] Vec<bpffloor::EmptyProgram>),
}

fn attach(exe: &Path, dir: &Path, plan: &LadderPlan, rung: Rung) -> Result<Attached> {
    if rung == Rung::EmptyPrograms {
        let programs = (plan.tracepoints.iter())
            .map(|tp| bpffloor::attach_empty(tp).with_context(|| format!("empty program on {tp}")))
            .collect::<Result<_>>()?;
        return Ok(Attached::Empty(programs));
    }
    Ok(match record_args(rung, workload_port(plan.workload)) {
        Some(args) => Attached::Recorder(spawn_recorder(exe, dir, &args)?),
        None => Attached::Nothing,
    })
}

/// One workload over every rung, rounds interleaved (the order rotated each round, so every
/// rung runs first, last and in between equally often).
fn ladder(
    exe: &Path,
    dir: &Path,
    redis: &RedisLab,
    plan: &LadderPlan,
    sizes: Sizes,
) -> Result<Vec<RungResult>> {
    let name = plan.workload.name();
    let mut results: Vec<RungResult> = (plan.rungs.iter())
        .map(|r| RungResult::new(name.clone(), *r))
        .collect();
    for round in 0..sizes.rounds {
        for k in 0..plan.rungs.len() {
            let i = (round + k) % plan.rungs.len();
            let attached = attach(exe, dir, plan, plan.rungs[i])?;
            let before = CpuTimes::now()?;
            let mut run = run_workload(exe, redis, plan.workload, sizes)?;
            let machine = CpuTimes::now()?.since(before);
            if let Workload::Redis { clients } = plan.workload {
                // Outside the CPU window (its requests are not the run's), same recorder.
                run.p50_us = redis.ping_p50_us(exe, clients, sizes.redis_latency_seconds)?;
            }
            drop(attached);
            eprintln!(
                "bench: round {round} {name:<36} {:<26} {:>10.0}/s p50 {:>8.1} us, {:.1} CPU us/req, steal {:.1} %",
                plan.rungs[i].name(),
                run.throughput,
                run.p50_us,
                machine.busy_us() / run.requests,
                machine.steal_pct()
            );
            results[i].add(&run, machine);
        }
    }
    Ok(results)
}

/// The tracepoints a recorder tracing everything attaches to, read from its raw-tracepoint
/// links (`tp_name` in /proc/PID/fdinfo; tp_btf links are raw-tracepoint links too), so the
/// empty-programs rung follows the recorder's attach plan without a list kept by hand.
fn recorder_tracepoints(exe: &Path, dir: &Path) -> Result<Vec<String>> {
    let args = record_args(Rung::TracingAll, echo_port()).expect("tracing all records");
    let recorder = spawn_recorder(exe, dir, &args)?;
    let fdinfo = std::path::PathBuf::from(format!("/proc/{}/fdinfo", recorder.0.id()));
    let mut names: Vec<String> = std::fs::read_dir(&fdinfo)
        .with_context(|| format!("reading {}", fdinfo.display()))?
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|info| {
            let line = info.lines().find(|l| l.starts_with("tp_name:"))?;
            Some(line["tp_name:".len()..].trim().to_owned())
        })
        .collect();
    names.sort();
    names.dedup();
    anyhow::ensure!(
        !names.is_empty(),
        "the recorder holds no raw-tracepoint link"
    );
    Ok(names)
}

/// Per-program ns/run from the kernel's BPF statistics, for each recorder rung on `workload`:
/// a pass of its own after the ladder, so the statistics' own cost (two clock reads per
/// program run) does not inflate the ladder's ratios.
fn program_costs(
    exe: &Path,
    dir: &Path,
    redis: &RedisLab,
    workload: Workload,
    rungs: &[Rung],
    sizes: Sizes,
) -> Result<Vec<(Rung, Vec<ProgramCost>)>> {
    let _stats = StatsEnabled::on()?;
    // The floor runs beside the recorder on the busiest RX tracepoint; it is held by this
    // process, so its statistics are read through our own pid.
    let _floor = bpffloor::attach_empty("netif_receive_skb")?;
    let mut out = Vec::new();
    // The idle on-demand recorder's hot programs never run: nothing to measure per program.
    for &rung in rungs.iter().filter(|r| **r != Rung::OnDemandIdle) {
        let Some(args) = record_args(rung, workload_port(workload)) else {
            continue;
        };
        let mut rounds = Vec::new();
        for _ in 0..sizes.rounds.min(3) {
            let recorder = spawn_recorder(exe, dir, &args)?;
            rounds.push(bpfstats::costs_over(recorder.0.id(), || {
                run_workload(exe, redis, workload, sizes).map(|r| (r.throughput, r.p50_us))
            })?);
        }
        out.push((rung, median_costs(&rounds)));
    }
    Ok(out)
}

fn run_workload(
    exe: &Path,
    redis: &RedisLab,
    workload: Workload,
    sizes: Sizes,
) -> Result<WorkloadRun> {
    match workload {
        Workload::Redis { clients } => {
            let (throughput, p50_us) = redis.ping(clients, sizes.redis_requests)?;
            Ok(WorkloadRun {
                throughput,
                p50_us,
                requests: sizes.redis_requests as f64,
            })
        }
        Workload::Echo { concurrency } => {
            let v = echo_client(exe, concurrency, 0, sizes.echo_seconds)?;
            Ok(WorkloadRun {
                throughput: number(&v, "qps")?,
                p50_us: number(&v, "p50_us")?,
                requests: number(&v, "requests_total")?,
            })
        }
    }
}

fn number(v: &serde_json::Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("lab client JSON lacks {key}"))
}

/// `meshlab lab client` against the echo server; `qps` 0 = as fast as it goes.
fn echo_client(
    exe: &Path,
    concurrency: usize,
    qps: u64,
    seconds: u64,
) -> Result<serde_json::Value> {
    let out = pinned(&mut Command::new(exe), Side::Client)
        .args([
            "lab",
            "client",
            "--connect",
            &format!("127.0.0.1:{}", echo_port()),
            "--json",
        ])
        .args(["--warmup", "300ms", "--duration", &format!("{seconds}s")])
        .args([
            "--concurrency",
            &concurrency.to_string(),
            "--qps",
            &qps.to_string(),
        ])
        .stderr(Stdio::null())
        .output()
        .context("running meshlab lab client")?;
    if !out.status.success() {
        anyhow::bail!("meshlab lab client failed: {}", out.status);
    }
    serde_json::from_slice(&out.stdout).context("lab client --json output")
}

/// Port of the ladder's echo server, chosen by the kernel (port 0): fixed ports collide with
/// other benches running on a shared machine. Set once, before any workload runs.
static ECHO_PORT: OnceLock<u16> = OnceLock::new();

/// tcpmux, which nothing here serves: the filtered-out rung's `--port`.
const FILTERED_OUT_PORT: u16 = 1;

fn echo_port() -> u16 {
    *ECHO_PORT
        .get()
        .expect("spawn_echo_server sets the port first")
}

pub(crate) fn spawn_echo_server(exe: &Path, dir: &Path) -> Result<Proc> {
    let ready = dir.join("ladder-echo.ready");
    let child = pinned(&mut Command::new(exe), Side::Server)
        .args(["lab", "server", "--listen", "127.0.0.1:0", "--ready-file"])
        .arg(&ready)
        .stdout(Stdio::null())
        .spawn()
        .context("starting meshlab lab server")?;
    let server = Proc::new(child, "meshlab lab server");
    wait_for(&ready)?;
    let bound = std::fs::read_to_string(&ready)?;
    let port = bound
        .trim()
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .with_context(|| format!("echo server ready file: expected host:port, got {bound:?}"))?;
    let _ = ECHO_PORT.set(port);
    Ok(server)
}

pub fn spawn_recorder(exe: &Path, dir: &Path, args: &[String]) -> Result<Proc> {
    // Events to stdout, discarded: `record` refuses /dev/null as an output path (a device).
    spawn_recorder_with(exe, dir, args, Stdio::null(), Path::new("-"))
}

fn spawn_recorder_with(
    exe: &Path,
    dir: &Path,
    args: &[String],
    stderr: Stdio,
    output: &Path,
) -> Result<Proc> {
    let ready = dir.join("ladder-recorder.ready");
    let _ = std::fs::remove_file(&ready);
    let child = Command::new(exe)
        .args(["record", "-o"])
        .arg(output)
        .args(args)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting meshlab record")?;
    let recorder = Proc::new(child, "meshlab record");
    wait_for(&ready)?;
    Ok(recorder)
}

fn record_supports(exe: &Path, flag: &str) -> Result<bool> {
    let out = Command::new(exe)
        .args(["record", "--help"])
        .output()
        .context("running meshlab record --help")?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(flag))
}

/// Echo c=32 at rising fixed rates with a recorder tracing everything into a capture file:
/// events recorded and dropped at each rate (the recorder's own summary line) and the
/// recorder's CPU per event. The last step's capture is kept for [`merge_rate`].
fn rate_search(exe: &Path, dir: &Path, sizes: Sizes) -> Result<Vec<RateStep>> {
    rate_search_with(exe, exe, dir, sizes)
}

/// [`rate_search`] with `recorder` recording and `workload`'s lab client driving the echo
/// server ([`spawn_echo_server`] first): two recorder builds compare under the same client
/// (crate::bench_rate).
pub(crate) fn rate_search_with(
    recorder_exe: &Path,
    workload: &Path,
    dir: &Path,
    sizes: Sizes,
) -> Result<Vec<RateStep>> {
    let mut steps = Vec::new();
    for &qps in sizes.rate_steps {
        let args = vec!["--port".to_owned(), echo_port().to_string()];
        let capture = dir.join(RATE_CAPTURE);
        let mut recorder = spawn_recorder_with(recorder_exe, dir, &args, Stdio::piped(), &capture)?;
        let pid = recorder.0.id() as i32;
        let cpu_at_ready = proc_cpu_s(pid)?;
        let started = std::time::Instant::now();
        let client = echo_client(workload, 32, qps, sizes.echo_seconds)?;
        let recorder_cpu_s = proc_cpu_s(pid)? - cpu_at_ready;
        // SAFETY: signalling our own child; the summary is printed on SIGINT.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let mut stderr = String::new();
        if let Some(mut pipe) = recorder.0.stderr.take() {
            std::io::Read::read_to_string(&mut pipe, &mut stderr)?;
        }
        let _ = recorder.0.wait();
        let seconds = started.elapsed().as_secs_f64();
        let (events, dropped) = parse_summary(&stderr)
            .with_context(|| format!("no summary line in the recorder's stderr:\n{stderr}"))?;
        let step = RateStep {
            requested_qps: qps,
            achieved_qps: number(&client, "qps")?,
            events,
            dropped,
            events_per_s: events as f64 / seconds,
            recorder_ns_per_event: recorder_cpu_s * 1e9 / events.max(1) as f64,
        };
        eprintln!("bench: rate {step:?}");
        steps.push(step);
    }
    Ok(steps)
}

/// The rate search's capture file (each step overwrites it).
const RATE_CAPTURE: &str = "rate.capture";

/// `meshlab merge` of the last rate step's capture (one node, kernel-only, loopback echo RPC):
/// events per CPU-second of the merge process (all its threads), at the median CPU time of
/// [`crate::ladder_doc::MERGE_RUNS`] runs.
fn merge_rate(exe: &Path, dir: &Path, steps: &[RateStep]) -> Result<f64> {
    let events = steps.last().context("no rate step")?.events;
    let mut cpu_s = (0..crate::ladder_doc::MERGE_RUNS)
        .map(|_| Ok(crate::bench_merge::merge_once(exe, &[dir.join(RATE_CAPTURE)])?.cpu_s))
        .collect::<Result<Vec<f64>>>()?;
    cpu_s.sort_by(f64::total_cmp);
    let median = cpu_s[cpu_s.len() / 2];
    let rate = events as f64 / median;
    eprintln!(
        "bench: merge of the last rate capture: {events} events, CPU s of {} runs \
         {cpu_s:.2?}, {rate:.0} events per CPU-second at the median",
        cpu_s.len()
    );
    Ok(rate)
}

/// `... : N events, M dropped [...]` from `meshlab record`'s last stderr line.
fn parse_summary(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("meshlab record:"))?;
    let tail = line.rsplit_once("): ")?.1;
    let mut words = tail.split_whitespace();
    let events = words.next()?.parse().ok()?;
    let dropped = words.nth(1)?.parse().ok()?;
    Some((events, dropped))
}

/// Median ns/run per program over rounds, for one rung.
pub fn median_costs(rounds: &[Vec<ProgramCost>]) -> Vec<ProgramCost> {
    let mut by_name: std::collections::BTreeMap<String, Vec<ProgramCost>> = Default::default();
    for cost in rounds.iter().flatten() {
        by_name
            .entry(cost.name.clone())
            .or_default()
            .push(cost.clone());
    }
    by_name
        .into_values()
        .filter_map(|mut v| {
            v.sort_by(|a, b| a.ns_per_run.total_cmp(&b.ns_per_run));
            let mut m = v[v.len() / 2].clone();
            m.runs = v.iter().map(|c| c.runs).sum::<u64>() / v.len() as u64;
            (m.runs > 0).then_some(m)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_costs_take_the_middle_round_per_program() {
        let round = |ns: f64| {
            vec![ProgramCost {
                name: "p".into(),
                runs: 10,
                ns_per_run: ns,
                bytes_xlated: 1,
                bytes_jited: 1,
            }]
        };
        let m = median_costs(&[round(30.0), round(10.0), round(20.0)]);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].ns_per_run, m[0].runs), (20.0, 10));
    }

    #[test]
    fn summary_line_gives_events_and_drops() {
        let stderr =
            "recording...\nmeshlab record: node a 3.2s (signal): 1234 events, 5 dropped [x=1]\n";
        assert_eq!(parse_summary(stderr), Some((1234, 5)));
        assert_eq!(parse_summary("nothing"), None);
    }
}
