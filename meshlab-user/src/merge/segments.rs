//! The one definition of chain points and segment names and boundaries (docs/segments.md).
//!
//! A request is a chain of points: the client's points up to its request leaving the NIC, the
//! server's points from the request's arrival to its response leaving the NIC, and the
//! client's points from the response's arrival to the end. A segment is the span between two
//! consecutive *observed* points of one node. When points between them were not observed (or do
//! not exist on that path), the segment covers the stages in between under their names joined
//! by `+`, unless a direct definition exists for that pair (see [`SEGMENTS`]).

use std::sync::OnceLock;

use crate::schema::{Kind, Layer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PointId {
    // Client probes.
    ClientEncodeBegin,
    ClientEncodeEnd,
    ClientWriteBegin,
    ClientReadReady,
    ClientReadEnd,
    ClientDecodeEnd,
    // Server probes.
    ServerReadReady,
    ServerReadEnd,
    ServerDecodeEnd,
    ServerHandlerBegin,
    ServerHandlerEnd,
    ServerEncodeEnd,
    ServerWriteBegin,
    // Kernel TX (of the message's first byte for tcp_sendmsg, its last byte for the rest).
    TcpSendmsg,
    /// The send call that wrote the message's last byte returned, before that byte left: the
    /// rest of the message waited in the socket's send queue (docs/segments.md).
    SendReturn,
    /// Socket TX timestamp SCHED: the skb entered the device layer (`record --tx-timestamps`).
    TxTstampSched,
    NetDevQueue,
    NetDevStartXmit,
    /// Socket TX timestamp SND_SW: the driver's software timestamp inside ndo_start_xmit.
    TxTstampSw,
    NetDevXmit,
    /// Socket TX timestamp SND_HW: when the kernel got the NIC's hardware TX timestamp.
    TxTstampHw,
    /// The driver freed the skb after the NIC sent it (skb:consume_skb of a NIC's TX skb).
    TxComplete,
    // Kernel RX (the skb carrying the message's last byte, and its CPU's IRQ context).
    /// The NIC's hardware RX timestamp of that skb, placed through the NIC clock: the frame's
    /// arrival at the NIC (`record --hw-timestamps`).
    RxTstampHw,
    IrqEntry,
    SoftirqRaise,
    SoftirqEntry,
    NetifReceiveSkb,
    TcpProbe,
    SkDataReady,
    SchedWakeup,
    SchedSwitch,
    SkbCopyDatagram,
    RecvReturn,
    // Unix stream legs (sidecars): data queued on the receiving socket, and the receiver's
    // recv returning the message's last byte (docs/segments.md, "Hops and legs").
    UdsDataReady,
    UdsRecvReturn,
    /// A probe point outside the standard chains (any catalog: `ROLE.NAME`), interned by
    /// [`super::custom_points::intern`].
    Custom(u16),
}

impl PointId {
    pub fn name(self) -> &'static str {
        use PointId::*;
        match self {
            ClientEncodeBegin => "client.encode_begin",
            ClientEncodeEnd => "client.encode_end",
            ClientWriteBegin => "client.write_begin",
            ClientReadReady => "client.read_ready",
            ClientReadEnd => "client.read_end",
            ClientDecodeEnd => "client.decode_end",
            ServerReadReady => "server.read_ready",
            ServerReadEnd => "server.read_end",
            ServerDecodeEnd => "server.decode_end",
            ServerHandlerBegin => "server.handler_begin",
            ServerHandlerEnd => "server.handler_end",
            ServerEncodeEnd => "server.encode_end",
            ServerWriteBegin => "server.write_begin",
            TcpSendmsg => "tcp_sendmsg",
            SendReturn => "send_return",
            TxTstampSched => "tx_tstamp_sched",
            NetDevQueue => "net_dev_queue",
            NetDevStartXmit => "net_dev_start_xmit",
            TxTstampSw => "tx_tstamp_sw",
            NetDevXmit => "net_dev_xmit",
            TxTstampHw => "tx_tstamp_hw",
            TxComplete => "tx_complete",
            RxTstampHw => "rx_tstamp_hw",
            IrqEntry => "irq_entry",
            SoftirqRaise => "softirq_raise",
            SoftirqEntry => "softirq_entry",
            NetifReceiveSkb => "netif_receive_skb",
            TcpProbe => "tcp_probe",
            SkDataReady => "sk_data_ready",
            SchedWakeup => "sched_wakeup",
            SchedSwitch => "sched_switch",
            SkbCopyDatagram => "skb_copy_datagram",
            RecvReturn => "recv_return",
            UdsDataReady => "uds_data_ready",
            UdsRecvReturn => "uds_recv_return",
            Custom(i) => super::custom_points::name(i),
        }
    }

    /// A userland probe's point (`ROLE.NAME`: a client's, a server's or a custom one), not a
    /// kernel hook's. A match, not a look at the name: the merge asks this per segment. No
    /// wildcard arm, so a new point must be placed on one side.
    pub fn is_probe(self) -> bool {
        use PointId::*;
        match self {
            ClientEncodeBegin | ClientEncodeEnd | ClientWriteBegin | ClientReadReady
            | ClientReadEnd | ClientDecodeEnd | ServerReadReady | ServerReadEnd
            | ServerDecodeEnd | ServerHandlerBegin | ServerHandlerEnd | ServerEncodeEnd
            | ServerWriteBegin | Custom(_) => true,
            TcpSendmsg | SendReturn | TxTstampSched | NetDevQueue | NetDevStartXmit
            | TxTstampSw | NetDevXmit | TxTstampHw | TxComplete | RxTstampHw | IrqEntry
            | SoftirqRaise | SoftirqEntry | NetifReceiveSkb | TcpProbe | SkDataReady
            | SchedWakeup | SchedSwitch | SkbCopyDatagram | RecvReturn | UdsDataReady
            | UdsRecvReturn => false,
        }
    }

    /// The probe point for `role.point`, if it is on a request's critical path.
    pub fn probe(client: bool, point: &str) -> Option<PointId> {
        use PointId::*;
        Some(match (client, point) {
            (true, "encode_begin") => ClientEncodeBegin,
            (true, "encode_end") => ClientEncodeEnd,
            (true, "write_begin") => ClientWriteBegin,
            (true, "read_ready") => ClientReadReady,
            (true, "read_end") => ClientReadEnd,
            (true, "decode_end") => ClientDecodeEnd,
            (false, "read_ready") => ServerReadReady,
            (false, "read_end") => ServerReadEnd,
            (false, "decode_end") => ServerDecodeEnd,
            (false, "handler_begin") => ServerHandlerBegin,
            (false, "handler_end") => ServerHandlerEnd,
            (false, "encode_end") => ServerEncodeEnd,
            (false, "write_begin") => ServerWriteBegin,
            _ => return None,
        })
    }
}

/// Known probe points that are not on a request's path (docs/probe-catalog.md): the writer's
/// syscall return happens while its message travels, so it splits nothing.
pub const OFF_PATH_PROBES: &[&str] = &["write_end"];

/// Where a segment's `unit` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// The probe's `process` (role) name, e.g. `client`.
    Process,
    Fixed(&'static str),
}

/// A named span between two chain points of one node.
#[derive(Clone, Copy, Debug)]
pub struct SegmentDef {
    pub name: &'static str,
    pub from: PointId,
    pub to: PointId,
    pub layer: Layer,
    pub unit: Unit,
    pub kind: Kind,
}

const fn def(
    name: &'static str,
    from: PointId,
    to: PointId,
    layer: Layer,
    unit: Unit,
    kind: Kind,
) -> SegmentDef {
    SegmentDef {
        name,
        from,
        to,
        layer,
        unit,
        kind,
    }
}

use Kind::{Compute, Queue};
use Layer::{Kernel, Process};
use PointId::*;
use Unit::Fixed;

/// Every segment the merge emits from observed points. docs/segments.md mirrors this table.
pub const SEGMENTS: &[SegmentDef] = &[
    // Client, before the request leaves.
    def(
        "client_encode",
        ClientEncodeBegin,
        ClientEncodeEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "client_pre_write",
        ClientEncodeEnd,
        ClientWriteBegin,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "tx_syscall_entry",
        ClientWriteBegin,
        TcpSendmsg,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    // TX, both sides.
    def(
        "tx_tcp_ip",
        TcpSendmsg,
        NetDevQueue,
        Kernel,
        Fixed("tcp_ip"),
        Compute,
    ),
    // The message's last byte left after its send call returned (a window or congestion
    // limit held it): the TCP/IP part ends at the return, the rest is send-queue wait.
    def(
        "tx_tcp_ip",
        TcpSendmsg,
        SendReturn,
        Kernel,
        Fixed("tcp_ip"),
        Compute,
    ),
    def(
        TX_SOCKET_QUEUE,
        SendReturn,
        NetDevQueue,
        Kernel,
        Fixed("socket"),
        Queue,
    ),
    def(
        TX_SOCKET_QUEUE,
        SendReturn,
        TxTstampSched,
        Kernel,
        Fixed("socket"),
        Queue,
    ),
    def(
        "tx_qdisc",
        NetDevQueue,
        NetDevStartXmit,
        Kernel,
        Fixed("qdisc"),
        Queue,
    ),
    def(
        "tx_driver",
        NetDevStartXmit,
        NetDevXmit,
        Kernel,
        Fixed("driver"),
        Compute,
    ),
    // With socket TX timestamps (`record --tx-timestamps`): the SCHED stamp is taken when the
    // skb enters __dev_queue_xmit, before tc/netfilter egress and TX queue selection; the
    // software stamp inside the driver's ndo_start_xmit, before it hands the skb on (doorbell,
    // or the peer's backlog on veth/lo); the hardware stamp when the driver reports the NIC's
    // send time, in its completion path.
    def(
        "tx_tcp_ip",
        TcpSendmsg,
        TxTstampSched,
        Kernel,
        Fixed("tcp_ip"),
        Compute,
    ),
    def(
        "tx_dev_egress",
        TxTstampSched,
        NetDevQueue,
        Kernel,
        Fixed("device"),
        Compute,
    ),
    def(
        "tx_driver",
        NetDevStartXmit,
        TxTstampSw,
        Kernel,
        Fixed("driver"),
        Compute,
    ),
    def(
        "tx_driver_handoff",
        TxTstampSw,
        NetDevXmit,
        Kernel,
        Fixed("driver"),
        Compute,
    ),
    def(
        "tx_nic_send",
        NetDevXmit,
        TxTstampHw,
        Kernel,
        Fixed("nic"),
        Queue,
    ),
    def(
        "tx_reclaim",
        TxTstampHw,
        TxComplete,
        Kernel,
        Fixed("driver"),
        Queue,
    ),
    // The NIC's part of sending: handed to the driver -> the driver reclaimed the sent skb.
    def(
        "tx_completion",
        NetDevXmit,
        TxComplete,
        Kernel,
        Fixed("nic"),
        Queue,
    ),
    // RX, both sides. The NIC from the frame's arrival (its hardware RX stamp) to the IRQ:
    // interrupt coalescing and the DMA of the frame.
    def(
        "rx_nic_receive",
        RxTstampHw,
        IrqEntry,
        Kernel,
        Fixed("nic"),
        Queue,
    ),
    def(
        "rx_irq_handler",
        IrqEntry,
        SoftirqRaise,
        Kernel,
        Fixed("irq"),
        Compute,
    ),
    def(
        "rx_softirq_delay",
        SoftirqRaise,
        SoftirqEntry,
        Kernel,
        Fixed("softirq"),
        Queue,
    ),
    def(
        "rx_napi_poll",
        SoftirqEntry,
        NetifReceiveSkb,
        Kernel,
        Fixed("driver"),
        Compute,
    ),
    def(
        "rx_ip_tcp",
        NetifReceiveSkb,
        TcpProbe,
        Kernel,
        Fixed("tcp_ip"),
        Compute,
    ),
    def(
        "rx_tcp_deliver",
        TcpProbe,
        SkDataReady,
        Kernel,
        Fixed("tcp"),
        Compute,
    ),
    def(
        "rx_wakeup",
        SkDataReady,
        SchedWakeup,
        Kernel,
        Fixed("scheduler"),
        Compute,
    ),
    def(
        "rx_sched_delay",
        SchedWakeup,
        SchedSwitch,
        Kernel,
        Fixed("scheduler"),
        Queue,
    ),
    def(
        "client_poll_return",
        SchedSwitch,
        ClientReadReady,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_poll_return",
        SchedSwitch,
        ServerReadReady,
        Process,
        Unit::Process,
        Compute,
    ),
    // The reader was not asleep (no wake-up): the data waited in the socket queue.
    def(
        RX_SOCKET_QUEUE,
        SkDataReady,
        ClientReadReady,
        Kernel,
        Fixed("socket"),
        Queue,
    ),
    def(
        RX_SOCKET_QUEUE,
        SkDataReady,
        ServerReadReady,
        Kernel,
        Fixed("socket"),
        Queue,
    ),
    def(
        RX_SOCKET_QUEUE,
        SkDataReady,
        SkbCopyDatagram,
        Kernel,
        Fixed("socket"),
        Queue,
    ),
    def(
        "rx_recv_entry",
        ClientReadReady,
        SkbCopyDatagram,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "rx_recv_entry",
        ServerReadReady,
        SkbCopyDatagram,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "rx_wakeup_to_copy",
        SchedSwitch,
        SkbCopyDatagram,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "rx_copy",
        SkbCopyDatagram,
        RecvReturn,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    // Client, after the response arrived.
    def(
        "client_read_return",
        RecvReturn,
        ClientReadEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "client_decode",
        ClientReadEnd,
        ClientDecodeEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    // Server, between receiving the request and sending the response.
    def(
        "server_read_return",
        RecvReturn,
        ServerReadEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_decode",
        ServerReadEnd,
        ServerDecodeEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_dispatch",
        ServerDecodeEnd,
        ServerHandlerBegin,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_handler",
        ServerHandlerBegin,
        ServerHandlerEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_encode",
        ServerHandlerEnd,
        ServerEncodeEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_pre_write",
        ServerEncodeEnd,
        ServerWriteBegin,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "tx_syscall_entry",
        ServerWriteBegin,
        TcpSendmsg,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    // Kernel-only mode: the server process between its recv returning and its send.
    def(
        "server_app",
        RecvReturn,
        TcpSendmsg,
        Process,
        Fixed("server"),
        Compute,
    ),
    // Unix stream legs: the sender's syscall until the data is queued on the peer socket, then
    // the reader's side (a probed reader splits it at its read_ready).
    def(
        "uds_send",
        ClientWriteBegin,
        UdsDataReady,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "uds_send",
        ServerWriteBegin,
        UdsDataReady,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "uds_receive",
        UdsDataReady,
        UdsRecvReturn,
        Kernel,
        Fixed("socket"),
        Queue,
    ),
    def(
        "uds_wakeup",
        UdsDataReady,
        ClientReadReady,
        Kernel,
        Fixed("scheduler"),
        Queue,
    ),
    def(
        "uds_wakeup",
        UdsDataReady,
        ServerReadReady,
        Kernel,
        Fixed("scheduler"),
        Queue,
    ),
    def(
        "uds_recv",
        ClientReadReady,
        UdsRecvReturn,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "uds_recv",
        ServerReadReady,
        UdsRecvReturn,
        Kernel,
        Fixed("syscall"),
        Compute,
    ),
    def(
        "client_read_return",
        UdsRecvReturn,
        ClientReadEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "server_read_return",
        UdsRecvReturn,
        ServerReadEnd,
        Process,
        Unit::Process,
        Compute,
    ),
    // A proxy without probes (kernel-only relay rule, docs/segments.md): from its read of the
    // message on one socket to its write of it on the next (the unit is the proxy).
    def(
        "proxy_uds_to_tcp",
        UdsRecvReturn,
        TcpSendmsg,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "proxy_tcp_to_uds",
        RecvReturn,
        UdsDataReady,
        Process,
        Unit::Process,
        Compute,
    ),
    def(
        "proxy_uds_to_uds",
        UdsRecvReturn,
        UdsDataReady,
        Process,
        Unit::Process,
        Compute,
    ),
];

/// What the thread that read a message was doing while the message waited in its socket
/// without waking it (the `rx_socket_queue` span), from its scheduler events
/// ([`super::reader`]; docs/segments.md, "The reader's scheduler state").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaderState {
    /// On a CPU, busy with other work: the process's time.
    Busy,
    /// Runnable without a CPU: preempted, or woken by something else and not yet running.
    Runnable,
    /// Asleep on something other than this data.
    Blocked,
    /// No scheduler event tells (events lost, or the thread was not tracked).
    Unknown,
}

/// How one reader state's part of the socket-queue wait is reported.
#[derive(Clone, Copy, Debug)]
pub struct ReaderSegmentDef {
    pub state: ReaderState,
    pub name: &'static str,
    pub layer: Layer,
    pub unit: Unit,
    pub kind: Kind,
}

/// The parts `rx_socket_queue` is cut into. A blocked or unknown reader's part stays
/// `rx_socket_queue` (the data waited in the socket). docs/segments.md mirrors this table.
pub const READER_SEGMENTS: &[ReaderSegmentDef] = &[
    ReaderSegmentDef {
        state: ReaderState::Busy,
        name: "rx_reader_busy",
        layer: Process,
        unit: Unit::Process,
        kind: Compute,
    },
    ReaderSegmentDef {
        state: ReaderState::Runnable,
        name: "rx_runqueue_wait",
        layer: Kernel,
        unit: Fixed("scheduler"),
        kind: Queue,
    },
];

/// The wait of a message's last byte in the sender's socket send queue after its send call
/// returned (the peer's receive window or the congestion window held it).
pub const TX_SOCKET_QUEUE: &str = "tx_socket_queue";

/// The socket-queue wait the reader's state splits.
pub const RX_SOCKET_QUEUE: &str = "rx_socket_queue";

pub fn reader_segment(state: ReaderState) -> Option<&'static ReaderSegmentDef> {
    READER_SEGMENTS.iter().find(|d| d.state == state)
}

/// The time a thread spent runnable without a CPU inside a span of its own (docs/segments.md,
/// "The thread's own spans"): cut out of the process-layer or syscall segment it interrupted,
/// which keeps its name on both sides.
pub const RUNQUEUE_WAIT: ReaderSegmentDef = ReaderSegmentDef {
    state: ReaderState::Runnable,
    name: "runqueue_wait",
    layer: Kernel,
    unit: Fixed("scheduler"),
    kind: Queue,
};

/// Whether a segment described as `layer` / `unit` is the execution of the thread whose events
/// bound it: the process's own time, or the kernel time of its syscall. Only such a span is
/// cut by that thread's scheduler state (a queue or a softirq stage is not the thread's work:
/// the thread being preempted does not delay it).
pub fn runs_on_thread(layer: Layer, unit: &str) -> bool {
    layer == Process || unit == "syscall"
}

/// The cross-node segment, derived by the difference method.
pub const NETWORK_ROUND_TRIP: &str = "network_round_trip";
/// The client's wait for its peer when the server half is unknown (no server recording or no
/// match): not split, and the request is incomplete.
pub const PEER_WAIT: &str = "peer_wait";

/// The one stage that runs in the receive softirq of the frame that starts it but ends at an
/// event of no device (`tcp_probe`): `rx_ip_tcp` is placed on that frame's device, queue and
/// IRQ when both ends ran on one CPU (merge/event.rs `Place::or_device_of`), so a frame polled
/// without an IRQ of its own still counts on its queue. Not a span joined over lost points (it
/// may hold scheduler or socket time), not `tcp_probe` from a socket backlog on another CPU.
pub const IN_FRAME_CONTEXT: (PointId, PointId) = (NetifReceiveSkb, TcpProbe);

/// The definition of the segment from `from` to `to`, if [`SEGMENTS`] has one. A hash
/// lookup, built once: the merge asks this for every segment of every request, and a scan of
/// the 55 definitions was ~1 % of its instructions.
pub fn find(from: PointId, to: PointId) -> Option<&'static SegmentDef> {
    static BY_ENDS: OnceLock<super::HashMap<(PointId, PointId), &'static SegmentDef>> =
        OnceLock::new();
    let by_ends = BY_ENDS.get_or_init(|| {
        let mut by_ends = super::HashMap::default();
        for d in SEGMENTS {
            // The first definition of a pair wins, as the scan's did.
            by_ends.entry((d.from, d.to)).or_insert(d);
        }
        by_ends
    });
    by_ends.get(&(from, to)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::chain::{RX_KERNEL, TX_KERNEL};

    /// `is_probe` is a match for speed; the names (`ROLE.NAME` for a probe) are the definition.
    #[test]
    fn is_probe_agrees_with_the_point_names() {
        let probes = [
            "encode_begin",
            "encode_end",
            "write_begin",
            "read_ready",
            "read_end",
        ];
        let probes = probes
            .iter()
            .chain(&["decode_end", "handler_begin", "handler_end"]);
        let mut points: Vec<PointId> = probes
            .flat_map(|p| [PointId::probe(true, p), PointId::probe(false, p)])
            .flatten()
            .collect();
        points.extend(TX_KERNEL.iter().chain(RX_KERNEL.iter()).copied());
        points.extend(SEGMENTS.iter().flat_map(|d| [d.from, d.to]));
        points.extend([UdsDataReady, UdsRecvReturn, TxTstampHw, RxTstampHw]);
        points.push(crate::merge::catalog::intern("proxy.accept_end").expect("room"));
        assert!(points.iter().filter(|p| p.is_probe()).count() >= 14);
        for p in points {
            assert_eq!(p.is_probe(), p.name().contains('.'), "{}", p.name());
        }
    }

    #[test]
    fn find_returns_the_first_definition_of_a_pair_and_none_for_others() {
        for d in SEGMENTS {
            let first = SEGMENTS.iter().find(|e| (e.from, e.to) == (d.from, d.to));
            let (found, first) = (find(d.from, d.to).expect("defined"), first.expect("d"));
            assert_eq!(
                (found.name, found.from, found.to),
                (first.name, first.from, first.to)
            );
        }
        assert!(find(SendReturn, ClientEncodeBegin).is_none());
        let custom = crate::merge::catalog::intern("proxy.accept_end").expect("room");
        assert!(find(custom, TcpSendmsg).is_none());
    }
}
