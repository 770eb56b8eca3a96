//! The order of a request's chain points, defined once (docs/segments.md): the kernel TX and RX
//! stages of one message, and how a node's half strings its probe points around them.
//!
//! [`super::index`] finds the stamps of [`TX_KERNEL`] and [`RX_KERNEL`]; the joiners
//! ([`super::join`], [`super::turns`]) build halves with [`client_request`],
//! [`client_response`] and [`server`]; [`super::attribution`] names the span between each two
//! consecutive observed points with [`super::segments`].

use super::event::Stamp;
use super::reader::ReaderTimeline;
use super::segments::PointId::{self, *};

/// Kernel TX stages of a message, in path order: tcp_sendmsg of its first byte, the return of
/// the send call that wrote its last byte (kept only when that byte left later), then the
/// device stages of the skb carrying its last byte, ending with its TX completion (NICs only).
/// The socket TX timestamps sit where the kernel takes them (docs/segments.md).
pub(crate) const TX_KERNEL: [PointId; 9] = [
    TcpSendmsg,
    SendReturn,
    TxTstampSched,
    NetDevQueue,
    NetDevStartXmit,
    TxTstampSw,
    NetDevXmit,
    TxTstampHw,
    TxComplete,
];

/// TX stages a message may lack without anything being lost: the send return is a point only
/// when the last byte left after it, completions exist on NICs only, socket TX timestamps only
/// in recordings with `--tx-timestamps` (hardware ones only on NICs that stamp).
pub(crate) fn tx_optional(id: PointId) -> bool {
    matches!(
        id,
        SendReturn | TxComplete | TxTstampSched | TxTstampSw | TxTstampHw
    )
}

/// Kernel RX stages of a message in path order; a probe's `read_ready` goes before
/// [`PointId::SkbCopyDatagram`] (see [`with_read_ready`]).
pub(crate) const RX_KERNEL: [PointId; 11] = [
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
];

/// Client probes before its request's TX stages.
const CLIENT_BEFORE_WRITE: [PointId; 3] = [ClientEncodeBegin, ClientEncodeEnd, ClientWriteBegin];
/// Client probes after the response's RX stages.
const CLIENT_AFTER_READ: [PointId; 2] = [ClientReadEnd, ClientDecodeEnd];
/// Server probes between the request's RX stages and the response's TX stages.
const SERVER_BETWEEN: [PointId; 6] = [
    ServerReadEnd,
    ServerDecodeEnd,
    ServerHandlerBegin,
    ServerHandlerEnd,
    ServerEncodeEnd,
    ServerWriteBegin,
];

/// A stage point found for a message (or not), and whether it had to be observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Point {
    pub id: PointId,
    pub stamp: Option<Stamp>,
    /// Not observed and expected => listed as missing. Optional stages (no IRQ on veth, no
    /// wake-up because the reader was running) are not expected.
    pub expected: bool,
    /// Which process of the half the point belongs to: 0 = the half's probed process, `i` =
    /// its `relays[i - 1]` (a proxy on the path, or another probed process). Process-layer
    /// segments take the process of the point they start at.
    pub owner: u8,
}

impl Point {
    pub fn seen(id: PointId, stamp: Option<Stamp>) -> Point {
        Point {
            id,
            stamp,
            expected: true,
            owner: 0,
        }
    }

    pub fn owned_by(self, owner: u8) -> Point {
        Point { owner, ..self }
    }
}

/// Stage points of one message plus notes (retransmissions).
#[derive(Debug, Default)]
pub(crate) struct Stages {
    pub points: Vec<Point>,
    pub retransmitted: bool,
    /// IRQ/softirq context times of the RX skb's CPU that contradict the skb's order (a later
    /// interrupt on that CPU overwrote them) and were therefore not used.
    pub stale_context: bool,
    /// RX without a wake-up: the reader thread's states while the data waited.
    pub reader: Option<ReaderTimeline>,
    /// The thread whose syscall the stages belong to: TX, the one whose tcp_sendmsg copied the
    /// message's first byte; RX, the one that took its data (the copy's, else the recv
    /// return's).
    pub thread: Option<u32>,
}

impl Stages {
    /// Stages of a message that could not be located at all (no connection, no kernel
    /// recording): every stage absent; only the ones that must exist are expected.
    pub fn absent(ids: &[PointId]) -> Stages {
        let points = ids
            .iter()
            .map(|&id| Point {
                id,
                stamp: None,
                expected: !matches!(
                    id,
                    RxTstampHw | IrqEntry | SoftirqRaise | SoftirqEntry | SchedWakeup | SchedSwitch
                ) && !tx_optional(id),
                owner: 0,
            })
            .collect();
        Stages {
            points,
            ..Stages::default()
        }
    }
}

/// A node's probe points by id; `None` in kernel-only mode, where a chain is kernel stages only.
pub(crate) type Probes<'a> = Option<&'a dyn Fn(PointId) -> Point>;

/// The client's chain until its request left: its probes before the write, then TX.
pub(crate) fn client_request(probes: Probes, tx: Vec<Point>) -> Vec<Point> {
    let mut chain = probe_points(probes, &CLIENT_BEFORE_WRITE);
    chain.extend(tx);
    chain
}

/// The client's chain from its response's arrival: RX, then its probes after the read.
pub(crate) fn client_response(probes: Probes, rx: Vec<Point>) -> Vec<Point> {
    let mut chain = with_read_ready(probes, rx, ClientReadReady);
    chain.extend(probe_points(probes, &CLIENT_AFTER_READ));
    chain
}

/// The server's chain: the request's RX, its probes, the response's TX.
pub(crate) fn server(probes: Probes, rx: Vec<Point>, tx: Vec<Point>) -> Vec<Point> {
    let mut chain = with_read_ready(probes, rx, ServerReadReady);
    chain.extend(probe_points(probes, &SERVER_BETWEEN));
    chain.extend(tx);
    chain
}

fn probe_points(probes: Probes, ids: &[PointId]) -> Vec<Point> {
    probes.map_or_else(Vec::new, |probe| ids.iter().map(|&id| probe(id)).collect())
}

/// RX stages with the probe's `read_ready` placed where the reader returns from poll: after
/// its wake-up, before its own recv copies (TCP) or returns (a unix leg, whose chain may start
/// with a proxy's TCP stages: hence the last copy or unix recv).
fn with_read_ready(probes: Probes, mut rx: Vec<Point>, read_ready: PointId) -> Vec<Point> {
    if let Some(probe) = probes {
        let at = rx
            .iter()
            .rposition(|p| matches!(p.id, SkbCopyDatagram | UdsRecvReturn))
            .unwrap_or(rx.len());
        rx.insert(at, probe(read_ready));
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::segments::find;

    fn ids(points: Vec<Point>) -> Vec<PointId> {
        points.into_iter().map(|p| p.id).collect()
    }

    #[test]
    fn every_consecutive_pair_of_the_standard_chains_has_a_definition() {
        let seen = |id| Point::seen(id, None);
        let tx = || Stages::absent(&TX_KERNEL).points;
        let rx = || Stages::absent(&RX_KERNEL).points;
        let chains = [
            ids(client_request(Some(&seen), tx())),
            ids(client_response(Some(&seen), rx())),
            ids(server(Some(&seen), rx(), tx())),
            ids(server(None, rx(), tx())),
        ];
        for chain in chains {
            for pair in chain.windows(2) {
                assert!(find(pair[0], pair[1]).is_some(), "{pair:?}");
            }
        }
    }

    #[test]
    fn read_ready_goes_before_the_copy() {
        let seen = |id| Point::seen(id, None);
        let chain = ids(client_response(
            Some(&seen),
            Stages::absent(&RX_KERNEL).points,
        ));
        let ready = chain.iter().position(|&id| id == ClientReadReady);
        let copy = chain.iter().position(|&id| id == SkbCopyDatagram);
        assert_eq!(ready.map(|r| r + 1), copy);
    }
}
