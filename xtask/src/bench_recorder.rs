//! `cargo xtask bench recorder-cpu`: the recorder's own CPU time (user+sys of the `meshlab
//! record` process) per event it receives, writing a binary capture vs NDJSON, under loopback
//! RPC load as fast as the lab client goes. Formats are interleaved round by round and
//! compared by medians. The CPU the recorder spent before it was ready (loading and attaching
//! the programs) is read from /proc and left out: the figure is the per-event cost. Each
//! format writes once to a file (what a recording costs, page cache included) and once to
//! /dev/null (the recorder's own processing without the page cache).
//!
//! `--baseline OLD_MESHLAB` adds that binary's capture runs to the same rounds: an A/B of two
//! builds under the same load and the same noise, the evidence for a change to the recorder.
//! `--formats capture` leaves this build's NDJSON runs out.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

use crate::procs::Proc;
use crate::{run_cmd, workspace_root};

#[derive(clap::Args)]
pub struct RecorderCpuArgs {
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Client connections (each sends its next request when the previous one is answered).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// An older `meshlab` binary whose capture runs alternate with this build's, round by
    /// round (the table names it by its file name: name the copy after its commit).
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Output formats of this build to measure.
    #[arg(long, value_delimiter = ',', default_value = "ndjson,capture")]
    pub formats: Vec<Format>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Ndjson,
    Capture,
}

impl Format {
    fn as_str(self) -> &'static str {
        match self {
            Format::Ndjson => "ndjson",
            Format::Capture => "capture",
        }
    }
}

const PORT: u16 = 47_310;

/// One kind of run: which binary, which format, to a file or to /dev/null.
struct Mode {
    exe: PathBuf,
    /// The binary's name in the table: "" for this build.
    build: String,
    format: Format,
    to_file: bool,
}

impl Mode {
    fn label(&self) -> String {
        let to = if self.to_file { "a file" } else { "/dev/null" };
        let mut s = format!("{} to {to}", self.format.as_str());
        if !self.build.is_empty() {
            s.push_str(&format!(" (baseline `{}`)", self.build));
        }
        s
    }
}

/// This build's formats, each to a file and to /dev/null, then the baseline's capture runs.
fn modes(exe: &Path, args: &RecorderCpuArgs) -> Result<Vec<Mode>> {
    let mut modes = Vec::new();
    for to_file in [true, false] {
        for &format in &args.formats {
            modes.push(Mode {
                exe: exe.to_owned(),
                build: String::new(),
                format,
                to_file,
            });
        }
        if let Some(baseline) = &args.baseline {
            ensure!(baseline.exists(), "{}: no such binary", baseline.display());
            let name = baseline.file_name().unwrap_or_default();
            modes.push(Mode {
                exe: baseline.clone(),
                build: name.to_string_lossy().into_owned(),
                format: Format::Capture,
                to_file,
            });
        }
    }
    ensure!(
        !modes.is_empty(),
        "nothing to measure: no format and no baseline"
    );
    Ok(modes)
}

/// One recorder run.
struct Run {
    events: u64,
    dropped: u64,
    cpu_s: f64,
    seconds: f64,
}

pub fn run(args: RecorderCpuArgs) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_cmd(Command::new(cargo).args(["build", "--release", "--bin", "meshlab"]))?;
    let exe = crate::target_dir().join("release/meshlab");
    let dir = crate::target_dir().join("bench-recorder");
    std::fs::create_dir_all(&dir)?;
    let _server = spawn_ready(
        Command::new(&exe).args(["lab", "server", "--listen", &format!("127.0.0.1:{PORT}")]),
        &dir.join("server.ready"),
        "meshlab lab server",
    )?;
    let modes = modes(&exe, &args)?;
    let mut runs: Vec<Vec<Run>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds.max(1) {
        // Rotate the order each round so drift over time does not favour one mode.
        for k in 0..modes.len() {
            let m = (round + k) % modes.len();
            runs[m].push(record_once(&dir, &modes[m], &exe, &args)?);
        }
    }
    let text = markdown(&modes, &runs, &args);
    print!("{text}");
    let doc = workspace_root().join("docs/benchmarks-recorder.md");
    std::fs::write(&doc, &text).with_context(|| format!("writing {}", doc.display()))?;
    eprintln!("wrote {}", doc.display());
    let _ = std::fs::remove_dir_all(dir.join("out"));
    Ok(())
}

/// Starts meshlab with `--ready-file ready` and waits (up to 30 s) for it to serve.
pub fn spawn_ready(cmd: &mut Command, ready: &Path, what: &str) -> Result<Proc> {
    let _ = std::fs::remove_file(ready);
    let child = cmd
        .arg("--ready-file")
        .arg(ready)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut child = Proc::new(child, what);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ready.exists() {
        if let Some(status) = child.0.try_wait()? {
            bail!("{what} exited before it was ready: {status}");
        }
        if std::time::Instant::now() > deadline {
            bail!("{} did not appear within 30 s", ready.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(child)
}

/// One recording by `mode`'s binary while this build's client (`client_exe`) sends the load.
fn record_once(dir: &Path, mode: &Mode, client_exe: &Path, args: &RecorderCpuArgs) -> Result<Run> {
    let (exe, format, to_file) = (&mode.exe, mode.format.as_str(), mode.to_file);
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir)?;
    // Not to file: stdout ("-") into /dev/null; `record` refuses /dev/null as an output path
    // (a device: crate::output's rules for files written as root).
    let (output, stdout) = if to_file {
        (out_dir.join(format!("rec.{format}")), Stdio::inherit())
    } else {
        ("-".into(), Stdio::null())
    };
    let mut recorder = spawn_ready(
        Command::new(exe)
            .args(["record", "--format", format, "--port", &PORT.to_string()])
            .arg("-o")
            .arg::<&std::path::Path>(&output)
            .stdout(stdout)
            .stderr(Stdio::piped()),
        &dir.join("record.ready"),
        "meshlab record",
    )?;
    let pid = recorder.0.id() as i32;
    let cpu_at_ready = proc_cpu_s(pid)?;
    let started = std::time::Instant::now();
    let mut client = Command::new(client_exe);
    client
        .args(["lab", "client", "--connect", &format!("127.0.0.1:{PORT}")])
        .args([
            "--warmup",
            "0s",
            "--duration",
            &format!("{}s", args.seconds),
        ])
        .args(["--concurrency", &args.concurrency.to_string(), "--qps", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let client = crate::cleanup::status_forwarding(&mut client, "meshlab lab client")?;
    ensure!(client.success(), "meshlab lab client failed: {client}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let mut stderr = String::new();
    if let Some(mut e) = recorder.0.stderr.take() {
        e.read_to_string(&mut stderr)?;
    }
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let seconds = started.elapsed().as_secs_f64();
    // Reaped: its pid is no longer its own, so its clean-up registration ends here.
    drop(recorder);
    ensure!(rc > 0, "wait4: {}", std::io::Error::last_os_error());
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "meshlab record failed: {stderr}"
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu_s = secs(usage.ru_utime) + secs(usage.ru_stime) - cpu_at_ready;
    if to_file {
        let _ = std::fs::remove_file(&output);
    }
    let (events, dropped) = summary_counts(&stderr)?;
    Ok(Run {
        events,
        dropped,
        cpu_s,
        seconds,
    })
}

/// user+sys seconds of a running process (/proc/PID/stat fields 14 and 15, in clock ticks).
pub fn proc_cpu_s(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').context("/proc/PID/stat format")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / per_s)
}

/// Events and drops from the recorder's final stderr line
/// ("meshlab record: node N 5.0s (sigint): 123 events, 0 dropped [...]").
fn summary_counts(stderr: &str) -> Result<(u64, u64)> {
    let line = stderr
        .lines()
        .rfind(|l| l.starts_with("meshlab record: node"))
        .with_context(|| format!("no summary line in the recorder's stderr: {stderr}"))?;
    let after = line.rsplit_once("): ").context("summary format")?.1;
    let mut words = after.split_whitespace();
    let events = words.next().context("event count")?.parse()?;
    let dropped = words.nth(1).context("drop count")?.parse()?;
    Ok((events, dropped))
}

fn markdown(modes: &[Mode], runs: &[Vec<Run>], args: &RecorderCpuArgs) -> String {
    let mut command = format!(
        "cargo xtask bench recorder-cpu --rounds {} --seconds {} --concurrency {}",
        args.rounds, args.seconds, args.concurrency
    );
    if args.formats != [Format::Ndjson, Format::Capture] {
        let formats: Vec<&str> = args.formats.iter().map(|f| f.as_str()).collect();
        command.push_str(&format!(" --formats {}", formats.join(",")));
    }
    if let Some(b) = &args.baseline {
        command.push_str(&format!(" --baseline {}", b.display()));
    }
    let mut s = format!(
        "## Recorder CPU per event (target: ≤ 100 ns)\n\n\
         `{command}` on {}: \
         `meshlab record --port P` tracing loopback echo RPCs of `meshlab lab client --qps 0`; \
         user+sys of the recorder process after it was ready (wait4(2) minus /proc/PID/stat at \
         ready), divided by the events it received. Modes interleaved round by round; median \
         and each run.\n\n\
         | output | ns/event (median) | runs | events/s received (median) | dropped (all runs) |\n\
         |---|---:|---|---:|---:|\n",
        crate::bench_merge::machine()
    );
    let mut medians = Vec::new();
    for (mode, runs) in modes.iter().zip(runs) {
        let ns: Vec<f64> = runs
            .iter()
            .map(|r| r.cpu_s * 1e9 / r.events.max(1) as f64)
            .collect();
        let rate: Vec<f64> = runs.iter().map(|r| r.events as f64 / r.seconds).collect();
        let dropped: u64 = runs.iter().map(|r| r.dropped).sum();
        medians.push(median(ns.clone()));
        let each: Vec<String> = ns.iter().map(|n| format!("{n:.0}")).collect();
        s.push_str(&format!(
            "| {} | **{:.0}** | {} | {:.0} | {dropped} |\n",
            mode.label(),
            medians[medians.len() - 1],
            each.join(", "),
            median(rate),
        ));
    }
    s.push('\n');
    s.push_str(&ratios(modes, &medians));
    s
}

/// Median ratios: capture / NDJSON of this build, this build / baseline for captures.
fn ratios(modes: &[Mode], medians: &[f64]) -> String {
    let find = |build_is_baseline: bool, format: Format, to_file: bool| {
        modes
            .iter()
            .position(|m| {
                m.build.is_empty() != build_is_baseline
                    && m.format == format
                    && m.to_file == to_file
            })
            .map(|i| medians[i])
    };
    let mut lines = Vec::new();
    for (what, num, den) in [
        (
            "capture / NDJSON",
            (false, Format::Capture),
            (false, Format::Ndjson),
        ),
        (
            "this build / baseline (captures)",
            (false, Format::Capture),
            (true, Format::Capture),
        ),
    ] {
        let ratio = |to_file| Some(find(num.0, num.1, to_file)? / find(den.0, den.1, to_file)?);
        if let (Some(file), Some(null)) = (ratio(true), ratio(false)) {
            lines.push(format!(
                "{what} CPU per event: {file:.3} to a file, {null:.3} to /dev/null.\n"
            ));
        }
    }
    lines.join("\n")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
