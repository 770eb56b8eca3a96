//! Kernel-only mode (a node without userland probe files): a message is the byte range of
//! tcp_sendmsg calls, a request is one turn and its reply.
//!
//! On the connecting side (client, `sock_established.active`), a turn starts with a new send
//! call after the previous turn's reply was read, collects further send calls as its request,
//! and the data its recv calls return as its reply. On the accepting side (server) a turn
//! starts with the data recv returns after the previous reply was sent, and its send calls are
//! the reply. A turn closes when the next one starts or after a `--window` without activity,
//! and finishes a window after its last send call (so its TX events, which may be deferred by
//! the stack, have arrived).

use std::collections::VecDeque;

use super::HashMap;

use crate::schema::JoinMethod;

use super::chain::{self, RX_KERNEL, Stages};
use super::conns::Conns;
use super::event::{Role, Stamp};
use super::half::{Half, stage_notes};
use super::index::NodeIndex;
use super::message::{MsgRef, SendCall};
use super::time::NodeId;

struct Turn {
    cookie: u64,
    client: bool,
    tx: Option<(u64, u64)>,
    rx: Option<(u64, u64)>,
    rx_stages: Option<Stages>,
    last_tx_ns: u64,
    last_ns: u64,
}

impl Turn {
    /// The second half of the turn (reply) has started.
    fn replied(&self) -> bool {
        if self.client {
            self.rx.is_some()
        } else {
            self.tx.is_some()
        }
    }
}

fn extend(range: &mut Option<(u64, u64)>, start: u64, end: u64) {
    *range = Some(match *range {
        Some((s, e)) => (s.min(start), e.max(end)),
        None => (start, end),
    });
}

#[derive(Default)]
pub struct Turns {
    open: HashMap<u64, Turn>,
    /// Closed turns waiting for their TX events: (due, turn).
    closing: VecDeque<(u64, Turn)>,
    pub done: Vec<Half>,
    /// Calls that could not be attributed, counted (reported at the end of the merge).
    pub skipped: Skipped,
}

/// Kernel-only traffic the turn model cannot attribute (docs/segments.md, kernel-only mode).
#[derive(Default)]
pub(crate) struct Skipped {
    /// Calls on connections without `sock_established` (opened before the recording).
    pub unknown_connection: u64,
    /// Data the accepting side sent before any request (a server speaking first).
    pub server_first: u64,
    /// Data the connecting side received before sending anything.
    pub before_request: u64,
}

impl Skipped {
    /// One summary line for the merge's errors, if anything was skipped.
    pub fn describe(&self, node: &str) -> Option<String> {
        let total = self.unknown_connection + self.server_first + self.before_request;
        (total > 0).then(|| {
            format!(
                "node {node}: kernel-only: {total} calls not attributed: {} on connections opened before the recording, {} server-first sends, {} receives before any request",
                self.unknown_connection, self.server_first, self.before_request
            )
        })
    }
}

impl Turns {
    pub fn send_call(&mut self, conns: &Conns, call: SendCall, window_ns: u64) {
        let msg = call.msg;
        let Some(est) = conns.by_cookie.get(&msg.cookie) else {
            self.skipped.unknown_connection += 1;
            return;
        };
        let now = call.stamp.ns();
        if est.active && self.open.get(&msg.cookie).is_some_and(|t| t.replied()) {
            self.close(msg.cookie, window_ns);
        }
        if !est.active && !self.open.contains_key(&msg.cookie) {
            self.skipped.server_first += 1;
            return; // a server speaking first: no request to attribute it to
        }
        let turn = self.open.entry(msg.cookie).or_insert_with(|| Turn {
            cookie: msg.cookie,
            client: true,
            tx: None,
            rx: None,
            rx_stages: None,
            last_tx_ns: now,
            last_ns: now,
        });
        extend(&mut turn.tx, msg.start, msg.end);
        turn.last_tx_ns = now;
        turn.last_ns = now;
    }

    pub fn recv(
        &mut self,
        conns: &Conns,
        stamp: Stamp,
        msg: MsgRef,
        stages: Stages,
        window_ns: u64,
    ) {
        let Some(est) = conns.by_cookie.get(&msg.cookie) else {
            self.skipped.unknown_connection += 1;
            return;
        };
        let now = stamp.ns();
        if !est.active && self.open.get(&msg.cookie).is_some_and(|t| t.replied()) {
            self.close(msg.cookie, window_ns);
        }
        if est.active && !self.open.contains_key(&msg.cookie) {
            self.skipped.before_request += 1;
            return; // data before any request on this connection
        }
        let turn = self.open.entry(msg.cookie).or_insert_with(|| Turn {
            cookie: msg.cookie,
            client: false,
            tx: None,
            rx: None,
            rx_stages: None,
            last_tx_ns: now,
            last_ns: now,
        });
        extend(&mut turn.rx, msg.start, msg.end);
        // The message's stages are those of its last byte: the latest recv's lookup wins.
        turn.rx_stages = Some(stages);
        turn.last_ns = now;
    }

    fn close(&mut self, cookie: u64, window_ns: u64) {
        if let Some(turn) = self.open.remove(&cookie) {
            self.closing
                .push_back((turn.last_tx_ns.saturating_add(window_ns), turn));
        }
    }

    /// Closes turns without activity for a window (`now = u64::MAX` closes all).
    pub fn close_idle(&mut self, now: u64, window_ns: u64) {
        let mut idle: Vec<(u64, u64)> = self
            .open
            .values()
            .filter(|t| t.last_ns.saturating_add(window_ns) <= now)
            .map(|t| (t.last_ns, t.cookie))
            .collect();
        idle.sort();
        for (_, cookie) in idle {
            self.close(cookie, window_ns);
        }
        let mut due: Vec<(u64, Turn)> = self.closing.drain(..).collect();
        due.sort_by_key(|(d, _)| *d);
        self.closing = due.into();
    }

    pub fn run_deadlines(
        &mut self,
        now: u64,
        index: &NodeIndex,
        conns: &Conns,
        node_name: &str,
        node: NodeId,
    ) {
        while self.closing.front().is_some_and(|(d, _)| *d <= now) {
            let (_, turn) = self.closing.pop_front().expect("front exists");
            if let Some(half) = finish(turn, index, conns, node_name, node, now) {
                self.done.push(half);
            }
        }
    }
}

fn finish(
    turn: Turn,
    index: &NodeIndex,
    conns: &Conns,
    node_name: &str,
    node: NodeId,
    now: u64,
) -> Option<Half> {
    let (tx_start, tx_end) = turn.tx?;
    let tx = index.tx_stages(turn.cookie, tx_start, tx_end);
    let mut rx = turn.rx_stages.unwrap_or_else(|| Stages::absent(&RX_KERNEL));
    let readers = rx.reader.take().into_iter().collect();
    let request_start = if turn.client { tx_start } else { turn.rx?.0 };
    let mut notes = Vec::new();
    let (req, resp) = if turn.client { (&tx, &rx) } else { (&rx, &tx) };
    notes.extend(stage_notes(node_name, "request", req));
    notes.extend(stage_notes(node_name, "response", resp));
    let thread = index.half_thread((tx.thread, rx.thread), &[&tx.points, &rx.points]);
    let (points, post) = if turn.client {
        (
            chain::client_request(None, tx.points),
            chain::client_response(None, rx.points),
        )
    } else {
        (chain::server(None, rx.points, tx.points), Vec::new())
    };
    Some(Half {
        role: if turn.client {
            Role::Client
        } else {
            Role::Server
        },
        node,
        trace_id: None,
        link: conns.link(turn.cookie, request_start),
        join: JoinMethod::KernelOnly,
        process: if turn.client { "client" } else { "server" }.into(),
        relays: Vec::new(),
        unresolved: Vec::new(),
        points,
        post,
        notes,
        readers,
        thread,
        kernel_recorded: true,
        ready_ns: now.min(turn.last_ns),
    })
}
