//! The causes `cargo xtask truth` injects: what each is, where it lives (the segments its
//! added time must land in), and the workload its runs use (docs/truth.md).

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
    /// Guests only: the same move of B's NIC RX IRQ, but the CPU is kept busy by a loopback
    /// TCP flood inside B (a lab client and server pinned to it, in both conditions): its
    /// time is spent in softirqs and in sections with softirqs held off, which a spinning
    /// task's is not, so a NIC IRQ landing there waits for its NET_RX run -> B's IRQ and
    /// softirq segments.
    IrqSoftirqLoad,
    /// Guests only, not run unless named: a flood on B's NIC itself (A's lab client, 16
    /// connections of 64-byte requests as fast as replies come, to a second server on B), B's
    /// NIC RX IRQ on its idle CPU in both conditions: the frames of the measured requests share
    /// the NIC's queue and NAPI polls with the flood's -> B's IRQ and softirq segments (what a
    /// NIC under other traffic costs a request; docs/truth.md).
    IrqNicFlood,
    /// Guests only: guest B booted with `threadirqs` (hard IRQ handlers run in threads,
    /// SCHED_FIFO 50, as on PREEMPT_RT), its virtio-net RX IRQ pinned to a CPU where a
    /// SCHED_FIFO task above those threads spins 6 ms in every 7 (in both conditions; the IRQ on
    /// that CPU with the cause, on an idle one without): the IRQ thread, and the NET_RX softirq
    /// it raises, wait for the hog's spin to end -> B's IRQ and softirq segments. Where a busy
    /// CPU does delay network RX (docs/truth.md).
    IrqRtBusyCpu,
}

/// The causes a run without `--cause` injects, in table order.
pub(crate) const CAUSES: [Cause; 7] = [
    Cause::TbfRateLimit,
    Cause::CpuHogs,
    Cause::CpuHogsLongHandler,
    Cause::CpuHogsBusyPoll,
    Cause::SlowHandler,
    Cause::SmallRcvbuf,
    Cause::WireLoss,
];

/// The causes `--vm` injects (the guests' kernel has netem and a real NIC), in table order.
pub(crate) const VM_CAUSES: [Cause; 6] = [
    Cause::NetemDelay,
    Cause::NetemLoss,
    Cause::WireDelay,
    Cause::IrqBusyCpu,
    Cause::IrqSoftirqLoad,
    Cause::IrqRtBusyCpu,
];

/// Guest causes run only when named (`--vm --cause ...`).
pub(crate) const VM_NAMED_CAUSES: [Cause; 1] = [Cause::IrqNicFlood];

/// Every cause, in table order.
pub(crate) const ALL_CAUSES: [Cause; 16] = [
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
    Cause::IrqSoftirqLoad,
    Cause::IrqRtBusyCpu,
    Cause::IrqNicFlood,
];

/// The share of frames [`Cause::WireLoss`] drops, per million.
pub(crate) const WIRE_LOSS_PPM: u32 = 10_000;
// The cause's name in the table says "1%".
const _: () = assert!(WIRE_LOSS_PPM == 10_000);

/// CPU time the server's handler needs per request in the busy-server CPU-hog runs (with and
/// without the hogs): a server that uses the CPU, so that it competes with the hogs for it. A
/// SCHED_OTHER server of a few microseconds per request wins every wake-up against them
/// (EEVDF: docs/truth.md).
pub(crate) const HOG_RUN_HANDLER_CPU: &str = "400us";
/// CPU time per request of the long-handler CPU-hog runs: longer than a tick, so a tick
/// always falls inside the handler's work.
pub(crate) const LONG_HANDLER_CPU: &str = "5ms";

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
            Cause::IrqSoftirqLoad => "B's NIC IRQ on a softirq-loaded CPU",
            Cause::IrqNicFlood => "a 64 B flood on B's NIC",
            Cause::IrqRtBusyCpu => "B's threaded NIC IRQ, RT hog",
        }
    }

    /// Injected in the qemu guests (`--vm`), not in the namespaces.
    pub fn in_guests(self) -> bool {
        VM_CAUSES.contains(&self) || VM_NAMED_CAUSES.contains(&self)
    }

    /// Needs the guests' spare vCPUs: the IRQ causes (an idle and a loaded CPU for B's NIC
    /// IRQ) and the NIC flood (its client and server beside the measured ones).
    pub fn needs_spare_cpus(self) -> bool {
        self.moves_irq() || self == Cause::IrqNicFlood
    }

    /// Moves guest B's NIC RX IRQ onto a loaded CPU (with the cause) or an idle one.
    pub fn moves_irq(self) -> bool {
        matches!(
            self,
            Cause::IrqBusyCpu | Cause::IrqSoftirqLoad | Cause::IrqRtBusyCpu
        )
    }

    /// Its guests boot with `threadirqs` (`vm run --kernel-arg`): IRQ handlers in threads.
    pub fn threaded_irqs(self) -> bool {
        self == Cause::IrqRtBusyCpu
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
            Cause::IrqBusyCpu
            | Cause::IrqSoftirqLoad
            | Cause::IrqRtBusyCpu
            | Cause::IrqNicFlood => "B irq+softirq",
        }
    }

    /// Hogs on the server's CPU delay the server thread only while it is runnable without a
    /// CPU: after its wake-up (`rx_sched_delay`), while its data waits for it preempted
    /// (`rx_runqueue_wait`) and while it is preempted inside its own work (`runqueue_wait`),
    /// the server's segments of unit `scheduler` and kind `queue` (docs/truth.md). The
    /// busy-poll server is never woken (it does not sleep): its cause is only the wait of the
    /// preempted reader, `rx_runqueue_wait`.
    pub(crate) fn is_target(self, seg: &Segment) -> bool {
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
            Cause::IrqBusyCpu
            | Cause::IrqSoftirqLoad
            | Cause::IrqRtBusyCpu
            | Cause::IrqNicFlood => seg.node == "B" && (seg.unit == "irq" || seg.unit == "softirq"),
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
            // The real-time hog's 7 ms cycle: at 47 req/s (21.3 ms apart, 3.04 cycles) each
            // request arrives a little later in the cycle than the one before, so a run's
            // arrivals walk through every phase of it; and 21 ms is more than a request takes
            // even with the cause, so both conditions run at the client's pace, not back to
            // back (at 200 req/s the runs with the cause fell to ~110 req/s).
            Cause::IrqRtBusyCpu => Workload {
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
            Cause::NetemDelay
            | Cause::NetemLoss
            | Cause::WireDelay
            | Cause::IrqBusyCpu
            | Cause::IrqSoftirqLoad
            | Cause::IrqNicFlood => Workload {
                payload: 64,
                qps: 200,
            },
        }
    }

    /// CPU hogs started with the cause. Three, except for the busy-poll server: with three,
    /// about a quarter of its requests waited 0, 1, 2 and 3 ticks each, so the median request
    /// sat on the step from one tick to two and a run's e2e median and target median could
    /// fall on different steps (docs/truth.md); two hogs leave more requests on the first
    /// steps.
    pub(crate) fn hogs(self) -> usize {
        match self {
            Cause::CpuHogsBusyPoll => 2,
            c if c.has_hogs() => 3,
            _ => 0,
        }
    }

    pub(crate) fn has_hogs(self) -> bool {
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
    pub(crate) fn batch_server(self) -> bool {
        self == Cause::CpuHogs
    }
}

#[derive(Clone, Copy)]
pub struct Workload {
    pub payload: usize,
    pub qps: u64,
}

/// A merged request's segment, as far as the causes' targets and the statistics read it.
pub(crate) struct Segment {
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) unit: String,
    pub(crate) kind: String,
    pub(crate) dur_ns: u64,
    /// The CPU a kernel stage ran on (its `place`).
    pub(crate) cpu: Option<u64>,
}

/// A segment of a merged request line; `None` when a field the harness reads is missing.
pub(crate) fn parse_segment(v: &serde_json::Value) -> Option<Segment> {
    Some(Segment {
        name: v["name"].as_str()?.to_owned(),
        node: v["node"].as_str().unwrap_or("").to_owned(),
        unit: v["unit"].as_str()?.to_owned(),
        kind: v["kind"].as_str()?.to_owned(),
        dur_ns: v["dur_ns"].as_u64()?,
        cpu: v["place"]["cpu"].as_u64(),
    })
}
