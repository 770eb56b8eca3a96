//! One node's share of a request ("half"): the client's points around its wait for the peer,
//! or the server's points from the request's arrival to the response leaving. The assembler
//! pairs a client half with a server half from another node.

use crate::schema::JoinMethod;

use super::chain::{Point, Stages};
use super::event::{Endpoint, Role};
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

/// `CLIENT_ADDR:PORT>SERVER_ADDR:PORT@OFFSET`: names a request without a trace id.
impl std::fmt::Display for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, s) = (&self.client, &self.server);
        write!(
            f,
            "{}:{}>{}:{}@{}",
            c.addr, c.port, s.addr, s.port, self.request_start
        )
    }
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
