//! Attribution of one request: ordered, non-overlapping segments summing exactly to the
//! client's end-to-end time (docs/segments.md).
//!
//! Client points before its request leaves and after the response arrives give node-local
//! segments; the client's wait in between (request left -> response arrived, the outer span) is
//! split into the server's own segments (request arrived -> response left, the inner span) and
//! the network round trip = outer - inner, the difference method. Every duration is a
//! subtraction of two instants of one node's clock ([`super::time`]), so clock skew between
//! nodes cannot enter any figure.
//!
//! A point out of order (its time before the previous kept point of the same chain) would make
//! a negative segment: it is dropped with an error naming both events, the neighbouring stages
//! merge into one segment, and the request is incomplete.

use std::borrow::Cow;

use super::HashMap;

use crate::schema::{
    Derivation, JoinMethod, Kind, Layer, MergedRequest, Placement, Segment, interned,
};

use super::chain::Point;
use super::event::{Place, Stamp};
use super::half::{Half, LinkKey};
use super::reader::ReaderTimeline;
use super::segments::{
    self, NETWORK_ROUND_TRIP, PEER_WAIT, PointId, RX_SOCKET_QUEUE, ReaderSegmentDef, ReaderState,
    Unit,
};
use super::time::{Instant, NodeClock, Span, TimeError, difference, with_clock};

/// Names the merge needs to describe events: node names and input file names.
pub struct Names<'a> {
    pub nodes: &'a [String],
    pub files: &'a [String],
    /// Per node: ifindex -> device name (its startup's `devices` and `nic_irqs`).
    pub devices: &'a [HashMap<u32, &'static str>],
}

impl Names<'_> {
    fn event(&self, node: &str, id: PointId, s: &Stamp) -> String {
        let file = self
            .files
            .get(usize::from(s.origin.file))
            .map_or("?", String::as_str);
        format!(
            "{node}:{} at {} ns ({file}:{})",
            id.name(),
            s.ns(),
            { s.origin.line } // a copy: Origin is packed
        )
    }
}

pub struct Attributed {
    pub request: MergedRequest,
    pub errors: Vec<String>,
    /// Kept points of the request, (node, point, stamp), for timeline output.
    pub timeline: Vec<(String, PointId, Stamp)>,
}

/// A chain point kept for attribution, with its position in the full chain.
#[derive(Clone, Copy)]
struct Kept {
    pos: usize,
    id: PointId,
    stamp: Stamp,
}

/// Borrows from its half what it only reads (processes, reader and thread timelines): two
/// chains per request, and cloning those was a measurable part of the merge's allocations.
struct Chain<'h> {
    node: &'static str,
    node_id: usize,
    /// The half's probed process, then the proxies its points may belong to ([`Point::owner`]).
    processes: Vec<&'h str>,
    full: Vec<PointId>,
    owners: Vec<u8>,
    kept: Vec<Kept>,
    /// The half's reader timelines ([`Half::readers`]).
    readers: &'h [ReaderTimeline],
    /// The half's own thread's states ([`Half::thread`]).
    thread: Option<&'h ReaderTimeline>,
}

/// A point without a stamp: named as missing when expected, or once as "no recording" for
/// all kernel points of a node that was not recorded.
fn note_missing(half: &Half, p: &Point, node: &str, missing: &mut Vec<String>) {
    if !half.kernel_recorded && !p.id.is_probe() {
        let whole = format!("{node}:kernel (no recording)");
        if !missing.contains(&whole) {
            missing.push(whole);
        }
    } else if p.expected {
        missing.push(format!("{node}:{}", p.id.name()));
    }
}

impl<'h> Chain<'h> {
    /// Keeps the observed points in order. `pin_ends` keeps the first and last point (the e2e
    /// anchors) and drops whatever contradicts them instead.
    fn new(
        names: &Names,
        half: &'h Half,
        points: &[Point],
        pin_ends: bool,
        found: &mut Findings,
        trace: &str,
    ) -> Self {
        let (missing, errors) = (&mut found.missing, &mut found.errors);
        let node = interned(&names.nodes[usize::from(half.node.0)]);
        let mut kept: Vec<Kept> = Vec::with_capacity(points.len());
        let last_seen = points.iter().rposition(|p| p.stamp.is_some());
        for (pos, p) in points.iter().enumerate() {
            let Some(stamp) = p.stamp else {
                note_missing(half, p, node, missing);
                continue;
            };
            if reported_after_handoff(p.id) && reported_late(points, pos, stamp) {
                continue;
            }
            if left_before_driver_returned(kept.last(), p.id, &stamp) {
                kept.pop();
            }
            let pinned = pin_ends && Some(pos) == last_seen;
            while pinned && kept.len() > 1 && kept.last().is_some_and(|k| k.stamp.ns() > stamp.ns())
            {
                let k = kept.pop().expect("non-empty");
                errors.push(out_of_order(names, node, trace, &k, (p.id, &stamp)));
                missing.push(format!("{node}:{} (out of order)", k.id.name()));
            }
            match kept.last() {
                // A blocking reader takes `read_ready` before its recv waits for the data: the
                // point then precedes the receive path and does not split it.
                Some(prev)
                    if prev.stamp.ns() > stamp.ns()
                        && matches!(p.id, PointId::ClientReadReady | PointId::ServerReadReady) => {}
                Some(prev) if prev.stamp.ns() > stamp.ns() => {
                    errors.push(out_of_order(names, node, trace, prev, (p.id, &stamp)));
                    missing.push(format!("{node}:{} (out of order)", p.id.name()));
                }
                _ => kept.push(Kept {
                    pos,
                    id: p.id,
                    stamp,
                }),
            }
        }
        let mut processes = vec![half.process.as_str()];
        processes.extend(half.relays.iter().map(String::as_str));
        Chain {
            node,
            node_id: usize::from(half.node.0),
            processes,
            full: points.iter().map(|p| p.id).collect(),
            owners: points.iter().map(|p| p.owner).collect(),
            kept,
            readers: &half.readers,
            thread: half.thread.as_ref(),
        }
    }

    /// Appends the segments between consecutive kept points in `kept` to `out` (the request's
    /// one vector, sized by [`segment_room`], rather than a vector per part regrown as the
    /// parts are joined).
    fn segments<'n>(
        &self,
        names: &Names,
        clock: &NodeClock<'n>,
        kept: &[Kept],
        out: &mut Vec<Segment>,
    ) {
        for w in kept.windows(2) {
            let span = span(clock, &w[0], &w[1]);
            let (name, layer, unit, kind) = self.describe(w[0].pos, w[1].pos);
            // A kernel stage ran where the event that ends it was recorded; `rx_ip_tcp` on the
            // device of the frame that starts it (segments::IN_FRAME_CONTEXT).
            let place = (layer == Layer::Kernel && !w[1].id.is_probe())
                .then(|| {
                    let end = w[1].stamp.place;
                    let place = if (w[0].id, w[1].id) == segments::IN_FRAME_CONTEXT {
                        end.or_device_of(&w[0].stamp.place)
                    } else {
                        end
                    };
                    placement(names, self.node_id, &place)
                })
                .flatten();
            let seg = Segment {
                name,
                node: Some(Cow::Borrowed(self.node)),
                layer,
                unit,
                kind,
                start_ns: Some(span.start().absolute_ns()),
                dur_ns: span.dur_ns(),
                error_ns: error_bound(&[w[0].stamp, w[1].stamp]),
                derived: None,
                place,
            };
            if self.thread_runs(&w[0], &w[1], &seg) {
                self.by_thread_state(seg, &w[0], &w[1], out);
            } else {
                self.by_reader_state(seg, &w[0], out);
            }
        }
    }

    /// Whether the half's own thread ran the span from `a` to `b` (`seg`): process time or
    /// its syscall's, between points of the half's own process (a proxy's are another
    /// thread's).
    fn thread_runs(&self, a: &Kept, b: &Kept, seg: &Segment) -> bool {
        self.thread.is_some()
            && self.owners[a.pos] == 0
            && self.owners[b.pos] == 0
            && segments::runs_on_thread(seg.layer, &seg.unit)
    }

    /// A span the half's thread ran, with the time it was runnable but off its CPU (preempted,
    /// or woken inside the span and not yet switched in) cut out as `runqueue_wait`; the rest
    /// keeps the span's name on either side. The parts tile the span (exact sum); a cut is a
    /// kernel time, so a converted end's error stays with the part it bounds.
    fn by_thread_state(&self, seg: Segment, from: &Kept, to: &Kept, out: &mut Vec<Segment>) {
        let (Some(thread), Some(start)) = (self.thread, seg.start_ns) else {
            out.push(seg);
            return;
        };
        let end = start + seg.dur_ns;
        // Running, blocked (the process waiting on something of its own) and unknown all stay
        // the span's time: only the run-queue wait is cut out.
        let mut parts: Vec<(u64, u64, bool)> = Vec::with_capacity(4);
        for (at, dur, state) in thread.split(start, end) {
            let waiting = state == ReaderState::Runnable;
            match parts.last_mut() {
                Some(last) if last.2 == waiting => last.1 += dur,
                _ => parts.push((at, dur, waiting)),
            }
        }
        if !parts.iter().any(|p| p.2) {
            out.push(seg);
            return;
        }
        let n = parts.len();
        let own_error = |k: &Kept| (k.stamp.error_ns > 0).then_some(k.stamp.error_ns);
        out.extend(
            parts
                .into_iter()
                .enumerate()
                .map(|(i, (at, dur, waiting))| {
                    let error_ns = match (i == 0, i == n - 1) {
                        (true, true) => seg.error_ns,
                        (true, false) => own_error(from),
                        (false, true) => own_error(to),
                        (false, false) => None,
                    };
                    let mut part = Segment {
                        start_ns: Some(at),
                        dur_ns: dur,
                        error_ns,
                        ..seg.clone()
                    };
                    if waiting {
                        restate(&mut part, &segments::RUNQUEUE_WAIT, self.processes[0]);
                        // The wait's CPU is not known from the span's end event.
                        part.place = None;
                    }
                    part
                }),
        );
    }

    /// `rx_socket_queue` cut by the reader thread's scheduler state (busy: its process's
    /// time; runnable: run-queue wait); other segments unchanged. The parts tile the span, so
    /// the sum stays exact; only the part ending at the span's end keeps its conversion error
    /// (the cuts are kernel times).
    fn by_reader_state(&self, seg: Segment, from: &Kept, out: &mut Vec<Segment>) {
        let timeline = (seg.name == RX_SOCKET_QUEUE && from.id == PointId::SkDataReady)
            .then(|| self.readers.iter().find(|t| t.ready_ns == from.stamp.ns()))
            .flatten();
        let (Some(timeline), Some(start)) = (timeline, seg.start_ns) else {
            out.push(seg);
            return;
        };
        let end = start + seg.dur_ns;
        let process = self.process_of(from.pos);
        out.extend(
            timeline
                .split(start, end)
                .into_iter()
                .map(|(at, dur, state)| {
                    let mut part = Segment {
                        start_ns: Some(at),
                        dur_ns: dur,
                        error_ns: seg.error_ns.filter(|_| at + dur == end),
                        ..seg.clone()
                    };
                    if let Some(d) = segments::reader_segment(state) {
                        restate(&mut part, d, process);
                        // A place is where a kernel stage ran; the reader's own time has none.
                        if d.layer != Layer::Kernel {
                            part.place = None;
                        }
                    }
                    part
                }),
        );
    }

    /// The process the point at full-chain position `pos` belongs to.
    fn process_of(&self, pos: usize) -> &'h str {
        let owner = usize::from(self.owners[pos]);
        self.processes
            .get(owner)
            .copied()
            .unwrap_or(self.processes[0])
    }

    /// Name, layer, unit and kind of the span from full-chain position `a` to `b`: the direct
    /// definition, else the stages in between joined by `+` (described by the first of them).
    fn describe(&self, a: usize, b: usize) -> (Cow<'static, str>, Layer, Cow<'static, str>, Kind) {
        let owner = usize::from(self.owners[a]);
        let process = self
            .processes
            .get(owner)
            .copied()
            .unwrap_or(self.processes[0]);
        let unit = |d: &segments::SegmentDef| match d.unit {
            Unit::Process => Cow::Owned(process.to_owned()),
            Unit::Fixed(u) => Cow::Borrowed(u),
        };
        if let Some(d) = segments::find(self.full[a], self.full[b]) {
            return (Cow::Borrowed(d.name), d.layer, unit(d), d.kind);
        }
        let custom = |id: PointId| matches!(id, PointId::Custom(_));
        let defs: Vec<_> = if custom(self.full[a]) || custom(self.full[b]) {
            Vec::new()
        } else {
            (a..b)
                .filter_map(|i| segments::find(self.full[i], self.full[i + 1]))
                .collect()
        };
        let name = defs.iter().map(|d| d.name).collect::<Vec<_>>().join("+");
        let (from, to) = (self.full[a], self.full[b]);
        match defs.first() {
            Some(d) => (name.into(), d.layer, unit(d), d.kind),
            // Any catalog: a pair without a definition is named after its two points; next to
            // a probe point it is that process's time (the first point's process, else the
            // second's), otherwise kernel time of an unknown stage.
            None if from.is_probe() || to.is_probe() => {
                let at = if from.is_probe() { a } else { b };
                let owner = usize::from(self.owners[at]);
                let process = self
                    .processes
                    .get(owner)
                    .copied()
                    .unwrap_or(self.processes[0]);
                (
                    format!("{}..{}", from.name(), to.name()).into(),
                    Layer::Process,
                    process.to_owned().into(),
                    Kind::Compute,
                )
            }
            None => (
                format!("{}..{}", from.name(), to.name()).into(),
                Layer::Kernel,
                "unknown".into(),
                Kind::Wait,
            ),
        }
    }
}

/// The wire form of a kernel point's [`Place`]; `None` without a CPU (not a kernel event).
fn placement(names: &Names, node: usize, p: &Place) -> Option<Placement> {
    Some(Placement {
        cpu: p.cpu()?,
        dev: (p.ifindex()).and_then(|i| Some(Cow::Borrowed(*names.devices.get(node)?.get(&i)?))),
        queue: p.queue(),
        irq: p.irq(),
    })
}

fn out_of_order(
    names: &Names,
    node: &str,
    trace: &str,
    prev: &Kept,
    p: (PointId, &Stamp),
) -> String {
    format!(
        "trace {trace}: negative segment refused: {} is after {}",
        names.event(node, prev.id, &prev.stamp),
        names.event(node, p.0, p.1)
    )
}

fn span<'n>(clock: &NodeClock<'n>, a: &Kept, b: &Kept) -> Span<'n> {
    let at = |k: &Kept| -> Instant<'n> {
        clock
            .at(k.stamp.time)
            .expect("chain points are of the chain's node")
    };
    at(a).span_to(at(b)).expect("kept points are in order")
}

/// Conversion error of a duration between stamps: none when they share a clock (both kernel, or
/// both converted through the same clock sample), else the sum of the ends' bounds.
fn error_bound(stamps: &[Stamp]) -> Option<u64> {
    let same_clock = stamps.windows(2).all(|w| w[0].sample == w[1].sample);
    let sum: u64 = stamps.iter().map(|s| s.error_ns).sum();
    (!same_clock && sum > 0).then_some(sum)
}

/// Conversion error of the difference method's result: each span's own bound. Clock-sample
/// indices are per node, so the two spans are never compared with each other.
fn difference_bound(outer: [Stamp; 2], inner: [Stamp; 2]) -> Option<u64> {
    let sum = error_bound(&outer).unwrap_or(0) + error_bound(&inner).unwrap_or(0);
    (sum > 0).then_some(sum)
}

/// What attribution of one request found wrong: stages not observed, refused segments.
#[derive(Default)]
struct Findings {
    missing: Vec<String>,
    errors: Vec<String>,
    /// What the request's `notes` say beyond its halves' (docs/schema.md).
    notes: Vec<String>,
}

/// The client's chain split at its wait for the peer: `kept[..cut]` until the request left,
/// `kept[cut..]` from the response's arrival. `first` and `last` anchor the e2e time.
struct ClientSide<'h> {
    chain: Chain<'h>,
    cut: usize,
    first: Kept,
    last: Kept,
}

impl<'h> ClientSide<'h> {
    fn new(
        names: &Names,
        client: &'h Half,
        trace: &str,
        found: &mut Findings,
    ) -> Result<ClientSide<'h>, String> {
        let mut points = client.points.clone();
        let split = points.len();
        points.extend(client.post.iter().copied());
        let chain = Chain::new(names, client, &points, true, found, trace);
        let (Some(&first), Some(&last)) = (chain.kept.first(), chain.kept.last()) else {
            return Err(format!(
                "trace {trace}: no client point observed on {}",
                chain.node
            ));
        };
        if first.pos != 0 || last.pos != points.len() - 1 {
            return Err(format!(
                "trace {trace}: cannot measure end to end on {}: {} or {} not observed",
                chain.node,
                points[0].id.name(),
                points[points.len() - 1].id.name()
            ));
        }
        let cut = chain
            .kept
            .iter()
            .position(|k| k.pos >= split)
            .unwrap_or(chain.kept.len());
        Ok(ClientSide {
            chain,
            cut,
            first,
            last,
        })
    }

    fn pre(&self) -> &[Kept] {
        &self.chain.kept[..self.cut]
    }

    fn post(&self) -> &[Kept] {
        &self.chain.kept[self.cut..]
    }
}

/// The server's half and its kept chain.
struct ServerSide<'h> {
    half: &'h Half,
    chain: Chain<'h>,
}

/// A request's name in output and errors: its trace id, else its connection and offset.
fn trace_name(client: &Half, server: Option<&Half>) -> String {
    client
        .trace_id
        .clone()
        .or_else(|| server.and_then(|s| s.trace_id.clone()))
        .or_else(|| client.link.as_ref().map(LinkKey::to_string))
        .unwrap_or_else(|| "unlinked".into())
}

pub fn attribute(
    names: &Names,
    client: &Half,
    server: Option<&Half>,
) -> Result<Attributed, String> {
    let trace = trace_name(client, server);
    let mut found = Findings::default();
    let cside = ClientSide::new(names, client, &trace, &mut found)?;
    let sside = server.map(|half| ServerSide {
        half,
        chain: Chain::new(names, half, &half.points, false, &mut found, &trace),
    });
    if server.is_none() {
        found.missing.push("server".into());
    }
    found.missing.extend(client.unresolved.iter().cloned());
    found
        .missing
        .extend(server.iter().flat_map(|s| s.unresolved.iter().cloned()));
    let (segments, e2e_ns) = with_clock(client.node, |cc| {
        client_segments(&cc, &cside, sside.as_ref(), names, &trace, &mut found)
    });
    let mut notes = client.notes.clone();
    notes.extend(server.iter().flat_map(|s| s.notes.iter().cloned()));
    notes.append(&mut found.notes);
    let total: u64 = segments.iter().map(|s| s.dur_ns).sum();
    if total != e2e_ns {
        found.errors.push(format!(
            "trace {trace}: internal error: segments sum to {total} ns, e2e is {e2e_ns} ns"
        ));
    }
    let timeline = timeline(&cside, sside.as_ref());
    let join = match server.map(|s| s.join) {
        Some(j) if rank(j) < rank(client.join) => j,
        _ => client.join,
    };
    let Findings {
        missing, errors, ..
    } = found;
    Ok(Attributed {
        request: MergedRequest {
            trace_id: trace,
            client_node: cside.chain.node.to_owned(),
            server_node: sside.as_ref().map(|s| s.chain.node.to_owned()),
            join,
            start_ns: cside.first.stamp.ns(),
            e2e_ns,
            complete: missing.is_empty() && errors.is_empty(),
            missing,
            segments,
            notes,
        },
        errors,
        timeline,
    })
}

/// Kept points in causal order: client until the request left, server, client from the
/// response's arrival.
fn timeline(cside: &ClientSide, sside: Option<&ServerSide>) -> Vec<(String, PointId, Stamp)> {
    let point = |node: &str, k: &Kept| (node.to_owned(), k.id, k.stamp);
    let client = |kept: &[Kept]| {
        kept.iter()
            .map(|k| point(cside.chain.node, k))
            .collect::<Vec<_>>()
    };
    let mut timeline = client(cside.pre());
    if let Some(s) = sside {
        timeline.extend(s.chain.kept.iter().map(|k| point(s.chain.node, k)));
    }
    timeline.extend(client(cside.post()));
    timeline
}

/// The request's segments on the client's clock, with the wait for the peer split by the
/// server's chain when there is one, and the e2e time.
fn client_segments(
    cc: &NodeClock,
    cside: &ClientSide,
    sside: Option<&ServerSide>,
    names: &Names,
    trace: &str,
    found: &mut Findings,
) -> (Vec<Segment>, u64) {
    let chain = &cside.chain;
    let e2e = span(cc, &cside.first, &cside.last).dur_ns();
    let (pre, post) = (cside.pre(), cside.post());
    if pre.is_empty() || post.is_empty() {
        // Only reachable when every point of one side was dropped: no wait to split.
        let rest = &chain.kept[cside.cut.saturating_sub(1)..];
        let mut segs = Vec::with_capacity(segment_room(pre.len() + rest.len()));
        chain.segments(names, cc, pre, &mut segs);
        chain.segments(names, cc, rest, &mut segs);
        return (segs, e2e);
    }
    let server = sside.filter(|s| s.chain.kept.len() >= 2);
    let (sent, arrival, wait) = wait_for_peer(cc, cside, server, names, trace, found);
    if arrival > 0 {
        found
            .notes
            .push(context_dropped_note(chain.node, &post[..=arrival]));
    }
    let mut segs = Vec::with_capacity(segment_room(sent + post.len()) + wait.len());
    chain.segments(names, cc, &pre[..sent], &mut segs);
    segs.extend(wait);
    chain.segments(names, cc, &post[arrival..], &mut segs);
    (segs, e2e)
}

/// The note of a response whose receive context on the client began before it existed (the
/// points of `dropped_then_end` but the last, which ends the peer wait instead).
fn context_dropped_note(node: &str, dropped_then_end: &[Kept]) -> String {
    let (end, dropped) = dropped_then_end.split_last().expect("an arrival point");
    let dropped: Vec<&str> = dropped.iter().map(|k| k.id.name()).collect();
    format!(
        "receive context before the response: {} on {node} dropped; the peer wait ends at {}",
        dropped.join(", "),
        end.id.name()
    )
}

/// Room for the segments between `kept` points and a few split ones (a split adds a
/// run-queue wait and a rest).
fn segment_room(kept: usize) -> usize {
    kept + 8
}

/// The wait for the peer, from the request's last kept point until the response arrived,
/// split by the server's chain, how many of the request's kept points come before it and at
/// which of the response's kept points it ends. A request's TX completion after the server
/// already had the request (the difference would be negative) was reclaimed late, as the
/// response's in [`split_wait`]: the wait then starts at the point before it, and the
/// completion is no stage of this request.
///
/// A server chain whose IRQ ran its handler late ([`a_late_irq_handler`]) keeps that IRQ
/// before the request's late completion is: the server's receive context goes only when
/// dropping the completion does not make the difference non-negative. Otherwise the context
/// goes first ([`inner_chain`]), which with a threaded IRQ handler waiting milliseconds for its
/// CPU (truth --vm `irq-rt-busy-cpu`) put that wait into the network round trip.
///
/// When nothing on the server's side makes the difference non-negative, the response's
/// receive context on the client goes, as the server's does: a softirq run that began before
/// the response existed (an earlier frame's IRQ, NAPI polling on while this one arrived) does
/// not start it, and the wait ends at the next point, at the latest at `netif_receive_skb`.
fn wait_for_peer(
    cc: &NodeClock,
    cside: &ClientSide,
    server: Option<&ServerSide>,
    names: &Names,
    trace: &str,
    found: &mut Findings,
) -> (usize, usize, Vec<Segment>) {
    let (pre, post) = (cside.pre(), cside.post());
    let outer = |n: usize, arrival: usize| Outer {
        span: span(cc, &pre[n - 1], &post[arrival]),
        ends: (pre[n - 1], post[arrival]),
        node: cside.chain.node,
    };
    let unsplit = |n| vec![peer_wait(&outer(n, 0))];
    let Some(s) = server else {
        return (pre.len(), 0, unsplit(pre.len()));
    };
    let late_handler = with_clock(s.half.node, |sc| a_late_irq_handler(&sc, &s.chain.kept));
    let rules: &[ContextRule] = if late_handler {
        &[ContextRule::Keep, ContextRule::MayDrop]
    } else {
        &[ContextRule::MayDrop]
    };
    let context = post.iter().take_while(|k| is_rx_context(k.id)).count();
    let mut first_error = None;
    for arrival in 0..=context.min(post.len() - 1) {
        let outer_from = |n| outer(n, arrival);
        match split_over_departures(pre, outer_from, s, rules, names, trace) {
            Ok((n, segs)) => return (n, arrival, segs),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    found.errors.extend(first_error);
    (pre.len(), 0, unsplit(pre.len()))
}

/// The outer wait ending at one arrival split by the server's chain: under each of `rules`,
/// from the request's last kept point, then from the ones before it while the later one was
/// reported after the hand-off. The number of the request's points before the wait and the
/// segments, or the first error.
fn split_over_departures<'n>(
    pre: &[Kept],
    outer_from: impl Fn(usize) -> Outer<'n>,
    s: &ServerSide,
    rules: &[ContextRule],
    names: &Names,
    trace: &str,
) -> Result<(usize, Vec<Segment>), String> {
    let mut first_error = None;
    for &rule in rules {
        for n in (1..=pre.len()).rev() {
            match with_clock(s.half.node, |sc| {
                split_wait(&sc, &outer_from(n), s, rule, names, trace)
            }) {
                Ok(segs) => return Ok((n, segs)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            if !reported_after_handoff(pre[n - 1].id) {
                break;
            }
        }
    }
    // `rules` and `pre` are never empty (client_segments returns early without a departure).
    Err(first_error.expect("at least one rule and one departure tried"))
}

/// Whether the server's chain starts at a hard IRQ whose handler ran late: from the IRQ to the
/// next receive-context point (the handler's NET_RX raise) took longer than from there to the
/// frame's `netif_receive_skb`. A handler that ran at once is microseconds from its raise;
/// a receive context left from an earlier frame (one poll of the same queue) has its long gap
/// after the raise, where the poll went on until this frame arrived. A handler that waited,
/// a threaded IRQ (`threadirqs`, PREEMPT_RT) behind a task of higher priority, has it before:
/// that IRQ came after the frame, so the request's late completion goes instead
/// (merge_scenarios `a_late_request_completion_goes_before_the_servers_irq`,
/// `an_earlier_frames_irq_still_goes_before_the_request_completion`).
fn a_late_irq_handler(sc: &NodeClock, kept: &[Kept]) -> bool {
    let [irq, next, ..] = kept else {
        return false;
    };
    let frame = kept.iter().find(|k| !is_rx_context(k.id));
    let Some(frame) = frame.filter(|_| irq.id == PointId::IrqEntry && is_rx_context(next.id))
    else {
        return false;
    };
    span(sc, irq, next).dur_ns() > span(sc, next, frame).dur_ns()
}

/// Whether [`inner_chain`] may start the server's chain after its receive context.
#[derive(Clone, Copy)]
enum ContextRule {
    Keep,
    MayDrop,
}

/// The client's wait for its peer: request left -> response arrived.
struct Outer<'n> {
    span: Span<'n>,
    ends: (Kept, Kept),
    node: &'static str,
}

/// The outer wait split by the difference method: network round trip = outer - inner (the
/// server's span), then the server's own segments. An error naming both spans when it would
/// be negative.
fn split_wait(
    sc: &NodeClock,
    outer: &Outer,
    sside: &ServerSide,
    rule: ContextRule,
    names: &Names,
    trace: &str,
) -> Result<Vec<Segment>, String> {
    let s = &sside.chain;
    let (oa, ob) = outer.ends;
    let (kept, result) = inner_chain(sc, outer, &s.kept, rule);
    let (ia, ib) = (kept[0], kept[kept.len() - 1]);
    match result {
        Ok(rtt) => {
            let mut v = Vec::with_capacity(1 + segment_room(kept.len()));
            v.push(Segment {
                name: NETWORK_ROUND_TRIP.into(),
                node: None,
                layer: Layer::Network,
                unit: "network".into(),
                kind: Kind::Network,
                start_ns: None,
                dur_ns: rtt,
                error_ns: difference_bound([oa.stamp, ob.stamp], [ia.stamp, ib.stamp]),
                derived: Some(Box::new(Derivation {
                    method: "difference".into(),
                    outer_node: outer.node.to_owned(),
                    outer: vec![oa.id.name().into(), ob.id.name().into()],
                    inner_node: s.node.to_owned(),
                    inner: vec![ia.id.name().into(), ib.id.name().into()],
                })),
                place: None,
            });
            s.segments(names, sc, kept, &mut v);
            Ok(v)
        }
        Err(e) => Err(format!(
            "trace {trace}: network round trip would be negative ({e}): outer {} -> {}, inner {} -> {}",
            names.event(outer.node, oa.id, &oa.stamp),
            names.event(outer.node, ob.id, &ob.stamp),
            names.event(s.node, ia.id, &ia.stamp),
            names.event(s.node, ib.id, &ib.stamp),
        )),
    }
}

/// The part of the server's kept chain that splits the outer wait, and the network
/// difference it leaves. A request's receive context (the CPU's IRQ and softirq run) before
/// the client sent the request belongs to a softirq run that began before the frame existed
/// (on veth the run that transmitted it: the peer's window update processed, the next segment
/// sent and received in one run): when the difference would be negative and `rule` allows,
/// the chain starts at the next point instead.
fn inner_chain<'k>(
    sc: &NodeClock,
    outer: &Outer,
    kept: &'k [Kept],
    rule: ContextRule,
) -> (&'k [Kept], Result<u64, TimeError>) {
    let starts = match rule {
        ContextRule::Keep => 0,
        ContextRule::MayDrop => kept
            .iter()
            .take_while(|k| is_rx_context(k.id))
            .count()
            .min(kept.len().saturating_sub(2)),
    };
    let mut tried = (0..=starts).map(|from| {
        let kept = trim_late_end(sc, outer, &kept[from..]);
        (kept, difference(outer.span, inner_span(sc, kept)))
    });
    let first = tried.next().expect("start 0 is always tried");
    match first.1 {
        Ok(_) => first,
        Err(_) => tried.find(|t| t.1.is_ok()).unwrap_or(first),
    }
}

/// The server's kept chain without a response's TX completion or driver return that came
/// after the client already had the response (the difference would be negative): reclaimed
/// late (at a later transmit or poll), it says nothing about the NIC; the frame left at the
/// doorbell inside the driver call.
fn trim_late_end<'k>(sc: &NodeClock, outer: &Outer, mut kept: &'k [Kept]) -> &'k [Kept] {
    while kept.len() > 2
        && reported_after_handoff(kept[kept.len() - 1].id)
        && difference(outer.span, inner_span(sc, kept)).is_err()
    {
        kept = &kept[..kept.len() - 1];
    }
    kept
}

fn inner_span<'n>(sc: &NodeClock<'n>, kept: &[Kept]) -> Span<'n> {
    span(sc, &kept[0], &kept[kept.len() - 1])
}

/// The per-CPU receive context a message's RX stages start with (docs/segments.md).
fn is_rx_context(id: PointId) -> bool {
    matches!(
        id,
        PointId::IrqEntry | PointId::SoftirqRaise | PointId::SoftirqEntry
    )
}

/// `part` renamed to the stage `d` describes (a state cut out of a span: the reader busy or
/// runnable, a thread's run-queue wait), its process unit `process`.
fn restate(part: &mut Segment, d: &ReaderSegmentDef, process: &str) {
    part.name = Cow::Borrowed(d.name);
    (part.layer, part.kind) = (d.layer, d.kind);
    part.unit = match d.unit {
        Unit::Process => Cow::Owned(process.to_owned()),
        Unit::Fixed(u) => Cow::Borrowed(u),
    };
}

/// A hardware stamp on the NIC's clock (the frame's wire time) before the driver's return
/// (`prev`): the doorbell inside ndo_start_xmit started the send, so the return is no stage
/// boundary and is left out (tx_nic_send then starts where the driver's own stages end).
fn left_before_driver_returned(prev: Option<&Kept>, id: PointId, stamp: &Stamp) -> bool {
    id == PointId::TxTstampHw
        && stamp.on_nic_clock()
        && prev.is_some_and(|k| k.id == PointId::NetDevXmit && k.stamp.ns() > stamp.ns())
}

/// Points a driver reports from its TX completion path (the skb free, and the hardware TX
/// timestamp it reads there): both come late when the driver reclaims lazily.
fn reported_at_reclaim(id: PointId) -> bool {
    matches!(id, PointId::TxComplete | PointId::TxTstampHw)
}

/// Points reported after the driver handed the frame to the NIC: the driver's return
/// (net_dev_xmit fires when ndo_start_xmit returns, and the frame may be on the wire from the
/// doorbell inside it on; seen in the 6.12 guests, where the peer had the frame up to 2 ms
/// before the sender's virtio kick returned) and the completion path. When the difference
/// method would be negative with one of them as the departure, the one before it is used and
/// the overlap is network time.
fn reported_after_handoff(id: PointId) -> bool {
    id == PointId::NetDevXmit || reported_at_reclaim(id)
}

/// Whether the point after the hand-off at `points[pos]` comes after the chain's next observed
/// point outside the completion path: a TX completion the driver reclaimed lazily (virtio frees
/// sent skbs at its next transmit), or a driver return after the reply already arrived. Either
/// way the time says nothing about when the NIC sent the frame.
fn reported_late(points: &[Point], pos: usize, stamp: Stamp) -> bool {
    points[pos + 1..]
        .iter()
        .filter(|p| !reported_at_reclaim(p.id))
        .find_map(|p| p.stamp)
        .is_some_and(|next| next.ns() < stamp.ns())
}

/// The wait for the peer, not split (no server half, or it could not be used).
fn peer_wait(outer: &Outer) -> Segment {
    let (a, b) = outer.ends;
    Segment {
        name: PEER_WAIT.into(),
        node: Some(Cow::Borrowed(outer.node)),
        layer: Layer::Network,
        unit: "peer".into(),
        kind: Kind::Wait,
        start_ns: Some(outer.span.start().absolute_ns()),
        dur_ns: outer.span.dur_ns(),
        error_ns: error_bound(&[a.stamp, b.stamp]),
        derived: None,
        place: None,
    }
}

/// Join exactness: a request is labelled with the weaker join of its two halves.
fn rank(j: JoinMethod) -> u8 {
    match j {
        JoinMethod::Offset => 2,
        JoinMethod::PidTidTime => 1,
        JoinMethod::KernelOnly => 0,
    }
}
