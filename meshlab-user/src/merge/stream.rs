//! One node's events in node time order: all of the node's files read lazily through a
//! reorder buffer of `--window`. An event leaves the buffer once every unfinished file of the
//! node has been read a window past it, so lines out of order by less than the window come out
//! in order, and the buffer holds about a window of events, whatever the input size.

use crate::records::RecordSource;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::MergeError;
use super::event::Item;
use super::input::Plan;
use super::reduce::to_item;
use super::time::NodeId;

struct Source {
    file: usize,
    /// NDJSON or binary capture (crate::records).
    reader: RecordSource,
    /// Latest timestamp read from this file.
    high_ns: u64,
    done: bool,
}

/// A buffered event's place in time order; the event itself waits in [`Slab`], so the heap
/// moves 24-byte keys rather than whole items (a window holds up to millions of events).
struct Queued {
    ns: u64,
    seq: u64,
    slot: u32,
}

/// The buffered events, by slot; freed slots are reused, so it grows to the window's peak.
#[derive(Default)]
struct Slab {
    items: Vec<Option<Item>>,
    free: Vec<u32>,
}

impl Slab {
    fn put(&mut self, item: Item) -> u32 {
        match self.free.pop() {
            Some(slot) => {
                self.items[slot as usize] = Some(item);
                slot
            }
            None => {
                self.items.push(Some(item));
                (self.items.len() - 1) as u32
            }
        }
    }

    fn take(&mut self, slot: u32) -> Item {
        self.free.push(slot);
        self.items[slot as usize]
            .take()
            .expect("a queued slot holds its item")
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
    pub node: NodeId,
    sources: Vec<Source>,
    heap: BinaryHeap<Reverse<Queued>>,
    slab: Slab,
    window_ns: u64,
    seq: u64,
    last_out_ns: u64,
    /// Events that arrived later than the window allows (processed, but out of order).
    pub late: u64,
    pub first_late: Option<String>,
}

impl NodeStream {
    pub fn open(plan: &Plan, node: NodeId, window_ns: u64) -> Result<Self, MergeError> {
        let name = &plan.nodes[usize::from(node.0)];
        let mut sources = Vec::new();
        for (i, f) in plan.files.iter().enumerate() {
            if f.nodes.contains(name) {
                sources.push(Source {
                    file: i,
                    reader: RecordSource::open(&f.path)?,
                    high_ns: 0,
                    done: false,
                });
            }
        }
        Ok(Self {
            node,
            sources,
            heap: BinaryHeap::new(),
            slab: Slab::default(),
            window_ns,
            seq: 0,
            last_out_ns: 0,
            late: 0,
            first_late: None,
        })
    }

    /// Reads one event from source `s` into the buffer (skipping non-events); false at its end.
    fn fill_one(&mut self, plan: &Plan, s: usize) -> Result<bool, MergeError> {
        loop {
            let src = &mut self.sources[s];
            let Some(record) = src.reader.next() else {
                src.done = true;
                return Ok(false);
            };
            let line = src.reader.position();
            if let Some(item) = to_item(plan, src.file, line, self.node, record?)? {
                let ns = item.stamp().ns();
                src.high_ns = src.high_ns.max(ns);
                self.seq += 1;
                let slot = self.slab.put(item);
                self.heap.push(Reverse(Queued {
                    ns,
                    seq: self.seq,
                    slot,
                }));
                return Ok(true);
            }
        }
    }

    /// The next event in node time order, or `None` when every file is exhausted.
    pub fn next(&mut self, plan: &Plan) -> Result<Option<Item>, MergeError> {
        loop {
            let head = self.heap.peek().map(|q| q.0.ns);
            // A file that has not yet been read a window past the head may still hold earlier events.
            let lagging = self
                .sources
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    !s.done && head.is_none_or(|h| s.high_ns < h.saturating_add(self.window_ns))
                })
                .min_by_key(|(_, s)| s.high_ns)
                .map(|(i, _)| i);
            match lagging {
                Some(s) => {
                    self.fill_one(plan, s)?;
                }
                None => break,
            }
        }
        let Some(Reverse(q)) = self.heap.pop() else {
            return Ok(None);
        };
        let item = self.slab.take(q.slot);
        if q.ns < self.last_out_ns {
            self.late += 1;
            if self.first_late.is_none() {
                let o = item.stamp().origin;
                self.first_late = Some(format!(
                    "{}:{}: event at {} ns is {} ns earlier than an event already merged, more than --window allows; it was joined out of order",
                    plan.files[usize::from(o.file)].display,
                    o.line,
                    q.ns,
                    self.last_out_ns - q.ns
                ));
            }
        }
        self.last_out_ns = self.last_out_ns.max(q.ns);
        Ok(Some(item))
    }
}
