//! The maps shared by all hook families.

use aya_ebpf::bindings::BPF_F_MMAPABLE;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf};
use meshlab_common::{
    ConnInfo, DEFAULT_RING_BYTES, HOOK_COUNT, MAX_FILTER_ENTRIES, MAX_NIC_IRQS, MAX_TRACED_CONNS,
    MAX_TRACKED_THREADS, NicIrq, PREFILTER_SLOTS, TupleKey,
};

/// The event rings: CPU `c` writes `EVENTS_{c % EVENT_RINGS}` (emit::reserve_event), so a ring's
/// lock and producer position stay in one CPU's cache while there are no more CPUs than rings.
/// Sizes are set by the loader (rings no possible CPU maps to get one page).
///
/// Eight static maps rather than an array of ring buffer maps: aya-ebpf 0.2.1 has
/// `btf_maps::ArrayOfMaps`, but its inner ring's size is a compile-time constant and the
/// loader would have to create and insert the inner rings itself; eight legacy maps keep the
/// loader's `map_max_entries` and the programs' verification as they were (one more map
/// reference per ring in each emitting program, well under the kernel's 64).
#[map]
pub static EVENTS_0: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_1: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_2: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_3: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_4: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_5: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_6: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
#[map]
pub static EVENTS_7: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);
const _: () = assert!(
    meshlab_common::EVENT_RINGS == 8,
    "one EVENTS_n static per ring"
);

/// Per-CPU, per-hook count of events the programs tried to emit.
#[map]
pub static HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HOOK_COUNT, 0);

/// Per-CPU, per-hook count of failed ring buffer reservations: lost events, never silent.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HOOK_COUNT, 0);

/// Per-CPU countdown to the next event that forces a reader wakeup (emit::wakeup_flag).
#[map]
pub static WAKEUP_COUNTDOWN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Traced connections: socket cookie -> 4-tuple and sequence bases. Filled by sock_ops.
#[map]
pub static TRACED_CONNS: LruHashMap<u64, ConnInfo> =
    LruHashMap::with_max_entries(MAX_TRACED_CONNS, 0);

/// Local-view 4-tuple -> cookie, for RX hooks that only have packet headers.
#[map]
pub static TUPLES: LruHashMap<TupleKey, u64> = LruHashMap::with_max_entries(MAX_TRACED_CONNS, 0);

/// Threads that own traced sockets: tid -> cookie of the last traced socket they used.
#[map]
pub static TRACKED_THREADS: LruHashMap<u32, u64> =
    LruHashMap::with_max_entries(MAX_TRACKED_THREADS, 0);

/// NIC IRQ numbers -> device and queue (from /proc/interrupts and sysfs).
#[map]
pub static NIC_IRQS: HashMap<u32, NicIrq> = HashMap::with_max_entries(MAX_NIC_IRQS, 0);

/// Port filter (host byte order); in force when `FILTER_PORTS` is set.
#[map]
pub static FILTER_PORT_SET: HashMap<u16, u8> = HashMap::with_max_entries(MAX_FILTER_ENTRIES, 0);

/// Address filter (16 bytes, IPv4-mapped); in force when `FILTER_ADDRS` is set.
#[map]
pub static FILTER_ADDR_SET: HashMap<[u8; 16], u8> =
    HashMap::with_max_entries(MAX_FILTER_ENTRIES, 0);

/// Per-CPU RX context: the NIC IRQ and NET_RX softirq that precede the RX events on this CPU,
/// and the traced socket whose data-ready is in progress (to attribute the wakeup it causes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuState {
    /// Context of the NET_RX softirq run in progress (what RX events carry).
    pub irq_entry_ns: u64,
    pub softirq_raise_ns: u64,
    pub softirq_entry_ns: u64,
    pub data_ready_ns: u64,
    pub data_ready_cookie: u64,
    /// The NIC IRQ and NET_RX raise seen since the last softirq run started: they belong to
    /// the NEXT run (an IRQ can arrive while NAPI is polling), so they wait here until
    /// softirq_entry promotes them. A NIC IRQ resets the pending raise: the raise kept is
    /// the first one after the latest IRQ (or after the run started, when no IRQ came).
    /// Except where the running net_rx_action polls the IRQ's device itself: then the
    /// device's frame promotes them into the running context (rx.rs `netif_context`).
    pub pending_irq_ns: u64,
    pub pending_raise_ns: u64,
    pub irq: u32,
    pub pending_irq: u32,
}

#[map]
pub static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU copy of the last traced skb handed to a driver (net_dev_start_xmit): by the time
/// net_dev_xmit fires the driver may have freed or forwarded the skb, so its fields are taken
/// from here, matched by skb address.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct XmitState {
    pub skb: u64,
    pub cookie: u64,
    pub seq: u32,
    pub len: u32,
    pub ifindex: u32,
    pub queue: u32,
}

#[map]
pub static XMIT_STATE: PerCpuArray<XmitState> = PerCpuArray::with_max_entries(1, 0);

/// Hit counter of the classic-tracepoint capability probes (doctor only; see tx.rs).
#[map]
pub static TRACEPOINT_PROBE_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU scratch for sock_ops: the connection record is built here, not on the 512-byte
/// BPF stack (the 4-tuple, the record and the map-update copies would not fit together).
#[map]
pub static SCRATCH_CONN: PerCpuArray<ConnInfo> = PerCpuArray::with_max_entries(1, 0);

/// TX skbs handed to a NIC driver, by address, until the driver frees them (TX completion).
#[map]
pub static INFLIGHT_TX: LruHashMap<u64, XmitState> =
    LruHashMap::with_max_entries(MAX_TRACED_CONNS, 0);

/// Interfaces that have NIC IRQs (filled by the loader): only their frees are TX completions.
#[map]
pub static NIC_IFINDEXES: HashMap<u32, u8> = HashMap::with_max_entries(MAX_NIC_IRQS, 0);

/// Two counts in one cache line, read first by every hot program ([`LIVE_CONNS`],
/// [`LIVE_SAMPLED_TURNS`]). An LRU eviction without a close leaves them too high, which only
/// costs the slower path.
#[map]
pub static TRACED_LIVE: Array<u64> = Array::with_max_entries(2, 0);

/// TRACED_LIVE index: connections in TRACED_CONNS (sock_ops adds and removes them). Zero means
/// no socket hook can match.
pub const LIVE_CONNS: u32 = 0;
/// TRACED_LIVE index: with `--sample-messages`, traced connections whose current turn is
/// sampled (turn.rs). Zero means only the hooks that start turns have anything to do.
pub const LIVE_SAMPLED_TURNS: u32 = 1;

/// One traced connection as its prefilter slot holds it: the cookie that owns the slot
/// (`cookie & (PREFILTER_SLOTS - 1)`), or PREFILTER_COLLIDED_COOKIE when two traced cookies
/// share it, and that connection's record (tuple, sequence bases, turn), in the first cache
/// line; the direction of its current turn alone in the second. The array is page-aligned
/// (mmapable), so each slot is exactly two lines and no connection's writes touch another's.
///
/// Why two lines: with sampling, the hooks that decide turns write the direction on every
/// message, one from the sending CPU and one from the receiving CPU, while every other hook of
/// the connection reads the first line. In one line, each message moved it between the CPUs
/// and the next reader on the other CPU waited for it (~90-120 ns per hook in `bench
/// kernel-ab`'s sampling rung: netif_receive_skb, skb_copy_datagram_iovec, sched_switch). The
/// first line is now written at ESTABLISHED and when a request turn's sampling decision
/// changes (turn.rs). Re-measured once only the deciders touched the slot between sampled
/// turns (prefilter::nothing_sampled): the direction back in the first line cost them more
/// (+5.4 % BPF time per request, docs/benchmarks-kernel-sampled.md).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ConnSlot {
    pub cookie: u64,
    /// Authoritative while `cookie` owns the slot alone: TRACED_CONNS' copy of the turn is
    /// then stale (sock_ops copies it back when a second connection collides). Its
    /// `turn.direction` is unused here: [`ConnSlot::direction`] holds it.
    pub info: ConnInfo,
    /// `TURN_NONE`, `TURN_TX` or `TURN_RX`, while `cookie` owns the slot alone.
    pub direction: u8,
    pub _line: [u8; 63],
}

const _: () = assert!(core::mem::size_of::<ConnSlot>() == 128);
const _: () = assert!(core::mem::offset_of!(ConnSlot, direction) == 64);
// turn.rs changes the record's turn with 8-byte atomics.
const _: () = assert!(core::mem::offset_of!(ConnSlot, info) % 8 == 0);

/// Prefilter and fast path in front of TRACED_CONNS (see [`ConnSlot`]). Array lookups are
/// inlined by the verifier; hash lookups are helper calls with a hash computation.
#[map]
pub static CONN_SLOTS: Array<ConnSlot> = Array::with_max_entries(PREFILTER_SLOTS, BPF_F_MMAPABLE);

/// Prefilter in front of TUPLES, for netif_receive_skb (no socket yet, only headers): slot
/// `prefilter::tuple_index` of a traced connection's local-view 4-tuple -> its cookie, or
/// PREFILTER_COLLIDED_COOKIE when two traced tuples share it. An empty slot is a definite
/// "not traced" for every packet whose tuple maps there.
#[map]
pub static TUPLE_SLOTS: Array<u64> = Array::with_max_entries(PREFILTER_SLOTS, 0);

/// Prefilter in front of TRACKED_THREADS, like CONN_SLOTS (slot `tid & mask`).
#[map]
pub static TID_SLOTS: Array<u32> = Array::with_max_entries(PREFILTER_SLOTS, 0);

/// Next to TID_SLOTS: the cookie of the traced socket the slot's thread last used, valid while
/// the slot names that thread alone. Lets the scheduler hooks and every traced send/receive
/// skip the TRACKED_THREADS hash lookup (see prefilter::thread_slot).
#[map]
pub static THREAD_COOKIE_SLOTS: Array<u64> = Array::with_max_entries(PREFILTER_SLOTS, 0);

/// Non-zero once net_dev_start_xmit put a TX skb into INFLIGHT_TX (a NIC device): before
/// that, tx_complete (every freed skb on the machine) has nothing to look up. Never cleared.
#[map]
pub static INFLIGHT_TX_USED: Array<u64> = Array::with_max_entries(1, 0);
