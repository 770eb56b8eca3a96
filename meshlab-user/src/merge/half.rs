//! One node's share of a request ("half"): the client's points around its wait for the peer,
//! or the server's points from the request's arrival to the response leaving. The assembler
//! pairs a client half with a server half from another node.

use crate::schema::JoinMethod;

use super::chain::{Point, Stages};
use super::event::{Endpoint, Role};
use super::reader::ReaderTimeline;
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
    /// Other processes on this node's part of the path: proxies linked by the kernel-only
    /// relay rule ([`super::hops`]) and probed processes of other roles; a point with
    /// `owner = i` belongs to `relays[i - 1]`.
    pub relays: Vec<String>,
    /// Hops that could not be followed (`NODE:relay 1 ambiguous: ...`): listed as missing.
    pub unresolved: Vec<String>,
    /// Client: points up to the request leaving. Server: all its points.
    pub points: Vec<Point>,
    /// Client only: points from the response's arrival to the end.
    pub post: Vec<Point>,
    pub notes: Vec<String>,
    /// The reader thread's states while a received message waited in its socket without
    /// waking it (splits `rx_socket_queue`), keyed by the message's sk_data_ready time.
    pub readers: Vec<ReaderTimeline>,
    /// The scheduler states of the half's own thread (the one that made its TX and RX
    /// syscalls) over the half's span: cuts the thread's run-queue waits out of its own
    /// segments (docs/segments.md, "The thread's own spans").
    pub thread: Option<ReaderTimeline>,
    /// The node has a kernel recording; without one its kernel points are not expected one by
    /// one but reported once as `NODE:kernel (no recording)`.
    pub kernel_recorded: bool,
    /// Node time the half was completed (used to order the output of unmatched halves).
    pub ready_ns: u64,
}

/// Names of the proxies a half's hop chains crossed, nearest first: `sidecar-out` on the
/// client's node, `sidecar-in` on the server's, numbered from the second (`sidecar-out-2`).
pub fn relay_names(client: bool, count: u8) -> Vec<String> {
    let side = if client { "sidecar-out" } else { "sidecar-in" };
    (1..=count)
        .map(|k| match k {
            1 => side.to_owned(),
            k => format!("{side}-{k}"),
        })
        .collect()
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
