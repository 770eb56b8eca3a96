//! Benchmarks that need the real binary and a kernel: the recorder's cost on the traffic it
//! watches (and on the traffic it does not), and a long soak for the recorder's memory.
//!
//! Machines are noisy: modes are interleaved round by round, repeated, and compared by their
//! medians, side by side in one run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::procs::{Proc, tempdir, wait_for};
use crate::{run_cmd, workspace_root};

#[derive(clap::Subcommand)]
pub enum BenchTask {
    /// Workload latency with no recorder / a recorder that does not trace this traffic /
    /// a recorder tracing it: medians of interleaved rounds and their ratios.
    Overhead {
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Measured seconds per run.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Fixed total request rate, so CPU time per request compares like with like.
        #[arg(long, default_value_t = 2000)]
        qps: u64,
    },
    /// The recorder's decode path alone (ring record -> NDJSON line), events per second.
    Decode,
    /// Merge throughput and peak RSS, binary capture vs NDJSON input (bench_merge.rs).
    Merge(crate::bench_merge::MergeBenchArgs),
    /// The recorder's own CPU per event, binary capture vs NDJSON output (bench_recorder.rs).
    RecorderCpu(crate::bench_recorder::RecorderCpuArgs),
    /// Per-program BPF cost of two recorder builds, alternated round by round
    /// (bench_kernel.rs).
    KernelAb(crate::bench_kernel::KernelAbArgs),
    /// The pieces of a traced event (ring reserve/submit by size, clock, pid, counters, kernel
    /// read) as raw programs side by side on one tracepoint (bench_helpers.rs).
    Helpers(crate::bench_helpers::HelpersArgs),
    /// The zero-drop event rate search of the ladder alone, for two recorder builds alternated
    /// round by round (bench_rate.rs).
    RateAb(crate::bench_rate::RateAbArgs),
    /// `record --attach on-demand`: delay from a traced connection to its hot hooks attached,
    /// over connect/close cycles (bench_attach.rs).
    AttachDelay(crate::bench_attach::AttachDelayArgs),
    /// The lab's userland probes: off / on but not sampling / sampling all (bench_probes.rs).
    Probes(crate::bench_probes::ProbeBenchArgs),
    /// Records lab RPC load for N minutes, sampling the recorder's RSS, descriptors and BPF
    /// maps; checks the recording's accounting and merges it with the probe files.
    Soak {
        #[arg(long, default_value_t = 30)]
        minutes: u64,
        #[arg(long, default_value_t = 2)]
        concurrency: usize,
        /// Total request rate (keeps the machine usable and the recording near 1 MB/s).
        #[arg(long, default_value_t = 200)]
        qps: u64,
    },
}

pub const PORT_TRACED: u16 = 47_300;
pub const PORT_OTHER: u16 = 47_301;

/// The cost ladder (crate::ladder): release build into docs/, or `quick` with the debug build
/// `cargo test` already made into target/bench-quick/.
pub fn ladder(quick: bool, partial: &crate::ladder_plan::PartialArgs) -> Result<()> {
    let profile = if quick { "debug" } else { "release" };
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    build.args(["build", "--bin", "meshlab"]);
    if !quick {
        build.arg("--release");
    }
    run_cmd(&mut build)?;
    let root = workspace_root();
    let exe = crate::target_dir().join(profile).join("meshlab");
    let full = crate::ladder::Scope::full;
    if quick {
        let out = crate::target_dir().join("bench-quick");
        crate::ladder::run(&exe, crate::ladder_plan::QUICK, &out, full())
    } else if partial.is_partial() {
        // A part of the ladder is no replacement for docs/benchmarks.md.
        let scope = crate::ladder::Scope {
            rungs: partial.rungs(),
            everything: false,
        };
        let out = crate::target_dir().join("bench-partial");
        crate::ladder::run(&exe, partial.sizes(), &out, scope)
    } else {
        crate::ladder::run(&exe, crate::ladder_plan::FULL, &root.join("docs"), full())
    }
}

pub fn run(task: BenchTask) -> Result<()> {
    let task = match task {
        BenchTask::Merge(args) => return crate::bench_merge::run(args),
        BenchTask::RecorderCpu(args) => return crate::bench_recorder::run(args),
        BenchTask::KernelAb(args) => return crate::bench_kernel::run(args),
        BenchTask::Helpers(args) => return crate::bench_helpers::run(args),
        BenchTask::AttachDelay(args) => return crate::bench_attach::run(args),
        BenchTask::RateAb(args) => return crate::bench_rate::run(args),
        other => other,
    };
    if let BenchTask::Decode = task {
        return run_cmd(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())).args([
                "bench",
                "-p",
                "meshlab-user",
                "--bench",
                "decode",
            ]),
        );
    }
    run_cmd(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())).args([
            "build",
            "--release",
            "--bin",
            "meshlab",
        ]),
    )?;
    let exe = crate::target_dir().join("release/meshlab");
    match task {
        BenchTask::Decode
        | BenchTask::Merge(_)
        | BenchTask::RecorderCpu(_)
        | BenchTask::KernelAb(_)
        | BenchTask::Helpers(_)
        | BenchTask::RateAb(_)
        | BenchTask::AttachDelay(_) => Ok(()),
        BenchTask::Probes(args) => crate::bench_probes::run(&exe, args),
        BenchTask::Overhead {
            rounds,
            seconds,
            concurrency,
            qps,
        } => overhead(&exe, rounds, seconds, concurrency, qps),
        BenchTask::Soak {
            minutes,
            concurrency,
            qps,
        } => soak(&exe, minutes, concurrency, qps),
    }
}

pub fn spawn_server(exe: &Path, dir: &Path) -> Result<Proc> {
    let ready = dir.join("server.ready");
    let child = Command::new(exe)
        .args([
            "lab",
            "server",
            "--listen",
            &format!("127.0.0.1:{PORT_TRACED}"),
            "--ready-file",
        ])
        .arg(&ready)
        .stdout(Stdio::null())
        .spawn()
        .context("starting meshlab lab server")?;
    let server = Proc::new(child, "meshlab lab server");
    wait_for(&ready)?;
    Ok(server)
}

fn spawn_recorder(exe: &Path, dir: &Path, name: &str, port: u16) -> Result<Proc> {
    let ready = dir.join(format!("{name}.ready"));
    let _ = std::fs::remove_file(&ready);
    let child = Command::new(exe)
        .args([
            "record",
            "-o",
            "-",
            "--port",
            &port.to_string(),
            "--ready-file",
        ])
        .arg(&ready)
        // Recorded lines are thrown away: `record` refuses to open a device as its output.
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting meshlab record")?;
    let rec = Proc::new(child, "meshlab record");
    wait_for(&ready)?;
    Ok(rec)
}

/// One client run at a fixed rate.
struct RunResult {
    p50_us: f64,
    /// Machine-wide CPU time (all CPUs, busy = not idle/iowait) per request, microseconds:
    /// what the workload plus the recorder and its kernel probes cost.
    cpu_us_per_request: f64,
}

/// Busy CPU time of the whole machine so far, in microseconds (from /proc/stat).
fn busy_cpu_us() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .context("/proc/stat is empty")?
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let total: f64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0.0) + fields.get(4).copied().unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((total - idle) / ticks * 1e6)
}

fn client_run(exe: &Path, seconds: u64, concurrency: usize, qps: u64) -> Result<RunResult> {
    let busy_before = busy_cpu_us()?;
    let out = Command::new(exe)
        .args([
            "lab",
            "client",
            "--connect",
            &format!("127.0.0.1:{PORT_TRACED}"),
            "--json",
        ])
        .args(["--warmup", "500ms", "--duration", &format!("{seconds}s")])
        .args([
            "--concurrency",
            &concurrency.to_string(),
            "--qps",
            &qps.to_string(),
        ])
        .stderr(Stdio::null())
        .output()
        .context("running meshlab lab client")?;
    let busy = busy_cpu_us()? - busy_before;
    if !out.status.success() {
        bail!("meshlab lab client failed: {}", out.status);
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("client --json output")?;
    let field = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("client JSON lacks {k}"))
    };
    let requests = field("requests_total")?.max(1.0);
    Ok(RunResult {
        p50_us: field("p50_us")?,
        cpu_us_per_request: busy / requests,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn overhead(exe: &Path, rounds: usize, seconds: u64, concurrency: usize, qps: u64) -> Result<()> {
    let dir = tempdir()?;
    let _server = spawn_server(exe, &dir)?;
    const MODES: [&str; 3] = ["off", "untraced", "traced"];
    let mut p50: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        // Rotate the order each round so drift over time does not favour one mode.
        for k in 0..MODES.len() {
            let mode = (round + k) % MODES.len();
            let _recorder = match MODES[mode] {
                "off" => None,
                "untraced" => Some(spawn_recorder(exe, &dir, "untraced", PORT_OTHER)?),
                _ => Some(spawn_recorder(exe, &dir, "traced", PORT_TRACED)?),
            };
            let r = client_run(exe, seconds, concurrency, qps)?;
            eprintln!(
                "round {round} {:<9} p50 {:8.1} us  cpu {:7.1} us/request",
                MODES[mode], r.p50_us, r.cpu_us_per_request
            );
            p50[mode].push(r.p50_us);
            cpu[mode].push(r.cpu_us_per_request);
        }
    }
    let (base_p50, base_cpu) = (median(p50[0].clone()), median(cpu[0].clone()));
    println!(
        "\nrecorder overhead, loopback echo, c={concurrency}, {qps} req/s, {rounds} interleaved rounds x {seconds}s, medians:"
    );
    println!(
        "{:<10} {:>10} {:>8} {:>16} {:>8}",
        "mode", "p50 us", "x off", "CPU us/request", "x off"
    );
    for (i, mode) in MODES.iter().enumerate() {
        let (p, c) = (median(p50[i].clone()), median(cpu[i].clone()));
        println!(
            "{mode:<10} {p:>10.1} {:>8.3} {c:>16.1} {:>8.3}",
            p / base_p50,
            c / base_cpu
        );
    }
    println!(
        "(p50 at c=1 mostly measures idle wake-up latency: a busy recorder keeps CPUs awake and can \
         lower it; CPU time per request at a fixed rate is the cost measure)"
    );
    Ok(())
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("VmRSS missing")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()?)
}

/// One sample of a process: RSS, open descriptors, BPF maps among them.
#[derive(Clone, Copy)]
struct Sample {
    rss_kib: u64,
    fds: usize,
    bpf_maps: usize,
}

fn sample(pid: u32) -> Result<Sample> {
    let mut fds = 0;
    let mut bpf_maps = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        fds += 1;
        let info = std::fs::read_to_string(entry?.path()).unwrap_or_default();
        if info.lines().any(|l| l.starts_with("map_id:")) {
            bpf_maps += 1;
        }
    }
    Ok(Sample {
        rss_kib: rss_kib(pid)?,
        fds,
        bpf_maps,
    })
}

/// Samples taken after the warm-up must stay within these bounds of the first of them.
const RSS_TOLERANCE: f64 = 0.05;
const WARMUP_SAMPLES: usize = 6;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// The recorder, the lab server and client (both writing probe files) for `minutes`; then
/// the recording is checked (exact accounting) and merged with the probes while merge's
/// memory is sampled.
fn soak(exe: &Path, minutes: u64, concurrency: usize, qps: u64) -> Result<()> {
    let dir = tempdir()?;
    let server = spawn_traced_server(exe, &dir)?;
    let recording = dir.join("soak.ndjson");
    let recorder = spawn_soak_recorder(exe, &dir, &recording)?;
    let total = Duration::from_secs(minutes * 60);
    let mut client = Proc::new(
        Command::new(exe)
            .args([
                "lab",
                "client",
                "--connect",
                &format!("127.0.0.1:{PORT_TRACED}"),
            ])
            .args([
                "--warmup",
                "0s",
                "--duration",
                &format!("{}s", total.as_secs()),
            ])
            .args([
                "--concurrency",
                &concurrency.to_string(),
                "--qps",
                &qps.to_string(),
            ])
            .args(["--node", "soak", "--trace"])
            .arg(dir.join("client.probe.ndjson"))
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?,
        "meshlab lab client",
    );
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < total && client.0.try_wait()?.is_none() {
        std::thread::sleep(SAMPLE_EVERY);
        let s = sample(recorder.0.id())?;
        println!(
            "t={:>5}s recorder RSS {} KiB, {} fds, {} BPF maps",
            start.elapsed().as_secs(),
            s.rss_kib,
            s.fds,
            s.bpf_maps
        );
        samples.push(s);
    }
    let _ = client.0.wait();
    // Reaped: its pid is no longer its own, so its clean-up registration ends here.
    drop(client);
    // SIGINT: the recorder writes its final accounting, the server flushes its probe file.
    drop(recorder);
    drop(server);
    println!("load: lab client c={concurrency}, {qps} req/s for {minutes} min");
    check_flat("recorder", &samples)?;
    let events = check_exact_accounting(&recording)?;
    let inputs = [
        recording,
        dir.join("client.probe.ndjson"),
        dir.join("server.probe.ndjson"),
    ];
    merge_sampled(exe, &inputs, &dir.join("merged.ndjson"), events)
}

fn spawn_traced_server(exe: &Path, dir: &Path) -> Result<Proc> {
    let ready = dir.join("server.ready");
    let child = Command::new(exe)
        .args([
            "lab",
            "server",
            "--listen",
            &format!("127.0.0.1:{PORT_TRACED}"),
        ])
        .args(["--node", "soak", "--trace"])
        .arg(dir.join("server.probe.ndjson"))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .spawn()
        .context("starting meshlab lab server")?;
    let server = Proc::new(child, "meshlab lab server");
    wait_for(&ready)?;
    Ok(server)
}

fn spawn_soak_recorder(exe: &Path, dir: &Path, out: &Path) -> Result<Proc> {
    let ready = dir.join("soak.ready");
    let child = Command::new(exe)
        .args([
            "record",
            "--node",
            "soak",
            "--port",
            &PORT_TRACED.to_string(),
            // NDJSON: the accounting check below reads kernel lines by hook name.
            "--format",
            "ndjson",
            "-o",
        ])
        .arg(out)
        .arg("--ready-file")
        .arg(&ready)
        .stderr(Stdio::null())
        .spawn()
        .context("starting meshlab record")?;
    let rec = Proc::new(child, "meshlab record");
    wait_for(&ready)?;
    Ok(rec)
}

/// After the warm-up: RSS within RSS_TOLERANCE of the first sample, fds and maps constant.
fn check_flat(what: &str, samples: &[Sample]) -> Result<()> {
    let Some(first) = samples.get(WARMUP_SAMPLES) else {
        bail!("{what}: soak too short: need more than {WARMUP_SAMPLES} samples");
    };
    let later = &samples[WARMUP_SAMPLES..];
    let (lo, hi) = later.iter().fold((u64::MAX, 0), |(lo, hi), s| {
        (lo.min(s.rss_kib), hi.max(s.rss_kib))
    });
    let pct = |v: u64| (v as f64 / first.rss_kib as f64 - 1.0) * 100.0;
    println!(
        "{what} RSS after warm-up {} KiB, then {lo}..{hi} KiB ({:+.1} %..{:+.1} %) over {} samples; fds {}, BPF maps {}",
        first.rss_kib,
        pct(lo),
        pct(hi),
        later.len(),
        first.fds,
        first.bpf_maps
    );
    if pct(hi) > RSS_TOLERANCE * 100.0 || pct(lo) < -RSS_TOLERANCE * 100.0 {
        bail!(
            "{what}: RSS not flat within ±{:.0} %",
            RSS_TOLERANCE * 100.0
        );
    }
    if let Some(s) = later
        .iter()
        .find(|s| s.fds != first.fds || s.bpf_maps != first.bpf_maps)
    {
        bail!(
            "{what}: descriptors or maps changed: {} fds / {} maps, then {} / {}",
            first.fds,
            first.bpf_maps,
            s.fds,
            s.bpf_maps
        );
    }
    Ok(())
}

/// The summary's books must balance: per hook received + dropped == hits, and as many
/// kernel lines as received. Returns the number of kernel events.
fn check_exact_accounting(recording: &Path) -> Result<u64> {
    use std::io::BufRead;
    let file = std::fs::File::open(recording)?;
    let mut lines_per_hook = std::collections::BTreeMap::<String, u64>::new();
    let mut summary = None;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if line.starts_with("{\"type\":\"kernel\"") {
            // Only the hook name is needed: a substring, not a JSON parse of a gigabyte.
            let hook = line
                .split_once("\"hook\":\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map_or("?", |(hook, _)| hook);
            *lines_per_hook.entry(hook.to_owned()).or_default() += 1;
        } else if line.starts_with("{\"type\":\"summary\"") {
            summary = Some(serde_json::from_str::<serde_json::Value>(&line)?);
        }
    }
    let summary = summary.context("the recording has no summary")?;
    let per_hook = summary["per_hook"]
        .as_object()
        .context("summary.per_hook")?;
    for (hook, c) in per_hook {
        let n = |k: &str| c[k].as_u64().unwrap_or(u64::MAX);
        let written = lines_per_hook.get(hook).copied().unwrap_or(0);
        if n("received") + n("dropped") != n("hits") || written != n("received") {
            bail!("{hook}: accounting does not balance: {c} with {written} lines written");
        }
    }
    let events: u64 = lines_per_hook.values().sum();
    println!(
        "recording: {events} kernel events, {} dropped, accounting exact for {} hooks",
        summary["dropped"],
        per_hook.len()
    );
    Ok(events)
}

/// `meshlab merge` over the soak's files, its RSS sampled every 100 ms.
fn merge_sampled(exe: &Path, inputs: &[PathBuf], out: &Path, events: u64) -> Result<()> {
    let log = out.with_extension("stderr");
    let mut child = Command::new(exe)
        .arg("merge")
        .args(inputs)
        .arg("-o")
        .arg(out)
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let _cleanup = crate::cleanup::kill_child(&child, "meshlab merge");
    let started = Instant::now();
    let mut samples = Vec::new();
    while child.try_wait()?.is_none() {
        if let Ok(s) = sample(child.id()) {
            samples.push(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !child.wait()?.success() {
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "meshlab merge failed on the soak recording: {}",
            tail.join(" | ")
        );
    }
    let input_mib = inputs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum::<u64>()
        / (1 << 20);
    let peak = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    println!(
        "merge: {input_mib} MiB of input ({events} kernel events) in {:.1} s, peak RSS {peak} KiB",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
