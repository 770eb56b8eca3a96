//! The kernel <-> userspace contract of meshlab.
//!
//! Everything the eBPF programs write into the ring buffer, and everything the loader hands to
//! them (configuration, kernel struct offsets, map keys), is defined here once. All types are
//! `#[repr(C)]`, laid out without implicit padding (checked by the `const` assertions below), so
//! the same bytes mean the same thing on both sides. The `user` feature adds `aya::Pod`.
#![cfg_attr(target_arch = "bpf", no_std)]

mod event;
mod hook;
pub mod names;
mod sample;

pub use event::*;
pub use hook::*;
pub use sample::*;

/// Maximum number of CIDR-free address filters and port filters the loader may install.
pub const MAX_FILTER_ENTRIES: u32 = 64;
/// Capacity of the traced-connection maps. LRU: old connections age out under churn.
pub const MAX_TRACED_CONNS: u32 = 65_536;
/// Capacity of the tracked-thread map (threads that own traced sockets).
pub const MAX_TRACKED_THREADS: u32 = 16_384;
/// Slots of the traced-cookie and tracked-thread prefilter arrays (index: low bits of the
/// cookie / tid). A power of two so the index is a mask.
pub const PREFILTER_SLOTS: u32 = 65_536;
/// Prefilter slot of a local-view 4-tuple (the kernel programs' TUPLE_SLOTS index): the last
/// four bytes of each 16-byte address (the whole IPv4 address of an IPv4-mapped one) as a
/// little-endian u32 and both ports, chained by multiplications and spread by murmur3's
/// finaliser, so every input bit reaches every slot bit. Collisions only cost the hash-map
/// lookup; tests use this to make two connections share a slot.
#[inline(always)]
pub fn tuple_slot_index(local_low: u32, local_port: u16, remote_low: u32, remote_port: u16) -> u32 {
    const K: u32 = 0x9e37_79b1;
    let ports = (u32::from(local_port) << 16) | u32::from(remote_port);
    let mut h = (local_low.wrapping_mul(K) ^ remote_low).wrapping_mul(K) ^ ports;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h & (PREFILTER_SLOTS - 1)
}

/// Prefilter slot value: two traced keys share this slot, ask the authoritative hash map.
pub const PREFILTER_COLLIDED_COOKIE: u64 = u64::MAX;
/// See [`PREFILTER_COLLIDED_COOKIE`], for the tracked-thread slots.
pub const PREFILTER_COLLIDED_TID: u32 = u32::MAX;
/// Capacity of the NIC IRQ map (IRQ number -> device and queue).
pub const MAX_NIC_IRQS: u32 = 1_024;
/// Default size in bytes of each event ring (must be a power-of-two multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 8 << 20;
/// Event rings the kernel programs write: CPU `c` writes ring `c % EVENT_RINGS`, so up to this
/// many CPUs each have a ring of their own and never share its lock and positions (a ring
/// written from two CPUs cost 25-72 ns more per record: docs/benchmarks-kernel.md, issue 10).
/// Statically declared maps (EVENTS_0..), not an array of maps: see meshlab-ebpf's maps.rs.
/// A power of two, so the selection is a mask.
pub const EVENT_RINGS: u32 = 8;
const _: () = assert!(EVENT_RINGS.is_power_of_two());

/// The event ring CPU `cpu` writes (see [`EVENT_RINGS`]).
#[inline(always)]
pub const fn event_ring_of_cpu(cpu: u32) -> u32 {
    cpu & (EVENT_RINGS - 1)
}

/// Softirq vector numbers (include/linux/interrupt.h); stable kernel ABI for tracepoints.
pub const NET_TX_SOFTIRQ: u32 = 2;
/// See [`NET_TX_SOFTIRQ`].
pub const NET_RX_SOFTIRQ: u32 = 3;

/// Address families as they appear in `sock_common.skc_family`.
pub const AF_INET: u16 = 2;
/// See [`AF_INET`].
pub const AF_INET6: u16 = 10;
/// Unix-domain sockets (the sidecar legs of the lab topologies).
pub const AF_UNIX: u16 = 1;

/// Filters and switches the loader sets before load (an eBPF read-only global).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `bpf_get_netns_cookie` value to restrict tracing to; 0 = every network namespace.
    pub netns_cookie: u64,
    /// Bit set of `FILTER_*` flags: which of the filter maps are in force.
    pub filter_flags: u32,
    /// Trace one connection in `sample_every` (by a hash of the canonical 4-tuple); 0 or 1 = all.
    pub sample_every: u32,
    /// Only trace connections whose packets use this ifindex; 0 = any device.
    pub ifindex: u32,
    /// Non-zero: stream every NIC IRQ / NET softirq / napi_poll event (NIC evaluation).
    pub raw_irq_stream: u32,
    /// Non-zero: also record send/recv/data-ready of unix stream sockets (in `netns_cookie`'s
    /// namespace when set). Unix sockets have no TCP sequence: userspace counts their bytes.
    pub trace_unix: u32,
    /// Events one CPU submits between two forced reader wakeups (the loader sizes it so that
    /// all CPUs together submit about 1/16 of the ring in that time); the others are submitted
    /// without a wakeup and the reader drains on its timer. 0 = the kernel's own policy (wake
    /// when the reader has caught up, i.e. on almost every event at moderate rates).
    pub wakeup_events: u32,
    /// Trace one request turn in `sample_messages_every` (and the response that answers it) on
    /// every traced connection, by [`message_sampled`]; 0 or 1 = every message.
    pub sample_messages_every: u32,
    /// Non-zero: sock_ops asks the kernel for socket TX timestamps (qdisc, driver software,
    /// NIC hardware, ACK) of sampled sends on traced connections. Set only when the loader
    /// resolved the kfuncs this needs ([`KFUNC_CALL_PLACEHOLDERS`]).
    pub tx_timestamps: u32,
    /// Non-zero (`record --attach on-demand`): sock_ops forces a reader wakeup with the
    /// `sock_established` event of every newly traced connection, so the recorder attaches its
    /// hot hooks within a wakeup of the first one instead of at its next timed drain.
    pub wake_on_traced: u32,
    /// Non-zero (`record --hw-timestamps`): netif_receive_skb records the skb's RX hardware
    /// timestamp (`skb_hwtstamps(skb)->hwtstamp`, the NIC clock's time of the frame's
    /// arrival) in `aux`. A read-only constant: without the flag the verifier removes the read.
    pub rx_hw_timestamps: u32,
}

/// `Config::filter_flags`: the PORTS map restricts traced connections.
pub const FILTER_PORTS: u32 = 1;
/// `Config::filter_flags`: the ADDRS map restricts traced connections.
pub const FILTER_ADDRS: u32 = 2;

/// Kernel struct field offsets in bytes, resolved by the loader from vmlinux BTF.
///
/// Rust eBPF has no CO-RE relocations, so every kernel struct read goes through one of these.
/// No offset is compiled in: a kernel lacking a field fails at start-up, naming it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub sk_buff_sk: u32,
    pub sk_buff_len: u32,
    pub sk_buff_data: u32,
    pub sk_buff_head: u32,
    pub sk_buff_network_header: u32,
    pub sk_buff_dev: u32,
    pub sk_buff_cb: u32,
    pub sk_buff_queue_mapping: u32,
    pub sock_common_cookie: u32,
    pub sock_common_family: u32,
    pub tcp_sock_write_seq: u32,
    pub tcp_sock_copied_seq: u32,
    pub tcp_sock_rcv_nxt: u32,
    pub net_device_ifindex: u32,
    pub task_struct_pid: u32,
    pub task_struct_tgid: u32,
    pub tcp_skb_cb_seq: u32,
    pub tcp_skb_cb_end_seq: u32,
    pub msghdr_msg_iter: u32,
    pub iov_iter_count: u32,
    pub napi_struct_dev: u32,
    pub sock_common_net: u32,
    pub net_cookie: u32,
    pub unix_sock_peer: u32,
    pub socket_sk: u32,
    pub sock_ops_kern_skb: u32,
    pub sk_buff_end: u32,
    pub skb_shared_info_tskey: u32,
    pub skb_shared_info_hwtstamps: u32,
    /// vmlinux BTF type ids for the kfunc `bpf_rdonly_cast` (Linux 6.2+), which retypes a
    /// kernel address as a pointer to that struct so tp_btf programs read it with direct
    /// (fault-tolerant) loads instead of bpf_probe_read_kernel. 0 = not usable here (no
    /// kfunc, no such type, or a layout the programs cannot use): the programs read with the
    /// helper. Set by the loader, not part of the offset resolution proper.
    ///
    /// A struct whose first [`CAST_WORDS_BYTES`] bytes are 8-byte integer fields, each at its
    /// own 8-byte offset (x86-64 `struct user_regs_struct`): raw bytes (packet headers behind
    /// `skb->head`) read as aligned 8-byte words at constant offsets from a cast pointer.
    pub cast_id_words: u32,
    /// `struct tcp_skb_cb`, the layout of `skb->cb` on the TCP paths (TCP_SKB_CB(skb)).
    pub cast_id_tcp_skb_cb: u32,
    /// `struct tcp_sock`, for a socket pointer the verifier does not trust (`skb->sk`).
    pub cast_id_tcp_sock: u32,
}

/// Bytes from a [`KernelOffsets::cast_id_words`] cast the programs read as words: an
/// option-less IPv4 header plus 20 bytes of TCP, or the fixed IPv6 header.
pub const CAST_WORDS_BYTES: u32 = 40;

/// Kernel functions (kfuncs) the eBPF object calls, with the placeholder each call carries.
///
/// aya 0.14 cannot emit or relocate kfunc calls, so the programs write each one as an inline
/// `call <placeholder>` (a helper call to a helper id no kernel has) and the loader rewrites
/// that instruction into a kfunc call (src_reg BPF_PSEUDO_KFUNC_CALL, imm = the function's
/// vmlinux BTF id) before aya parses the object. A kernel without the kfunc gets a harmless
/// helper call there instead and the read-only global gating that call (`Config::tx_timestamps`,
/// the `KernelOffsets::cast_id_*` ids) stays 0, so the call is never reached.
pub const KFUNC_CALL_PLACEHOLDERS: [(&str, i32); 3] = [
    ("bpf_cast_to_kern_ctx", KFUNC_PLACEHOLDER_CAST_TO_KERN_CTX),
    (
        "bpf_sock_ops_enable_tx_tstamp",
        KFUNC_PLACEHOLDER_ENABLE_TX_TSTAMP,
    ),
    ("bpf_rdonly_cast", KFUNC_PLACEHOLDER_RDONLY_CAST),
];
/// See [`KFUNC_CALL_PLACEHOLDERS`]; "mLk1" as bytes, far above any helper id.
pub const KFUNC_PLACEHOLDER_CAST_TO_KERN_CTX: i32 = 0x6d4c_6b31;
/// See [`KFUNC_CALL_PLACEHOLDERS`]; "mLk2".
pub const KFUNC_PLACEHOLDER_ENABLE_TX_TSTAMP: i32 = 0x6d4c_6b32;
/// See [`KFUNC_CALL_PLACEHOLDERS`]; "mLk3". Its calls are gated by the
/// [`KernelOffsets`] `cast_id_*` fields instead of `Config::tx_timestamps`.
pub const KFUNC_PLACEHOLDER_RDONLY_CAST: i32 = 0x6d4c_6b33;

/// Key of the 4-tuple -> cookie map, as seen from the local socket.
///
/// Addresses are 16 bytes; IPv4 is stored IPv4-mapped (`::ffff:a.b.c.d`) so one key type serves
/// both families. Ports are in host byte order. 8-byte aligned (the layout is the same as with
/// 4): the kernel programs compare the addresses as two 8-byte words each.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TupleKey {
    pub local_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    pub local_port: u16,
    pub remote_port: u16,
    pub _pad: u32,
}

/// Value of the traced-connection map (key: socket cookie).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnInfo {
    pub tuple: TupleKey,
    /// `snd_nxt` at ESTABLISHED: the sequence number of stream offset 0 of sent data.
    pub snd_base: u32,
    /// `rcv_nxt` at ESTABLISHED: the sequence number of stream offset 0 of received data.
    pub rcv_base: u32,
    /// [`conn_sample_hash`] of the 4-tuple: the per-connection seed of [`message_sampled`].
    pub sample_hash: u32,
    /// The connection's message sampling state, updated in place by the payload hooks.
    pub turn: Turn,
}

/// Which way a connection's bytes last flowed, and whether that turn is sampled.
///
/// A request turn starts when bytes flow from the active opener after bytes flowed the other
/// way (or first); its first byte decides. A response turn inherits the decision of the
/// request turn before it, so a request and its answer are sampled together.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// `TURN_NONE`, `TURN_TX` or `TURN_RX`: the direction of the current turn. Kept here
    /// for a connection whose record lives in the kernel's hash map; one that owns its
    /// prefilter slot keeps it in the slot's second cache line (meshlab-ebpf maps.rs
    /// `ConnSlot`), because it changes with every message.
    pub direction: u8,
    /// 1 when the current turn (and so every event of it) is sampled, 0 when not; 2 or 3
    /// once the record no longer holds the connection's turn (it closed, or its state moved
    /// to another record), so that a hook still holding the old record cannot change it
    /// (meshlab-ebpf turn.rs counts the connections in a sampled turn by these changes).
    pub sampled: u8,
    /// Non-zero on the active opener's side: its sends are requests.
    pub requests_are_sent: u8,
    pub _pad: u8,
}

/// `Turn::direction`: no payload yet.
pub const TURN_NONE: u8 = 0;
/// `Turn::direction`: this end is sending.
pub const TURN_TX: u8 = 1;
/// `Turn::direction`: this end is receiving.
pub const TURN_RX: u8 = 2;

/// Value of the NIC IRQ map (key: IRQ number), filled from /proc/interrupts and sysfs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicIrq {
    pub ifindex: u32,
    /// Queue index parsed from the IRQ name (e.g. `virtio0-input.0`), u32::MAX if unknown.
    pub queue: u32,
}

#[cfg(feature = "user")]
mod pod {
    // Each type below is #[repr(C)], Copy, made only of integers and integer arrays, and has
    // no padding (sizes asserted in event.rs and below), so any byte pattern is a valid value.
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::TupleKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::ConnInfo {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::NicIrq {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Event {}
}

const _: () = assert!(core::mem::size_of::<Config>() == 48);
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 32 * 4);
const _: () = assert!(core::mem::size_of::<TupleKey>() == 40);
const _: () = assert!(core::mem::size_of::<ConnInfo>() == 56);
const _: () = assert!(core::mem::align_of::<TupleKey>() == 8);
const _: () = assert!(core::mem::size_of::<NicIrq>() == 8);
