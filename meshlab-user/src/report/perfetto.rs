//! `--perfetto FILE`: Chrome trace-event JSON ("traceEvents", ph "X" complete events, ts and
//! dur in microseconds) that the Perfetto UI and chrome://tracing open.
//!
//! One process per node, one thread (track) per process role or kernel sub-layer, plus a
//! `requests` track on the client node. Every node keeps its own clock: a segment's ts is its
//! start_ns on its node's CLOCK_MONOTONIC, never shifted to another node's. The only events
//! placed on a clock other than their own are derived cross-node segments (drawn on the client
//! node where the client waited, see layout.rs): their args say `display_only: true`.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde_json::{Value, json};

use crate::schema::MergedRequest;

use super::layout::place;

/// Placement note carried by every display-only event.
pub const DISPLAY_NOTE: &str = "derived by the difference method; no clock of its own: drawn on the outer \
node's clock inside its wait, split in two equal halves (request and response flight) for display only";

pub struct TraceWriter<W: Write> {
    out: W,
    first: bool,
    pids: BTreeMap<String, u32>,
    tids: BTreeMap<(u32, String), u32>,
    /// Per (pid, track): lanes of occupied [start, end) intervals. Slices on one trace thread
    /// must not partly overlap, so concurrent requests spill onto `track #2`, `#3`, ...
    lanes: BTreeMap<(u32, String), Vec<BTreeMap<i128, i128>>>,
    pub events: u64,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut out: W, node_order: &[String]) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[\n")?;
        let mut w = TraceWriter {
            out,
            first: true,
            pids: BTreeMap::new(),
            tids: BTreeMap::new(),
            lanes: BTreeMap::new(),
            events: 0,
        };
        for n in node_order {
            w.pid(n)?;
        }
        Ok(w)
    }

    fn emit(&mut self, v: &Value) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut self.out, v)?;
        self.events += 1;
        Ok(())
    }

    fn pid(&mut self, node: &str) -> io::Result<u32> {
        if let Some(&p) = self.pids.get(node) {
            return Ok(p);
        }
        let pid = self.pids.len() as u32 + 1;
        self.pids.insert(node.to_owned(), pid);
        let name = format!("node {node} (its own CLOCK_MONOTONIC)");
        self.emit(&json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}))?;
        self.emit(&json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}))?;
        Ok(pid)
    }

    fn tid(&mut self, pid: u32, track: &str) -> io::Result<u32> {
        if let Some(&t) = self.tids.get(&(pid, track.to_owned())) {
            return Ok(t);
        }
        let tid = self.tids.keys().filter(|(p, _)| *p == pid).count() as u32 + 1;
        self.tids.insert((pid, track.to_owned()), tid);
        self.emit(&json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}}))?;
        self.emit(&json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}))?;
        Ok(tid)
    }

    /// The thread for an event on `track` spanning [start, end): the track's first lane where
    /// it overlaps nothing.
    fn lane(&mut self, pid: u32, track: &str, start: i128, end: i128) -> io::Result<u32> {
        let lanes = self.lanes.entry((pid, track.to_owned())).or_default();
        let free = |lane: &BTreeMap<i128, i128>| {
            let before = lane
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e > start);
            let after = lane.range(start..).next().is_some_and(|(&s, _)| s < end);
            !before && !after
        };
        let at = match lanes.iter().position(free) {
            Some(i) => i,
            None => {
                lanes.push(BTreeMap::new());
                lanes.len() - 1
            }
        };
        lanes[at].insert(start, end);
        let name = if at == 0 {
            track.to_owned()
        } else {
            format!("{track} #{}", at + 1)
        };
        self.tid(pid, &name)
    }

    /// All segments of one request, plus its end-to-end span on the client's `requests` track.
    pub fn request(&mut self, req: &MergedRequest, label: Option<&str>) -> io::Result<()> {
        let client = self.pid(&req.client_node)?;
        let start = i128::from(req.start_ns);
        let tid = self.lane(client, "requests", start, start + i128::from(req.e2e_ns))?;
        let name = match label {
            Some(l) => format!("request {} ({l})", req.trace_id),
            None => format!("request {}", req.trace_id),
        };
        self.emit(&json!({
            "ph": "X", "name": name, "cat": "request", "pid": client, "tid": tid,
            "ts": micros(i128::from(req.start_ns)), "dur": micros(i128::from(req.e2e_ns)),
            "args": {"trace_id": req.trace_id, "e2e_ns": req.e2e_ns, "complete": req.complete,
                     "missing": req.missing, "join": req.join, "start_ns": req.start_ns},
        }))?;
        for p in place(req) {
            let s = &req.segments[p.segment];
            let mut args = json!({
                "trace_id": req.trace_id, "segment": s.name, "layer": s.layer.as_str(),
                "unit": s.unit, "kind": s.kind.as_str(), "dur_ns": s.dur_ns,
            });
            let own_clock = s.derived.is_none() && s.node.is_some() && s.start_ns.is_some();
            let (pid, track, ts, dur) = if own_clock {
                let node = s.node.as_deref().expect("checked");
                let start = s.start_ns.expect("checked");
                args["node"] = json!(node);
                args["start_ns"] = json!(start);
                (
                    self.pid(node)?,
                    format!("{}: {}", s.layer.as_str(), s.unit),
                    i128::from(start),
                    i128::from(s.dur_ns),
                )
            } else {
                args["display_only"] = json!(true);
                args["placement"] = json!(DISPLAY_NOTE);
                if let Some(d) = &s.derived {
                    args["derived"] = json!(d);
                }
                if let Some((part, of)) = p.part {
                    args["part"] = json!(format!("{part}/{of}"));
                }
                let track = if s.derived.is_some() {
                    "derived network (display placement)".to_owned()
                } else {
                    format!("{} (display placement)", s.unit)
                };
                (client, track, i128::from(req.start_ns) + p.x0, p.x1 - p.x0)
            };
            let tid = self.lane(pid, &track, ts, ts + dur)?;
            let cat = format!("{},{}", s.layer.as_str(), s.kind.as_str());
            self.emit(
                &json!({"ph": "X", "name": s.name, "cat": cat, "pid": pid, "tid": tid,
                              "ts": micros(ts), "dur": micros(dur), "args": args}),
            )?;
        }
        Ok(())
    }

    pub fn finish(mut self, other: Value) -> io::Result<W> {
        self.out
            .write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
        serde_json::to_writer(&mut self.out, &other)?;
        self.out.write_all(b"}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Nanoseconds as the format's microseconds (a JSON number with up to 3 decimals).
fn micros(ns: i128) -> Value {
    json!(ns as f64 / 1000.0)
}
