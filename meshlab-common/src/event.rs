//! The one record the kernel programs write into the ring buffer.

/// A kernel event. One fixed-size layout for every hook keeps the reader free of per-hook
/// parsing and allocation; which fields are meaningful depends on [`Event::hook`] and is
/// documented per hook in docs/probe-points.md.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC of this node.
    pub ts_ns: u64,
    /// Socket cookie (`SO_COOKIE`), 0 when the hook has no socket.
    pub cookie: u64,
    /// `struct sk_buff *` address, links events of one skb within a node; 0 when none.
    pub skb: u64,
    /// Per-CPU RX context: entry time of the last NIC hard IRQ on this CPU, 0 if none.
    pub irq_entry_ns: u64,
    /// Per-CPU RX context: time NET_RX was raised on this CPU, 0 if not seen.
    pub softirq_raise_ns: u64,
    /// Per-CPU RX context: entry time of the running NET_RX softirq, 0 if not in one.
    pub softirq_entry_ns: u64,
    /// Hook-specific 64-bit value (see docs/probe-points.md), e.g. the wakee's waker tid.
    pub aux: u64,
    /// Process id (tgid) of the current task.
    pub pid: u32,
    /// Thread id of the current task (for scheduler hooks: the task the event is about).
    pub tid: u32,
    /// TCP sequence number: first byte of the segment, or the socket's write/copied/rcv pointer.
    pub seq: u32,
    /// Payload bytes the event covers.
    pub len: u32,
    /// Network device index, 0 if unknown.
    pub ifindex: u32,
    /// Hook-specific signed value: driver rc, syscall return, napi work, IRQ number, ...
    pub value: i32,
    /// Source address (IPv4-mapped for IPv4), only on hooks that parse headers or own a tuple.
    pub saddr: [u8; 16],
    /// Destination address, like `saddr`.
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    /// A [`crate::Hook`] as u16.
    pub hook: u16,
    /// `EVENT_FLAG_*` bits.
    pub flags: u16,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// Last NIC IRQ number seen on this CPU (valid when `irq_entry_ns != 0`).
    pub irq: u32,
    /// Device queue, u32::MAX if unknown: the TX queue (skb `queue_mapping`) on TX hooks, the
    /// RX queue the driver recorded (`queue_mapping` - 1) on netif_receive_skb, the vector's
    /// queue on the IRQ stream.
    pub queue: u32,
    /// Explicit padding so the struct has no implicit holes.
    pub _pad: u32,
}

/// The 4-tuple fields are valid.
pub const EVENT_FLAG_TUPLE: u16 = 1;
/// `sock_ops`: the connection was opened actively (connect) rather than accepted.
pub const EVENT_FLAG_ACTIVE_OPEN: u16 = 8;
/// A unix stream socket event: `skb` holds the socket's address, `aux` its peer's (unix
/// sockets have no cookie unless someone asked for one, and no sequence numbers).
pub const EVENT_FLAG_UNIX: u16 = 16;

const _: () = assert!(core::mem::size_of::<Event>() == 136);
const _: () = assert!(core::mem::align_of::<Event>() == 8);

/// Version of the [`Event`] byte layout, written into every binary capture
/// (docs/capture-format.md) next to `size_of::<Event>()`. Bump it whenever a field of `Event`
/// changes meaning, order or width, even if the size stays the same: a capture is raw `Event`
/// bytes, and a reader refuses a layout it was not built for.
pub const EVENT_LAYOUT_VERSION: u32 = 1;
