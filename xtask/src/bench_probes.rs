//! `cargo xtask bench probes`: the seed's three-way overhead run for the lab's own userland
//! probes (issue 9). "Off means upstream behaviour" only holds if probes that are compiled in
//! but not sampling cost nothing measurable, so the three modes run side by side:
//!
//! - `off`: no `--trace` (no probe sink at all);
//! - `idle`: `--trace` with `--trace-sample 1/4294967295`, the sink open but not sampling (the
//!   sampling test passes only for sequence id 0, each connection's first request);
//! - `all`: `--trace` with `--trace-sample 1/1`, every request probed.
//!
//! Echo server and client on loopback, no recorder. Each run starts its own server in the run's
//! mode; modes are interleaved and rotated round by round; medians of p50 latency and of the
//! CPU time of the server and client processes per request (their own rusage, so other load on
//! the machine does not count), with ratios to `off`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::procs::{Proc, tempdir, wait_for};

/// Its own port, so it can run next to the recorder benchmarks (47300/47301, 47310).
const PORT: u16 = 47_320;

#[derive(clap::Args)]
pub struct ProbeBenchArgs {
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
}

#[derive(Clone, Copy)]
enum ProbeMode {
    Off,
    Idle,
    All,
}

impl ProbeMode {
    const ALL: [ProbeMode; 3] = [ProbeMode::Off, ProbeMode::Idle, ProbeMode::All];

    fn name(self) -> &'static str {
        match self {
            ProbeMode::Off => "off",
            ProbeMode::Idle => "idle",
            ProbeMode::All => "all",
        }
    }

    /// The probe flags of one process (`role`) in this mode; probe files go under `dir`.
    fn flags(self, dir: &Path, role: &str) -> Vec<String> {
        let sample = match self {
            ProbeMode::Off => return Vec::new(),
            ProbeMode::Idle => "1/4294967295",
            ProbeMode::All => "1/1",
        };
        let file = dir.join(format!("{role}.probe.ndjson"));
        vec![
            "--trace".into(),
            file.display().to_string(),
            "--trace-sample".into(),
            sample.into(),
        ]
    }
}

struct RunResult {
    p50_us: f64,
    cpu_us_per_request: f64,
}

pub fn run(exe: &Path, args: ProbeBenchArgs) -> Result<()> {
    let mut p50: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..args.rounds {
        // Rotate the order each round so drift over time does not favour one mode.
        for k in 0..ProbeMode::ALL.len() {
            let index = (round + k) % ProbeMode::ALL.len();
            let mode = ProbeMode::ALL[index];
            let r = one_run(exe, mode, &args)?;
            eprintln!(
                "round {round} {:<5} p50 {:8.1} us  cpu {:7.1} us/request",
                mode.name(),
                r.p50_us,
                r.cpu_us_per_request
            );
            p50[index].push(r.p50_us);
            cpu[index].push(r.cpu_us_per_request);
        }
    }
    print_table(&args, &p50, &cpu);
    Ok(())
}

fn print_table(args: &ProbeBenchArgs, p50: &[Vec<f64>; 3], cpu: &[Vec<f64>; 3]) {
    let ProbeBenchArgs {
        rounds,
        seconds,
        concurrency,
        qps,
    } = args;
    println!(
        "\nlab probe overhead, loopback echo, c={concurrency}, {qps} req/s, {rounds} interleaved \
         rounds x {seconds}s, medians (CPU = server + client processes):"
    );
    println!(
        "{:<6} {:>10} {:>8} {:>16} {:>8} {:>17}",
        "probes", "p50 us", "x off", "CPU us/request", "x off", "CPU min..max"
    );
    let (base_p50, base_cpu) = (median(&p50[0]), median(&cpu[0]));
    for (i, mode) in ProbeMode::ALL.iter().enumerate() {
        let (p, c) = (median(&p50[i]), median(&cpu[i]));
        let (low, high) = (min(&cpu[i]), max(&cpu[i]));
        println!(
            "{:<6} {p:>10.1} {:>8.3} {c:>16.1} {:>8.3} {:>17}",
            mode.name(),
            p / base_p50,
            c / base_cpu,
            format!("{low:.1}..{high:.1}")
        );
    }
    println!(
        "(the min..max range is the run-to-run noise: a ratio inside it is no measured difference)"
    );
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Server and client in `mode`; the probe files are removed with the run's directory.
fn one_run(exe: &Path, mode: ProbeMode, args: &ProbeBenchArgs) -> Result<RunResult> {
    let dir = tempdir()?;
    let cpu_before = children_cpu_us();
    let server = spawn_server(exe, &dir, mode)?;
    let out = Command::new(exe)
        .args(["lab", "client", "--connect", &format!("127.0.0.1:{PORT}")])
        .args(["--json", "--warmup", "500ms"])
        .args(["--duration", &format!("{}s", args.seconds)])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--qps", &args.qps.to_string()])
        .args(mode.flags(&dir, "client"))
        .stderr(Stdio::null())
        .output()
        .context("running meshlab lab client")?;
    // Stops and reaps the server, so its CPU time is in the children's rusage below.
    drop(server);
    let cpu_us = children_cpu_us() - cpu_before;
    if !out.status.success() {
        bail!("meshlab lab client failed: {}", out.status);
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("client --json output")?;
    let field = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("client JSON lacks {k}"))
    };
    Ok(RunResult {
        p50_us: field("p50_us")?,
        cpu_us_per_request: cpu_us / field("requests_total")?.max(1.0),
    })
}

fn spawn_server(exe: &Path, dir: &Path, mode: ProbeMode) -> Result<Proc> {
    let ready = dir.join("server.ready");
    let child = Command::new(exe)
        .args(["lab", "server", "--listen", &format!("127.0.0.1:{PORT}")])
        .arg("--ready-file")
        .arg(&ready)
        .args(mode.flags(dir, "server"))
        .stdout(Stdio::null())
        .spawn()
        .context("starting meshlab lab server")?;
    let server = Proc::new(child, "meshlab lab server");
    wait_for(&ready)?;
    Ok(server)
}

/// User + system CPU time of all reaped children so far, in microseconds.
fn children_cpu_us() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}
