//! One node's join: its time-ordered events go into the [`NodeIndex`]; userland probe groups
//! (one per trace id and role) or, without probes, kernel-only turns ([`super::turns`]) name
//! the messages; their stages are looked up and finished [`Half`]s come out.
//!
//! Userland messages join kernel events by connection (cookie, or 4-tuple through the
//! node's `sock_established` records) + stream offset (`join = offset`). A probe without a
//! connection or offset falls back to the same thread's next tcp_sendmsg call (TX) or last
//! recv return (RX) in time order (`join = pid_tid_time`), which can mis-pair pipelined
//! requests and is labelled so.

use std::collections::VecDeque;

use super::{HashMap, MergeError};

use crate::schema::{Direction, Hook, JoinMethod};

use super::catalog::{self, Extra};
use super::chain::{self, Point, RX_KERNEL, Stages, TX_KERNEL};
use super::conns::Conns;
use super::event::{Item, KEvent, PEvent, Role, Stamp};
use super::half::{Half, relay_names, stage_notes};
use super::hops::{self, HopChain};
use super::index::NodeIndex;
use super::legs::{Io, Legs};
use super::message::{MsgRef, SendCall};
use super::segments::{OFF_PATH_PROBES, PointId};
use super::time::NodeId;
use super::turns::Turns;

/// A probe group: one trace id on one side (`true` = client).
type GroupKey = (String, bool);

#[derive(Default)]
struct Group {
    role: Option<Role>,
    process: String,
    probes: ProbeStamps,
    tx_deadline: Option<u64>,
    tx: Option<Stages>,
    tx_msg: Option<MsgRef>,
    rx: Option<Stages>,
    rx_msg: Option<MsgRef>,
    write_tid: u32,
    /// The request/response this process wrote on a unix socket: (start, end, write_begin).
    tx_unix: Option<(u64, u64, Stamp)>,
    /// The message this process read on a unix socket: (reading thread, start, end).
    rx_unix: Option<(u32, u64, u64)>,
    /// Proxies crossed and unresolved hops, per direction (unix legs only).
    hops: Vec<HopChain>,
    /// Points of this process outside the standard chain (any catalog).
    custom: Vec<Extra>,
    fallback: bool,
    finished: bool,
    last_ns: u64,
}

/// A group's probe points and their stamps: at most seven (a side's standard probe points;
/// custom points go to `Group::custom`), so a search of a small vector costs less than a hash
/// map's hashing and its table allocations, one map per request side.
#[derive(Default)]
struct ProbeStamps(Vec<(PointId, Stamp)>);

impl ProbeStamps {
    fn get(&self, id: &PointId) -> Option<&Stamp> {
        self.0.iter().find(|(p, _)| p == id).map(|(_, s)| s)
    }

    fn contains_key(&self, id: &PointId) -> bool {
        self.get(id).is_some()
    }

    /// Adds a point not yet present (the caller checks: a duplicate is an error there).
    fn insert(&mut self, id: PointId, stamp: Stamp) {
        debug_assert!(!self.contains_key(&id));
        self.0.push((id, stamp));
    }
}

/// Closed turns finished per step at the end of input ([`NodeJoiner::finish_all`]).
const FINAL_TURNS_STEP: usize = 1024;

pub struct NodeJoiner {
    pub node: NodeId,
    pub name: String,
    window_ns: u64,
    kernel_recorded: bool,
    pub index: NodeIndex,
    pub conns: Conns,
    /// Unix legs and per-thread socket I/O, for hop chains through proxies.
    legs: Legs,
    /// Kernel-only mode (this node has no probe files).
    turns: Option<Turns>,
    groups: HashMap<GroupKey, Group>,
    deadlines: VecDeque<(u64, GroupKey)>,
    /// Unix reads to follow back once the proxy's write has surely been seen: its send may
    /// return after the reader's recv did (read_end + a quarter window; in time order).
    rx_deadlines: VecDeque<(u64, GroupKey)>,
    /// Points of other processes on the path (probed proxies), per trace id, until the
    /// node's half of that trace finishes.
    extras: HashMap<String, Vec<Extra>>,
    /// Custom and other-process points placed into chains, and those that could not be.
    pub custom_points: u64,
    pub unplaced_points: u64,
    last_call_end: HashMap<u64, u64>,
    calls_by_tid: HashMap<u32, VecDeque<SendCall>>,
    recvs_by_tid: HashMap<u32, VecDeque<(Stamp, MsgRef)>>,
    frontier_ns: u64,
    since_sweep: u32,
    /// The frontier at the last sweep: a quiet node sweeps by time too (half a window), so an
    /// idle turn is finished soon after it went quiet, not thousands of events later.
    swept_at_ns: u64,
    pub done: Vec<Half>,
    pub errors: Vec<String>,
}

impl NodeJoiner {
    pub fn new(
        node: NodeId,
        name: String,
        window_ns: u64,
        kernel_only: bool,
        kernel_recorded: bool,
    ) -> Self {
        Self {
            node,
            name,
            window_ns,
            kernel_recorded,
            index: NodeIndex::default(),
            conns: Conns::default(),
            legs: Legs::default(),
            turns: kernel_only.then(Turns::default),
            groups: HashMap::default(),
            deadlines: VecDeque::new(),
            rx_deadlines: VecDeque::new(),
            extras: HashMap::default(),
            custom_points: 0,
            unplaced_points: 0,
            last_call_end: HashMap::default(),
            calls_by_tid: HashMap::default(),
            recvs_by_tid: HashMap::default(),
            frontier_ns: 0,
            since_sweep: 0,
            swept_at_ns: 0,
            done: Vec::new(),
            errors: Vec::new(),
        }
    }

    pub fn frontier_ns(&self) -> u64 {
        self.frontier_ns
    }

    pub fn push(&mut self, item: Item) {
        let now = item.stamp().ns();
        self.frontier_ns = self.frontier_ns.max(now);
        match item {
            Item::Kernel(ev) => self.kernel(&ev),
            Item::Probe(p) => self.probe(*p),
        }
        self.run_deadlines(self.frontier_ns);
        self.since_sweep += 1;
        // Saturating: a capture's times can reach the end of u64 (fuzz/regressions/capture).
        let half_window_on = self.swept_at_ns.saturating_add(self.window_ns / 2);
        if self.since_sweep >= 4096 || self.frontier_ns >= half_window_on {
            self.sweep();
        }
    }

    fn kernel(&mut self, ev: &KEvent) {
        if let (Some(est), Some(cookie)) = (ev.extra.established(), ev.cookie) {
            self.conns.insert(cookie, est.clone());
            return;
        }
        if let Some(ends) = ev.extra.unix() {
            self.legs.insert_unix(ev, ends);
            return;
        }
        self.index.insert(ev);
        let Some(cookie) = ev.cookie else { return };
        match (ev.hook, ev.offset) {
            (Hook::TcpSendmsg, Some(offset)) => self.tcp_sendmsg(ev, cookie, offset),
            (Hook::RecvReturn, Some(ptr)) => self.recv_return(ev, cookie, ptr),
            _ => {}
        }
    }

    /// Registers a send call the first time tcp_sendmsg reaches a new stream end.
    fn tcp_sendmsg(&mut self, ev: &KEvent, cookie: u64, offset: u64) {
        let end = offset + u64::from(ev.len);
        let last = self.last_call_end.entry(cookie).or_insert(0);
        if !(end > *last || (*last == 0 && end == 0)) {
            return;
        }
        *last = end;
        let call = SendCall {
            stamp: ev.stamp,
            msg: MsgRef {
                cookie,
                start: offset,
                end,
            },
        };
        self.calls_by_tid.entry(ev.tid).or_default().push_back(call);
        self.legs
            .thread_io(Io::tcp_call(call.msg, Direction::Tx, ev.stamp, ev.tid));
        if let Some(turns) = &mut self.turns {
            turns.send_call(&self.conns, call, self.window_ns);
        }
    }

    /// Registers the message a recv call returned (`value` bytes ending at the pointer `ptr`).
    fn recv_return(&mut self, ev: &KEvent, cookie: u64, ptr: u64) {
        let bytes = ev.value.unwrap_or(0).max(0) as u64;
        if bytes == 0 || bytes > ptr {
            return;
        }
        let msg = MsgRef {
            cookie,
            start: ptr - bytes,
            end: ptr,
        };
        self.recvs_by_tid
            .entry(ev.tid)
            .or_default()
            .push_back((ev.stamp, msg));
        self.legs
            .thread_io(Io::tcp_call(msg, Direction::Rx, ev.stamp, ev.tid));
        if let Some(turns) = &mut self.turns {
            let stages = self.index.rx_stages(cookie, ptr);
            turns.recv(&self.conns, ev.stamp, msg, stages, self.window_ns);
        }
    }

    fn probe(&mut self, mut p: PEvent) {
        let Some(role) = p.role else {
            // Another process on the path: placed into this node's half of the trace.
            if let Some(extra) = self.extra(&p, p.point.clone()) {
                self.extras.entry(p.trace_id).or_default().push(extra);
            }
            return;
        };
        let client = role == Role::Client;
        // The event's trace id becomes the key (nothing below reads it from `p`), and the map
        // takes a copy only for a group it does not hold yet: two clones per probe line were
        // a measurable part of the merge's allocations (docs/benchmarks-merge-ab.md).
        let key = (std::mem::take(&mut p.trace_id), client);
        if !self.groups.contains_key(&key) {
            self.groups.insert(key.clone(), Group::default());
        }
        let group = self.groups.get_mut(&key).expect("just registered");
        group.role = Some(role);
        group.last_ns = group.last_ns.max(p.stamp.ns());
        if group.process.is_empty() {
            group.process = p.process.clone();
        }
        if OFF_PATH_PROBES.contains(&p.point.as_str()) {
            return;
        }
        let Some(id) = PointId::probe(client, &p.point) else {
            let side = if client { "client" } else { "server" };
            if let Some(extra) = self.extra(&p, format!("{side}.{}", p.point)) {
                let group = self.groups.get_mut(&key).expect("just registered");
                group.custom.push(extra);
            }
            return;
        };
        if group.probes.contains_key(&id) {
            self.errors.push(format!(
                "node {}: trace {}: duplicate probe point {} (line {}); the first is used",
                self.name,
                key.0,
                id.name(),
                { p.stamp.origin.line } // a copy: Origin is packed
            ));
            return;
        }
        group.probes.insert(id, p.stamp);
        match id {
            PointId::ClientWriteBegin | PointId::ServerWriteBegin => self.write_begin(key, &p),
            PointId::ClientReadEnd | PointId::ServerReadEnd => self.read_end(&key, &p),
            PointId::ClientDecodeEnd => self.decode_end(&key),
            _ => {}
        }
    }

    /// A custom point (any catalog) to place into the node's chain; counted when the
    /// interner is full.
    fn extra(&mut self, p: &PEvent, name: String) -> Option<Extra> {
        let Some(id) = catalog::intern(&name) else {
            self.unplaced_points += 1;
            return None;
        };
        let process = p.process.clone();
        Some(Extra::new(id, p.stamp, process, p.conn.as_ref(), p.dir))
    }

    /// The request (client) or response (server) was written: its TX stages are looked up a
    /// window later, when the stack has sent it.
    fn write_begin(&mut self, key: GroupKey, p: &PEvent) {
        let msg = self.locate(p);
        let deadline = p.stamp.ns() + self.window_ns;
        let unix = unix_range(p).filter(|_| self.kernel_recorded);
        let group = self.groups.get_mut(&key).expect("registered by probe()");
        group.tx_msg = msg;
        group.tx_unix = unix.map(|(start, end)| (start, end, p.stamp));
        group.fallback |= msg.is_none() && unix.is_none();
        group.write_tid = p.tid;
        group.tx_deadline = Some(deadline);
        self.deadlines.push_back((deadline, key));
    }

    /// The response (client) or request (server) was read: its RX events are in the past
    /// (on a unix leg, the proxy's write may still return: followed back a little later).
    fn read_end(&mut self, key: &GroupKey, p: &PEvent) {
        if let Some((start, end)) = unix_range(p).filter(|_| self.kernel_recorded) {
            let group = self.groups.get_mut(key).expect("registered by probe()");
            group.rx_unix = Some((p.tid, start, end));
            let due = p.stamp.ns() + self.window_ns / 4;
            self.rx_deadlines.push_back((due, key.clone()));
            return;
        }
        let located = self.locate(p);
        let fallback = located.is_none();
        let msg = located.or_else(|| self.last_recv_of_thread(p));
        let rx = match msg {
            Some(m) => self.index.rx_stages(m.cookie, m.end),
            None => Stages::absent(&RX_KERNEL),
        };
        let group = self.groups.get_mut(key).expect("registered by probe()");
        group.fallback |= fallback;
        group.rx_msg = msg;
        group.rx = Some(rx);
        self.finish_if_ready(key);
    }

    /// Fallback for a read without connection or offset: the thread's last recv before it.
    fn last_recv_of_thread(&self, p: &PEvent) -> Option<MsgRef> {
        let recent = self.recvs_by_tid.get(&p.tid)?;
        let (_, last) = recent.iter().rev().find(|(s, _)| s.ns() <= p.stamp.ns())?;
        let len = p.len.unwrap_or(last.end - last.start);
        Some(MsgRef {
            start: last.end.saturating_sub(len),
            ..*last
        })
    }

    /// The response arrived, so the request's transmission is over: take its TX stages now
    /// when all were seen rather than holding the group for a window.
    fn decode_end(&mut self, key: &GroupKey) {
        let group = self.groups.get_mut(key).expect("registered by probe()");
        let unix_tx = group.tx_unix.filter(|_| group.tx.is_none());
        let tid = group.write_tid;
        if let Some(out) = unix_tx {
            let chain = self.unix_out(tid, out);
            self.set_unix_tx(key, chain);
        }
        let group = self.groups.get_mut(key).expect("registered by probe()");
        if group.tx.is_none()
            && let Some(m) = group.tx_msg
        {
            let stages = self.index.tx_stages(m.cookie, m.start, m.end);
            if stages.points.iter().all(|p| p.stamp.is_some()) {
                group.tx = Some(stages);
            }
        }
        self.finish_if_ready(key);
    }

    /// The message a write_begin/read_end probe names by connection + offset, if it does.
    fn locate(&self, p: &PEvent) -> Option<MsgRef> {
        let cookie = self.conns.resolve(p.conn.as_ref()?)?;
        let start = p.offset?;
        Some(MsgRef {
            cookie,
            start,
            end: start + p.len?,
        })
    }

    fn run_deadlines(&mut self, now: u64) {
        self.run_group_deadlines(now);
        self.run_turn_deadlines(now);
    }

    /// The probe groups' RX (unix leg) and TX lookups due by `now`.
    fn run_group_deadlines(&mut self, now: u64) {
        while self.rx_deadlines.front().is_some_and(|(d, _)| *d <= now) {
            let (_, key) = self.rx_deadlines.pop_front().expect("front exists");
            self.unix_rx_due(&key);
        }
        while self.deadlines.front().is_some_and(|(d, _)| *d <= now) {
            let (_, key) = self.deadlines.pop_front().expect("front exists");
            self.tx_due(&key);
        }
    }

    /// Kernel-only turns closed a window ago (or idle): finished into halves.
    fn run_turn_deadlines(&mut self, now: u64) {
        if let Some(turns) = &mut self.turns {
            turns.run_deadlines(now, &self.index, &self.conns, &self.name, self.node);
            self.done.append(&mut turns.done);
        }
    }

    /// A window after write_begin: the TX stages of the written message.
    fn tx_due(&mut self, key: &GroupKey) {
        let Some(group) = self.groups.get(key) else {
            return;
        };
        if group.tx.is_some() {
            return;
        }
        if let Some(out) = group.tx_unix {
            let chain = self.unix_out(group.write_tid, out);
            self.set_unix_tx(key, chain);
            self.finish_if_ready(key);
            return;
        }
        let msg = group
            .tx_msg
            .or_else(|| self.first_send_call_after_write(group, key.1));
        let stages = match msg {
            Some(m) => self.index.tx_stages(m.cookie, m.start, m.end),
            None => Stages::absent(&TX_KERNEL),
        };
        let group = self.groups.get_mut(key).expect("checked");
        group.tx_msg = msg;
        group.tx = Some(stages);
        self.finish_if_ready(key);
    }

    /// Fallback: the writing thread's first new send call after write_begin.
    fn first_send_call_after_write(&self, group: &Group, client: bool) -> Option<MsgRef> {
        let begin = group.probes.get(&if client {
            PointId::ClientWriteBegin
        } else {
            PointId::ServerWriteBegin
        })?;
        let calls = self.calls_by_tid.get(&group.write_tid)?;
        let call = calls.iter().find(|c| c.stamp.ns() >= begin.ns())?;
        Some(call.msg)
    }

    fn finish_if_ready(&mut self, key: &GroupKey) {
        let Some(group) = self.groups.get(key) else {
            return;
        };
        let ready = match group.role {
            Some(Role::Client) => {
                group.tx.is_some()
                    && group.rx.is_some()
                    && group.probes.contains_key(&PointId::ClientDecodeEnd)
            }
            _ => group.tx.is_some() && group.rx.is_some(),
        };
        if ready {
            self.finish(key);
        }
    }

    /// Builds the half of a probe group, complete or not, and forgets the group.
    fn finish(&mut self, key: &GroupKey) {
        let Some(mut g) = self.groups.remove(key) else {
            return;
        };
        if g.finished {
            return;
        }
        g.finished = true;
        let client = key.1;
        let tx = g.tx.take().unwrap_or_else(|| Stages::absent(&TX_KERNEL));
        let mut rx = g.rx.take().unwrap_or_else(|| Stages::absent(&RX_KERNEL));
        let readers = rx.reader.take().into_iter().collect();
        let (request, response) = if client { (&tx, &rx) } else { (&rx, &tx) };
        let mut notes = stage_notes(&self.name, "request", request);
        notes.extend(stage_notes(&self.name, "response", response));
        let threads = (tx.thread, rx.thread);
        let probe = |id: PointId| Point::seen(id, g.probes.get(&id).copied());
        let (mut points, mut post) = if client {
            (
                chain::client_request(Some(&probe), tx.points),
                chain::client_response(Some(&probe), rx.points),
            )
        } else {
            (
                chain::server(Some(&probe), rx.points, tx.points),
                Vec::new(),
            )
        };
        let mut owners = vec![g.process.clone()];
        let relays = g.hops.iter().map(|h| h.relays).max().unwrap_or(0);
        owners.extend(relay_names(client, relays));
        let extras = std::mem::take(&mut g.custom);
        self.place_custom(extras, key, (&mut points, &mut post), &mut owners);
        let thread = self.index.half_thread(threads, &[&points, &post]);
        let unresolved = g.hops.iter().flat_map(|h| &h.unresolved);
        let unresolved = unresolved.map(|u| format!("{}:{u}", self.name)).collect();
        let request = if client { g.tx_msg } else { g.rx_msg };
        self.done.push(Half {
            role: if client { Role::Client } else { Role::Server },
            node: self.node,
            trace_id: Some(key.0.clone()),
            link: request.and_then(|m| self.conns.link(m.cookie, m.start)),
            join: if g.fallback {
                JoinMethod::PidTidTime
            } else {
                JoinMethod::Offset
            },
            process: g.process,
            relays: owners.split_off(1),
            unresolved,
            thread,
            points,
            post,
            notes,
            readers,
            kernel_recorded: self.kernel_recorded,
            ready_ns: self.frontier_ns,
        });
    }

    /// Places other probed processes' points of a half's trace into its chains, counting
    /// those placed and those that fit nowhere.
    fn place_custom(
        &mut self,
        mut extras: Vec<Extra>,
        key: &GroupKey,
        (points, post): (&mut Vec<Point>, &mut Vec<Point>),
        owners: &mut Vec<String>,
    ) {
        extras.extend(self.extras.remove(&key.0).unwrap_or_default());
        let count = extras.len() as u64;
        let unplaced = catalog::place(points, post, key.1, extras, owners);
        self.custom_points += count - unplaced;
        self.unplaced_points += unplaced;
    }

    /// Other processes' points whose trace has no half on this node (counted, not placed).
    fn drop_extras_before(&mut self, before_ns: u64) {
        let mut dropped = 0;
        self.extras.retain(|_, v| {
            let stale = v.iter().all(|e| e.stamp.ns() < before_ns);
            if stale {
                dropped += v.len() as u64;
            }
            !stale
        });
        self.unplaced_points += dropped;
    }

    /// Evicts old kernel events and finishes groups and turns that went quiet.
    fn sweep(&mut self) {
        self.since_sweep = 0;
        self.swept_at_ns = self.frontier_ns;
        // Idle turns first, and finished while their events are still indexed: a connection's
        // last turn has no next turn to close it, and by this sweep (4096 events later, seconds
        // in a quiet recording) its events may be older than the cutoff below.
        if let Some(turns) = &mut self.turns {
            turns.close_idle(self.frontier_ns, self.window_ns);
        }
        self.run_turn_deadlines(self.frontier_ns);
        let cutoff = self.frontier_ns.saturating_sub(self.window_ns);
        self.index.evict_before(cutoff);
        self.legs.evict_before(cutoff);
        for q in self.calls_by_tid.values_mut() {
            while q.front().is_some_and(|c| c.stamp.ns() < cutoff) {
                q.pop_front();
            }
        }
        self.calls_by_tid.retain(|_, q| !q.is_empty());
        for q in self.recvs_by_tid.values_mut() {
            while q.front().is_some_and(|(s, _)| s.ns() < cutoff) {
                q.pop_front();
            }
        }
        self.recvs_by_tid.retain(|_, q| !q.is_empty());
        let stale_before = self.frontier_ns.saturating_sub(4 * self.window_ns);
        let mut stale: Vec<(u64, GroupKey)> = self
            .groups
            .iter()
            .filter(|(_, g)| g.last_ns < stale_before && g.tx_deadline.is_none_or(|d| d < cutoff))
            .map(|(k, g)| (g.last_ns, k.clone()))
            .collect();
        stale.sort();
        for (_, key) in stale {
            self.finish(&key);
        }
        self.drop_extras_before(stale_before);
    }

    /// End of input: every deadline is due, every group and turn finishes, and each half is
    /// handed to `emit` in the order the deadlines give. A capture's last window of turns all
    /// closes here: finished [`FINAL_TURNS_STEP`] at a time, each step's halves handed on
    /// before the next is built, so the joiner never holds them all (they were a third of a
    /// short capture's peak memory, docs/benchmarks-merge-ab.md round 40). The pipeline
    /// writes a half when its partner is there; one whose partner is still to come (another
    /// node's) waits in the pipeline, as before.
    pub fn finish_all(
        &mut self,
        emit: &mut dyn FnMut(Half) -> Result<(), MergeError>,
    ) -> Result<(), MergeError> {
        self.run_group_deadlines(u64::MAX);
        self.finish_turns(emit)?;
        let mut keys: Vec<(u64, GroupKey)> = self
            .groups
            .iter()
            .map(|(k, g)| (g.last_ns, k.clone()))
            .collect();
        keys.sort();
        for (_, key) in keys {
            self.finish(&key);
        }
        self.drop_extras_before(u64::MAX);
        if let Some(turns) = &mut self.turns {
            if let Some(line) = turns.skipped.describe(&self.name) {
                self.errors.push(line);
            }
            turns.close_idle(u64::MAX, 0);
        }
        self.finish_turns(emit)
    }

    /// Finishes every closed turn, in steps, handing `done` to `emit` after each.
    fn finish_turns(
        &mut self,
        emit: &mut dyn FnMut(Half) -> Result<(), MergeError>,
    ) -> Result<(), MergeError> {
        loop {
            let more = self.turns.as_mut().is_some_and(|turns| {
                turns.finish_some(
                    FINAL_TURNS_STEP,
                    &self.index,
                    &self.conns,
                    &self.name,
                    self.node,
                )
            });
            if let Some(turns) = &mut self.turns {
                self.done.append(&mut turns.done);
            }
            for half in std::mem::take(&mut self.done) {
                emit(half)?;
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// The request this process wrote on a unix socket, followed through the node's proxies to
    /// the TCP leg ([`hops::forward`]).
    fn unix_out(&self, tid: u32, (start, end, begin): (u64, u64, Stamp)) -> HopChain {
        match self.legs.call_of(tid, Direction::Tx, start, end) {
            Some(sent) => hops::forward(&self.legs, &self.index, sent, (start, end), begin.ns()),
            None => unix_not_found("write"),
        }
    }

    /// The message this process read on a unix socket, followed back through the node's
    /// proxies to the TCP leg ([`hops::backward`]), ending with the reader's own recv.
    fn unix_in(&self, tid: u32, (start, end): (u64, u64)) -> HopChain {
        match self.legs.call_of(tid, Direction::Rx, start, end) {
            Some(read) => {
                let mut chain = hops::backward(&self.legs, &self.index, read, (start, end));
                let recv = Point::seen(PointId::UdsRecvReturn, Some(read.stamp));
                chain.points.push(recv);
                chain
            }
            None => unix_not_found("read"),
        }
    }

    fn set_unix_tx(&mut self, key: &GroupKey, chain: HopChain) {
        let Some(group) = self.groups.get_mut(key) else {
            return;
        };
        group.tx_msg = chain.tcp;
        group.tx = Some(chain.stages());
        group.hops.push(chain);
    }

    /// A quarter window after a unix read_end: the read followed back ([`Self::unix_in`]).
    fn unix_rx_due(&mut self, key: &GroupKey) {
        let Some((tid, start, end)) = self.groups.get(key).and_then(|g| g.rx_unix) else {
            return;
        };
        let chain = self.unix_in(tid, (start, end));
        let group = self.groups.get_mut(key).expect("checked");
        group.rx_msg = chain.tcp;
        group.rx = Some(chain.stages());
        group.hops.push(chain);
        self.finish_if_ready(key);
    }
}

/// `[start, end)` of a message a probe names on a unix socket (`conn.unix_path` + offset).
fn unix_range(p: &PEvent) -> Option<(u64, u64)> {
    p.conn.as_ref()?.unix_path.as_ref()?;
    let start = p.offset?;
    Some((start, start + p.len?))
}

/// A probed unix message whose call the kernel recording does not show: its leg's points are
/// missing (the relay beyond it cannot be followed).
fn unix_not_found(what: &str) -> HopChain {
    HopChain {
        points: Stages::absent(&[PointId::UdsDataReady, PointId::UdsRecvReturn]).points,
        unresolved: vec![format!("unix {what} not recorded")],
        ..HopChain::default()
    }
}
