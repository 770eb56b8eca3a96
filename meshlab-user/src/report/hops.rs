//! The report per hop: a request's path cut at its processes (docs/segments.md, "Hops and
//! legs"). Each process on the path is a hop with its own time (all its process segments in
//! the request: a proxy's request and response relays together); the kernel and network
//! segments between two consecutive processes are the leg between them, one per direction:
//! a unix leg when all its stages are `uds_*`, else a TCP leg (its TX stages, the derived
//! network round trip when it crosses nodes, its RX stages).
//!
//! Per request a hop's figure is the sum of its segments; hops are listed in path order (the
//! order they first appear in the requests).

use serde::Serialize;

use crate::schema::{Layer, MergedRequest, Segment};

use super::quantile::{Samples, Stats};

/// Prefix of the unix-leg segment names (docs/segments.md).
const UNIX_STAGE_PREFIX: &str = "uds_";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HopKind {
    Process,
    UnixLeg,
    TcpLeg,
}

impl HopKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HopKind::Process => "process",
            HopKind::UnixLeg => "unix leg",
            HopKind::TcpLeg => "tcp leg",
        }
    }
}

/// One hop of the path across all requests.
#[derive(Debug)]
struct Hop {
    label: String,
    kind: HopKind,
    /// Segment names in path order (first seen).
    stages: Vec<String>,
    samples: Samples,
}

/// Every hop seen, in path order.
#[derive(Debug, Default)]
pub struct Hops {
    hops: Vec<Hop>,
}

/// One hop's row of the report.
#[derive(Debug, Serialize)]
pub struct HopRow {
    /// `client on A`, or `client@A -> sidecar-out@A` for a leg.
    pub hop: String,
    pub kind: HopKind,
    pub stages: Vec<String>,
    #[serde(flatten)]
    pub stats: Stats,
    pub share: f64,
}

/// `unit@node` of a process segment.
fn process_of(s: &Segment) -> String {
    format!("{}@{}", s.unit, s.node.as_deref().unwrap_or("derived"))
}

/// A request's hops in path order: (label, kind, its segments).
fn cut(req: &MergedRequest) -> Vec<(String, HopKind, Vec<&Segment>)> {
    let mut hops: Vec<(String, HopKind, Vec<&Segment>)> = Vec::new();
    let mut leg: Vec<&Segment> = Vec::new();
    let mut previous = "start".to_owned();
    for s in &req.segments {
        if s.layer != Layer::Process {
            leg.push(s);
            continue;
        }
        let process = process_of(s);
        if !leg.is_empty() {
            hops.push(leg_hop(&previous, &process, std::mem::take(&mut leg)));
        }
        let label = format!("{} on {}", s.unit, s.node.as_deref().unwrap_or("derived"));
        match hops
            .iter_mut()
            .find(|(l, k, _)| *l == label && *k == HopKind::Process)
        {
            Some((_, _, segments)) => segments.push(s),
            None => hops.push((label, HopKind::Process, vec![s])),
        }
        previous = process;
    }
    if !leg.is_empty() {
        hops.push(leg_hop(&previous, "end", leg));
    }
    hops
}

fn leg_hop<'a>(from: &str, to: &str, leg: Vec<&'a Segment>) -> (String, HopKind, Vec<&'a Segment>) {
    let kind = if leg.iter().all(|s| s.name.starts_with(UNIX_STAGE_PREFIX)) {
        HopKind::UnixLeg
    } else {
        HopKind::TcpLeg
    };
    (format!("{from} -> {to}"), kind, leg)
}

impl Hops {
    pub fn add_request(&mut self, req: &MergedRequest) {
        for (label, kind, segments) in cut(req) {
            let at = match self
                .hops
                .iter()
                .position(|h| h.label == label && h.kind == kind)
            {
                Some(at) => at,
                None => {
                    self.hops.push(Hop {
                        label,
                        kind,
                        stages: Vec::new(),
                        samples: Samples::default(),
                    });
                    self.hops.len() - 1
                }
            };
            let hop = &mut self.hops[at];
            for s in &segments {
                if !hop.stages.iter().any(|n| *n == s.name) {
                    hop.stages.push(s.name.to_string());
                }
            }
            hop.samples.push(segments.iter().map(|s| s.dur_ns).sum());
        }
    }

    /// The rows, with each hop's share of `e2e_sum_ns` (all end-to-end time).
    pub fn rows(&mut self, e2e_sum_ns: u128) -> Vec<HopRow> {
        self.hops
            .iter_mut()
            .filter_map(|h| {
                let stats = h.samples.finish()?;
                Some(HopRow {
                    hop: h.label.clone(),
                    kind: h.kind,
                    stages: h.stages.clone(),
                    share: stats.sum_ns as f64 / e2e_sum_ns.max(1) as f64,
                    stats,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{JoinMethod, Kind};

    fn seg(name: &str, node: Option<&str>, layer: Layer, unit: &str, dur_ns: u64) -> Segment {
        Segment {
            name: name.to_owned().into(),
            node: node.map(|n| n.to_owned().into()),
            layer,
            unit: unit.to_owned().into(),
            kind: Kind::Compute,
            start_ns: None,
            dur_ns,
            error_ns: None,
            derived: None,
            place: None,
        }
    }

    /// client -UDS-> sidecar-out (A) -TCP-> server (B), and back.
    fn one_hop_request() -> MergedRequest {
        use Layer::{Kernel, Network, Process};
        let a = Some("A");
        let b = Some("B");
        let segments = vec![
            seg("client_encode", a, Process, "client", 5),
            seg("uds_send", a, Kernel, "syscall", 2),
            seg("uds_receive", a, Kernel, "socket", 3),
            seg("proxy_uds_to_tcp", a, Process, "sidecar-out", 7),
            seg("tx_tcp_ip", a, Kernel, "tcp_ip", 4),
            seg("network_round_trip", None, Network, "network", 1),
            seg("rx_copy", b, Kernel, "syscall", 2),
            seg("server_handler", b, Process, "server", 10),
            seg("tx_tcp_ip", b, Kernel, "tcp_ip", 4),
            seg("rx_copy", a, Kernel, "syscall", 2),
            seg("proxy_tcp_to_uds", a, Process, "sidecar-out", 6),
            seg("uds_wakeup", a, Kernel, "scheduler", 3),
            seg("client_decode", a, Process, "client", 5),
        ];
        MergedRequest {
            trace_id: "t".into(),
            client_node: "A".into(),
            server_node: Some("B".into()),
            join: JoinMethod::Offset,
            start_ns: 0,
            e2e_ns: segments.iter().map(|s| s.dur_ns).sum(),
            complete: true,
            missing: Vec::new(),
            segments,
            notes: Vec::new(),
        }
    }

    #[test]
    fn the_path_is_cut_at_its_processes_with_legs_between_them() {
        let mut hops = Hops::default();
        hops.add_request(&one_hop_request());
        let rows = hops.rows(54);
        let got: Vec<(&str, HopKind, u64)> = rows
            .iter()
            .map(|r| (r.hop.as_str(), r.kind, r.stats.p50_ns))
            .collect();
        assert_eq!(
            got,
            [
                ("client on A", HopKind::Process, 10),
                ("client@A -> sidecar-out@A", HopKind::UnixLeg, 5),
                ("sidecar-out on A", HopKind::Process, 13),
                ("sidecar-out@A -> server@B", HopKind::TcpLeg, 7),
                ("server on B", HopKind::Process, 10),
                ("server@B -> sidecar-out@A", HopKind::TcpLeg, 6),
                ("sidecar-out@A -> client@A", HopKind::UnixLeg, 3),
            ]
        );
        assert_eq!(
            rows[3].stages,
            ["tx_tcp_ip", "network_round_trip", "rx_copy"]
        );
        let shares: f64 = rows.iter().map(|r| r.share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "hops cover the whole request");
    }
}
