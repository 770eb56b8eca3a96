//! One node's events in node time order: all of the node's files read lazily through a
//! reorder buffer. An event leaves the buffer once every unfinished file of the node has been
//! read its read-ahead past it (`--window`, or [`CAPTURE_READ_AHEAD_NS`] for a binary
//! capture), so lines out of order by less than that come out in order, and the buffer holds
//! about a window of events, whatever the input size.

use crate::incoming::Incoming;
use crate::records::{ReducedSource, file_is_capture};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use super::MergeError;
use super::event::{Item, Reduced};
use super::input::Plan;
use super::reduce::to_item;
use super::time::NodeId;

/// How far ahead of the stream's head a binary capture is read (or `--window`, if shorter).
/// `record` writes a capture in time order across CPUs (its reader merges the per-CPU rings
/// up to a horizon no ring can still precede); inside one ring a stamp steps back only when
/// a program was interrupted between its reservation and its clock read by one that
/// reserved and stamped after it, by the length of that interruption (an IRQ and the softirq
/// work at its exit: microseconds, rarely milliseconds). So a capture needs no window of
/// read-ahead: its events would wait in the buffer for a window (~20 % of a one-node merge's
/// peak memory with a 2 s window) for nothing. An event more out of order than this is still
/// merged; it is counted as late and reported, as for `--window`.
///
/// Not for a node with hardware TX timestamps (a NIC clock in its clock records): those
/// events are placed at their wire time, earlier than the stamp `record` ordered them by (by
/// the completion delay, which nothing bounds); such a capture keeps the window.
pub const CAPTURE_READ_AHEAD_NS: u64 = 10_000_000;

struct Source {
    /// NDJSON or binary capture (crate::records), reduced to this node's items on the
    /// reading thread: the merging thread neither moves whole records nor reduces them.
    items: ReducedSource<Reduced, MergeError>,
    /// Latest timestamp read from this file.
    high_ns: u64,
    /// How far past the head this file is read: its own disorder bound.
    read_ahead_ns: u64,
    /// Its index in [`Plan::files`] (an item's `Origin::file`).
    file: usize,
    done: bool,
}

struct Queued {
    ns: u64,
    seq: u64,
    item: Item,
}

/// Events waiting out the window, in (time, arrival) order. Each file is nearly in time order,
/// so an event not earlier than the last one queued from its file joins that file's run (a
/// FIFO, sorted by construction) and only the others go to a heap. The next event is the least
/// of the runs' fronts and the heap's top: the order one heap of everything would give, without
/// a heap operation per event on a window of up to millions of events.
#[derive(Default)]
struct ReorderBuffer {
    /// Per source (index into `NodeStream::sources`).
    runs: Vec<VecDeque<Queued>>,
    stragglers: BinaryHeap<Reverse<Queued>>,
    /// Where the earliest event is and its (time, arrival) key, kept up to date by `push` and
    /// found again by `pop`: the stream peeks at it after every event it reads, so a scan of
    /// the runs per peek would cost more than one per event taken out.
    head: Option<(Option<usize>, (u64, u64))>,
}

impl ReorderBuffer {
    fn push(&mut self, source: usize, q: Queued) {
        let key = (q.ns, q.seq);
        let run = &mut self.runs[source];
        // An event joining a run is the earliest only if the run was empty: the run's last
        // event is not later and arrived before it.
        let place = if run.back().is_none_or(|last| last.ns <= q.ns) {
            run.push_back(q);
            Some(source)
        } else {
            self.stragglers.push(Reverse(q));
            None
        };
        if self.head.is_none_or(|(_, head)| key < head) {
            self.head = Some((place, key));
        }
    }

    /// The run holding the earliest event (`None`: the heap's top is earlier, or all is empty).
    fn earliest(&self) -> Option<(Option<usize>, (u64, u64))> {
        let mut best: Option<(Option<usize>, (u64, u64))> = self
            .stragglers
            .peek()
            .map(|Reverse(q)| (None, (q.ns, q.seq)));
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(q) = run.front()
                && best.is_none_or(|(_, key)| (q.ns, q.seq) < key)
            {
                best = Some((Some(i), (q.ns, q.seq)));
            }
        }
        best
    }

    fn peek_ns(&self) -> Option<u64> {
        self.head.map(|(_, (ns, _))| ns)
    }

    fn pop(&mut self) -> Option<Queued> {
        let q = match self.head? {
            (Some(run), _) => self.runs[run].pop_front(),
            (None, _) => self.stragglers.pop().map(|Reverse(q)| q),
        };
        self.head = self.earliest();
        q
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.ns, self.seq) == (other.ns, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.ns, self.seq).cmp(&(other.ns, other.seq))
    }
}

pub struct NodeStream {
    sources: Vec<Source>,
    buffer: ReorderBuffer,
    seq: u64,
    last_out_ns: u64,
    /// Events that arrived later than their file's read-ahead allows (processed, but out of
    /// order).
    pub late: u64,
    pub first_late: Option<String>,
}

impl NodeStream {
    pub fn open(plan: &Plan, node: NodeId, window_ns: u64) -> Result<Self, MergeError> {
        let name = &plan.nodes[usize::from(node.0)];
        let shared = Arc::new(plan.clone());
        let mut sources = Vec::new();
        let wire_stamps = plan.clocks[usize::from(node.0)].nic().places_stamps();
        for (i, f) in plan.files.iter().enumerate() {
            if f.nodes.contains(name) {
                let plan = Arc::clone(&shared);
                let reduce =
                    move |line, record: Incoming<'_>| to_item(&plan, i, line, node, record);
                let read_ahead_ns = if !wire_stamps && file_is_capture(&f.path)? {
                    CAPTURE_READ_AHEAD_NS.min(window_ns)
                } else {
                    window_ns
                };
                sources.push(Source {
                    items: ReducedSource::open(&f.path, reduce)?,
                    high_ns: 0,
                    read_ahead_ns,
                    file: i,
                    done: false,
                });
            }
        }
        Ok(Self {
            buffer: ReorderBuffer {
                runs: (0..sources.len()).map(|_| VecDeque::new()).collect(),
                ..ReorderBuffer::default()
            },
            sources,
            seq: 0,
            last_out_ns: 0,
            late: 0,
            first_late: None,
        })
    }

    /// Reads one event from source `s` into the buffer; false at its end.
    fn fill_one(&mut self, s: usize) -> Result<bool, MergeError> {
        let src = &mut self.sources[s];
        let Some(item) = src.items.next() else {
            src.done = true;
            return Ok(false);
        };
        let item = item?.boxed();
        let ns = item.stamp().ns();
        src.high_ns = src.high_ns.max(ns);
        self.seq += 1;
        let seq = self.seq;
        self.buffer.push(s, Queued { ns, seq, item });
        Ok(true)
    }

    /// The next event in node time order, or `None` when every file is exhausted.
    pub fn next(&mut self, plan: &Plan) -> Result<Option<Item>, MergeError> {
        loop {
            let head = self.buffer.peek_ns();
            // A file not yet read its read-ahead past the head may still hold earlier events.
            let lagging = self
                .sources
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    !s.done && head.is_none_or(|h| s.high_ns < h.saturating_add(s.read_ahead_ns))
                })
                .min_by_key(|(_, s)| s.high_ns)
                .map(|(i, _)| i);
            match lagging {
                Some(s) => {
                    self.fill_one(s)?;
                }
                None => break,
            }
        }
        let Some(Queued { ns, item, .. }) = self.buffer.pop() else {
            return Ok(None);
        };
        if ns < self.last_out_ns {
            self.note_late(plan, ns, &item);
        }
        self.last_out_ns = self.last_out_ns.max(ns);
        Ok(Some(item))
    }

    /// Counts an event earlier than one already merged; the first is described.
    fn note_late(&mut self, plan: &Plan, ns: u64, item: &Item) {
        self.late += 1;
        if self.first_late.is_some() {
            return;
        }
        let o = item.stamp().origin;
        let file = usize::from(o.file);
        let source = self.sources.iter().find(|s| s.file == file);
        let read_ahead_ns = source.map_or(0, |s| s.read_ahead_ns);
        self.first_late = Some(format!(
            "{}:{}: event at {} ns is {} ns earlier than an event already merged, more than its file's read-ahead of {} ns allows; it was joined out of order",
            plan.files[file].display,
            { o.line }, // a copy: Origin is packed
            ns,
            self.last_out_ns - ns,
            read_ahead_ns,
        ));
    }
}
