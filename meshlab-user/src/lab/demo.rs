//! `meshlab demo`: the lab end to end. Sets up namespaces A and B, records each "machine"
//! with its own `meshlab record`, runs the echo workload with probes over the chosen
//! topologies, merges, reports, and prints where every file is and the seed's ladder table.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::codec::Proto;
use super::demo_summary::{TopologyOutcome, print_outcomes};
use super::netns::{Lab, NamedNetns};
use super::probes::SampleRate;
use super::process::ChildGuard;
use super::topology::{Topology, TopologyRun};
use super::workload::client::parse_duration;
use super::workload::latency::LatencySummary;
use super::workload::{install_shutdown_handler, shutting_down};

/// How long `meshlab record` may take to attach before the demo gives up.
const RECORD_READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyChoice {
    Direct,
    OneHop,
    TwoHop,
    /// The seed's control experiment: two hops with both sidecars on node A.
    TwoHopSameNode,
    /// The ladder (direct, one-hop, two-hop) and its control (two-hop-same-node).
    All,
}

/// `meshlab demo`: the lab end to end.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    #[arg(long, value_enum, default_value_t = TopologyChoice::Direct)]
    pub topology: TopologyChoice,
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Payload bytes per request.
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Total request rate limit (0 = as fast as replies come back).
    #[arg(long, default_value_t = 0)]
    pub qps: u64,
    /// Measured time per topology.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Framing; off means upstream behaviour (the seed's rule): Framed unless `--proto ttheader`.
    #[arg(long, value_enum, default_value_t = Proto::Framed)]
    pub proto: Proto,
    /// Userland probes on one request in N.
    #[arg(long, default_value = "1/10")]
    pub trace_sample: SampleRate,
    /// Output directory (default ./meshlab-out-<UTC timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Leave the namespaces in place afterwards (remove later with `meshlab lab down`).
    #[arg(long)]
    pub keep_lab: bool,
    /// Skip the kernel recorders (workload, probes, merge and report still run).
    #[arg(long)]
    pub no_record: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    install_shutdown_handler();
    let exe = std::env::current_exe().context("locate the meshlab executable")?;
    let out = args.out.clone().unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&out).with_context(|| format!("mkdir {}", out.display()))?;
    let topologies: Vec<Topology> = match args.topology {
        TopologyChoice::Direct => vec![Topology::Direct],
        TopologyChoice::OneHop => vec![Topology::OneHop],
        TopologyChoice::TwoHop => vec![Topology::TwoHop],
        TopologyChoice::TwoHopSameNode => vec![Topology::TwoHopSameNode],
        TopologyChoice::All => Topology::ALL.to_vec(),
    };
    log::info!("demo: output in {}", out.display());
    log::info!("demo: creating network namespaces A and B");
    let lab = Lab::create().context("create the lab (needs root)")?;
    log::info!(
        "demo: A = {} ({}), B = {} ({})",
        lab.a.name(),
        lab.addrs.a,
        lab.b.name(),
        lab.addrs.b
    );
    let mut outcomes = Vec::new();
    for topology in topologies.iter().copied() {
        if shutting_down() {
            bail!("interrupted");
        }
        let dir = if topologies.len() == 1 {
            out.clone()
        } else {
            out.join(topology.name())
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        outcomes.push(run_topology(&args, &exe, &lab, topology, &dir)?);
    }
    if args.keep_lab {
        log::info!(
            "demo: keeping namespaces {} and {} (`meshlab lab down` removes them)",
            lab.a.name(),
            lab.b.name()
        );
        std::mem::forget(lab);
    } else {
        drop(lab);
        log::info!("demo: namespaces removed");
    }
    compare_topologies(&exe, &out, &mut outcomes);
    print_outcomes(&out, &outcomes)
}

/// With several topologies, the seed's ladder from the merged files themselves, segment by
/// segment (`meshlab report --compare`), written to compare.txt and shown.
fn compare_topologies(exe: &Path, out: &Path, outcomes: &mut [TopologyOutcome]) {
    let runs: Vec<(String, PathBuf)> = outcomes
        .iter()
        .map(|o| (o.topology.name().to_owned(), o.dir.join("merged.ndjson")))
        .filter(|(_, merged)| merged.exists())
        .collect();
    let Some(first) = outcomes.first_mut() else {
        return;
    };
    if runs.len() < 2 {
        return;
    }
    let text = out.join("compare.txt");
    let labels: Vec<&str> = runs.iter().map(|(name, _)| name.as_str()).collect();
    let mut compare = Command::new(exe);
    compare
        .arg("report")
        .arg("--compare")
        .args(runs.iter().map(|(_, merged)| merged));
    compare.arg("--labels").arg(labels.join(","));
    log::info!("demo: comparing {} segment by segment", labels.join(" / "));
    if run_step(&mut compare, "meshlab report --compare", Some(&text), first) {
        if let Ok(table) = std::fs::read_to_string(&text) {
            eprintln!("{table}");
        }
        first.files.push(text);
    }
}

fn default_out_dir() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as libc::time_t)
        .unwrap_or(0);
    // SAFETY: zeroed tm is a valid out value; gmtime_r only writes it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to a time_t and a tm.
    unsafe { libc::gmtime_r(&secs, &mut tm) };
    PathBuf::from(format!(
        "meshlab-out-{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    ))
}

fn os(s: impl Into<OsString>) -> OsString {
    s.into()
}

fn run_topology(
    args: &DemoArgs,
    exe: &Path,
    lab: &Lab,
    topology: Topology,
    dir: &Path,
) -> anyhow::Result<TopologyOutcome> {
    let name = topology.name();
    let mut outcome = TopologyOutcome {
        topology,
        dir: dir.to_owned(),
        summary: None,
        files: Vec::new(),
        failures: Vec::new(),
    };
    // Binary captures (`meshlab export` turns one into NDJSON); merge reads them directly.
    let kernel_files = [dir.join("kernel-A.capture"), dir.join("kernel-B.capture")];
    let recorders = start_recorders(args, exe, lab, &kernel_files, dir, name)?;
    let probe_files = [
        dir.join("probes-client.ndjson"),
        dir.join("probes-server.ndjson"),
    ];
    let client_stdout = run_workload(args, exe, lab, topology, &probe_files, &mut outcome)?;
    let summary: LatencySummary =
        serde_json::from_slice(&client_stdout).context("parse the client's --json summary")?;
    let summary_file = dir.join("client-summary.json");
    crate::output::write_output(&summary_file, &client_stdout)?;
    outcome.summary = Some(summary);
    for (node, mut recorder) in ["A", "B"].into_iter().zip(recorders) {
        let status = recorder.stop()?;
        if !status.success() {
            outcome
                .failures
                .push(format!("meshlab record (node {node}) exited with {status}"));
        }
    }
    outcome
        .files
        .extend(kernel_files.iter().filter(|f| f.exists()).cloned());
    outcome.files.extend(probe_files.iter().cloned());
    outcome.files.push(summary_file);
    merge_and_report(exe, dir, &kernel_files, &probe_files, &mut outcome);
    Ok(outcome)
}

/// One `meshlab record` per lab node, unless `--no-record`.
fn start_recorders(
    args: &DemoArgs,
    exe: &Path,
    lab: &Lab,
    kernel_files: &[PathBuf; 2],
    dir: &Path,
    name: &str,
) -> anyhow::Result<Vec<ChildGuard>> {
    if args.no_record {
        log::info!("demo[{name}]: --no-record: no kernel recorders");
        return Ok(Vec::new());
    }
    let mut recorders = Vec::new();
    for (node, ns, file) in [
        ("A", &lab.a, &kernel_files[0]),
        ("B", &lab.b, &kernel_files[1]),
    ] {
        recorders.push(start_recorder(exe, node, ns, file, dir)?);
    }
    log::info!("demo[{name}]: recorders for A and B attached");
    Ok(recorders)
}

/// `--trace FILE --trace-sample 1/N --node NODE --process ROLE` for the workload's probes.
fn trace_flags(args: &DemoArgs, file: &Path, node: &str, role: &str) -> Vec<OsString> {
    vec![
        os("--trace"),
        file.as_os_str().to_owned(),
        os("--trace-sample"),
        os(format!("1/{}", args.trace_sample.0)),
        os("--node"),
        os(node),
        os("--process"),
        os(role),
    ]
}

/// Starts the topology (server and sidecars), runs the client to the end and stops the
/// server; returns the client's `--json` summary.
fn run_workload(
    args: &DemoArgs,
    exe: &Path,
    lab: &Lab,
    topology: Topology,
    [client_probes, server_probes]: &[PathBuf; 2],
    outcome: &mut TopologyOutcome,
) -> anyhow::Result<Vec<u8>> {
    let name = topology.name();
    log::info!(
        "demo[{name}]: starting server in {}{}",
        topology.server_node(),
        sidecar_note(topology)
    );
    let server_flags = trace_flags(args, server_probes, topology.server_node(), "server");
    let mut run = TopologyRun::start(lab, topology, exe, args.proto, &server_flags)?;
    log::info!(
        "demo[{name}]: client in A -> {} for {:?} (+{:?} warm-up), c={}, {} B",
        run.client_target,
        args.duration,
        args.warmup,
        args.concurrency,
        args.payload
    );
    let output = run
        .client_command(lab, exe, args.proto)
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--payload", &args.payload.to_string()])
        .args(["--qps", &args.qps.to_string()])
        .args(["--warmup", &format!("{}ms", args.warmup.as_millis())])
        .args(["--duration", &format!("{}ms", args.duration.as_millis())])
        .arg("--json")
        .args(trace_flags(args, client_probes, "A", "client"))
        .stderr(Stdio::inherit())
        .output()
        .context("run the client")?;
    let server_status = run.stop_server()?;
    drop(run);
    if !output.status.success() {
        bail!("demo[{name}]: the client failed ({})", output.status);
    }
    if !server_status.success() {
        outcome
            .failures
            .push(format!("echo server exited with {server_status}"));
    }
    Ok(output.stdout)
}

fn sidecar_note(topology: Topology) -> &'static str {
    match topology {
        Topology::Direct => "",
        Topology::OneHop => " and HAProxy sidecar in A",
        Topology::TwoHop => " and HAProxy sidecars in A and B",
        Topology::TwoHopSameNode => " and both HAProxy sidecars in A (the control experiment)",
    }
}

/// `meshlab record -o FILE --node N --netns /run/netns/NS --ready-file F --duration 1h`,
/// waiting until it says it is attached.
fn start_recorder(
    exe: &Path,
    node: &str,
    ns: &NamedNetns,
    file: &Path,
    dir: &Path,
) -> anyhow::Result<ChildGuard> {
    let ready = dir.join(format!(".ready-{node}"));
    let _ = std::fs::remove_file(&ready);
    let mut cmd = Command::new(exe);
    // --unix: the sidecar legs are unix sockets; the netns filter keeps it to the lab's.
    cmd.arg("record")
        .arg("-o")
        .arg(file)
        .args(["--node", node, "--unix"]);
    cmd.arg("--netns")
        .arg(ns.path())
        .arg("--ready-file")
        .arg(&ready);
    // Long enough to outlive the run; the demo stops it with SIGINT.
    cmd.args(["--duration", "3600s"]).stdin(Stdio::null());
    let mut recorder = ChildGuard::spawn(
        &format!("meshlab record (node {node})"),
        &mut cmd,
        libc::SIGINT,
    )?;
    let deadline = Instant::now() + RECORD_READY_TIMEOUT;
    while !ready.exists() {
        if !recorder.running() {
            let status = recorder.wait()?;
            bail!(
                "meshlab record for node {node} exited with {status} before it was ready \
                 (its error is above); run the demo with --no-record to skip kernel recording"
            );
        }
        if Instant::now() > deadline || shutting_down() {
            bail!("meshlab record for node {node} was not ready within {RECORD_READY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(recorder)
}

fn merge_and_report(
    exe: &Path,
    dir: &Path,
    kernel_files: &[PathBuf],
    probe_files: &[PathBuf],
    outcome: &mut TopologyOutcome,
) {
    let name = outcome.topology.name();
    let merged = dir.join("merged.ndjson");
    let inputs = kernel_files
        .iter()
        .chain(probe_files)
        .filter(|f| f.exists());
    log::info!("demo[{name}]: merging");
    let mut merge = Command::new(exe);
    merge.arg("merge").args(inputs).arg("-o").arg(&merged);
    if !run_step(&mut merge, "meshlab merge", None, outcome) {
        return;
    }
    outcome.files.push(merged.clone());
    let html = dir.join("report.html");
    let text = dir.join("report.txt");
    log::info!("demo[{name}]: writing the report");
    let mut report = Command::new(exe);
    report.arg("report").arg(&merged).arg("--html").arg(&html);
    if run_step(&mut report, "meshlab report", Some(&text), outcome) {
        outcome.files.extend([html, text]);
    }
}

/// Runs one pipeline step; its stdout goes to `stdout_file` (or the demo's stderr). A failure
/// is recorded in the outcome, not raised: the demo still prints what it has.
fn run_step(
    cmd: &mut Command,
    what: &str,
    stdout_file: Option<&Path>,
    outcome: &mut TopologyOutcome,
) -> bool {
    let result = cmd.stderr(Stdio::inherit()).output();
    match result {
        Ok(out) if out.status.success() => {
            if let Some(file) = stdout_file
                && let Err(e) = crate::output::write_output(file, &out.stdout)
            {
                outcome.failures.push(format!("{what}: {e}"));
                return false;
            }
            true
        }
        Ok(out) => {
            outcome
                .failures
                .push(format!("{what} failed ({}): {cmd:?}", out.status));
            false
        }
        Err(e) => {
            outcome
                .failures
                .push(format!("{what} could not start: {e}"));
            false
        }
    }
}
