//! The NDJSON wire format (schema version [`SCHEMA_VERSION`]), documented in docs/schema.md.
//!
//! Every line is one JSON object with a `"type"` tag. Every record struct denies unknown fields
//! so a typo or a drifted producer is an error, not silently ignored data. Timestamps named
//! `*_ns` are nanoseconds of the clock the record names (kernel records: the node's
//! CLOCK_MONOTONIC); durations are `dur_ns`/`e2e_ns`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

pub use meshlab_common::{Direction, Hook};

/// Version of this wire format. Bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Gives a unit-variant wire enum `as_str()` (its serde name, a test checks they agree) and
/// `ALL` (every variant), so output code never spells the names again.
macro_rules! wire_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The name this value has in NDJSON.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }
    };
}

/// One NDJSON line of any meshlab stream (record output, probe output, merged output).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    Startup(Startup),
    Clock(ClockSample),
    Kernel(KernelEvent),
    Drops(Drops),
    Summary(Summary),
    HotHooks(HotHooks),
    Probe(ProbeEvent),
    MergeInfo(MergeInfo),
    Request(MergedRequest),
    MergeSummary(MergeSummary),
}

impl Record {
    /// The record's `"type"` tag.
    pub fn type_name(&self) -> &'static str {
        match self {
            Record::Startup(_) => "startup",
            Record::Clock(_) => "clock",
            Record::Kernel(_) => "kernel",
            Record::Drops(_) => "drops",
            Record::Summary(_) => "summary",
            Record::HotHooks(_) => "hot_hooks",
            Record::Probe(_) => "probe",
            Record::MergeInfo(_) => "merge_info",
            Record::Request(_) => "request",
            Record::MergeSummary(_) => "merge_summary",
        }
    }
}

/// First line of a `meshlab record` stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Startup {
    pub schema_version: u32,
    pub tool: String,
    pub version: String,
    /// Node name: `--node`, else the host name. Names the machine in every later step.
    pub node: String,
    pub hostname: String,
    /// `uname -r`.
    pub kernel: String,
    pub command: Vec<String>,
    pub pid: u32,
    pub clock: ClockSample,
    pub attach_plan: Vec<AttachEntry>,
    pub filters: Filters,
    /// Size of each event ring (`record --ring-bytes`).
    pub ring_buffer_bytes: u32,
    /// Event rings read, each of `ring_buffer_bytes`: one per CPU up to 8 (CPU c writes ring
    /// c % 8). Absent = 1: recordings before per-CPU rings, or a one-CPU machine.
    #[serde(default = "one_ring", skip_serializing_if = "is_one_ring")]
    pub event_rings: u32,
    /// NIC IRQs the kernel programs watch (from /proc/interrupts and sysfs).
    pub nic_irqs: Vec<NicIrqInfo>,
    /// Settings of each traced network device at start-up, so an A/B run shows what differed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceContext>,
    /// `record --attach`: absent = `always`; with `on_demand` the hooks whose plan status is
    /// `on_demand` are attached only between `hot_hooks` records.
    #[serde(default, skip_serializing_if = "AttachMode::is_always")]
    pub attach_mode: AttachMode,
}

fn one_ring() -> u32 {
    1
}

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_one_ring(rings: &u32) -> bool {
    *rings == 1
}

/// When `record` attaches its hot hooks (every hook but sock_ops: tracepoints, scheduler,
/// IRQ and softirq).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum AttachMode {
    /// At start, for the whole recording.
    #[default]
    Always,
    /// Only sock_ops at start; the hot hooks when the first connection is traced, detached
    /// again after no connection has been traced for a while (`hot_hooks` records say when).
    /// While nothing is traced the recorder costs the traffic nothing.
    OnDemand,
}

wire_names!(AttachMode {
    Always => "always",
    OnDemand => "on_demand",
});

impl AttachMode {
    fn is_always(&self) -> bool {
        *self == AttachMode::Always
    }
}

/// `record --attach on-demand`: the hot hooks were attached or detached at `ts_ns`. Their
/// events are missing outside the attached windows, so stages of requests that started
/// before an `attached` record's `ts_ns` are incomplete for that reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotHooks {
    pub node: String,
    /// When the change was complete (CLOCK_MONOTONIC of `node`).
    pub ts_ns: u64,
    pub change: HotHooksChange,
    /// The attach-plan hooks attached or detached.
    pub hooks: Vec<String>,
    /// `attached`: the start of the window in which their events are missing (the recording's
    /// start or the previous `detached` record), ending at `ts_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_since_ns: Option<u64>,
    /// `attached`: the `sock_established` event of the first connection traced in that window,
    /// which triggered the attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_ns: Option<u64>,
    /// `attached`: `ts_ns - trigger_ns`, the reaction delay; the traced connection's events in
    /// it are missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ns: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HotHooksChange {
    /// A connection is traced: the hot hooks were attached.
    Attached,
    /// No connection has been traced for a while: the hot hooks were detached.
    Detached,
}

wire_names!(HotHooksChange {
    Attached => "attached",
    Detached => "detached",
});

/// How one hook was attached (or why it was not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachEntry {
    /// Hook family member, e.g. `tcp_sendmsg`, `net_dev_queue`, `sock_ops`.
    pub hook: String,
    pub tier: Tier,
    pub status: AttachStatus,
    /// The kernel's or loader's reason when not attached (verifier log tail included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachStatus {
    Attached,
    Failed,
    /// Not tried: a faster tier already attached, or the hook was not requested.
    Skipped,
    /// `record --attach on-demand`: this tier attached at start (so it can) and was detached
    /// again with its program kept loaded; it is attached while a connection is traced
    /// (`hot_hooks` records).
    OnDemand,
}

wire_names!(AttachStatus {
    Attached => "attached",
    Failed => "failed",
    Skipped => "skipped",
    OnDemand => "on_demand",
});

impl AttachStatus {
    /// The tier the recorder uses for its hook: attached for the whole recording or on demand.
    pub fn is_chosen(self) -> bool {
        matches!(self, AttachStatus::Attached | AttachStatus::OnDemand)
    }
}

/// How a program is attached to the kernel (kernel/plan.rs lists each hook's tiers, fastest
/// first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// BPF trampoline on a kernel function (needs BTF and CONFIG_FUNCTION_TRACER; ~fastest).
    Fentry,
    /// BPF trampoline on a kernel function's return (with its arguments and return value).
    Fexit,
    /// kprobe on a kernel function (needs CONFIG_KPROBES).
    Kprobe,
    /// BTF-typed raw tracepoint (5.5+): ~8 ns bare cost.
    TpBtf,
    /// Raw tracepoint (4.17+): same arguments as tp_btf, no BTF needed.
    RawTp,
    /// Classic perf tracepoint (~41 ns): only a capability probe, see tx.rs in meshlab-ebpf.
    Tracepoint,
    /// cgroup2 sock_ops.
    SockOps,
}

wire_names!(Tier {
    Fentry => "fentry",
    Fexit => "fexit",
    Kprobe => "kprobe",
    TpBtf => "tp_btf",
    RawTp => "raw_tp",
    Tracepoint => "tracepoint",
    SockOps => "sock_ops",
});

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Filters in force for a recording (applied in the kernel).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filters {
    pub ports: Vec<u16>,
    pub addrs: Vec<String>,
    /// Network namespace restriction as a `/proc/PID/ns/net` or `/run/netns/NAME` path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// cgroup2 directory the sock_ops program is attached to.
    pub cgroup: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// One connection in `sample_every` is traced (1 = all).
    pub sample_every: u32,
    /// One request turn in `sample_messages_every` (with its response) is traced on each traced
    /// connection (`record --sample-messages`; 0 or 1, written as absent = every message).
    #[serde(default, skip_serializing_if = "every_message")]
    pub sample_messages_every: u32,
    pub raw_irq_stream: bool,
}

fn every_message(every: &u32) -> bool {
    *every <= 1
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicIrqInfo {
    pub irq: u32,
    pub dev: String,
    pub ifindex: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
}

/// One network device's settings at start-up, read through ethtool's netlink interface, the
/// ethtool ioctl (driver and firmware only; netlink has no driver info) and sysfs. A part that
/// could not be read is absent and named in `unavailable` with the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceContext {
    pub dev: String,
    pub ifindex: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// Bus address (`0000:3b:00.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_info: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Channels>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<Rings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce: Option<Coalesce>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloads: Option<Offloads>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamping: Option<Timestamping>,
    /// `record --hw-timestamps`: what was done to the device's hardware stamping (absent
    /// without the flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hw_timestamps: Option<HwTimestamps>,
    /// Receive queues (sysfs `queues/rx-N`) with their RPS CPUs.
    pub rx_queues: Vec<QueueCpus>,
    /// Transmit queues (sysfs `queues/tx-N`) with their XPS CPUs.
    pub tx_queues: Vec<QueueCpus>,
    pub irqs: Vec<DeviceIrq>,
    /// `part: reason` for every part that could not be read (e.g. `rings: Operation not supported`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// ethtool channel counts (`ethtool -l`): current and maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Channels {
    pub rx: u32,
    pub tx: u32,
    pub other: u32,
    pub combined: u32,
    pub rx_max: u32,
    pub tx_max: u32,
    pub other_max: u32,
    pub combined_max: u32,
}

/// Descriptor ring sizes (`ethtool -g`): current and maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rings {
    pub rx: u32,
    pub tx: u32,
    pub rx_max: u32,
    pub tx_max: u32,
}

/// Interrupt coalescing (`ethtool -c`); a field the driver does not report is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Coalesce {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_usecs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_max_frames: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_usecs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_max_frames: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_rx: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_tx: Option<bool>,
}

/// The offloads that change where time is spent, as active now (`ethtool -k`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offloads {
    /// `tx-tcp-segmentation`.
    pub tso: bool,
    /// `tx-generic-segmentation`.
    pub gso: bool,
    /// `rx-gro`.
    pub gro: bool,
    /// `rx-gro-hw`.
    pub gro_hw: bool,
    /// `rx-lro`.
    pub lro: bool,
    /// `rx-hashing` (the NIC computes the RSS hash).
    pub rx_hash: bool,
}

/// What the device can timestamp (`ethtool -T`), by the kernel's names for the
/// `SOF_TIMESTAMPING_*` capability bits, hardware transmit types and receive filters. Whether a
/// hardware stamp can become a stage depends on it: without `hardware_tx` no `tx_tstamp_hw`
/// event can appear, whatever `record --tx-timestamps` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timestamping {
    /// `software-transmit`: the driver stamps in its xmit (`tx_tstamp_sw`).
    pub software_tx: bool,
    /// `software-receive`.
    pub software_rx: bool,
    /// `hardware-transmit`: the NIC stamps sent packets (`tx_tstamp_hw`).
    pub hardware_tx: bool,
    /// `hardware-receive`.
    pub hardware_rx: bool,
    /// `hardware-raw-clock`: the stamps are in the NIC clock's time base.
    pub hardware_raw_clock: bool,
    /// The NIC clock (`/dev/ptpN`); absent when the device has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phc_index: Option<u32>,
    /// Hardware TX stamping modes (`off`, `on`, `onestep-sync`, ...).
    pub tx_types: Vec<String>,
    /// Hardware RX stamping filters (`none`, `all`, `ptpv2-event`, ...).
    pub rx_filters: Vec<String>,
}

/// `record --hw-timestamps` on one device: the driver's hardware stamping config before and
/// after meshlab set it (SIOCGHWTSTAMP / SIOCSHWTSTAMP), or why it was left alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HwTimestamps {
    pub outcome: HwTimestampsOutcome,
    /// The config found at start; restored when the recorder exits (`switched_on` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<HwStampConfig>,
    /// The config the driver reported back after the set (it may widen the RX filter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<HwStampConfig>,
    /// Why the device was left alone (`not_capable`, `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `record --hw-timestamps` did to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HwTimestampsOutcome {
    /// TX on (and RX all where the driver offers it); the previous config is restored at exit.
    SwitchedOn,
    /// TSINFO says the device cannot stamp in hardware: not touched.
    NotCapable,
    /// Reading or setting the config failed: the device keeps the config it had.
    Failed,
}

wire_names!(HwTimestampsOutcome {
    SwitchedOn => "switched_on",
    NotCapable => "not_capable",
    Failed => "failed",
});

/// `struct hwtstamp_config` (include/uapi/linux/net_tstamp.h) with the kernel's numbers:
/// `tx_type` 0 = HWTSTAMP_TX_OFF, 1 = HWTSTAMP_TX_ON; `rx_filter` 0 = HWTSTAMP_FILTER_NONE,
/// 1 = HWTSTAMP_FILTER_ALL, higher = the PTP filters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HwStampConfig {
    pub flags: i32,
    pub tx_type: i32,
    pub rx_filter: i32,
}

/// A queue and the CPUs steered to it by RPS (rx) or XPS (tx); empty when steering is off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueCpus {
    pub queue: u32,
    pub cpus: Vec<u32>,
}

/// One interrupt vector of a device, from sysfs `msi_irqs` and /proc/interrupts names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceIrq {
    pub irq: u32,
    /// The /proc/interrupts action name (empty when the vector has no handler yet).
    pub name: String,
    pub role: IrqRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
    /// `/proc/irq/N/smp_affinity_list`.
    pub affinity: Vec<u32>,
    /// `/proc/irq/N/effective_affinity_list`: where the interrupt is delivered now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_affinity: Option<Vec<u32>>,
}

/// Which traffic a NIC vector's interrupts announce (see kernel/nic/irq_names.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IrqRole {
    Rx,
    Tx,
    /// One vector per channel for both directions (`TxRx`, mlx5 completion EQs, shared virtio).
    RxTx,
    /// Configuration, link, async events, mailbox: no packets.
    Other,
}

wire_names!(IrqRole {
    Rx => "rx",
    Tx => "tx",
    RxTx => "rx_tx",
    Other => "other",
});

impl IrqRole {
    /// Whether an interrupt of this vector can start a receive path.
    pub fn can_start_rx(self) -> bool {
        matches!(self, IrqRole::Rx | IrqRole::RxTx)
    }
}

/// The node's clocks sampled back to back. `monotonic_ns` is the midpoint of two MONOTONIC
/// reads that bracket the others; `bracket_ns` (their distance) bounds the conversion error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSample {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub realtime_ns: u64,
    pub monotonic_ns: u64,
    pub tai_ns: u64,
    pub boottime_ns: u64,
    pub bracket_ns: u64,
    /// `record --hw-timestamps`: each traced device's NIC clock (PHC) read against
    /// CLOCK_MONOTONIC at about the same time (absent without the flag or a PHC).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nic_clocks: Vec<NicClockSample>,
}

/// A NIC's hardware clock (`/dev/ptpN`, the PHC that stamps its packets) against the node's
/// CLOCK_MONOTONIC: the tightest of several PTP_SYS_OFFSET_EXTENDED readings (system clock,
/// PHC, system clock). A hardware stamp `h` (the `aux` of `tx_tstamp_hw`) is at about
/// `monotonic_ns + (h - phc_ns)` (PHC and system clocks drift apart by ppm: use the nearest
/// sample), within `window_ns / 2`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicClockSample {
    pub dev: String,
    pub phc_index: u32,
    /// The PHC's reading, ns.
    pub phc_ns: u64,
    /// CLOCK_MONOTONIC at the middle of the system-clock reads around it.
    pub monotonic_ns: u64,
    /// Distance between the two system-clock reads (plus the realtime-to-monotonic
    /// conversion's bracket on kernels without a monotonic PTP readout): the error bound.
    pub window_ns: u64,
    pub sys_clock: PhcSysClock,
}

/// Which system clock the kernel read around the PHC: CLOCK_MONOTONIC (6.11+), or
/// CLOCK_REALTIME converted to monotonic through a clock pair read right after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhcSysClock {
    Monotonic,
    RealtimeConverted,
}

/// A clock a userland timestamp can be declared in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockId {
    Realtime,
    Monotonic,
    Tai,
    Boottime,
}

wire_names!(ClockId {
    Realtime => "realtime",
    Monotonic => "monotonic",
    Tai => "tai",
    Boottime => "boottime",
});

/// One kernel event, decoded from `meshlab_common::Event`. Fields a hook does not set are
/// omitted (see docs/probe-points.md for which hook sets what).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEvent {
    pub node: String,
    /// Written as [`Hook::name`]; a name this build does not know is an error.
    pub hook: Hook,
    /// CLOCK_MONOTONIC of `node`.
    pub ts_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skb: Option<u64>,
    /// Raw TCP sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u32>,
    /// Stream offset of `seq` (relative to the connection's base seen at ESTABLISHED), when the
    /// connection's bases are known; direction given by `dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<Direction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifindex: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
    /// Hook-specific value (driver rc, syscall return, napi work, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
    /// Hook-specific 64-bit value (e.g. rcv base at ESTABLISHED, waker tid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saddr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daddr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    /// RX context of this CPU: last NIC IRQ and its entry time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq_entry_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softirq_raise_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softirq_entry_ns: Option<u64>,
    /// Segment lies below data already seen for this connection and direction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retrans: bool,
    /// sock_established only: opened by connect() (true) or accept() (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
    /// Unix stream socket events (`record --unix`): the socket's kernel address (unix sockets
    /// have no cookie unless asked for one); `offset`/`len` then count bytes on this socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_sock: Option<u64>,
    /// The connected peer socket's kernel address: its receive offsets match this socket's
    /// send offsets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_peer: Option<u64>,
}

impl KernelEvent {
    /// An event of `hook` on `node` at `ts_ns` with every optional field unset.
    pub fn new(node: String, hook: Hook, ts_ns: u64) -> KernelEvent {
        KernelEvent {
            node,
            hook,
            ts_ns,
            cpu: 0,
            pid: 0,
            tid: 0,
            cookie: None,
            skb: None,
            seq: None,
            len: None,
            offset: None,
            dir: None,
            ifindex: None,
            dev: None,
            queue: None,
            value: None,
            aux: None,
            saddr: None,
            sport: None,
            daddr: None,
            dport: None,
            irq: None,
            irq_entry_ns: None,
            softirq_raise_ns: None,
            softirq_entry_ns: None,
            retrans: false,
            active: None,
            unix_sock: None,
            unix_peer: None,
        }
    }
}

/// Per-hook accounting: `received + dropped == hits` when nothing was lost in userspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookCounts {
    /// Events the kernel programs tried to emit (per-CPU hit counters, summed).
    pub hits: u64,
    /// Ring buffer reservations that failed.
    pub dropped: u64,
    /// Events the reader decoded and wrote.
    pub received: u64,
}

/// Drop record, written whenever the drop counters moved since the last one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drops {
    pub node: String,
    pub ts_ns: u64,
    /// Hook name -> drops since the start of the recording.
    pub per_hook: BTreeMap<String, u64>,
    /// CPU index -> drops since the start of the recording.
    pub per_cpu: Vec<u64>,
    pub total: u64,
}

/// Last line of a `meshlab record` stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub node: String,
    pub ts_ns: u64,
    pub duration_ns: u64,
    pub per_hook: BTreeMap<String, HookCounts>,
    pub received: u64,
    pub dropped: u64,
    pub reason: StopReason,
    /// meshlab's own cost during this recording; absent in recordings made before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_cost: Option<SelfCost>,
}

/// meshlab's own cost during one recording (docs/schema.md, "self_cost"): its BPF programs'
/// run time (the kernel's BPF run-time statistics, sampled at start and end) and the recorder
/// process's CPU time (getrusage), both over the same window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfCost {
    pub bpf_stats: BpfStatsState,
    /// Program name -> its runs during the recording; empty when `bpf_stats` is not measured.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub programs: BTreeMap<String, ProgramRuns>,
    /// Recorder CPU time in user mode over the window, all threads.
    pub user_cpu_ns: u64,
    /// Recorder CPU time in the kernel on its behalf (system calls, page cache copies).
    pub sys_cpu_ns: u64,
    /// Events the recorder wrote over the window (the summary's `received`).
    pub events: u64,
    /// Program name -> hook firings the kernel did not run it for, because a program was
    /// already running on that CPU (`bpf_prog_info.recursion_misses`): events neither recorded
    /// nor counted in `dropped`. Read whether or not `bpf_stats` is measured; only programs
    /// with misses are listed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub missed_runs: BTreeMap<String, u64>,
}

/// Kernel events lost to full event rings against all the programs produced: the written
/// ones (a summary's `received`, a self_cost's `events`) plus the dropped ones. Displayed as
/// `2 (2.0 % of 100)` by the recorder's warning and the report alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropShare {
    pub dropped: u64,
    pub written: u64,
}

impl DropShare {
    pub fn produced(&self) -> u64 {
        self.dropped + self.written
    }

    pub fn percent(&self) -> f64 {
        100.0 * self.dropped as f64 / self.produced().max(1) as f64
    }
}

impl std::fmt::Display for DropShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (dropped, produced) = (self.dropped, self.produced());
        write!(f, "{dropped} ({:.1} % of {produced})", self.percent())
    }
}

/// Whether the program figures of a [`SelfCost`] were measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BpfStatsState {
    /// kernel.bpf_stats_enabled was 1 for the whole recording, or `record --bpf-stats`.
    Measured,
    /// The kernel did not count program run time: `programs` is empty.
    NotMeasured,
}

wire_names!(BpfStatsState {
    Measured => "measured",
    NotMeasured => "not_measured",
});

/// One of meshlab's BPF programs over a recording: differences of the kernel's cumulative
/// `run_cnt` and `run_time_ns` between the start and the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramRuns {
    /// The attach-plan hook the program serves (docs/probe-points.md).
    pub hook: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// Events its hook emitted (the hits of its event hooks): the runs that did more than
    /// filter, so `run_time_ns / events` bounds the mean cost of an emitting run.
    pub events: u64,
}

/// Why a recording ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--duration` elapsed.
    Duration,
    Sigint,
    Sigterm,
    /// A closed terminal or `kill -HUP`.
    Sighup,
}

wire_names!(StopReason {
    Duration => "duration",
    Sigint => "sigint",
    Sigterm => "sigterm",
    Sighup => "sighup",
});

/// A userland probe event (written by the lab workload, or any instrumented program).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeEvent {
    /// Node name; may be omitted when the file is given as `--node NAME=FILE` to merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Process role, e.g. `client`, `server`, `sidecar-a`.
    pub process: String,
    pub pid: u32,
    pub tid: u32,
    /// Timestamp in the clock named by `clock`.
    pub ts_ns: u64,
    pub clock: ClockId,
    pub trace_id: String,
    /// Probe point name from the catalog (docs/schema.md), e.g. `client.write_begin`.
    pub point: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn: Option<ConnRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<Direction>,
    /// Stream offset of the message's first byte in `dir` on `conn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u64>,
}

/// How a userland probe names its connection: by cookie, by 4-tuple (local view), or both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub laddr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raddr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rport: Option<u16>,
    /// Unix socket path for UDS legs (no TCP sequence; offsets count bytes per socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_path: Option<String>,
}

/// First line of a `meshlab merge` output: provenance of everything that follows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeInfo {
    pub schema_version: u32,
    pub version: String,
    pub command: Vec<String>,
    pub inputs: Vec<MergeInput>,
    /// The startup record of every node's kernel recording, as read.
    pub nodes: Vec<Startup>,
    /// Skew injected per node (`--inject-skew`), nanoseconds.
    pub injected_skew_ns: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeInput {
    pub file: String,
    pub node: String,
    pub kind: InputKind,
}

/// What a merge input file is, detected from its first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// A `meshlab record` output (first record `startup`).
    Kernel,
    /// Userland probe events (`probe` records).
    Probe,
}

wire_names!(InputKind {
    Kernel => "kernel",
    Probe => "probe",
});

/// One request's attribution: ordered, non-overlapping segments whose durations sum to
/// `e2e_ns` exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergedRequest {
    pub trace_id: String,
    pub client_node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_node: Option<String>,
    /// How userland messages were joined to kernel events.
    pub join: JoinMethod,
    /// Request start on the client node's CLOCK_MONOTONIC.
    pub start_ns: u64,
    pub e2e_ns: u64,
    pub complete: bool,
    /// Stages that were not observed (never invented).
    pub missing: Vec<String>,
    pub segments: Vec<Segment>,
    /// Observations that do not change the arithmetic but explain it, e.g. a retransmitted
    /// range (`retransmitted: ...`) whose first transmission was used for the TX stages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JoinMethod {
    /// Connection + stream offset: exact.
    Offset,
    /// Fallback: (pid, tid, time order). Labelled because it can mis-pair under pipelining.
    PidTidTime,
    /// No userland probes: messages are sendmsg byte ranges, a request is one turn + reply.
    KernelOnly,
}

wire_names!(JoinMethod {
    Offset => "offset",
    PidTidTime => "pid_tid_time",
    KernelOnly => "kernel_only",
});

/// One attributed piece of a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    /// Stable segment name from docs/segments.md. Borrowed when it is a catalog name, like a
    /// fixed unit: the merge writes about forty segments per request and allocating each
    /// one's name and unit was a measurable part of its cost (docs/benchmarks-merge-ab.md).
    pub name: Cow<'static, str>,
    /// Node the segment was measured on; `None` for cross-node derived segments. Borrowed
    /// when the merge writes it ([`interned`]): one allocation per segment otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Cow<'static, str>>,
    pub layer: Layer,
    /// Process role (for `process`) or kernel sub-layer (for `kernel`), e.g. `qdisc`.
    pub unit: Cow<'static, str>,
    pub kind: Kind,
    /// Start on `node`'s CLOCK_MONOTONIC; absent for derived segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ns: Option<u64>,
    pub dur_ns: u64,
    /// Bound on the error of `dur_ns` from converting a userland clock to the node's
    /// CLOCK_MONOTONIC (half the clock sample's bracket per converted end); absent when both
    /// ends are in the same clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_ns: Option<u64>,
    /// Boxed: one segment of a request has it, and every segment is moved as it is built
    /// (a `Derivation` inline made them 112 bytes larger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derived: Option<Box<Derivation>>,
    /// Kernel stages: where the stage ran (the event that ends it; `rx_ip_tcp` on the device,
    /// queue and IRQ of the frame that starts it, merge/segments.rs `IN_FRAME_CONTEXT`), for
    /// per-CPU and per-queue aggregation (`report --nic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<Placement>,
}

/// `name` for [`Segment::node`] and [`Placement::dev`], from a process-wide set of leaked
/// names: a request has about forty segments, and allocating (then freeing) each one's node
/// name was ~4 % of the merge's instructions (docs/benchmarks-merge-ab.md, round 26). A merge
/// has a few nodes and devices and each name is leaked once per process, so the set stays as
/// small as the set of node and device names seen.
pub fn interned(name: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into());
    names.insert(leaked);
    leaked
}

/// The CPU a kernel stage ran on and, where known, its device, queue and NIC IRQ. RX stages
/// take the queue of their CPU's receive IRQ, TX stages the skb's queue_mapping and the
/// vector serving that queue (docs/schema.md).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub cpu: u32,
    /// Borrowed when the merge writes it ([`interned`]), as `Segment::node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<Cow<'static, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Process,
    Kernel,
    Network,
}

wire_names!(Layer {
    Process => "process",
    Kernel => "kernel",
    Network => "network",
});

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Compute,
    Wait,
    Queue,
    Network,
}

wire_names!(Kind {
    Compute => "compute",
    Wait => "wait",
    Queue => "queue",
    Network => "network",
});

/// A cross-node figure obtained by the difference method: sum(outer) - sum(inner), where
/// outer spans are measured on one node and inner spans on another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Derivation {
    pub method: String,
    pub outer_node: String,
    pub outer: Vec<String>,
    pub inner_node: String,
    pub inner: Vec<String>,
}

/// Last line of a `meshlab merge` output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeSummary {
    pub requests: u64,
    pub complete: u64,
    pub incomplete: u64,
    /// Errors (e.g. a would-be negative segment) with the events that caused them.
    pub errors: Vec<String>,
    /// Kernel drops per node, copied from the recordings' summaries.
    pub dropped_per_node: BTreeMap<String, u64>,
    /// Probe points outside the standard chains (any catalog, other processes) placed into
    /// requests, and those that could not be placed (docs/probes.md).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub custom_points: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unplaced_points: u64,
    /// Per node: meshlab's own cost, copied from its recording's summary (nodes whose
    /// recording has none are absent).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub self_cost: BTreeMap<String, SelfCost>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `as_str()` of every wire enum is its serde name.
    fn assert_wire_names<T: Serialize + Copy + std::fmt::Debug>(
        all: &[T],
        as_str: fn(T) -> &'static str,
    ) {
        for &v in all {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", as_str(v)), "{v:?}");
        }
    }

    #[test]
    fn wire_enum_names_are_their_serde_names() {
        assert_wire_names(AttachStatus::ALL, AttachStatus::as_str);
        assert_wire_names(ClockId::ALL, ClockId::as_str);
        assert_wire_names(InputKind::ALL, InputKind::as_str);
        assert_wire_names(JoinMethod::ALL, JoinMethod::as_str);
        assert_wire_names(Layer::ALL, Layer::as_str);
        assert_wire_names(Kind::ALL, Kind::as_str);
        assert_wire_names(IrqRole::ALL, IrqRole::as_str);
        assert_wire_names(Tier::ALL, Tier::as_str);
        assert_wire_names(StopReason::ALL, StopReason::as_str);
        assert_wire_names(BpfStatsState::ALL, BpfStatsState::as_str);
        assert_wire_names(AttachMode::ALL, AttachMode::as_str);
        assert_wire_names(HotHooksChange::ALL, HotHooksChange::as_str);
        assert_wire_names(HwTimestampsOutcome::ALL, HwTimestampsOutcome::as_str);
        assert_wire_names(Hook::ALL.as_slice(), Hook::name);
    }

    #[test]
    fn record_type_names_are_the_type_tags() {
        let clock = ClockSample {
            node: None,
            realtime_ns: 1,
            monotonic_ns: 2,
            tai_ns: 3,
            boottime_ns: 4,
            bracket_ns: 5,
            nic_clocks: Vec::new(),
        };
        let kernel = KernelEvent::new("A".into(), Hook::TcpProbe, 1);
        for record in [Record::Clock(clock), Record::Kernel(kernel)] {
            let value = serde_json::to_value(&record).unwrap();
            assert_eq!(value["type"], record.type_name());
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let line = r#"{"type":"clock","realtime_ns":1,"monotonic_ns":2,"tai_ns":3,"boottime_ns":4,"bracket_ns":5,"extra":1}"#;
        let err = serde_json::from_str::<Record>(line)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn self_cost_round_trips_and_rejects_unknown_fields() {
        let line = r#"{"type":"summary","node":"A","ts_ns":9,"duration_ns":5,"per_hook":{},"received":3,"dropped":0,"reason":"duration","self_cost":{"bpf_stats":"measured","programs":{"p":{"hook":"tcp_probe","run_cnt":3,"run_time_ns":600,"events":3}},"user_cpu_ns":10,"sys_cpu_ns":20,"events":3}}"#;
        let record: Record = serde_json::from_str(line).unwrap();
        assert_eq!(serde_json::to_string(&record).unwrap(), line);
        let extra = line.replace(r#""events":3"#, r#""events":3,"extra":1"#);
        let err = serde_json::from_str::<Record>(&extra)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
        let extra = line.replace(r#""run_cnt":3"#, r#""run_cnt":3,"extra":1"#);
        let err = serde_json::from_str::<Record>(&extra)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn hot_hooks_round_trips_and_rejects_unknown_fields() {
        let line = r#"{"type":"hot_hooks","node":"A","ts_ns":900,"change":"attached","hooks":["tcp_probe","sched_switch"],"missing_since_ns":100,"trigger_ns":700,"delay_ns":200}"#;
        let record: Record = serde_json::from_str(line).unwrap();
        assert_eq!(record.type_name(), "hot_hooks");
        assert_eq!(serde_json::to_string(&record).unwrap(), line);
        let detached =
            r#"{"type":"hot_hooks","node":"A","ts_ns":5,"change":"detached","hooks":[]}"#;
        let record: Record = serde_json::from_str(detached).unwrap();
        assert_eq!(serde_json::to_string(&record).unwrap(), detached);
        let extra = line.replace(r#""delay_ns":200"#, r#""delay_ns":200,"extra":1"#);
        let err = serde_json::from_str::<Record>(&extra)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn device_hw_timestamps_round_trip_and_reject_unknown_fields() {
        let line = r#"{"dev":"eth0","ifindex":2,"hw_timestamps":{"outcome":"switched_on","previous":{"flags":0,"tx_type":0,"rx_filter":0},"active":{"flags":0,"tx_type":1,"rx_filter":1}},"rx_queues":[],"tx_queues":[],"irqs":[]}"#;
        let ctx: DeviceContext = serde_json::from_str(line).unwrap();
        let hw = ctx.hw_timestamps.clone().unwrap();
        assert_eq!(hw.outcome, HwTimestampsOutcome::SwitchedOn);
        assert_eq!(hw.active.map(|a| (a.tx_type, a.rx_filter)), Some((1, 1)));
        assert_eq!(serde_json::to_string(&ctx).unwrap(), line);
        let bad = line.replace(r#""rx_filter":1}"#, r#""rx_filter":1,"extra":1}"#);
        let err = serde_json::from_str::<DeviceContext>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn segment_place_round_trips_and_rejects_unknown_fields() {
        let line = r#"{"name":"rx_napi_poll","node":"B","layer":"kernel","unit":"driver","kind":"compute","start_ns":1,"dur_ns":2,"place":{"cpu":1,"dev":"eth0","queue":0,"irq":25}}"#;
        let seg: Segment = serde_json::from_str(line).unwrap();
        let place = seg.place.clone().unwrap();
        assert_eq!((place.cpu, place.queue, place.irq), (1, Some(0), Some(25)));
        assert_eq!(serde_json::to_string(&seg).unwrap(), line);
        let bad = line.replace(r#""irq":25"#, r#""irq":25,"napi":3"#);
        let err = serde_json::from_str::<Segment>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `napi`"), "{err}");
    }

    #[test]
    fn unknown_hook_is_rejected() {
        let line = r#"{"type":"kernel","node":"A","hook":"no_such_hook","ts_ns":1,"cpu":0,"pid":0,"tid":0}"#;
        let err = serde_json::from_str::<Record>(line)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `no_such_hook`"), "{err}");
    }

    #[test]
    fn unknown_type_is_rejected() {
        let err = serde_json::from_str::<Record>(r#"{"type":"nope"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `nope`"), "{err}");
    }

    #[test]
    fn kernel_event_round_trips_with_optional_fields_omitted() {
        let ev = KernelEvent {
            cookie: Some(7),
            seq: Some(1000),
            len: Some(64),
            ..KernelEvent::new("A".into(), Hook::NetDevQueue, 10)
        };
        let line = serde_json::to_string(&Record::Kernel(ev.clone())).unwrap();
        assert_eq!(
            line,
            r#"{"type":"kernel","node":"A","hook":"net_dev_queue","ts_ns":10,"cpu":0,"pid":0,"tid":0,"cookie":7,"seq":1000,"len":64}"#
        );
        assert_eq!(
            serde_json::from_str::<Record>(&line).unwrap(),
            Record::Kernel(ev)
        );
    }
}
