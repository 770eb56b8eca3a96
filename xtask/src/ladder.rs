//! `cargo xtask bench`: the recorder's cost ladder (issue 10, item 5 a-c).
//!
//! Rungs: no recorder / recorder attached but filtering this traffic out / sampling 1/100 of
//! messages / tracing everything. Workloads: the lab echo RPC on loopback (c=1, c=32, unlimited
//! rate) and redis-benchmark PING against redis-server across two network namespaces. Rungs
//! are interleaved round by round (rotated order) and compared by medians. While a recorder
//! runs, the kernel's BPF statistics give each of its programs' ns/run. Finally the highest
//! event rate recorded without a drop is searched on the echo RPC.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result};

use crate::bpffloor;
use crate::bpfstats::{self, ProgramCost, StatsEnabled};
use crate::ladder_doc::{self, LadderReport, RateStep, RungResult};
use crate::ladder_plan::{Rung, Sizes, Workload};
use crate::procs::{Proc, tempdir, wait_for};
use crate::redis_lab::{REDIS_PORT, RedisLab};

/// `meshlab record` arguments for this rung; `None` = no recorder.
pub fn record_args(rung: Rung, port: u16) -> Option<Vec<String>> {
    // A port no workload uses: the recorder attaches everything and traces nothing.
    let other = FILTERED_OUT_PORT;
    let args = match rung {
        Rung::Off => return None,
        Rung::FilteredOut => vec!["--port".into(), other.to_string()],
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

pub fn run(exe: &Path, sizes: Sizes, out_dir: &Path) -> Result<()> {
    let dir = tempdir()?;
    let _echo = spawn_echo_server(exe, &dir)?;
    let redis = RedisLab::start()?;
    let sampling = record_supports(exe, "--sample-messages")?;
    let rungs: Vec<Rung> = Rung::ALL
        .into_iter()
        .filter(|r| *r != Rung::Sampled || sampling)
        .collect();
    let load_before = loadavg();
    let mut results = Vec::new();
    for &workload in sizes.workloads {
        results.extend(ladder(exe, &dir, &redis, workload, &rungs, sizes)?);
    }
    let costs_workload = Workload::Redis { clients: 1 };
    let costs = program_costs(exe, &dir, &redis, costs_workload, &rungs, sizes)?;
    let rate_steps = rate_search(exe, &dir, sizes)?;
    let report = LadderReport {
        sizes,
        results,
        costs_workload: costs_workload.name(),
        costs,
        rate_steps,
        sampling_implemented: sampling,
        load_before,
        load_after: loadavg(),
    };
    ladder_doc::write(&report, out_dir)
}

/// One workload over every rung, rounds interleaved.
fn ladder(
    exe: &Path,
    dir: &Path,
    redis: &RedisLab,
    workload: Workload,
    rungs: &[Rung],
    sizes: Sizes,
) -> Result<Vec<RungResult>> {
    let mut results: Vec<RungResult> = rungs
        .iter()
        .map(|r| RungResult::new(workload.name(), *r))
        .collect();
    for round in 0..sizes.rounds {
        for k in 0..rungs.len() {
            let i = (round + k) % rungs.len();
            let recorder = match record_args(rungs[i], workload_port(workload)) {
                Some(args) => Some(spawn_recorder(exe, dir, &args)?),
                None => None,
            };
            let (throughput, p50_us) = run_workload(exe, redis, workload, sizes)?;
            drop(recorder);
            eprintln!(
                "bench: round {round} {:<36} {:<24} {throughput:>10.0}/s p50 {p50_us:>8.1} us",
                workload.name(),
                rungs[i].name()
            );
            results[i].add(throughput, p50_us);
        }
    }
    Ok(results)
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
    for &rung in rungs {
        let Some(args) = record_args(rung, workload_port(workload)) else {
            continue;
        };
        let mut rounds = Vec::new();
        for _ in 0..sizes.rounds.min(3) {
            let recorder = spawn_recorder(exe, dir, &args)?;
            rounds.push(bpfstats::costs_over(recorder.0.id(), || {
                run_workload(exe, redis, workload, sizes)
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
) -> Result<(f64, f64)> {
    match workload {
        Workload::Redis { clients } => redis.ping(clients, sizes.redis_requests),
        Workload::Echo { concurrency } => {
            let v = echo_client(exe, concurrency, 0, sizes.echo_seconds)?;
            Ok((number(&v, "qps")?, number(&v, "p50_us")?))
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
    let out = Command::new(exe)
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

fn spawn_echo_server(exe: &Path, dir: &Path) -> Result<Proc> {
    let ready = dir.join("ladder-echo.ready");
    let child = Command::new(exe)
        .args(["lab", "server", "--listen", "127.0.0.1:0", "--ready-file"])
        .arg(&ready)
        .stdout(Stdio::null())
        .spawn()
        .context("starting meshlab lab server")?;
    let server = Proc(child);
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
    spawn_recorder_with(exe, dir, args, Stdio::null())
}

fn spawn_recorder_with(exe: &Path, dir: &Path, args: &[String], stderr: Stdio) -> Result<Proc> {
    let ready = dir.join("ladder-recorder.ready");
    let _ = std::fs::remove_file(&ready);
    let child = Command::new(exe)
        // Events to stdout, discarded: `record` refuses /dev/null as an output path (a device).
        .args(["record", "-o", "-"])
        .args(args)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting meshlab record")?;
    let recorder = Proc(child);
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

/// Echo c=32 at rising fixed rates with a recorder tracing everything: events recorded and
/// dropped at each rate, from the recorder's own summary line.
fn rate_search(exe: &Path, dir: &Path, sizes: Sizes) -> Result<Vec<RateStep>> {
    let mut steps = Vec::new();
    for &qps in sizes.rate_steps {
        let args = vec!["--port".to_owned(), echo_port().to_string()];
        let mut recorder = spawn_recorder_with(exe, dir, &args, Stdio::piped())?;
        let started = std::time::Instant::now();
        let client = echo_client(exe, 32, qps, sizes.echo_seconds)?;
        // SAFETY: signalling our own child; the summary is printed on SIGINT.
        unsafe { libc::kill(recorder.0.id() as i32, libc::SIGINT) };
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
        };
        eprintln!("bench: rate {step:?}");
        steps.push(step);
    }
    Ok(steps)
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

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
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
