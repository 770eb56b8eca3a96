//! One node's share of a request ("half"): the client's points around its wait for the peer,
//! or the server's points from the request's arrival to the response leaving. The assembler
//! pairs a client half with a server half from another node.

use crate::schema::JoinMethod;

use super::event::{Endpoint, Role};
use super::index::{Point, Stages};
use super::segments::PointId;
use super::time::NodeId;

/// Links a client half to its server half across nodes: the connection (client and server
/// endpoints; the server sees the same 4-tuple reversed) and the request's first stream offset,
/// which is equal on both nodes because both offset bases come from the same ISN.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkKey {
    pub client: Endpoint,
    pub server: Endpoint,
    pub request_start: u64,
}

#[derive(Debug)]
pub struct Half {
    pub role: Role,
    pub node: NodeId,
    pub trace_id: Option<String>,
    pub link: Option<LinkKey>,
    pub join: JoinMethod,
    /// Process role name for process-layer segments (the probes' `process`).
    pub process: String,
    /// Client: points up to the request leaving. Server: all its points.
    pub points: Vec<Point>,
    /// Client only: points from the response's arrival to the end.
    pub post: Vec<Point>,
    pub notes: Vec<String>,
    /// The node has a kernel recording; without one its kernel points are not expected one by
    /// one but reported once as `NODE:kernel (no recording)`.
    pub kernel_recorded: bool,
    /// Node time the half was completed (used to order the output of unmatched halves).
    pub ready_ns: u64,
}

/// Stage points of a message that could not be located at all (no connection, no kernel
/// recording): every kernel stage absent; only the ones that must exist are expected.
pub fn absent(ids: &[PointId]) -> Vec<Point> {
    ids.iter()
        .map(|&id| Point {
            id,
            stamp: None,
            expected: !matches!(
                id,
                PointId::IrqEntry
                    | PointId::SoftirqRaise
                    | PointId::SoftirqEntry
                    | PointId::SchedWakeup
                    | PointId::SchedSwitch
            ),
        })
        .collect()
}

/// RX kernel stages with the probe's `read_ready` placed where the reader returns from poll:
/// after its wake-up, before its recv copies.
pub fn with_read_ready(mut rx: Vec<Point>, read_ready: Point) -> Vec<Point> {
    let at = rx
        .iter()
        .position(|p| p.id == PointId::SkbCopyDatagram)
        .unwrap_or(rx.len());
    rx.insert(at, read_ready);
    rx
}

/// Notes on how a message's stages were chosen (retransmission, unusable RX context).
pub fn stage_notes(node: &str, what: &str, stages: &Stages) -> Vec<String> {
    let mut notes = Vec::new();
    if stages.retransmitted {
        notes.push(format!(
            "retransmitted: {what} on {node}; stage times use the first transmission"
        ));
    }
    if stages.stale_context {
        notes.push(format!(
            "rx context: {what} on {node}: IRQ/softirq times later than the skb (a later interrupt on that CPU) were not used"
        ));
    }
    notes
}
