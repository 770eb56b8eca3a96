//! Synthetic two-node traffic shaped like real recordings (a client node `A`, a server node
//! `B`): kernel recordings with startup/clock/kernel/summary records and, optionally, userland
//! probe files in realtime. Used by the merge tests (hand-computed scenarios, property tests)
//! and by benchmarks (`meshlab-bench-generate N OUTDIR`, a binary of this crate).
//!
//! Every stage of every request takes a known time ([`Stages`]), so a test can write down the
//! segments the merge must find.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng, rngs::StdRng};

use meshlab_user::schema::{
    ClockId, ClockSample, ConnRef, Filters, Hook, KernelEvent, NicClockSample, NicIrqInfo,
    PhcSysClock, ProbeEvent, Record, Startup, StopReason, Summary,
};

/// Durations of one request's stages, in path order (ns).
#[derive(Clone, Copy, Debug)]
pub struct Stages {
    pub client_encode: u64,
    pub client_pre_write: u64,
    pub tx_syscall_entry: u64,
    pub tx_tcp_ip: u64,
    pub tx_qdisc: u64,
    pub tx_driver: u64,
    pub one_way: u64,
    pub rx_irq_handler: u64,
    pub rx_softirq_delay: u64,
    pub rx_napi_poll: u64,
    pub rx_ip_tcp: u64,
    pub rx_tcp_deliver: u64,
    pub rx_wakeup: u64,
    pub rx_sched_delay: u64,
    pub poll_return: u64,
    pub rx_recv_entry: u64,
    pub rx_copy: u64,
    pub read_return: u64,
    pub server_decode: u64,
    pub server_dispatch: u64,
    pub server_handler: u64,
    pub server_encode: u64,
    pub server_pre_write: u64,
    pub client_decode: u64,
}

/// The fixed stage times of the hand-computed scenarios (docs in tests/merge_scenarios.rs).
pub const FIXED: Stages = Stages {
    client_encode: 1_000,
    client_pre_write: 500,
    tx_syscall_entry: 300,
    tx_tcp_ip: 2_000,
    tx_qdisc: 700,
    tx_driver: 400,
    one_way: 10_000,
    rx_irq_handler: 300,
    rx_softirq_delay: 600,
    rx_napi_poll: 800,
    rx_ip_tcp: 1_500,
    rx_tcp_deliver: 900,
    rx_wakeup: 100,
    rx_sched_delay: 4_000,
    poll_return: 700,
    rx_recv_entry: 600,
    rx_copy: 1_100,
    read_return: 200,
    server_decode: 3_000,
    server_dispatch: 400,
    server_handler: 25_000,
    server_encode: 2_000,
    server_pre_write: 300,
    client_decode: 1_500,
};

#[derive(Clone, Debug)]
pub struct GenConfig {
    pub requests: usize,
    pub connections: usize,
    /// Requests per connection sent back to back before the first reply (1 = no pipelining).
    pub pipeline: usize,
    pub probes: bool,
    /// With `probes`: also write the server's probe file (else the server is kernel-only).
    pub server_probes: bool,
    /// The server reads with a blocking recv: its read_ready precedes the data's arrival.
    pub server_blocking_read: bool,
    /// How write_begin/read_end probes name their connection.
    pub probe_conn: ProbeConn,
    /// The NIC has an IRQ the recorder watches (else veth: no IRQ, softirq only).
    pub nic_irq: bool,
    pub request_len: u64,
    pub response_len: u64,
    pub mss: u64,
    /// TX: one skb for the whole message (TSO/GSO); else one per MSS.
    pub tso: bool,
    /// RX: one skb for the whole message (GRO); else one per MSS.
    pub gro: bool,
    /// The first transmission of every n-th request is lost and retransmitted after `rto_ns`.
    pub retransmit_every: Option<usize>,
    pub rto_ns: u64,
    /// Leave out the kernel event of `hook` on node (`"A"`/`"B"`) for request index `n`.
    pub drop: Option<(&'static str, Hook, usize)>,
    /// Reverse every run of 3 event lines (out-of-order input within the window).
    pub disorder: bool,
    /// Random stage times (a factor in [0.5, 2) per stage and request) from this seed.
    pub jitter_seed: Option<u64>,
    /// The NIC driver frees each TX skb this long after net_dev_xmit (a TX completion); none
    /// when unset or without `nic_irq`.
    pub tx_complete_after_ns: Option<u64>,
    /// The driver reports the NIC's hardware TX timestamp of each TX skb this long after
    /// net_dev_xmit (a `tx_tstamp_hw` keyed by the skb's last byte); none when unset or
    /// without `nic_irq`.
    pub tx_hw_tstamp_after_ns: Option<u64>,
    /// With `tx_hw_tstamp_after_ns`: the NIC stamped each frame this long after its doorbell
    /// on its own clock (`PHC_MINUS_MONO` ahead of the node's monotonic clock), so the stamps
    /// carry that time in `aux` and the clock records a `nic_clocks` sample
    /// (`record --hw-timestamps`).
    pub tx_hw_wire_after_doorbell_ns: Option<u64>,
    /// With `nic_irq`: the NIC stamped each received frame (on its clock, like
    /// `tx_hw_wire_after_doorbell_ns`) this long before its IRQ, in the `aux` of its
    /// `netif_receive_skb`, and the clock records carry the NIC clock.
    pub rx_hw_stamp_before_irq_ns: Option<u64>,
    /// The driver returns (net_dev_xmit) this long after the frame left at its doorbell
    /// (net_dev_start_xmit + tx_driver), as when a virtio kick stalls the sender's vCPU; the
    /// send's return and `write_end` move with it, the frame's arrival does not.
    pub driver_returns_after_ns: u64,
    /// Pause between a reply and the next request on a connection.
    pub think_ns: u64,
    pub stages: Stages,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            requests: 1,
            connections: 1,
            pipeline: 1,
            probes: true,
            server_probes: true,
            server_blocking_read: false,
            probe_conn: ProbeConn::Cookie,
            nic_irq: true,
            request_len: 100,
            response_len: 200,
            mss: 1448,
            tso: true,
            gro: true,
            retransmit_every: None,
            rto_ns: 200_000,
            drop: None,
            disorder: false,
            jitter_seed: None,
            tx_complete_after_ns: None,
            driver_returns_after_ns: 0,
            tx_hw_tstamp_after_ns: None,
            tx_hw_wire_after_doorbell_ns: None,
            rx_hw_stamp_before_irq_ns: None,
            think_ns: 20_000,
            stages: FIXED,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeConn {
    Cookie,
    /// Local/remote address and port, resolved through `sock_established`.
    FourTuple,
    /// No connection or offset: the merge must fall back to (pid, tid, time order).
    Absent,
}

/// Node clock bases: different boot times and realtime offsets, as on two real machines.
pub const MONO_BASE: [u64; 2] = [1_000_000_000_000, 7_000_000_000_000];
pub const REALTIME_MINUS_MONO: [u64; 2] = [1_700_000_000_000_000_000, 1_699_999_990_000_000_000];
pub const NODES: [&str; 2] = ["A", "B"];
const CLOCK_PERIOD_NS: u64 = 1_000_000_000;
const BRACKET_NS: u64 = 100;

/// Paths written by [`generate`].
#[derive(Debug, Clone)]
pub struct Generated {
    pub kernel: [PathBuf; 2],
    pub probes: Vec<PathBuf>,
}

impl Generated {
    pub fn all(&self) -> Vec<PathBuf> {
        let mut v = self.kernel.to_vec();
        v.extend(self.probes.iter().cloned());
        v
    }
}

/// A time-sorted output file that only holds events not yet safe to write.
struct SortedFile {
    out: BufWriter<File>,
    heap: BinaryHeap<Reverse<(u64, u64, String)>>,
    seq: u64,
    disorder: bool,
    run: Vec<String>,
    events: u64,
}

impl SortedFile {
    fn create(path: &Path, disorder: bool) -> io::Result<Self> {
        Ok(Self {
            out: BufWriter::with_capacity(1 << 16, File::create(path)?),
            heap: BinaryHeap::new(),
            seq: 0,
            disorder,
            run: Vec::new(),
            events: 0,
        })
    }

    fn line(&mut self, r: &Record) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, r)?;
        self.out.write_all(b"\n")
    }

    fn push(&mut self, ts: u64, r: &Record) {
        self.seq += 1;
        self.events += 1;
        self.heap.push(Reverse((
            ts,
            self.seq,
            serde_json::to_string(r).expect("serializable"),
        )));
    }

    /// Writes every queued event earlier than `before`.
    fn flush_before(&mut self, before: u64) -> io::Result<()> {
        while self
            .heap
            .peek()
            .is_some_and(|Reverse((ts, _, _))| *ts < before)
        {
            let Reverse((_, _, line)) = self.heap.pop().expect("peeked");
            self.run.push(line);
            if !self.disorder || self.run.len() == 3 {
                self.write_run()?;
            }
        }
        Ok(())
    }

    fn write_run(&mut self) -> io::Result<()> {
        let mut run = std::mem::take(&mut self.run);
        if self.disorder {
            run.reverse();
        }
        for line in run {
            self.out.write_all(line.as_bytes())?;
            self.out.write_all(b"\n")?;
        }
        Ok(())
    }

    fn finish(mut self, tail: Option<&Record>) -> io::Result<u64> {
        self.flush_before(u64::MAX)?;
        self.write_run()?;
        if let Some(r) = tail {
            self.line(r)?;
        }
        self.out.flush()?;
        Ok(self.events)
    }
}

/// A NIC clock (PHC) per node, this far ahead of its monotonic clock (no drift, so the
/// expected stage times stay whole numbers).
pub const PHC_MINUS_MONO: [u64; 2] = [37_000_000_123, 55_000_000_777];

/// `node`'s NIC clock read at monotonic time `mono`, as `record --hw-timestamps` writes it.
fn nic_clock(node: usize, mono: u64) -> NicClockSample {
    NicClockSample {
        dev: "eth0".into(),
        phc_index: 0,
        phc_ns: mono + PHC_MINUS_MONO[node],
        monotonic_ns: mono,
        window_ns: 40,
        sys_clock: PhcSysClock::Monotonic,
    }
}

fn sample(node: usize, mono: u64) -> ClockSample {
    let rt = mono + REALTIME_MINUS_MONO[node];
    ClockSample {
        node: None,
        realtime_ns: rt,
        monotonic_ns: mono,
        tai_ns: rt + 37_000_000_000,
        boottime_ns: mono + 3_000_000,
        bracket_ns: BRACKET_NS,
        nic_clocks: Vec::new(),
    }
}

fn startup(node: usize, nic_irq: bool) -> Startup {
    let dev = if nic_irq { "eth0" } else { "veth0" };
    Startup {
        schema_version: meshlab_user::schema::SCHEMA_VERSION,
        tool: "meshlab".into(),
        version: "gen".into(),
        node: NODES[node].into(),
        hostname: format!("host-{}", NODES[node]),
        kernel: "6.12.0-synthetic".into(),
        command: vec!["meshlab".into(), "record".into()],
        pid: 1,
        clock: sample(node, MONO_BASE[node]),
        attach_plan: Vec::new(),
        filters: Filters {
            sample_every: 1,
            ..Default::default()
        },
        ring_buffer_bytes: 1 << 24,
        event_rings: 1,
        nic_irqs: if nic_irq {
            vec![NicIrqInfo {
                irq: 40,
                dev: dev.into(),
                ifindex: 2,
                queue: Some(0),
            }]
        } else {
            Vec::new()
        },
        devices: Vec::new(),
        attach_mode: Default::default(),
    }
}

pub const CLIENT_ADDR: &str = "10.200.0.1";
pub const SERVER_ADDR: &str = "10.200.0.2";
pub const SERVER_PORT: u16 = 9000;
pub const CLIENT_TID: u32 = 1000;
pub const SERVER_TID: u32 = 2000;

pub fn client_port(conn: usize) -> u16 {
    40_000 + conn as u16
}

pub fn cookie(node: usize, conn: usize) -> u64 {
    (node as u64 + 1) * 1_000 + conn as u64
}

/// Writes the scenario into `dir`; returns the paths.
pub fn generate(cfg: &GenConfig, dir: &Path) -> io::Result<Generated> {
    std::fs::create_dir_all(dir)?;
    let kernel = [dir.join("A.kernel.ndjson"), dir.join("B.kernel.ndjson")];
    let probes = cfg
        .probes
        .then(|| [dir.join("A.probe.ndjson"), dir.join("B.probe.ndjson")]);
    let mut w = Writer::new(cfg, &kernel, probes.as_ref())?;
    w.run()?;
    w.finish()?;
    let mut probes: Vec<PathBuf> = probes.map(Vec::from).unwrap_or_default();
    if cfg.probes && !cfg.server_probes {
        std::fs::remove_file(&probes[1])?;
        probes.truncate(1);
    }
    Ok(Generated { kernel, probes })
}

const BENCH_THINK_NS: u64 = 1_000_000;

/// About `events` kernel+probe events of plain traffic on 8 connections, for benchmarks.
///
/// Each connection pauses 1 ms between a reply and its next request: about 7 300 requests/s,
/// 285 000 events/s of node time in all, so the merge's default 2 s window holds about 570 000
/// events and larger inputs show that its memory follows the window, not the input size.
pub fn bench_generate(events: u64, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let cfg = GenConfig {
        requests: (events / 39).max(1) as usize,
        connections: 8,
        jitter_seed: Some(1),
        think_ns: BENCH_THINK_NS,
        ..Default::default()
    };
    Ok(generate(&cfg, dir)?.all())
}

/// Traffic shapes for checking merge changes on more than [`bench_generate`]'s plain
/// traffic (`merge_bench_input N DIR SHAPE`, xtask/merge-identity.sh): each about `events`
/// events on 8 connections with jittered stage times. `None` for an unknown name.
pub fn shape_generate(events: u64, shape: &str, dir: &Path) -> io::Result<Option<Vec<PathBuf>>> {
    let mut cfg = GenConfig {
        requests: (events / 39).max(1) as usize,
        connections: 8,
        jitter_seed: Some(1),
        think_ns: BENCH_THINK_NS,
        ..Default::default()
    };
    match shape {
        "plain" => {}
        "pipelined" => cfg.pipeline = 4,
        "kernel-only" => cfg.probes = false,
        "server-kernel-only" => cfg.server_probes = false,
        "four-tuple" => cfg.probe_conn = ProbeConn::FourTuple,
        "no-conn" => cfg.probe_conn = ProbeConn::Absent,
        "disorder" => cfg.disorder = true,
        "retransmit" => cfg.retransmit_every = Some(7),
        "veth-mss" => {
            cfg.nic_irq = false;
            cfg.tso = false;
            cfg.gro = false;
            cfg.request_len = 4000;
            cfg.server_blocking_read = true;
        }
        "nic-completions" => {
            cfg.tx_complete_after_ns = Some(3_000);
            cfg.tx_hw_tstamp_after_ns = Some(1_000);
        }
        _ => return Ok(None),
    }
    Ok(Some(generate(&cfg, dir)?.all()))
}

/// The names [`shape_generate`] knows.
pub const SHAPES: &[&str] = &[
    "plain",
    "pipelined",
    "kernel-only",
    "server-kernel-only",
    "four-tuple",
    "no-conn",
    "disorder",
    "retransmit",
    "veth-mss",
    "nic-completions",
];

mod writer;
use writer::Writer;

/// Stage times of request `i`: fixed, or jittered by the seeded RNG.
fn stages_for(cfg: &GenConfig, rng: &mut Option<StdRng>) -> Stages {
    let Some(rng) = rng else { return cfg.stages };
    let mut s = cfg.stages;
    for v in [
        &mut s.client_encode,
        &mut s.client_pre_write,
        &mut s.tx_syscall_entry,
        &mut s.tx_tcp_ip,
        &mut s.tx_qdisc,
        &mut s.tx_driver,
        &mut s.one_way,
        &mut s.rx_irq_handler,
        &mut s.rx_softirq_delay,
        &mut s.rx_napi_poll,
        &mut s.rx_ip_tcp,
        &mut s.rx_tcp_deliver,
        &mut s.rx_wakeup,
        &mut s.rx_sched_delay,
        &mut s.poll_return,
        &mut s.rx_recv_entry,
        &mut s.rx_copy,
        &mut s.read_return,
        &mut s.server_decode,
        &mut s.server_dispatch,
        &mut s.server_handler,
        &mut s.server_encode,
        &mut s.server_pre_write,
        &mut s.client_decode,
    ] {
        *v = (*v as f64 * rng.random_range(0.5..2.0)) as u64 + 1;
    }
    s
}

fn rng_for(cfg: &GenConfig) -> Option<StdRng> {
    cfg.jitter_seed.map(StdRng::seed_from_u64)
}

fn kernel(node: usize, hook: Hook, ts: u64, tid: u32) -> KernelEvent {
    KernelEvent {
        cpu: 1,
        pid: tid,
        tid,
        ..KernelEvent::new(NODES[node].into(), hook, ts)
    }
}

fn probe(node: usize, role: &str, point: &str, mono: u64, trace: &str, tid: u32) -> ProbeEvent {
    ProbeEvent {
        node: Some(NODES[node].into()),
        process: role.into(),
        pid: tid,
        tid,
        ts_ns: mono + REALTIME_MINUS_MONO[node],
        clock: ClockId::Realtime,
        trace_id: trace.into(),
        point: format!("{role}.{point}"),
        conn: None,
        dir: None,
        offset: None,
        len: None,
    }
}

fn conn_ref(cookie: u64) -> ConnRef {
    ConnRef {
        cookie: Some(cookie),
        ..Default::default()
    }
}

fn summary(node: usize, end: u64, dropped: u64) -> Summary {
    Summary {
        node: NODES[node].into(),
        ts_ns: end,
        duration_ns: end - MONO_BASE[node],
        per_hook: Default::default(),
        received: 0,
        dropped,
        reason: StopReason::Duration,
        self_cost: None,
    }
}
