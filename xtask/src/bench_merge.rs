//! `cargo xtask bench merge`: merge throughput and peak memory on synthetic two-node traffic,
//! kernel recordings as binary captures vs as NDJSON (the same events), at several sizes.
//! Formats are interleaved round by round (order alternating) and compared by medians; the
//! result is written to docs/benchmarks-merge.md with the command that produced it. The
//! merged output of each size is then read by `meshlab report`, timed the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::{run_cmd, workspace_root};

#[derive(clap::Args)]
pub struct MergeBenchArgs {
    /// Approximate events per run (kernel + probe events of both nodes).
    #[arg(long, value_delimiter = ',', default_values_t = [100_000u64, 1_000_000, 10_000_000])]
    pub sizes: Vec<u64>,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Rounds for sizes of 10 million events or more (default: --rounds); one such merge
    /// takes minutes of CPU.
    #[arg(long)]
    pub large_rounds: Option<usize>,
    /// CI smoke test: 20 000 events, one round, debug build, nothing written to docs/.
    #[arg(long)]
    pub quick: bool,
}

const FORMATS: [&str; 2] = ["ndjson", "capture"];

/// One `meshlab merge` run.
pub struct Run {
    wall_s: f64,
    pub cpu_s: f64,
    max_rss_kib: u64,
    /// Times the kernel took the CPU from a runnable thread of the merge (wait4's
    /// ru_nivcsw): preemption by other load, as opposed to the merge waiting for something.
    preempted: u64,
}

/// Medians of one size and format.
struct Row {
    size: u64,
    rounds: usize,
    events: u64,
    format: &'static str,
    events_per_s: [f64; 3],
    events_per_cpu_s: f64,
    max_rss_mib: f64,
    /// Median CPU seconds per wall second (all threads): below 1 the merge was off the CPU.
    cpu_per_wall: f64,
    preempted: u64,
    /// 1-minute load average before and after this size's runs.
    load: (String, String),
}

/// Medians of `meshlab report` over one size's merged file.
struct ReportRow {
    /// Events the merge read (the size's input), requests and bytes of its merged file.
    events: u64,
    requests: u64,
    merged_bytes: u64,
    rounds: usize,
    wall_s: [f64; 3],
    cpu_s: f64,
    max_rss_mib: f64,
}

pub fn run(args: MergeBenchArgs) -> Result<()> {
    let (sizes, rounds) = if args.quick {
        (vec![20_000], 1)
    } else {
        (args.sizes.clone(), args.rounds.max(1))
    };
    // --quick (CI) uses the debug build `cargo test` has just made: seconds, not a release
    // build; its figures only show that the benchmark runs.
    let (profile, flag) = if args.quick {
        ("debug", None)
    } else {
        ("release", Some("--release"))
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let build = |what: &[&str]| run_cmd(Command::new(&cargo).arg("build").args(flag).args(what));
    build(&["--bin", "meshlab"])?;
    build(&["-p", "meshlab-user", "--example", "merge_bench_input"])?;
    let target = crate::target_dir().join(profile);
    let exe = target.join("meshlab");
    let mut rows = Vec::new();
    let mut report_rows = Vec::new();
    for size in sizes {
        let rounds = match args.large_rounds {
            Some(large) if size >= 10_000_000 => large.max(1),
            _ => rounds,
        };
        let dir = crate::target_dir().join(format!("bench-merge/{size}"));
        let _ = std::fs::remove_dir_all(&dir);
        let input = generate(&target.join("examples/merge_bench_input"), size, &dir)?;
        let mut runs: [Vec<Run>; 2] = Default::default();
        let load_before = load_average();
        for round in 0..rounds {
            for k in 0..FORMATS.len() {
                let f = (round + k) % FORMATS.len();
                runs[f].push(merge_once(&exe, &input.files[f])?);
            }
        }
        let load = (load_before, load_average());
        for (f, runs) in runs.into_iter().enumerate() {
            rows.push(summarize(
                size,
                input.events,
                FORMATS[f],
                &runs,
                load.clone(),
            ));
            eprintln!("bench merge: {size} events, {}: done", FORMATS[f]);
        }
        report_rows.push(time_report(&exe, &input, &dir, rounds)?);
        eprintln!("bench merge: {size} events, report: done");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let mut text = markdown(&rows, &args);
    text.push_str(&report_markdown(&report_rows));
    print!("{text}");
    if !args.quick {
        let doc = workspace_root().join("docs/benchmarks-merge.md");
        std::fs::write(&doc, &text).with_context(|| format!("writing {}", doc.display()))?;
        eprintln!("wrote {}", doc.display());
    }
    Ok(())
}

struct Input {
    events: u64,
    /// Per format (FORMATS order): the merge's input files.
    files: [Vec<PathBuf>; 2],
}

fn generate(tool: &Path, size: u64, dir: &Path) -> Result<Input> {
    let out = Command::new(tool)
        .arg(size.to_string())
        .arg(dir)
        .stderr(Stdio::inherit())
        .output()
        .context("running the merge_bench_input example")?;
    ensure!(
        out.status.success(),
        "merge_bench_input failed: {}",
        out.status
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("its JSON line")?;
    let files = |k: &str| -> Result<Vec<PathBuf>> {
        v[k].as_array()
            .with_context(|| format!("no {k} files"))?
            .iter()
            .map(|p| p.as_str().map(PathBuf::from).context("a path"))
            .collect()
    };
    Ok(Input {
        events: v["events"].as_u64().context("no event count")?,
        files: [files("ndjson")?, files("capture")?],
    })
}

/// Runs `meshlab merge FILES` (output discarded) and reads its CPU time and peak RSS from
/// wait4(2).
pub fn merge_once(exe: &Path, files: &[PathBuf]) -> Result<Run> {
    timed(exe, "merge", files)
}

/// Runs `meshlab SUBCOMMAND FILES` (output discarded), timed by wait4(2).
fn timed(exe: &Path, subcommand: &str, files: &[PathBuf]) -> Result<Run> {
    let started = Instant::now();
    let child = Command::new(exe)
        .arg(subcommand)
        .args(files)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting meshlab {subcommand}"))?;
    let _cleanup = crate::cleanup::kill_child(&child, "meshlab (bench merge)");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let rc = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall_s = started.elapsed().as_secs_f64();
    ensure!(rc > 0, "wait4: {}", std::io::Error::last_os_error());
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("meshlab {subcommand} {files:?} failed (wait status {status})");
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Run {
        wall_s,
        cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
        preempted: usage.ru_nivcsw as u64,
    })
}

/// Merges the size's captures once into `dir`/merged.ndjson and times `meshlab report` of
/// it, `rounds` times.
fn time_report(exe: &Path, input: &Input, dir: &Path, rounds: usize) -> Result<ReportRow> {
    let merged = dir.join("merged.ndjson");
    run_cmd(
        Command::new(exe)
            .arg("merge")
            .args(&input.files[1])
            .arg("-o")
            .arg(&merged)
            .stderr(Stdio::null()),
    )?;
    let (requests, merged_bytes) =
        request_lines(&merged).with_context(|| format!("reading {}", merged.display()))?;
    ensure!(requests > 0, "{}: no request records", merged.display());
    let runs = (0..rounds)
        .map(|_| timed(exe, "report", std::slice::from_ref(&merged)))
        .collect::<Result<Vec<_>>>()?;
    Ok(ReportRow {
        events: input.events,
        requests,
        merged_bytes,
        rounds,
        wall_s: min_median_max(runs.iter().map(|r| r.wall_s).collect()),
        cpu_s: median(runs.iter().map(|r| r.cpu_s).collect()),
        max_rss_mib: median(runs.iter().map(|r| r.max_rss_kib as f64 / 1024.0).collect()),
    })
}

/// The request records of a merged file and its size in bytes, read line by line (at 1e7
/// events the file has more than a GiB).
fn request_lines(merged: &Path) -> std::io::Result<(u64, u64)> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(std::fs::File::open(merged)?);
    let (mut requests, mut bytes, mut line) = (0, 0, Vec::new());
    loop {
        line.clear();
        let got = reader.read_until(b'\n', &mut line)?;
        if got == 0 {
            return Ok((requests, bytes));
        }
        bytes += got as u64;
        requests += u64::from(line.starts_with(br#"{"type":"request""#));
    }
}

/// The report table: per size, `meshlab report` of the merge's output.
fn report_markdown(rows: &[ReportRow]) -> String {
    let mut s = String::from(
        "\n## Report speed (5d)\n\n\
         Each size's binary captures merged once more into a file (`meshlab merge ... -o \
         merged.ndjson`), then `meshlab report merged.ndjson` (the default text report, output \
         discarded) timed by wait4(2), rounds as above. Events/s and per CPU-second count the \
         events the merge read (the size), so the two tables compare; requests/s is the merged \
         file's request records per wall second.\n\n\
         | events | requests | merged file MiB | rounds | wall s (min / median / max) | events/s (median) | events per CPU-second | requests/s | peak RSS MiB |\n\
         |---:|---:|---:|---:|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let [lo, med, hi] = r.wall_s;
        s.push_str(&format!(
            "| {} | {} | {:.1} | {} | {lo:.3} / **{med:.3}** / {hi:.3} | {:.0} | {:.0} | {:.0} | {:.1} |\n",
            r.events,
            r.requests,
            r.merged_bytes as f64 / (1024.0 * 1024.0),
            r.rounds,
            r.events as f64 / med,
            r.events as f64 / r.cpu_s,
            r.requests as f64 / med,
            r.max_rss_mib,
        ));
    }
    s
}

/// The 1-minute load average (/proc/loadavg), as written there.
/// The 1-minute load average (the first of [`crate::machine_cpu::loadavg`]'s three).
fn load_average() -> String {
    let all = crate::machine_cpu::loadavg();
    all.split_whitespace().next().unwrap_or("?").to_owned()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn min_median_max(v: Vec<f64>) -> [f64; 3] {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    [min, median(v), max]
}

fn summarize(
    size: u64,
    events: u64,
    format: &'static str,
    runs: &[Run],
    load: (String, String),
) -> Row {
    let rates: Vec<f64> = runs.iter().map(|r| events as f64 / r.wall_s).collect();
    Row {
        size,
        rounds: runs.len(),
        events,
        format,
        events_per_s: min_median_max(rates),
        events_per_cpu_s: median(runs.iter().map(|r| events as f64 / r.cpu_s).collect()),
        max_rss_mib: median(runs.iter().map(|r| r.max_rss_kib as f64 / 1024.0).collect()),
        cpu_per_wall: median(runs.iter().map(|r| r.cpu_s / r.wall_s).collect()),
        preempted: median(runs.iter().map(|r| r.preempted as f64).collect()) as u64,
        load,
    }
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}

fn markdown(rows: &[Row], args: &MergeBenchArgs) -> String {
    let command = if args.quick {
        "cargo xtask bench merge --quick".to_owned()
    } else {
        let sizes: Vec<String> = args.sizes.iter().map(u64::to_string).collect();
        let large = args
            .large_rounds
            .map(|r| format!(" --large-rounds {r}"))
            .unwrap_or_default();
        format!(
            "cargo xtask bench merge --sizes {} --rounds {}{large}",
            sizes.join(","),
            args.rounds
        )
    };
    let mut s = format!(
        "## Merge throughput and memory (5d)\n\n\
         `{command}` on {}: synthetic two-node traffic (8 connections, probes on both nodes, 1 ms \
         think time: about 285 000 events per second of node time, so the 2 s window holds \
         about 570 000 events; meshlab_testkit::synth::bench_generate), \
         kernel recordings as NDJSON or as binary captures of the same events; \
         `meshlab merge` with its default 2 s window, output discarded. Formats interleaved \
         round by round (rounds per row); events/s is events / wall time (min / median / max), events per CPU-second \
         counts user+sys of all threads (the one-core rate), peak RSS from wait4(2). \
         CPU/wall is CPU seconds (all threads) per wall second, median: the merge reads on \
         other threads, so on an idle machine it is 1 or more; below that the merge was off \
         the CPU. Preempted counts the times the kernel took the CPU from a runnable merge \
         thread (wait4's ru_nivcsw, median), load the 1-minute load average before / after \
         the size's runs: a low CPU/wall with many preemptions and a high load is other \
         load on the machine, not the merge waiting.\n\n\
         | events | input | rounds | events/s (min / median / max) | events per CPU-second | peak RSS MiB | CPU/wall | preempted | load |\n\
         |---:|---|---:|---|---:|---:|---:|---:|---|\n",
        machine()
    );
    for r in rows {
        let [lo, med, hi] = r.events_per_s;
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} / **{:.0}** / {:.0} | {:.0} | {:.1} | {:.2} | {} | {} / {} |\n",
            r.events,
            r.format,
            r.rounds,
            lo,
            med,
            hi,
            r.events_per_cpu_s,
            r.max_rss_mib,
            r.cpu_per_wall,
            r.preempted,
            r.load.0,
            r.load.1
        ));
    }
    for pair in rows.chunks(2) {
        if let [n, c] = pair {
            s.push_str(&format!(
                "\n{} requested events: capture / NDJSON median events/s = {:.2}",
                n.size,
                c.events_per_s[1] / n.events_per_s[1]
            ));
        }
    }
    s.push('\n');
    s
}
