//! Names of the kernel programs' maps and read-only globals, as userspace looks them up in the
//! loaded object. aya names a map or global after its `static` in meshlab-ebpf, which keeps
//! these identifiers; a test in meshlab-user (kernel/loader.rs) checks every name here is a
//! symbol of the compiled object, so a rename on either side fails the build's tests.

/// Ring buffers of [`crate::Event`] records, indexed by [`crate::event_ring_of_cpu`].
pub const MAP_EVENTS: [&str; crate::EVENT_RINGS as usize] = [
    "EVENTS_0", "EVENTS_1", "EVENTS_2", "EVENTS_3", "EVENTS_4", "EVENTS_5", "EVENTS_6", "EVENTS_7",
];
/// Per-CPU, per-hook count of events the programs tried to emit.
pub const MAP_HITS: &str = "HITS";
/// Per-CPU, per-hook count of failed ring buffer reservations.
pub const MAP_DROPS: &str = "DROPS";
/// Port filter set (`--port`).
pub const MAP_FILTER_PORT_SET: &str = "FILTER_PORT_SET";
/// Address filter set (`--addr`).
pub const MAP_FILTER_ADDR_SET: &str = "FILTER_ADDR_SET";
/// NIC IRQ number -> device and queue.
pub const MAP_NIC_IRQS: &str = "NIC_IRQS";
/// Interfaces with NIC IRQs (TX completion applies to them only).
pub const MAP_NIC_IFINDEXES: &str = "NIC_IFINDEXES";
/// aya-log-ebpf's ring buffer of the kernel programs' diagnostics (`record -v`).
pub const MAP_KERNEL_LOG: &str = "AYA_LOGS";
/// aya-log-ebpf's level global: 0 turns every kernel log call off (meshlab-ebpf's diag.rs).
pub const GLOBAL_KERNEL_LOG_LEVEL: &str = "AYA_LOG_LEVEL";
/// The [`crate::Config`] read-only global.
pub const GLOBAL_CONFIG: &str = "CONFIG";
/// The [`crate::KernelOffsets`] read-only global.
pub const GLOBAL_OFFSETS: &str = "OFFSETS";

/// Every name userspace uses, for the object check.
pub const USER_SIDE_NAMES: [&str; 18] = [
    MAP_EVENTS[0],
    MAP_EVENTS[1],
    MAP_EVENTS[2],
    MAP_EVENTS[3],
    MAP_EVENTS[4],
    MAP_EVENTS[5],
    MAP_EVENTS[6],
    MAP_EVENTS[7],
    MAP_HITS,
    MAP_DROPS,
    MAP_FILTER_PORT_SET,
    MAP_FILTER_ADDR_SET,
    MAP_NIC_IRQS,
    MAP_NIC_IFINDEXES,
    MAP_KERNEL_LOG,
    GLOBAL_KERNEL_LOG_LEVEL,
    GLOBAL_CONFIG,
    GLOBAL_OFFSETS,
];
