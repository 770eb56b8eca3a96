//! `cargo xtask truth`: does the attribution find a cause where it was put? Each known cause is
//! injected into a two-namespace lab (kernel-only recording: an unmodified echo server, no
//! userland probes), runs with and without it are interleaved, and the table shows per cause
//! the added end-to-end p50 and the share of it found in the segments where the cause lives.
//!
//! Medians: per run, the median over the run's complete requests; per condition, the median
//! over its runs. "Recovered" is the added median of the per-request sum of the cause's
//! segments; the share is recovered / added e2e p50.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::bpfstats::{self, StatsEnabled};
use crate::cleanup::Registered;
use crate::procs::{remove_dir_when_killed, run_quiet};
use crate::truth_breakdown::{self, RunBreakdown};
use crate::truth_lab::{
    CpuHogs, Proc, SchedSetup, TbfQdisc, TruthNetns, busy_between, cpu_ticks, median, own_session,
    sched_batch,
};
use crate::truth_reference::{self, Reference, ReferenceRun};
use crate::truth_retransmit::{self, Retransmissions, retransmissions};
use crate::wire_loss::WireLoss;
use crate::{run_cmd, workspace_root};

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
/// A share is shown only when the cause added more than this fraction of the p50 without it.
const MIN_ADDED_FRACTION: f64 = 0.1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Cause {
    /// TBF rate limit on the client's veth -> the client's tx_qdisc.
    TbfRateLimit,
    /// Three spinning threads pinned to the server's CPU, the echo server running SCHED_BATCH
    /// (with and without them): its wake-ups do not preempt a hog -> the server's scheduler
    /// waits.
    CpuHogs,
    /// The same hogs against a SCHED_OTHER server needing 400 us of CPU per request; not run
    /// unless named: it moves the mean, not the p50 (see docs/truth.md).
    CpuHogsBusy,
    /// The same hogs against the plain SCHED_OTHER echo server (a few us of CPU per request);
    /// not run unless named: on this VM it lowers the p50 (see docs/truth.md).
    CpuHogsEcho,
    /// The same hogs against a SCHED_OTHER server needing 5 ms of CPU per request, longer
    /// than a scheduler tick (4 ms at HZ=250): the tick preempts it inside its work and it
    /// waits for the hogs' slices -> the server's `runqueue_wait`.
    CpuHogsLongHandler,
    /// Two such hogs against a SCHED_OTHER server that busy-polls its socket between requests
    /// (`lab server --busy-poll`, with and without them): it never sleeps, so it takes turns
    /// with the hogs a tick at a time, and a request that arrives while it is preempted waits
    /// in its socket with the reader runnable -> the server's `rx_runqueue_wait`.
    CpuHogsBusyPoll,
    /// The server spins in its handler -> server_app (the server process, kernel-only mode).
    SlowHandler,
    /// A small SO_RCVBUF on the server's connection, requests larger than it -> the client's
    /// send queue (the request waits there for the server's window).
    SmallRcvbuf,
    /// 1 % of the frames arriving at either veth dropped at random by an XDP program, before
    /// the receiving stack sees them (crate::wire_loss), the same program passing every frame
    /// in the runs without: a frame lost on the wire -> TCP's retransmission, noted by the
    /// merge, and its wait in the derived network_round_trip (the sender's stages and the
    /// receiver's all happened for the copy each timed). Its p50 moves only through the paced
    /// client catching up after each stall (docs/truth.md): the retransmitted requests are
    /// reported on their own.
    WireLoss,
    /// Guests only: netem delay on guest A's NIC -> A's tx_qdisc (netem is a qdisc) and the
    /// derived network segment.
    NetemDelay,
    /// Guests only: netem loss on guest A's NIC -> the retransmission's wait, in the same
    /// segments as the delay; retransmitted requests carry a note.
    NetemLoss,
    /// Guests only: the host relay between the guests (vm/wire.rs) delays every frame ->
    /// the derived network_round_trip (the wire: outside both machines).
    WireDelay,
    /// Guests only: guest B's virtio-net RX IRQ pinned to a CPU where a hog spins (the IRQ is
    /// on that CPU with and without the hog) -> B's IRQ and softirq segments.
    IrqBusyCpu,
}

/// The causes a run without `--cause` injects, in table order.
const CAUSES: [Cause; 7] = [
    Cause::TbfRateLimit,
    Cause::CpuHogs,
    Cause::CpuHogsLongHandler,
    Cause::CpuHogsBusyPoll,
    Cause::SlowHandler,
    Cause::SmallRcvbuf,
    Cause::WireLoss,
];

/// The causes `--vm` injects (the guests' kernel has netem and a real NIC), in table order.
pub const VM_CAUSES: [Cause; 4] = [
    Cause::NetemDelay,
    Cause::NetemLoss,
    Cause::WireDelay,
    Cause::IrqBusyCpu,
];

/// Every cause, in table order.
const ALL_CAUSES: [Cause; 13] = [
    Cause::TbfRateLimit,
    Cause::CpuHogs,
    Cause::CpuHogsBusy,
    Cause::CpuHogsEcho,
    Cause::CpuHogsLongHandler,
    Cause::CpuHogsBusyPoll,
    Cause::SlowHandler,
    Cause::SmallRcvbuf,
    Cause::WireLoss,
    Cause::NetemDelay,
    Cause::NetemLoss,
    Cause::WireDelay,
    Cause::IrqBusyCpu,
];

/// The share of frames [`Cause::WireLoss`] drops, per million.
const WIRE_LOSS_PPM: u32 = 10_000;
// The cause's name in the table says "1%".
const _: () = assert!(WIRE_LOSS_PPM == 10_000);

/// CPU time the server's handler needs per request in the busy-server CPU-hog runs (with and
/// without the hogs): a server that uses the CPU, so that it competes with the hogs for it. A
/// SCHED_OTHER server of a few microseconds per request wins every wake-up against them
/// (EEVDF: docs/truth.md).
const HOG_RUN_HANDLER_CPU: &str = "400us";
/// CPU time per request of the long-handler CPU-hog runs: longer than a tick, so a tick
/// always falls inside the handler's work.
const LONG_HANDLER_CPU: &str = "5ms";

impl Cause {
    pub fn name(self) -> &'static str {
        match self {
            Cause::TbfRateLimit => "tbf 2mbit on client veth",
            Cause::CpuHogs => "3 CPU hogs, batch server",
            Cause::CpuHogsBusy => "3 CPU hogs, 400us/req server",
            Cause::CpuHogsEcho => "3 CPU hogs, echo server",
            Cause::CpuHogsLongHandler => "3 CPU hogs, 5ms/req server",
            Cause::CpuHogsBusyPoll => "2 CPU hogs, busy-poll server",
            Cause::SlowHandler => "server handler spins 200us",
            Cause::SmallRcvbuf => "server SO_RCVBUF 4 KiB, 64 KiB",
            Cause::WireLoss => "loss 1% on the wire (XDP)",
            Cause::NetemDelay => "netem delay 5ms on A's NIC",
            Cause::NetemLoss => "netem loss 1% on A's NIC",
            Cause::WireDelay => "wire relay 2.5ms each way",
            Cause::IrqBusyCpu => "B's NIC IRQ on a busy CPU",
        }
    }

    /// Injected in the qemu guests (`--vm`), not in the namespaces.
    pub fn in_guests(self) -> bool {
        VM_CAUSES.contains(&self)
    }

    /// Where the cause lives, as shown in the table.
    pub fn target_name(self) -> &'static str {
        match self {
            Cause::TbfRateLimit => "A tx_qdisc",
            Cause::CpuHogs
            | Cause::CpuHogsBusy
            | Cause::CpuHogsEcho
            | Cause::CpuHogsLongHandler => "B sched waits",
            Cause::CpuHogsBusyPoll => "B rx_runqueue_wait",
            Cause::SlowHandler => "B server_app",
            Cause::SmallRcvbuf => "A tx_socket_queue",
            Cause::NetemDelay | Cause::NetemLoss => "A qdisc+network",
            Cause::WireDelay | Cause::WireLoss => "network_round_trip",
            Cause::IrqBusyCpu => "B irq+softirq",
        }
    }

    /// Hogs on the server's CPU delay the server thread only while it is runnable without a
    /// CPU: after its wake-up (`rx_sched_delay`), while its data waits for it preempted
    /// (`rx_runqueue_wait`) and while it is preempted inside its own work (`runqueue_wait`),
    /// the server's segments of unit `scheduler` and kind `queue` (docs/truth.md). The
    /// busy-poll server is never woken (it does not sleep): its cause is only the wait of the
    /// preempted reader, `rx_runqueue_wait`.
    fn is_target(self, seg: &Segment) -> bool {
        match self {
            Cause::TbfRateLimit => seg.node == "A" && seg.name == "tx_qdisc",
            Cause::CpuHogs
            | Cause::CpuHogsBusy
            | Cause::CpuHogsEcho
            | Cause::CpuHogsLongHandler => {
                seg.node == "B" && seg.unit == "scheduler" && seg.kind == "queue"
            }
            Cause::CpuHogsBusyPoll => seg.node == "B" && seg.name == "rx_runqueue_wait",
            Cause::SlowHandler => seg.node == "B" && seg.name == "server_app",
            Cause::SmallRcvbuf => seg.node == "A" && seg.name == "tx_socket_queue",
            // netem holds (or drops, until the retransmission) A's packets between
            // net_dev_queue and net_dev_start_xmit; what a wire adds is the derived round trip.
            Cause::NetemDelay | Cause::NetemLoss => {
                (seg.node == "A" && seg.name == "tx_qdisc") || seg.name == "network_round_trip"
            }
            Cause::WireDelay | Cause::WireLoss => seg.name == "network_round_trip",
            // rx_irq_handler (unit irq) and rx_softirq_delay (unit softirq) on the server.
            Cause::IrqBusyCpu => seg.node == "B" && (seg.unit == "irq" || seg.unit == "softirq"),
        }
    }

    /// The workload for this cause's runs, with and without it (the same for both).
    pub fn workload(self) -> Workload {
        match self {
            // ~650-byte frames at 1000 req/s need more than a 2 mbit/s bucket refills between
            // two requests: every request waits for tokens.
            Cause::TbfRateLimit => Workload {
                payload: 512,
                qps: 1000,
            },
            // 12 KiB requests against a 4 KiB SO_RCVBUF: the server advertises a window smaller
            // than a request, so the request's tail waits in the client's send queue for window
            // updates, which come as the server reads (its `tx_socket_queue`). A request of the
            // buffer's size (4 KiB) fits the window and adds nothing (docs/truth.md).
            Cause::SmallRcvbuf => Workload {
                payload: 64 * 1024,
                qps: 500,
            },
            // The batch server (`CpuHogs`) needs a few us per request: with the hogs every
            // wake-up waits until the tick ends the running hog's slice. The busy server
            // (`CpuHogsBusy`), 400 us per request at 1000 req/s, needs 40 % of its CPU, more
            // than its fair share next to three hogs (a quarter): with them about half the
            // requests wait a hog's slice, which moves the mean but not the p50 (docs/truth.md,
            // the run at dcf35ff). The others need little CPU. (At 500 req/s, a fifth of the CPU,
            // the server's p50 rose with the hogs in some runs and not in others: whether the
            // scheduler forgave its overuse while it slept depended on the machine's load.)
            Cause::CpuHogs | Cause::CpuHogsBusy | Cause::CpuHogsEcho | Cause::SlowHandler => {
                Workload {
                    payload: 64,
                    qps: 1000,
                }
            }
            // 5 ms per request at 20 req/s is a tenth of the server's CPU, well under its fair
            // share next to three hogs (a quarter): the hogs delay it, it never saturates.
            Cause::CpuHogsLongHandler => Workload {
                payload: 64,
                qps: 20,
            },
            // The busy-poll server and its two hogs take turns on CPU 1, ended by the tick
            // (4 ms): a request that arrives off the server's turn waits whole ticks less the
            // arrival's phase (about 4, 8, 12 ms, more when the hogs get several ticks in a row
            // or other tasks take turns too). At 50 req/s (20 ms apart, longer than most such
            // waits) requests are sent on the client's schedule, not right after a late reply
            // (which would find the server on its CPU and hide the wait). At 47 req/s requests
            // are 5.32 ticks apart: not a whole number of ticks, so each arrives at another
            // point of its tick (at 50 req/s, exactly 5 ticks, every arrival of a run kept one
            // point of the tick: a run whose point fell just before a tick barely waited), and
            // not a multiple of the 3-tick cycle, so arrivals step through every turn too. The
            // waits then spread evenly over 0-8 ms instead of a run's luck of phase.
            Cause::CpuHogsBusyPoll => Workload {
                payload: 64,
                qps: 47,
            },
            // A lost frame costs its request a tail loss probe or an RTO (10-200+ ms): at 200
            // req/s a 2 s run has ~400 requests, ~1200 frames, a dozen lost.
            Cause::WireLoss => Workload {
                payload: 64,
                qps: 200,
            },
            // TCG guests on a shared 2-CPU host take milliseconds per request: at 200 req/s
            // they idle between requests instead of running back to back.
            Cause::NetemDelay | Cause::NetemLoss | Cause::WireDelay | Cause::IrqBusyCpu => {
                Workload {
                    payload: 64,
                    qps: 200,
                }
            }
        }
    }

    /// CPU hogs started with the cause. Three, except for the busy-poll server: with three,
    /// about a quarter of its requests waited 0, 1, 2 and 3 ticks each, so the median request
    /// sat on the step from one tick to two and a run's e2e median and target median could
    /// fall on different steps (docs/truth.md); two hogs leave more requests on the first
    /// steps.
    fn hogs(self) -> usize {
        match self {
            Cause::CpuHogsBusyPoll => 2,
            c if c.has_hogs() => 3,
            _ => 0,
        }
    }

    fn has_hogs(self) -> bool {
        matches!(
            self,
            Cause::CpuHogs
                | Cause::CpuHogsBusy
                | Cause::CpuHogsEcho
                | Cause::CpuHogsLongHandler
                | Cause::CpuHogsBusyPoll
        )
    }

    /// The cause drops frames: its retransmitted requests are reported on their own
    /// (crate::truth_retransmit; the host table lists only these causes, the guests' every
    /// cause they ran).
    pub fn loses_frames(self) -> bool {
        matches!(self, Cause::WireLoss | Cause::NetemLoss)
    }

    /// The server runs SCHED_BATCH in this cause's runs (with and without it).
    fn batch_server(self) -> bool {
        self == Cause::CpuHogs
    }
}

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

#[derive(Clone, Copy)]
pub struct Workload {
    pub payload: usize,
    pub qps: u64,
}

struct Segment {
    name: String,
    node: String,
    unit: String,
    kind: String,
    dur_ns: u64,
    /// The CPU a kernel stage ran on (its `place`).
    cpu: Option<u64>,
}

/// One run's per-request medians (complete requests only).
pub struct RunStats {
    pub e2e_p50_ns: f64,
    pub target_p50_ns: f64,
    /// Mean e2e time and target sum of the requests around the median (`median_band`).
    band_ns: (f64, f64),
    /// Median per (node, segment name), to name where an unrecovered share went.
    per_segment_p50_ns: BTreeMap<String, f64>,
    /// The (node, segment name) keys the cause's target matched.
    target_keys: BTreeSet<String>,
    /// Sums and CPUs per segment, for `--breakdown`.
    breakdown: RunBreakdown,
    /// Median per (node, segment name) over the requests that have the segment: what the
    /// bpftrace reference measures (it times only intervals that happened).
    present_p50_ns: BTreeMap<String, f64>,
    pub requests: usize,
    /// Run time of both recorders' BPF programs over their recordings, per request of the
    /// merged run, as `meshlab report` computes it (`own_cost`): the tracer's own kernel time.
    /// Machine-wide: the scheduler programs run on every context switch of every process, so
    /// a busy machine raises it. `None` when a recording says it was not measured
    /// (`kernel.bpf_stats_enabled` is one switch for the machine: another session may turn it
    /// off during a run).
    bpf_ns_per_request: Option<f64>,
    /// Both recorder processes' own CPU time (user, kernel) over their recordings, per request,
    /// from the same report.
    recorder_cpu_ns_per_request: CpuTimes,
    /// What bpftrace measured, in the runs the reference watched.
    reference: Option<truth_reference::BpftraceRun>,
    /// The report's own-cost estimate per stage on the client's node (reference runs only):
    /// the mean run time of meshlab's programs at the stage's two ends, over the recording.
    client_stage_own_ns: BTreeMap<String, f64>,
    /// Every BPF program loaded on the machine at the end of the run (reference runs only).
    loaded_programs: Vec<String>,
    /// The requests the merge noted retransmitted (host runs; the guests count per boot).
    retransmissions: Retransmissions,
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
        Ok(workspace_root().join("target/debug/meshlab"))
    } else {
        run_cmd(crate::cargo().args(["build", "--release", "--bin", "meshlab"]))?;
        Ok(workspace_root().join("target/release/meshlab"))
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

/// User and kernel CPU time, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct CpuTimes {
    user_ns: f64,
    kernel_ns: f64,
}

/// Both recorders' own cost per request, as the report's "meshlab's own cost" computes it
/// (report/own_cost.rs, docs/report.md): the sum over the nodes of its `bpf_ns_per_request`
/// (each node's BPF program run time over the report's requests), and the nodes' recorder
/// CPU time (getrusage over the recording) over the same requests. BPF run time is `None`
/// when a node's recording says it was not measured.
fn own_cost_per_request(report: &serde_json::Value) -> Result<(Option<f64>, CpuTimes)> {
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

fn parse_segment(v: &serde_json::Value) -> Option<Segment> {
    Some(Segment {
        name: v["name"].as_str()?.to_owned(),
        node: v["node"].as_str().unwrap_or("").to_owned(),
        unit: v["unit"].as_str()?.to_owned(),
        kind: v["kind"].as_str()?.to_owned(),
        dur_ns: v["dur_ns"].as_u64()?,
        cpu: v["place"]["cpu"].as_u64(),
    })
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
fn run_stats(merged: &Path, cause: Cause) -> Result<RunStats> {
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
fn per_segment_samples(requests: &[BTreeMap<String, u64>]) -> (Samples, Samples) {
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

fn medians(samples: BTreeMap<String, Vec<f64>>) -> BTreeMap<String, f64> {
    samples.into_iter().map(|(k, v)| (k, median(v))).collect()
}

fn condition_median(runs: &[RunStats], f: impl Fn(&RunStats) -> f64) -> f64 {
    median(runs.iter().map(f).collect())
}

/// The segment (other than the cause's own) whose median grew most.
fn largest_other_growth(without: &[RunStats], with: &[RunStats]) -> String {
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

/// What the table's title says about the runs, and whether the self-accounting columns were
/// measured (the guest runs do not measure them: "-").
pub struct TableSetting {
    pub title: String,
    pub self_cost: bool,
}

impl TableSetting {
    fn namespaces(rounds: usize, seconds: u64) -> Self {
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
fn cost_cell(per_run_ns: &[Option<f64>]) -> String {
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
fn print_retransmissions(results: &BTreeMap<(Cause, bool), Vec<RunStats>>) {
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
    use clap::Parser;
    use serde_json::json;

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
    }
}
