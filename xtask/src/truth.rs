//! `cargo xtask truth`: does the attribution find a cause where it was put? Each known cause is
//! injected into a two-namespace lab (kernel-only recording: an unmodified echo server, no
//! userland probes), runs with and without it are interleaved, and the table shows per cause
//! the added end-to-end p50 and the share of it found in the segments where the cause lives.
//!
//! Medians: per run, the median over the run's complete requests; per condition, the median
//! over its runs. "Recovered" is the added median of the per-request sum of the cause's
//! segments; the share is recovered / added e2e p50.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::bpfstats::{self, StatsEnabled};
use crate::cleanup::Registered;
use crate::procs::{remove_dir_when_killed, run_quiet};
use crate::truth_cause::{
    ALL_CAUSES, CAUSES, Cause, HOG_RUN_HANDLER_CPU, LONG_HANDLER_CPU, WIRE_LOSS_PPM,
};
use crate::truth_lab::{
    CpuHogs, Proc, SchedSetup, TbfQdisc, TruthNetns, busy_between, cpu_ticks, own_session,
    sched_batch,
};
use crate::truth_reference::{self, Reference, ReferenceRun};
use crate::truth_stats::{
    RunStats, TableSetting, own_cost_per_request, print_breakdowns, print_retransmissions,
    print_table, run_stats,
};
use crate::wire_loss::WireLoss;
use crate::{run_cmd, target_dir};

#[derive(clap::Args)]
pub struct TruthArgs {
    /// One round of 1 s runs, for CI: prints the table, checks no share.
    #[arg(long)]
    quick: bool,
    /// Interleaved rounds (each: one run without and one with every cause).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
    /// Name prefix of the namespaces (`PREFIX-PID-a`, `-b`).
    #[arg(long, default_value = "mltruth")]
    prefix: String,
    /// Keep the run directories (recordings, merged files) in this directory.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Use the debug build of meshlab (quicker to build; the eBPF object is the same).
    #[arg(long)]
    pub debug: bool,
    /// Only these causes (repeatable; default: all).
    #[arg(long = "cause", value_enum)]
    pub causes: Vec<Cause>,
    /// Only the bpftrace reference runs (no cause), for checking the reference quickly.
    #[arg(long)]
    reference_only: bool,
    /// No bpftrace reference runs (the causes' table only): for measuring causes on a machine
    /// where bpftrace is slow to stop, or not installed.
    #[arg(long, conflicts_with = "reference_only")]
    no_reference: bool,
    /// Also print, per cause, every segment's p50 and mean without and with it, and the CPUs
    /// it ran on: where an added latency went.
    #[arg(long)]
    pub breakdown: bool,
    /// The causes this host kernel cannot inject (netem, a real NIC IRQ), in two qemu guests
    /// (truth_vm.rs); `--cause` then names guest causes only.
    #[arg(long)]
    pub vm: bool,
}

/// The client runs on CPU 0, the server (and the hogs) on CPU 1.
const CLIENT_CPU: usize = 0;
const SERVER_CPU: usize = 1;
const PORT: u16 = 9000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunKind {
    Without,
    WithCause,
    /// Without the cause, watched by the bpftrace reference; not part of the table.
    /// `stamps`: the script keeps its clock reads (for the offsets, not the comparison).
    Reference {
        stamps: bool,
    },
}

/// Rounds and seconds per run of `args` (`--quick`: one short round), after checking that
/// every named cause is injected where `--vm` says (this host or the qemu guests).
pub fn run_shape(args: &TruthArgs) -> Result<(usize, u64)> {
    if !crate::setup::is_root() {
        bail!("cargo xtask truth needs root (network namespaces, qdiscs, eBPF): run it as root");
    }
    let misplaced = args.causes.iter().find(|c| c.in_guests() != args.vm);
    if let Some(cause) = misplaced {
        let (place, fix) = if args.vm {
            ("on this host", "drop --vm")
        } else {
            ("in the qemu guests", "add --vm")
        };
        bail!("{cause:?} is injected {place}: {fix}");
    }
    Ok(if args.quick {
        (1, 1)
    } else {
        (args.rounds.max(1), args.seconds.max(1))
    })
}

/// The host causes (`--vm` runs go to truth_vm::run_args instead).
pub fn run(args: TruthArgs) -> Result<()> {
    let (rounds, seconds) = run_shape(&args)?;
    let exe = build_meshlab(args.debug)?;
    let scratch = Scratch::new(args.keep.clone())?;
    let netns = TruthNetns::create(&args.prefix)?;
    // Global switch, set back on drop (also on failure).
    let _stats = StatsEnabled::on()?;
    eprintln!(
        "truth: namespaces {} ({}) and {} ({}); {rounds} round(s) x {seconds}s per run",
        netns.a, netns.addr_a, netns.b, netns.addr_b
    );
    let mut results: BTreeMap<(Cause, bool), Vec<RunStats>> = BTreeMap::new();
    let mut reference_runs = Vec::new();
    for round in 0..rounds {
        let causes = ALL_CAUSES.into_iter().filter(|c| {
            let chosen = if args.causes.is_empty() {
                CAUSES.contains(c)
            } else {
                args.causes.contains(c)
            };
            !args.reference_only && chosen
        });
        for cause in causes {
            // Alternate which condition goes first, so drift favours neither.
            for k in 0..2 {
                let with_cause = (round + k) % 2 == 1;
                let dir = scratch.run_dir(round, cause, with_cause)?;
                let kind = if with_cause {
                    RunKind::WithCause
                } else {
                    RunKind::Without
                };
                let stats = one_run(&exe, &netns, cause, kind, seconds, &dir)
                    .with_context(|| format!("round {round}, {} ({with_cause})", cause.name()))?;
                // Recordings take ~16 MB per run: keep only what was asked for.
                scratch.done_with(&dir);
                eprintln!(
                    "truth: round {round} {:<28} {:<7} e2e p50 {:>9.1} us, {} {:>9.1} us ({} requests, meshlab BPF {} us/request)",
                    cause.name(),
                    if with_cause { "cause" } else { "without" },
                    stats.e2e_p50_ns / 1e3,
                    cause.target_name(),
                    stats.target_p50_ns / 1e3,
                    stats.requests,
                    stats
                        .bpf_ns_per_request
                        .map_or("not measured".into(), |ns| format!("{:.1}", ns / 1e3))
                );
                results.entry((cause, with_cause)).or_default().push(stats);
            }
        }
        // One run for the comparison, one keeping bpftrace's clock reads for the offsets.
        let stamps_runs: &[bool] = if args.no_reference {
            &[]
        } else {
            &[false, true]
        };
        for &stamps in stamps_runs {
            reference_runs.extend(reference_run(
                &exe, &netns, &scratch, round, seconds, stamps,
            )?);
        }
    }
    print_table(&results, &TableSetting::namespaces(rounds, seconds));
    print_retransmissions(&results);
    if args.breakdown {
        print_breakdowns(&results);
    }
    if !args.no_reference {
        truth_reference::print_comparison(&reference_runs);
    }
    Ok(())
}

pub fn build_meshlab(debug: bool) -> Result<PathBuf> {
    if debug {
        run_cmd(crate::cargo().args(["build", "--bin", "meshlab"]))?;
        Ok(target_dir().join("debug/meshlab"))
    } else {
        run_cmd(crate::cargo().args(["build", "--release", "--bin", "meshlab"]))?;
        Ok(target_dir().join("release/meshlab"))
    }
}

/// The round's run watched by bpftrace: the plain 64-byte workload, no cause.
fn reference_run(
    exe: &Path,
    netns: &TruthNetns,
    scratch: &Scratch,
    round: usize,
    seconds: u64,
    stamps: bool,
) -> Result<Option<ReferenceRun>> {
    let dir = scratch
        .run_dir(round, Cause::SlowHandler, false)?
        .join(if stamps {
            "reference-stamps"
        } else {
            "reference"
        });
    std::fs::create_dir_all(&dir)?;
    let stats = one_run(
        exe,
        netns,
        Cause::SlowHandler,
        RunKind::Reference { stamps },
        seconds,
        &dir,
    )
    .with_context(|| format!("round {round}, reference run"))?;
    // meshlab's clock reads of the events bpftrace saw: the client's recording as NDJSON.
    let meshlab_reads = if stamps {
        let export = dir.join("kernel-A.export.ndjson");
        run_quiet(
            std::process::Command::new(exe)
                .arg("export")
                .arg(dir.join("kernel-A.ndjson"))
                .arg("-o")
                .arg(&export),
        )?;
        truth_reference::meshlab_reads(&export)?
    } else {
        Vec::new()
    };
    scratch.done_with(&dir);
    Ok(stats.reference.map(|r| ReferenceRun {
        stamps,
        offsets: truth_reference::clock_offsets(&r.reads, &meshlab_reads),
        bpftrace: r.medians,
        meshlab: stats.present_p50_ns,
        meshlab_stage_own_ns: stats.client_stage_own_ns,
        loaded_programs: stats.loaded_programs,
    }))
}

fn one_run(
    exe: &Path,
    netns: &TruthNetns,
    cause: Cause,
    run_kind: RunKind,
    seconds: u64,
    dir: &Path,
) -> Result<RunStats> {
    let with_cause = run_kind == RunKind::WithCause;
    let kernel = [dir.join("kernel-A.ndjson"), dir.join("kernel-B.ndjson")];
    let mut recorders = Vec::new();
    for (node, ns, file) in [("A", &netns.a, &kernel[0]), ("B", &netns.b, &kernel[1])] {
        recorders.push(start_recorder(exe, node, ns, file, dir)?);
    }
    let _qdisc = match (cause, with_cause) {
        (Cause::TbfRateLimit, true) => Some(TbfQdisc::add(&netns.a, &netns.dev_a, "2mbit")?),
        _ => None,
    };
    let _wire_loss = match cause {
        Cause::WireLoss => Some(WireLoss::attach(
            &[(&netns.a, &netns.dev_a), (&netns.b, &netns.dev_b)],
            if with_cause { WIRE_LOSS_PPM } else { 0 },
        )?),
        _ => None,
    };
    let hogs = match (cause, with_cause) {
        (c, true) if c.has_hogs() => Some(CpuHogs::start(c.hogs(), SERVER_CPU)?),
        _ => None,
    };
    // Its own runs: bpftrace's programs slow the traffic they watch, so a watched run must not
    // be a baseline of the table.
    let reference = match run_kind {
        RunKind::Reference { stamps } => Some(Reference::start(&netns.dev_a, stamps, dir)?),
        _ => None,
    };
    let ticks_before = cpu_ticks()?;
    let mut server = start_server(exe, netns, cause, with_cause, dir)?;
    if let Some(hogs) = &hogs {
        check_hog_setup(hogs, server.pid().context("server stopped")?, cause)?;
    }
    run_client(exe, netns, cause, seconds)?;
    server.stop()?;
    // While every tool's programs are still loaded: the reference's `progs` column.
    let loaded_programs = match &reference {
        Some(_) => Some(bpfstats::loaded_program_names()?),
        None => None,
    };
    let cpu_busy = busy_between(&ticks_before, &cpu_ticks()?);
    let reference = reference.map(Reference::finish).transpose()?;
    for mut recorder in recorders {
        recorder.stop()?;
    }
    let merged = merge_kernel(exe, &kernel, dir)?;
    let mut stats = run_stats(&merged, cause)?;
    let report = report_json(exe, &merged)?;
    let own = own_cost_per_request(&report)
        .with_context(|| format!("meshlab report --json {}: own_cost", merged.display()))?;
    (stats.bpf_ns_per_request, stats.recorder_cpu_ns_per_request) = own;
    stats.breakdown.cpu_busy = cpu_busy;
    stats.reference = reference;
    if let Some(loaded_programs) = loaded_programs {
        stats.client_stage_own_ns = truth_reference::client_stage_own_ns(&report);
        stats.loaded_programs = loaded_programs;
    }
    Ok(stats)
}

/// The hogs compete with the server as the cause says: the same nice value, pinned to the
/// server's CPU, in the server's autogroup (task group), and the same policy, except that the
/// batch-server cause runs the server SCHED_BATCH. Printed once per run; a difference is an
/// error (the harness started under another nice or policy would still be a cause, but not
/// this one).
fn check_hog_setup(hogs: &CpuHogs, server_pid: u32, cause: Cause) -> Result<()> {
    let server = SchedSetup::of(server_pid, server_pid)?;
    let me = std::process::id();
    let server_policy = if cause.batch_server() {
        i64::from(libc::SCHED_BATCH)
    } else {
        i64::from(libc::SCHED_OTHER)
    };
    for &tid in &hogs.tids {
        let hog = SchedSetup::of(me, tid as u32)?;
        let expected = SchedSetup {
            policy: server_policy,
            ..hog.clone()
        };
        if hog.policy != i64::from(libc::SCHED_OTHER)
            || expected != server
            || server.cpus != SERVER_CPU.to_string()
        {
            bail!(
                "CPU hogs: hog thread {tid} {hog:?}, server {server_pid} {server:?}: not SCHED_OTHER hogs, the server's policy {server_policy}, the same nice, CPU {SERVER_CPU} and autogroup"
            );
        }
    }
    eprintln!(
        "truth: {} hog threads (SCHED_OTHER) and the server: policy {} (0 = SCHED_OTHER, 3 = SCHED_BATCH), nice {}, CPUs {}, autogroup {}",
        hogs.tids.len(),
        server.policy,
        server.nice,
        server.cpus,
        server.autogroup
    );
    Ok(())
}

/// The lab client on node A, pinned, with the cause's workload; fails with its stderr.
fn run_client(exe: &Path, netns: &TruthNetns, cause: Cause, seconds: u64) -> Result<()> {
    let workload = cause.workload();
    let mut cmd = TruthNetns::exec_pinned(&netns.a, CLIENT_CPU, exe);
    let output = own_session(&mut cmd)
        .args(["lab", "client", "--connect"])
        .arg(format!("{}:{PORT}", netns.addr_b))
        .args(["--payload", &workload.payload.to_string()])
        .args(["--qps", &workload.qps.to_string()])
        .args(["--warmup", "300ms", "--duration", &format!("{seconds}s")])
        .stdin(std::process::Stdio::null())
        .output()
        .context("running the lab client")?;
    if !output.status.success() {
        bail!(
            "the lab client failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// `meshlab merge` of the two kernel recordings (kernel-only mode) into `dir`/merged.ndjson.
fn merge_kernel(exe: &Path, kernel: &[PathBuf], dir: &Path) -> Result<PathBuf> {
    let merged = dir.join("merged.ndjson");
    run_quiet(
        std::process::Command::new(exe)
            .arg("merge")
            .args(kernel)
            .arg("-o")
            .arg(&merged),
    )?;
    Ok(merged)
}

/// `meshlab report --json` of a merged file.
fn report_json(exe: &Path, merged: &Path) -> Result<serde_json::Value> {
    let out = run_quiet(
        std::process::Command::new(exe)
            .args(["report", "--json"])
            .arg(merged),
    )?;
    serde_json::from_slice(&out).context("meshlab report --json: not JSON")
}

fn start_recorder(exe: &Path, node: &str, ns: &str, file: &Path, dir: &Path) -> Result<Proc> {
    let ready = dir.join(format!(".ready-{node}"));
    // A kept directory may hold the file from an earlier run.
    let _ = std::fs::remove_file(&ready);
    let mut cmd = std::process::Command::new(exe);
    own_session(&mut cmd)
        .arg("record")
        .arg("-o")
        .arg(file)
        .args(["--node", node, "--netns", &TruthNetns::path(ns)])
        .arg("--ready-file")
        .arg(&ready)
        .args(["--duration", "600s"])
        .stderr(std::fs::File::create(
            dir.join(format!("record-{node}.log")),
        )?);
    let mut recorder = Proc::spawn(&format!("meshlab record (node {node})"), &mut cmd)?;
    recorder.wait_ready(&ready, Duration::from_secs(60))?;
    Ok(recorder)
}

fn start_server(
    exe: &Path,
    netns: &TruthNetns,
    cause: Cause,
    with_cause: bool,
    dir: &Path,
) -> Result<Proc> {
    let ready = dir.join(".ready-server");
    let _ = std::fs::remove_file(&ready);
    let mut cmd = TruthNetns::exec_pinned(&netns.b, SERVER_CPU, exe);
    cmd.args(["lab", "server", "--listen"])
        .arg(format!("{}:{PORT}", netns.addr_b))
        .arg("--ready-file")
        .arg(&ready)
        .args(server_options(cause, with_cause));
    if cause.batch_server() {
        sched_batch(&mut cmd);
    }
    let mut server = Proc::spawn("meshlab lab server", &mut cmd)?;
    server.wait_ready(&ready, Duration::from_secs(10))?;
    Ok(server)
}

/// The lab server's options in one run of `cause`, beyond where it listens.
fn server_options(cause: Cause, with_cause: bool) -> Vec<&'static str> {
    let mut options = Vec::new();
    // The CPU-hog runs' server is the same in both conditions: only the hogs differ.
    match cause {
        Cause::CpuHogsBusy => options.extend(["--handler-cpu", HOG_RUN_HANDLER_CPU]),
        Cause::CpuHogsLongHandler => options.extend(["--handler-cpu", LONG_HANDLER_CPU]),
        Cause::CpuHogsBusyPoll => options.push("--busy-poll"),
        _ => {}
    }
    match (cause, with_cause) {
        (Cause::SlowHandler, true) => options.extend(["--handler-spin", "200us"]),
        (Cause::SmallRcvbuf, true) => options.extend(["--rcvbuf", "4096"]),
        _ => {}
    }
    options
}

/// Where run directories go: a kept directory, or a temporary one removed at the end (or when
/// xtask is killed).
struct Scratch {
    root: PathBuf,
    keep: bool,
    _cleanup: Option<Registered>,
}

impl Scratch {
    fn new(keep: Option<PathBuf>) -> Result<Self> {
        let (root, keep) = match keep {
            Some(dir) => (dir, true),
            None => (
                std::env::temp_dir().join(format!("meshlab-truth-{}", std::process::id())),
                false,
            ),
        };
        std::fs::create_dir_all(&root).with_context(|| format!("mkdir {}", root.display()))?;
        let cleanup = (!keep).then(|| remove_dir_when_killed(root.clone()));
        Ok(Self {
            root,
            keep,
            _cleanup: cleanup,
        })
    }

    fn run_dir(&self, round: usize, cause: Cause, with_cause: bool) -> Result<PathBuf> {
        let dir = self.root.join(format!(
            "r{round}-{cause:?}-{}",
            if with_cause { "on" } else { "off" }
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        Ok(dir)
    }
}

impl Scratch {
    fn done_with(&self, run_dir: &Path) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(run_dir);
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::truth_cause::{VM_CAUSES, VM_NAMED_CAUSES};
    use crate::truth_stats::{CpuTimes, cost_cell, request_stats, target_ns};
    use clap::Parser;
    use serde_json::json;
    use std::collections::BTreeSet;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        truth: TruthArgs,
    }

    fn seg(node: &str, name: &str, unit: &str, kind: &str, dur: u64) -> serde_json::Value {
        json!({"node": node, "name": name, "unit": unit, "kind": kind, "dur_ns": dur})
    }

    fn request(trace_id: &str, e2e: u64, segments: serde_json::Value) -> serde_json::Value {
        json!({"type": "request", "complete": true, "trace_id": trace_id, "e2e_ns": e2e,
               "segments": segments})
    }

    /// One request of a busy-poll run with the hogs: the reader preempted while its data
    /// waited, then busy reading, then preempted inside its work; the client's own waits.
    fn busy_poll_request(trace_id: &str, runqueue: u64) -> serde_json::Value {
        request(
            trace_id,
            runqueue + 1_000,
            json!([
                seg("B", "rx_runqueue_wait", "scheduler", "queue", runqueue),
                seg("B", "rx_reader_busy", "role", "compute", 20),
                seg("B", "runqueue_wait", "scheduler", "queue", 300),
                seg("B", "rx_sched_delay", "scheduler", "queue", 200),
                seg("A", "rx_runqueue_wait", "scheduler", "queue", 400),
                seg("B", "server_app", "server", "compute", 80),
            ]),
        )
    }

    #[test]
    fn the_busy_poll_cause_counts_only_the_servers_rx_runqueue_wait() {
        let r = busy_poll_request("t@64", 5_000);
        assert_eq!(target_ns(&r, Cause::CpuHogsBusyPoll), 5_000);
        // The other hog causes count every wait of the server for its CPU.
        assert_eq!(target_ns(&r, Cause::CpuHogsLongHandler), 5_500);
        assert_eq!(Cause::CpuHogsBusyPoll.target_name(), "B rx_runqueue_wait");
    }

    #[test]
    fn the_busy_poll_server_polls_in_both_conditions_and_only_the_hogs_differ() {
        for with_cause in [false, true] {
            assert_eq!(
                server_options(Cause::CpuHogsBusyPoll, with_cause),
                ["--busy-poll"]
            );
            assert_eq!(
                server_options(Cause::CpuHogsLongHandler, with_cause),
                ["--handler-cpu", LONG_HANDLER_CPU]
            );
        }
        assert!(Cause::CpuHogsBusyPoll.has_hogs());
        assert!(!Cause::CpuHogsBusyPoll.batch_server());
        assert!(server_options(Cause::SlowHandler, false).is_empty());
        assert_eq!(
            server_options(Cause::SlowHandler, true),
            ["--handler-spin", "200us"]
        );
        assert_eq!(
            server_options(Cause::SmallRcvbuf, true),
            ["--rcvbuf", "4096"]
        );
    }

    #[test]
    fn busy_poll_requests_are_sent_further_apart_than_the_longest_wait() {
        // The hogs' ticks (HZ = 250: 4 ms each) before the server's turn comes back.
        let hogs = Cause::CpuHogsBusyPoll.hogs();
        assert_eq!(hogs, 2);
        let longest_wait = Duration::from_millis(4) * u32::try_from(hogs).unwrap();
        let workload = Cause::CpuHogsBusyPoll.workload();
        let interval = Duration::from_secs(1) / u32::try_from(workload.qps).unwrap();
        assert!(interval > longest_wait, "{interval:?}");
        assert_eq!(workload.payload, 64);
        // The interval in ticks, against the cycle of the server's and the hogs' turns: not a
        // multiple of it, so arrivals step through every turn; and not a whole number of
        // ticks, so arrivals step through every point of a tick.
        let tick = Duration::from_millis(4);
        let ticks = interval.as_micros() / tick.as_micros();
        assert_ne!(ticks % (hogs as u128 + 1), 0);
        let phase_step = interval.as_micros() % tick.as_micros();
        assert!(
            (tick.as_micros() / 10..=tick.as_micros() * 9 / 10).contains(&phase_step),
            "{interval:?} leaves arrivals near one point of the tick"
        );
        assert_eq!(Cause::CpuHogsLongHandler.hogs(), 3);
        assert_eq!(Cause::SlowHandler.hogs(), 0);
    }

    #[test]
    fn run_stats_skip_the_first_request_and_take_medians() {
        let records = [
            // The connection's first request: the server thread's start, not counted.
            busy_poll_request("c@0", 90_000),
            busy_poll_request("c@64", 1_000),
            busy_poll_request("c@128", 7_000),
            busy_poll_request("c@192", 3_000),
            json!({"type": "merge_summary"}),
        ];
        let stats = request_stats(records.iter(), Cause::CpuHogsBusyPoll).unwrap();
        assert_eq!(stats.requests, 3);
        assert_eq!(stats.target_p50_ns, 3_000.0);
        assert_eq!(stats.e2e_p50_ns, 4_000.0);
        assert_eq!(
            stats.target_keys,
            BTreeSet::from(["B rx_runqueue_wait".to_owned()])
        );
        assert_eq!(stats.present_p50_ns["A rx_runqueue_wait"], 400.0);
    }

    #[test]
    fn the_cli_names_the_busy_poll_cause_and_the_runs_without_reference() {
        let cli = Cli::try_parse_from([
            "truth",
            "--cause",
            "cpu-hogs-busy-poll",
            "--no-reference",
            "--debug",
        ])
        .unwrap();
        assert_eq!(cli.truth.causes, [Cause::CpuHogsBusyPoll]);
        assert!(cli.truth.no_reference && cli.truth.debug && !cli.truth.vm);
        let both = Cli::try_parse_from(["truth", "--no-reference", "--reference-only"]);
        assert!(both.is_err(), "--no-reference with --reference-only");
        assert!(!Cause::CpuHogsBusyPoll.in_guests());
    }

    #[test]
    fn the_own_cost_columns_are_the_reports_per_request_figures() {
        let report = json!({"own_cost": {"requests": 100, "nodes": [
            {"node": "A", "bpf_stats": "measured", "bpf_ns_per_request": 2500.0,
             "user_cpu_ns": 3_000_000, "sys_cpu_ns": 1_000_000},
            {"node": "B", "bpf_stats": "measured", "bpf_ns_per_request": 1500.0,
             "user_cpu_ns": 2_000_000, "sys_cpu_ns": 0},
        ]}});
        let (bpf, cpu) = own_cost_per_request(&report).unwrap();
        assert_eq!(bpf, Some(4000.0));
        assert_eq!(
            cpu,
            CpuTimes {
                user_ns: 50_000.0,
                kernel_ns: 10_000.0
            }
        );
        // One node whose BPF run time was not measured: the sum is not known, the CPU is.
        let unmeasured = json!({"own_cost": {"requests": 100, "nodes": [
            {"node": "A", "bpf_stats": "measured", "bpf_ns_per_request": 2500.0,
             "user_cpu_ns": 0, "sys_cpu_ns": 0},
            {"node": "B", "bpf_stats": "not_measured", "bpf_ns_per_request": null,
             "user_cpu_ns": 100_000, "sys_cpu_ns": 200_000}]}});
        let (bpf, cpu) = own_cost_per_request(&unmeasured).unwrap();
        assert_eq!(bpf, None);
        assert_eq!(cpu.kernel_ns, 2_000.0);
        assert!(own_cost_per_request(&json!({"own_cost": {"requests": 0, "nodes": []}})).is_err());
    }

    #[test]
    fn a_cost_cell_marks_runs_that_did_not_measure() {
        assert_eq!(
            cost_cell(&[Some(2_000.0), Some(4_000.0), Some(3_000.0)]),
            "     3.0"
        );
        assert_eq!(cost_cell(&[Some(2_000.0), None, Some(4_000.0)]), "    4.0*");
        assert_eq!(cost_cell(&[None, None]), "     n/m");
    }

    #[test]
    fn the_default_set_runs_every_server_scheduler_wait_in_table_order() {
        // One cause per wait of the server for its CPU: after a wake-up (the batch server),
        // preempted inside its work (the long handler), preempted while its data waits
        // (busy-poll).
        for cause in [
            Cause::CpuHogs,
            Cause::CpuHogsLongHandler,
            Cause::CpuHogsBusyPoll,
        ] {
            assert!(CAUSES.contains(&cause), "{cause:?}");
        }
        let order = |c: &Cause| ALL_CAUSES.iter().position(|a| a == c).unwrap();
        assert!(CAUSES.windows(2).all(|w| order(&w[0]) < order(&w[1])));
        assert!(CAUSES.iter().all(|c| !c.in_guests()));
        assert!(
            VM_CAUSES
                .iter()
                .all(|c| c.in_guests() && !CAUSES.contains(c))
        );
        // Named-only guest causes run in the guests, never by default.
        assert!(
            VM_NAMED_CAUSES
                .iter()
                .all(|c| c.in_guests() && !VM_CAUSES.contains(c) && ALL_CAUSES.contains(c))
        );
    }
}
