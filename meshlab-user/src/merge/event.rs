//! The merge's internal event forms: kernel and probe records reduced to what joining needs,
//! with node-local [`Stamp`]s and the file:line they came from.

use crate::schema::{ConnRef, Direction, Hook};

use super::nic_clock::OnMonotonic;
use super::time::NodeTime;

/// Where an event came from: index into the merge's input list, and 1-based line.
///
/// Packed to 10 bytes like [`NodeTime`], for the same reason: so a [`Stamp`] is 48 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(Rust, packed(2))]
pub struct Origin {
    pub file: u16,
    pub line: u64,
}

/// A node-local timestamp with its provenance and the error of any clock conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub time: NodeTime,
    /// 0 for kernel timestamps (already CLOCK_MONOTONIC).
    pub error_ns: u64,
    /// Converted userland timestamps: which clock sample converted them (`u32::MAX` = none).
    pub sample: u32,
    pub origin: Origin,
    /// Where a kernel event ran (nothing for probes); the segment a kernel point ends carries it.
    pub place: Place,
}

/// Where a kernel event ran: its CPU and, where known, its device, queue and NIC IRQ. RX
/// queues are the frame's own where the driver recorded one, else the queue the IRQ of the
/// CPU's receive context serves; TX IRQs come from the TX queue, both through the node's device
/// context ([`super::nic`]). Every [`Stamp`] carries one, so it is kept at 16 bytes: `u32::MAX`
/// stands for "not known" (no CPU, ifindex, IRQ or queue has it; the kernel event already uses
/// it for an unknown queue), and a queue known only through the IRQ has [`QUEUE_OF_IRQ`] set
/// (queues are u16 in the kernel), so that it goes when the IRQ does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    cpu: u32,
    ifindex: u32,
    queue: u32,
    irq: u32,
}

const UNKNOWN: u32 = u32::MAX;
/// In [`Place::queue`]'s field: the queue is the one the IRQ serves, not the event's own.
const QUEUE_OF_IRQ: u32 = 1 << 31;

impl Default for Place {
    fn default() -> Self {
        Place::new(None, None, None, None)
    }
}

impl Place {
    pub fn new(
        cpu: Option<u32>,
        ifindex: Option<u32>,
        queue: Option<u32>,
        irq: Option<u32>,
    ) -> Place {
        let v = |o: Option<u32>| o.unwrap_or(UNKNOWN);
        Place {
            cpu: v(cpu),
            ifindex: v(ifindex),
            queue: v(queue),
            irq: v(irq),
        }
    }

    fn get(v: u32) -> Option<u32> {
        (v != UNKNOWN).then_some(v)
    }

    pub fn cpu(&self) -> Option<u32> {
        Place::get(self.cpu)
    }

    pub fn ifindex(&self) -> Option<u32> {
        Place::get(self.ifindex)
    }

    pub fn queue(&self) -> Option<u32> {
        Place::get(self.queue).map(|q| q & !QUEUE_OF_IRQ)
    }

    /// The place with the queue its IRQ serves, where it has none of its own.
    pub fn or_queue_of_irq(self, served: Option<u32>) -> Place {
        match served {
            Some(q) if self.queue == UNKNOWN => Place {
                queue: q | QUEUE_OF_IRQ,
                ..self
            },
            _ => self,
        }
    }

    pub fn irq(&self) -> Option<u32> {
        Place::get(self.irq)
    }

    /// A stage's place (that of the event ending it) with the device, queue and IRQ of the
    /// frame that starts it, when the end has no device and both ran on one CPU: the stage ran
    /// in that frame's softirq (merge/segments.rs `IN_FRAME_CONTEXT`). Without it, a frame
    /// polled without an IRQ of its own has no stage on its RX queue (`rx_napi_poll` needs the
    /// IRQ's softirq run).
    pub fn or_device_of(self, start: &Place) -> Place {
        if self.ifindex != UNKNOWN || start.ifindex == UNKNOWN || self.cpu != start.cpu {
            return self;
        }
        *start
    }

    /// The same place without its IRQ and the queue known only through it.
    pub fn without_irq(self) -> Place {
        let of_irq = self.queue != UNKNOWN && self.queue & QUEUE_OF_IRQ != 0;
        Place {
            queue: if of_irq { UNKNOWN } else { self.queue },
            irq: UNKNOWN,
            ..self
        }
    }
}

const _: () = assert!(std::mem::size_of::<Place>() == 16);
// Stamps fill the merge's index for a whole window: 48 bytes before Place, 64 with it, 48
// again with `NodeTime` and `Origin` packed (round 32).
const _: () = assert!(std::mem::size_of::<Stamp>() == 48);

impl Stamp {
    pub fn ns(&self) -> u64 {
        self.time.absolute_ns()
    }

    /// A hardware stamp placed at its NIC-clock time (merge/nic_clock.rs), not at the time
    /// the driver reported it.
    pub fn on_nic_clock(&self) -> bool {
        self.sample != u32::MAX && self.sample & super::nic_clock::NIC_SAMPLE_BASE != 0
    }
}

/// Per-CPU receive context a `netif_receive_skb` event carries (absolute node times).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxContext {
    pub irq_entry_ns: Option<u64>,
    pub softirq_raise_ns: Option<u64>,
    pub softirq_entry_ns: Option<u64>,
    /// The receiving device is a NIC with an IRQ the recorder watches (startup `nic_irqs`), so
    /// an IRQ is expected; false on veth/loopback, where there is none to observe.
    pub irq_expected: bool,
    /// The skb's hardware RX stamp placed through the node's NIC clock (merge/nic_clock.rs).
    pub wire: Option<OnMonotonic>,
}

/// A local/remote address pair of a TCP connection as seen on one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub addr: String,
    pub port: u16,
}

impl Endpoint {
    /// Addresses compare in canonical form: an IPv4-mapped IPv6 address is its IPv4 address,
    /// so a probe's `::ffff:10.0.0.1` and a recorder's `10.0.0.1` name the same endpoint.
    pub fn new(addr: String, port: u16) -> Endpoint {
        let addr = match addr.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => v6
                .to_ipv4_mapped()
                .map_or_else(|| v6.to_string(), |v4| v4.to_string()),
            Ok(ip) => ip.to_string(),
            Err(_) => addr,
        };
        Endpoint { addr, port }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Established {
    pub local: Endpoint,
    pub remote: Endpoint,
    pub active: bool,
}

#[derive(Clone, Debug)]
pub struct KEvent {
    pub hook: Hook,
    pub stamp: Stamp,
    pub tid: u32,
    pub cookie: Option<u64>,
    pub dir: Option<Direction>,
    pub offset: Option<u64>,
    pub len: u32,
    pub value: Option<i64>,
    pub retrans: bool,
    /// What only some hooks carry ([`Extra`]).
    pub extra: Extra,
}

// Boxed items of a window's read-ahead: 184 bytes with the four fields `Extra` replaces (a
// 192-byte mimalloc block), 152 with it (160-byte block), 136 with a 48-byte `Stamp`, 128
// (a 128-byte block) with `Extra` at 16 bytes.
const _: () = assert!(std::mem::size_of::<KEvent>() <= 128);

/// The fields of a [`KEvent`] that only some hooks carry, as [`Extra`] stores them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// netif_receive_skb only.
    pub rx: Option<RxContext>,
    /// sock_established only.
    pub established: Option<Established>,
    /// Unix stream socket events (`record --unix`): the socket and its peer.
    pub unix: Option<UnixEnds>,
    /// sched_switch out: the thread's prev_state (0 = TASK_RUNNING: preempted).
    pub aux: Option<u64>,
}

/// [`Extras`] in 16 bytes rather than 56: no hook sets more than one of them, so one enum
/// holds whichever is set (`Unix` boxed too: only `record --unix` captures have them). Every
/// item of the merge's read-ahead carries one, so its size is the window's memory (page
/// faults, cache misses, the cross-thread frees of old items).
#[derive(Clone, Debug, Default)]
pub enum Extra {
    #[default]
    None,
    Rx(Box<RxContext>),
    Established(Box<Established>),
    Unix(Box<UnixEnds>),
    Aux(u64),
    /// Two or more set (no recorder writes that; kept so any input reduces as it did).
    Many(Box<Extras>),
}

const _: () = assert!(std::mem::size_of::<Extra>() == 16);

impl Extra {
    pub fn new(x: Extras) -> Extra {
        let set = usize::from(x.rx.is_some())
            + usize::from(x.established.is_some())
            + usize::from(x.unix.is_some())
            + usize::from(x.aux.is_some());
        match x {
            _ if set > 1 => Extra::Many(Box::new(x)),
            Extras { rx: Some(rx), .. } => Extra::Rx(Box::new(rx)),
            Extras {
                established: Some(e),
                ..
            } => Extra::Established(Box::new(e)),
            Extras { unix: Some(u), .. } => Extra::Unix(Box::new(u)),
            Extras { aux: Some(a), .. } => Extra::Aux(a),
            _ => Extra::None,
        }
    }

    pub fn rx(&self) -> Option<&RxContext> {
        match self {
            Extra::Rx(rx) => Some(rx),
            Extra::Many(x) => x.rx.as_ref(),
            _ => None,
        }
    }

    pub fn established(&self) -> Option<&Established> {
        match self {
            Extra::Established(e) => Some(e),
            Extra::Many(x) => x.established.as_ref(),
            _ => None,
        }
    }

    pub fn unix(&self) -> Option<UnixEnds> {
        match self {
            Extra::Unix(u) => Some(**u),
            Extra::Many(x) => x.unix,
            _ => None,
        }
    }

    pub fn aux(&self) -> Option<u64> {
        match self {
            Extra::Aux(a) => Some(*a),
            Extra::Many(x) => x.aux,
            _ => None,
        }
    }
}

/// Kernel identity of a unix stream socket and its connected peer (kernel addresses). The
/// peer's receive offsets equal this socket's send offsets (docs/probe-points.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnixEnds {
    pub sock: u64,
    pub peer: u64,
}

/// Probe points on a request's critical path, by role. Other points are timeline-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Client,
    Server,
}

#[derive(Clone, Debug)]
pub struct PEvent {
    /// `client` or `server`; `None` for any other process on the path (a probed proxy).
    pub role: Option<Role>,
    /// Point name without the role prefix for `client`/`server` (e.g. `write_begin`), the
    /// whole `ROLE.NAME` for other roles.
    pub point: String,
    pub process: String,
    pub trace_id: String,
    pub stamp: Stamp,
    pub tid: u32,
    pub conn: Option<ConnRef>,
    /// Direction of the message the point names (with `conn`).
    pub dir: Option<Direction>,
    pub offset: Option<u64>,
    pub len: Option<u64>,
}

/// One node's input, in node time order after the reorder window.
///
/// Both kinds boxed: an item is moved through the reorder buffer to the joiner, and a
/// 184-byte `KEvent` (128 since round 32) cost a memcpy call at each move, more than its one
/// allocation does (merge-callgrind, docs/benchmarks-merge-ab.md round 25). A kernel event is
/// boxed once it reaches the merging thread ([`Reduced`]).
#[derive(Clone, Debug)]
pub enum Item {
    Kernel(Box<KEvent>),
    Probe(Box<PEvent>),
}

const _: () = assert!(std::mem::size_of::<Item>() == 16);

/// An item as the reading thread reduces it: the kernel event by value, boxed by
/// [`Reduced::boxed`] on the merging thread, which also frees it. Allocated on the reading
/// thread, every kernel event's box was freed across threads (mimalloc's slow path: the
/// merging thread's `mi_free` was 10-11 % of a merge's CPU, perf, round 36).
pub enum Reduced {
    Kernel(KEvent),
    Probe(Box<PEvent>),
}

impl Reduced {
    pub fn boxed(self) -> Item {
        match self {
            Reduced::Kernel(k) => Item::Kernel(Box::new(k)),
            Reduced::Probe(p) => Item::Probe(p),
        }
    }
}

impl Item {
    pub fn stamp(&self) -> Stamp {
        match self {
            Item::Kernel(k) => k.stamp,
            Item::Probe(p) => p.stamp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Endpoint, Established, Extra, Extras, Place, RxContext, UnixEnds};

    #[test]
    fn a_stage_takes_the_frames_device_only_where_its_end_has_none_on_the_same_cpu() {
        let frame = Place::new(Some(1), Some(2), Some(0), None);
        let tcp = Place::new(Some(1), None, None, None);
        assert_eq!(tcp.or_device_of(&frame), frame);
        let elsewhere = Place::new(Some(0), None, None, None);
        assert_eq!(elsewhere.or_device_of(&frame), elsewhere);
        let on_device = Place::new(Some(1), Some(3), Some(1), Some(41));
        assert_eq!(on_device.or_device_of(&frame), on_device);
        assert_eq!(tcp.or_device_of(&Place::default()), tcp);
    }

    #[test]
    fn extra_gives_back_every_combination_of_extras() {
        let rx = RxContext {
            irq_entry_ns: Some(7),
            irq_expected: true,
            ..RxContext::default()
        };
        let est = Established {
            local: Endpoint::new("10.0.0.1".into(), 1),
            remote: Endpoint::new("10.0.0.2".into(), 2),
            active: true,
        };
        for bits in 0..16u8 {
            let x = Extras {
                rx: (bits & 1 != 0).then_some(rx),
                established: (bits & 2 != 0).then(|| est.clone()),
                unix: (bits & 4 != 0).then_some(UnixEnds { sock: 3, peer: 4 }),
                aux: (bits & 8 != 0).then_some(u64::from(bits)),
            };
            let e = Extra::new(x.clone());
            let back = Extras {
                rx: e.rx().copied(),
                established: e.established().cloned(),
                unix: e.unix(),
                aux: e.aux(),
            };
            assert_eq!(back, x, "combination {bits:04b}");
            assert_eq!(matches!(e, Extra::Many(_)), bits.count_ones() > 1);
        }
    }

    #[test]
    fn endpoints_compare_in_canonical_form() {
        let mapped = Endpoint::new("::ffff:10.200.0.1".into(), 80);
        assert_eq!(mapped, Endpoint::new("10.200.0.1".into(), 80));
        assert_eq!(Endpoint::new("fd00:0:0::1".into(), 1).addr, "fd00::1");
        assert_eq!(Endpoint::new("not-an-ip".into(), 1).addr, "not-an-ip");
    }
}
