//! One node's join: its time-ordered events go into the [`NodeIndex`]; userland probe groups
//! (one per trace id and role) or, without probes, kernel-only turns ([`super::turns`]) name
//! the messages; their stages are looked up and finished [`Half`]s come out.
//!
//! Userland messages join kernel events by connection (cookie, or 4-tuple through the
//! node's `sock_established` records) + stream offset (`join = offset`). A probe without a
//! connection or offset falls back to the same thread's next tcp_sendmsg call (TX) or last
//! recv return (RX) in time order (`join = pid_tid_time`), which can mis-pair pipelined
//! requests and is labelled so.

use std::collections::{HashMap, VecDeque};

use crate::schema::{Hook, JoinMethod};

use super::chain::{self, Point, RX_KERNEL, Stages, TX_KERNEL};
use super::conns::Conns;
use super::event::{Item, KEvent, PEvent, Role, Stamp};
use super::half::{Half, stage_notes};
use super::index::NodeIndex;
use super::message::{MsgRef, SendCall};
use super::segments::PointId;
use super::time::NodeId;
use super::turns::Turns;

/// A probe group: one trace id on one side (`true` = client).
type GroupKey = (String, bool);

#[derive(Default)]
struct Group {
    role: Option<Role>,
    process: String,
    probes: HashMap<PointId, Stamp>,
    tx_deadline: Option<u64>,
    tx: Option<Stages>,
    tx_msg: Option<MsgRef>,
    rx: Option<Stages>,
    rx_msg: Option<MsgRef>,
    write_tid: u32,
    fallback: bool,
    finished: bool,
    last_ns: u64,
}

pub struct NodeJoiner {
    pub node: NodeId,
    pub name: String,
    window_ns: u64,
    kernel_recorded: bool,
    pub index: NodeIndex,
    pub conns: Conns,
    /// Kernel-only mode (this node has no probe files).
    turns: Option<Turns>,
    groups: HashMap<GroupKey, Group>,
    deadlines: VecDeque<(u64, GroupKey)>,
    last_call_end: HashMap<u64, u64>,
    calls_by_tid: HashMap<u32, VecDeque<SendCall>>,
    recvs_by_tid: HashMap<u32, VecDeque<(Stamp, MsgRef)>>,
    frontier_ns: u64,
    since_sweep: u32,
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
            turns: kernel_only.then(Turns::default),
            groups: HashMap::new(),
            deadlines: VecDeque::new(),
            last_call_end: HashMap::new(),
            calls_by_tid: HashMap::new(),
            recvs_by_tid: HashMap::new(),
            frontier_ns: 0,
            since_sweep: 0,
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
            Item::Kernel(ev) => self.kernel(ev),
            Item::Probe(p) => self.probe(*p),
        }
        self.run_deadlines(self.frontier_ns);
        self.since_sweep += 1;
        if self.since_sweep >= 4096 {
            self.sweep();
        }
    }

    fn kernel(&mut self, ev: KEvent) {
        if let (Some(est), Some(cookie)) = (&ev.established, ev.cookie) {
            self.conns.insert(cookie, (**est).clone());
            return;
        }
        self.index.insert(&ev);
        let Some(cookie) = ev.cookie else { return };
        match (ev.hook, ev.offset) {
            (Hook::TcpSendmsg, Some(offset)) => self.tcp_sendmsg(&ev, cookie, offset),
            (Hook::RecvReturn, Some(ptr)) => self.recv_return(&ev, cookie, ptr),
            _ => {}
        }
    }

    /// Registers a send call the first time tcp_sendmsg reaches a new stream end.
    fn tcp_sendmsg(&mut self, ev: &KEvent, cookie: u64, offset: u64) {
        let end = offset + ev.len;
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
        if let Some(turns) = &mut self.turns {
            let stages = self.index.rx_stages(cookie, ptr);
            turns.recv(&self.conns, ev.stamp, msg, stages, self.window_ns);
        }
    }

    fn probe(&mut self, p: PEvent) {
        let client = p.role == Role::Client;
        let key = (p.trace_id.clone(), client);
        let group = self.groups.entry(key.clone()).or_default();
        group.role = Some(p.role);
        group.last_ns = group.last_ns.max(p.stamp.ns());
        if group.process.is_empty() {
            group.process = p.process.clone();
        }
        let Some(id) = PointId::probe(client, &p.point) else {
            return;
        };
        if group.probes.contains_key(&id) {
            self.errors.push(format!(
                "node {}: trace {}: duplicate probe point {} (line {}); the first is used",
                self.name,
                p.trace_id,
                id.name(),
                p.stamp.origin.line
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

    /// The request (client) or response (server) was written: its TX stages are looked up a
    /// window later, when the stack has sent it.
    fn write_begin(&mut self, key: GroupKey, p: &PEvent) {
        let msg = self.locate(p);
        let deadline = p.stamp.ns() + self.window_ns;
        let group = self.groups.get_mut(&key).expect("registered by probe()");
        group.tx_msg = msg;
        group.fallback |= msg.is_none();
        group.write_tid = p.tid;
        group.tx_deadline = Some(deadline);
        self.deadlines.push_back((deadline, key));
    }

    /// The response (client) or request (server) was read: its RX events are in the past.
    fn read_end(&mut self, key: &GroupKey, p: &PEvent) {
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
        while self.deadlines.front().is_some_and(|(d, _)| *d <= now) {
            let (_, key) = self.deadlines.pop_front().expect("front exists");
            self.tx_due(&key);
        }
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
        let rx = g.rx.take().unwrap_or_else(|| Stages::absent(&RX_KERNEL));
        let (request, response) = if client { (&tx, &rx) } else { (&rx, &tx) };
        let mut notes = stage_notes(&self.name, "request", request);
        notes.extend(stage_notes(&self.name, "response", response));
        let probe = |id: PointId| Point::seen(id, g.probes.get(&id).copied());
        let (points, post) = if client {
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
            points,
            post,
            notes,
            kernel_recorded: self.kernel_recorded,
            ready_ns: self.frontier_ns,
        });
    }

    /// Evicts old kernel events and finishes groups and turns that went quiet.
    fn sweep(&mut self) {
        self.since_sweep = 0;
        let cutoff = self.frontier_ns.saturating_sub(self.window_ns);
        self.index.evict_before(cutoff);
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
        if let Some(turns) = &mut self.turns {
            turns.close_idle(self.frontier_ns, self.window_ns);
        }
    }

    /// End of input: every deadline is due, every group and turn finishes.
    pub fn finish_all(&mut self) {
        self.run_deadlines(u64::MAX);
        let mut keys: Vec<(u64, GroupKey)> = self
            .groups
            .iter()
            .map(|(k, g)| (g.last_ns, k.clone()))
            .collect();
        keys.sort();
        for (_, key) in keys {
            self.finish(&key);
        }
        if let Some(turns) = &mut self.turns {
            turns.close_idle(u64::MAX, 0);
            turns.run_deadlines(u64::MAX, &self.index, &self.conns, &self.name, self.node);
            self.done.append(&mut turns.done);
        }
    }
}
