//! The streaming merge: pulls node streams, feeds their joiners, pairs client and server halves
//! across nodes (by trace id, else by the reversed 4-tuple + request stream offset), attributes
//! each request and hands output records to a sink.
//!
//! Which node to read next: before any request has been matched, the node with the fewest
//! unmatched halves (then the fewest events read); afterwards, the node whose frontier is
//! earliest once shifted by the offset seen between the nodes in matched requests. That offset
//! only schedules reading (it keeps the nodes' windows side by side); no duration ever uses it,
//! and it shifts exactly with any skew, so the reading order, and the output, do not change
//! under `--inject-skew`.

use std::collections::BTreeMap;

use super::HashMap;

use crate::schema::{ClockId, MergeSummary, MergedRequest, ProbeEvent, Record, interned};

use super::MergeError;
use super::attribution::{Names, attribute};
use super::chain::Point;
use super::event::{Role, Stamp};
use super::half::{Half, LinkKey};
use super::input::Plan;
use super::join::NodeJoiner;
use super::segments::PointId;
use super::stream::NodeStream;
use super::time::NodeId;

const MAX_ERRORS: usize = 1000;

#[derive(Default)]
struct Pending {
    halves: HashMap<u64, Half>,
    by_trace: HashMap<String, u64>,
    by_link: HashMap<LinkKey, u64>,
}

impl Pending {
    fn insert(&mut self, id: u64, half: Half) {
        if let Some(t) = &half.trace_id {
            self.by_trace.insert(t.clone(), id);
        }
        if let Some(l) = &half.link {
            self.by_link.insert(l.clone(), id);
        }
        self.halves.insert(id, half);
    }

    fn take_partner(&mut self, half: &Half) -> Option<Half> {
        let id = half
            .trace_id
            .as_ref()
            .and_then(|t| self.by_trace.get(t))
            .or_else(|| half.link.as_ref().and_then(|l| self.by_link.get(l)))
            .copied()?;
        self.remove(id)
    }

    fn remove(&mut self, id: u64) -> Option<Half> {
        let half = self.halves.remove(&id)?;
        if let Some(t) = &half.trace_id {
            self.by_trace.remove(t);
        }
        if let Some(l) = &half.link {
            self.by_link.remove(l);
        }
        Some(half)
    }
}

pub struct Options {
    pub window_ns: u64,
    pub timeline: bool,
}

/// Runs the merge over `plan`, sending each output record (requests, timeline lines; not the
/// merge_info header) to `sink`. Returns the summary.
pub(crate) fn run(
    plan: &Plan,
    opts: &Options,
    sink: &mut dyn FnMut(Record) -> std::io::Result<()>,
) -> Result<MergeSummary, MergeError> {
    let n = plan.nodes.len();
    let (mut streams, mut joiners) = open_nodes(plan, opts)?;
    let files: Vec<String> = plan.files.iter().map(|f| f.display.clone()).collect();
    let devices: Vec<_> = plan.nodes.iter().map(|n| device_names(plan, n)).collect();
    let names = Names {
        nodes: &plan.nodes,
        files: &files,
        devices: &devices,
    };
    let mut st = State::new(n, plan, opts.timeline);
    let mut exhausted = vec![false; n];
    let mut read = vec![0u64; n];
    while let Some(i) = pick(&exhausted, &st, &joiners, &read) {
        match streams[i].next(plan)? {
            Some(item) => {
                read[i] += 1;
                joiners[i].push(item);
            }
            None => {
                exhausted[i] = true;
                joiners[i].finish_all(&mut |half| st.add(&names, half, sink))?;
            }
        }
        for half in std::mem::take(&mut joiners[i].done) {
            st.add(&names, half, sink)?;
        }
        // Unmatched halves wait four windows; checking every 1024 events of a node is enough.
        if read[i].is_multiple_of(1024) || exhausted[i] {
            st.evict(
                &names,
                NodeId(i as u16),
                joiners[i].frontier_ns(),
                4 * opts.window_ns,
                exhausted.iter().all(|e| *e),
                sink,
            )?;
        }
    }
    st.evict_all(&names, sink)?;
    st.collect_node_errors(&mut joiners, &streams);
    Ok(st.summary)
}

/// ifindex -> name of `node`'s devices (its startup's device context and NIC vectors),
/// interned: each kernel segment's placement borrows its device's name.
fn device_names(plan: &Plan, node: &str) -> HashMap<u32, &'static str> {
    let Some(s) = plan.startups.iter().find(|s| s.node == node) else {
        return HashMap::default();
    };
    let irqs = s.nic_irqs.iter().map(|v| (v.ifindex, interned(&v.dev)));
    let devs = s.devices.iter().map(|d| (d.ifindex, interned(&d.dev)));
    irqs.chain(devs).collect()
}

/// Every node's time-ordered stream and its joiner (kernel-only when it has no probe file).
fn open_nodes(
    plan: &Plan,
    opts: &Options,
) -> Result<(Vec<NodeStream>, Vec<NodeJoiner>), MergeError> {
    let n = plan.nodes.len();
    let mut streams = Vec::with_capacity(n);
    let mut joiners = Vec::with_capacity(n);
    for i in 0..n {
        let node = NodeId(i as u16);
        streams.push(NodeStream::open(plan, node, opts.window_ns)?);
        let kernel_only = !plan.has_probes(node);
        joiners.push(NodeJoiner::new(
            node,
            plan.nodes[i].clone(),
            opts.window_ns,
            kernel_only,
            plan.kernel_recorded[i],
        ));
    }
    Ok((streams, joiners))
}

/// The node to read next: the one furthest behind on the common clock once every live node's
/// offset is known, else the one with the fewest pending halves; ties to the fewest read, then
/// the first. Called once per event, so a plain loop: perf put 5-8 % of a one-node merge's
/// samples in the `min_by_key` fold over a filtered range it was (docs/benchmarks-merge-ab.md,
/// round 38; callgrind: 0.5 % of the instructions, so stalls, not work).
fn pick(exhausted: &[bool], st: &State, joiners: &[NodeJoiner], read: &[u64]) -> Option<usize> {
    // One node: nothing to choose (the loop below is 0.5 % of a one-node merge's
    // instructions, callgrind, round 38).
    if let [done] = exhausted {
        return (!done).then_some(0);
    }
    let by_clock = (0..exhausted.len()).all(|i| exhausted[i] || st.offset[i].is_some());
    let mut best: Option<(usize, (i128, u64))> = None;
    for i in 0..exhausted.len() {
        if exhausted[i] {
            continue;
        }
        let first = if by_clock {
            i128::from(joiners[i].frontier_ns()) - st.offset[i].unwrap_or(0)
        } else {
            st.pending_per_node[i] as i128
        };
        let key = (first, read[i]);
        if best.is_none_or(|(_, b)| key < b) {
            best = Some((i, key));
        }
    }
    best.map(|(i, _)| i)
}

struct State {
    clients: Pending,
    servers: Pending,
    next_id: u64,
    /// Per node: offset of its clock to the first matched node's, for read scheduling only.
    offset: Vec<Option<i128>>,
    pending_per_node: Vec<usize>,
    summary: MergeSummary,
    extra_errors: u64,
    timeline: bool,
    /// [`Plan::detached`]: spans without kernel events, per node.
    detached: BTreeMap<String, Vec<(u64, u64)>>,
}

/// A note per node whose recording had its hot hooks detached (`record --attach on-demand`)
/// when the request started there or one of its segments did: its kernel stages there are
/// missing for that reason, not lost.
fn note_detached(req: &mut MergedRequest, detached: &BTreeMap<String, Vec<(u64, u64)>>) {
    if detached.is_empty() {
        return;
    }
    let starts = std::iter::once((req.client_node.as_str(), Some(req.start_ns)));
    let starts =
        starts.chain((req.segments.iter()).map(|s| (s.node.as_deref().unwrap_or(""), s.start_ns)));
    let mut hit: Vec<(String, (u64, u64))> = Vec::new();
    for (node, start) in starts {
        let Some(start) = start else { continue };
        let Some(spans) = detached.get(node) else {
            continue;
        };
        if let Some(span) = spans.iter().find(|(a, b)| (*a..*b).contains(&start))
            && !hit.iter().any(|(n, s)| n == node && s == span)
        {
            hit.push((node.to_owned(), *span));
        }
    }
    for (node, (from, to)) in hit {
        let to = if to == u64::MAX {
            "the end".to_owned()
        } else {
            format!("{to} ns")
        };
        req.notes.push(format!(
            "hooks detached: {node} recorded with --attach on-demand had no kernel hooks attached from {from} ns to {to}; its kernel stages in that span are missing"
        ));
    }
}

fn first_seen(points: &[Point], last: bool) -> Option<u64> {
    let mut it = points.iter().filter_map(|p| p.stamp.map(|s| s.ns()));
    if last { it.next_back() } else { it.next() }
}

impl State {
    fn new(nodes: usize, plan: &Plan, timeline: bool) -> State {
        State {
            clients: Pending::default(),
            servers: Pending::default(),
            next_id: 0,
            offset: vec![None; nodes],
            pending_per_node: vec![0; nodes],
            summary: MergeSummary {
                requests: 0,
                complete: 0,
                incomplete: 0,
                errors: Vec::new(),
                dropped_per_node: plan.dropped.clone(),
                custom_points: 0,
                unplaced_points: 0,
                self_cost: plan.self_cost.clone(),
            },
            extra_errors: 0,
            timeline,
            detached: plan.detached.clone(),
        }
    }

    /// End of input: the joiners' errors and late events, then the count of errors not listed.
    fn collect_node_errors(&mut self, joiners: &mut [NodeJoiner], streams: &[NodeStream]) {
        for (j, s) in joiners.iter_mut().zip(streams) {
            self.summary.custom_points += j.custom_points;
            self.summary.unplaced_points += j.unplaced_points;
            for e in j.errors.drain(..) {
                self.error(e);
            }
            if let Some(first) = &s.first_late {
                self.error(format!(
                    "node {}: {} events were out of order by more than their read-ahead; first: {first}",
                    j.name, s.late
                ));
            }
        }
        if self.extra_errors > 0 {
            self.summary
                .errors
                .push(format!("... and {} more errors", self.extra_errors));
        }
    }

    fn error(&mut self, e: String) {
        if self.summary.errors.len() < MAX_ERRORS {
            self.summary.errors.push(e);
        } else {
            self.extra_errors += 1;
        }
    }

    fn add(
        &mut self,
        names: &Names,
        half: Half,
        sink: &mut dyn FnMut(Record) -> std::io::Result<()>,
    ) -> Result<(), MergeError> {
        let (mine, theirs) = match half.role {
            Role::Client => (&mut self.clients, &mut self.servers),
            Role::Server => (&mut self.servers, &mut self.clients),
        };
        match theirs.take_partner(&half) {
            Some(partner) => {
                self.pending_per_node[usize::from(partner.node.0)] -= 1;
                let (client, server) = match half.role {
                    Role::Client => (half, partner),
                    Role::Server => (partner, half),
                };
                self.learn_offset(&client, &server);
                self.emit(names, &client, Some(&server), sink)
            }
            None => {
                self.next_id += 1;
                self.pending_per_node[usize::from(half.node.0)] += 1;
                mine.insert(self.next_id, half);
                Ok(())
            }
        }
    }

    fn learn_offset(&mut self, client: &Half, server: &Half) {
        let (c, s) = (usize::from(client.node.0), usize::from(server.node.0));
        let (Some(ct), Some(stt)) = (
            first_seen(&client.points, true),
            first_seen(&server.points, false),
        ) else {
            return;
        };
        let delta = i128::from(stt) - i128::from(ct);
        match (self.offset[c], self.offset[s]) {
            (None, None) => {
                self.offset[c] = Some(0);
                self.offset[s] = Some(delta);
            }
            (Some(oc), None) => self.offset[s] = Some(oc + delta),
            (None, Some(os)) => self.offset[c] = Some(os - delta),
            _ => {}
        }
    }

    fn emit(
        &mut self,
        names: &Names,
        client: &Half,
        server: Option<&Half>,
        sink: &mut dyn FnMut(Record) -> std::io::Result<()>,
    ) -> Result<(), MergeError> {
        let attributed = match attribute(names, client, server) {
            Ok(a) => a,
            Err(e) => {
                self.error(e);
                return Ok(());
            }
        };
        for e in attributed.errors {
            self.error(e);
        }
        let mut req = attributed.request;
        note_detached(&mut req, &self.detached);
        self.summary.requests += 1;
        if req.complete {
            self.summary.complete += 1;
        } else {
            self.summary.incomplete += 1;
        }
        if self.timeline {
            for (node, id, stamp) in &attributed.timeline {
                sink(timeline_record(node, *id, stamp, &req.trace_id))?;
            }
        }
        sink(Record::Request(req))?;
        Ok(())
    }

    /// Emits halves of `node` that waited `timeout_ns` past their completion for a partner.
    fn evict(
        &mut self,
        names: &Names,
        node: NodeId,
        frontier: u64,
        timeout_ns: u64,
        all_done: bool,
        sink: &mut dyn FnMut(Record) -> std::io::Result<()>,
    ) -> Result<(), MergeError> {
        if all_done {
            return Ok(());
        }
        let due = |p: &Pending| -> Vec<(u64, u64)> {
            let mut v: Vec<(u64, u64)> = p
                .halves
                .iter()
                .filter(|(_, h)| h.node == node && h.ready_ns.saturating_add(timeout_ns) < frontier)
                .map(|(id, h)| (h.ready_ns, *id))
                .collect();
            v.sort();
            v
        };
        // Cheap check first: eviction scans only when this node has pending halves.
        if self.pending_per_node[usize::from(node.0)] == 0 {
            return Ok(());
        }
        for (_, id) in due(&self.clients) {
            let half = self.clients.remove(id).expect("listed");
            self.pending_per_node[usize::from(node.0)] -= 1;
            self.emit(names, &half, None, sink)?;
        }
        for (_, id) in due(&self.servers) {
            let half = self.servers.remove(id).expect("listed");
            self.pending_per_node[usize::from(node.0)] -= 1;
            self.unmatched_server(names, &half);
        }
        Ok(())
    }

    fn unmatched_server(&mut self, names: &Names, half: &Half) {
        let node = &names.nodes[usize::from(half.node.0)];
        let id = half
            .trace_id
            .clone()
            .or_else(|| half.link.as_ref().map(LinkKey::to_string))
            .unwrap_or_default();
        self.error(format!(
            "server half {id} on node {node} matched no client request"
        ));
    }

    fn evict_all(
        &mut self,
        names: &Names,
        sink: &mut dyn FnMut(Record) -> std::io::Result<()>,
    ) -> Result<(), MergeError> {
        let mut clients: Vec<(u16, u64, u64)> = self
            .clients
            .halves
            .iter()
            .map(|(id, h)| (h.node.0, h.ready_ns, *id))
            .collect();
        clients.sort();
        for (_, _, id) in clients {
            let half = self.clients.remove(id).expect("listed");
            self.emit(names, &half, None, sink)?;
        }
        let mut servers: Vec<(u16, u64, u64)> = self
            .servers
            .halves
            .iter()
            .map(|(id, h)| (h.node.0, h.ready_ns, *id))
            .collect();
        servers.sort();
        for (_, _, id) in servers {
            let half = self.servers.remove(id).expect("listed");
            self.unmatched_server(names, &half);
        }
        Ok(())
    }
}

/// A kept chain point of a request as a probe-shaped line (`merge --timeline`), on its
/// node's CLOCK_MONOTONIC; kernel points are named `kernel.HOOK`.
fn timeline_record(node: &str, id: PointId, stamp: &Stamp, trace_id: &str) -> Record {
    let (process, point) = if id.is_probe() {
        let role = id.name().split('.').next().unwrap_or("");
        (role.to_owned(), id.name().to_owned())
    } else {
        ("kernel".to_owned(), format!("kernel.{}", id.name()))
    };
    Record::Probe(ProbeEvent {
        node: Some(node.to_owned()),
        process,
        pid: 0,
        tid: 0,
        ts_ns: stamp.ns(),
        clock: ClockId::Monotonic,
        trace_id: trace_id.to_owned(),
        point,
        conn: None,
        dir: None,
        offset: None,
        len: None,
    })
}

/// Counts per node for the summary log line.
pub fn per_node(map: &BTreeMap<String, u64>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{JoinMethod, Kind, Layer, Segment};

    fn segment(node: &str, start_ns: u64) -> Segment {
        Segment {
            name: "tx_qdisc".into(),
            node: Some(node.to_owned().into()),
            layer: Layer::Kernel,
            unit: "qdisc".into(),
            kind: Kind::Queue,
            start_ns: Some(start_ns),
            dur_ns: 1,
            error_ns: None,
            derived: None,
            place: None,
        }
    }

    fn request(start_ns: u64, segments: Vec<Segment>) -> MergedRequest {
        MergedRequest {
            trace_id: "t".into(),
            client_node: "A".into(),
            server_node: Some("B".into()),
            join: JoinMethod::KernelOnly,
            start_ns,
            e2e_ns: 1,
            complete: false,
            missing: Vec::new(),
            segments,
            notes: Vec::new(),
        }
    }

    #[test]
    fn requests_touching_a_detached_span_say_so_once_per_node_and_span() {
        let detached: BTreeMap<String, Vec<(u64, u64)>> = [
            ("A".to_owned(), vec![(0, 100)]),
            ("B".to_owned(), vec![(500, u64::MAX)]),
        ]
        .into_iter()
        .collect();
        let mut early = request(50, vec![segment("A", 60), segment("B", 20)]);
        note_detached(&mut early, &detached);
        assert_eq!(early.notes.len(), 1, "{:?}", early.notes);
        assert!(early.notes[0].contains("A recorded with --attach on-demand"));
        assert!(early.notes[0].contains("from 0 ns to 100 ns"));

        let mut late = request(200, vec![segment("B", 600)]);
        note_detached(&mut late, &detached);
        assert_eq!(late.notes.len(), 1, "{:?}", late.notes);
        assert!(late.notes[0].contains("B recorded") && late.notes[0].contains("to the end"));

        let mut inside = request(200, vec![segment("A", 300), segment("B", 400)]);
        note_detached(&mut inside, &detached);
        assert!(inside.notes.is_empty(), "{:?}", inside.notes);
    }
}
