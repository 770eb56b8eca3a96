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
use super::stored_stages::StoredStages;
use super::time::NodeId;

struct Turn {
    cookie: u64,
    client: bool,
    tx: Option<(u64, u64)>,
    rx: Option<(u64, u64)>,
    rx_stages: Option<StoredStages>,
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
    /// Closed turns waiting for their TX events.
    closing: Closing<Turn>,
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
        turn.rx_stages = Some(StoredStages::store(stages));
        turn.last_ns = now;
    }

    fn close(&mut self, cookie: u64, window_ns: u64) {
        if let Some(turn) = self.open.remove(&cookie) {
            self.closing
                .push(turn.last_tx_ns.saturating_add(window_ns), turn);
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
        self.closing.sort();
    }

    pub fn run_deadlines(
        &mut self,
        now: u64,
        index: &NodeIndex,
        conns: &Conns,
        node_name: &str,
        node: NodeId,
    ) {
        while let Some(turn) = self.closing.pop_due(now) {
            if let Some(half) = finish(turn, index, conns, node_name, node, now) {
                self.done.push(half);
            }
        }
    }

    /// At the end of input: finishes at most `limit` of the closed turns into `done`, taken
    /// from the front of the queue as [`Self::run_deadlines`] takes them (its sorted part,
    /// then the turns closed since); true while some are left.
    pub fn finish_some(
        &mut self,
        limit: usize,
        index: &NodeIndex,
        conns: &Conns,
        node_name: &str,
        node: NodeId,
    ) -> bool {
        for _ in 0..limit {
            let Some(turn) = self.closing.pop_due(u64::MAX) else {
                return false;
            };
            if let Some(half) = finish(turn, index, conns, node_name, node, u64::MAX) {
                self.done.push(half);
            }
        }
        !self.closing.due.is_empty()
    }
}

/// Closed turns by due time: a prefix sorted at the last [`Closing::sort`], then the turns
/// closed since, in closing order. Deadlines run from the front between sorts, as they did
/// when every sweep sorted the whole queue.
struct Closing<T> {
    due: VecDeque<(u64, T)>,
    sorted: usize,
}

impl<T> Default for Closing<T> {
    fn default() -> Self {
        Self {
            due: VecDeque::new(),
            sorted: 0,
        }
    }
}

impl<T> Closing<T> {
    fn push(&mut self, due: u64, turn: T) {
        self.due.push_back((due, turn));
    }

    /// The front turn if it is due by `now`.
    fn pop_due(&mut self, now: u64) -> Option<T> {
        if self.due.front().is_none_or(|(d, _)| *d > now) {
            return None;
        }
        self.sorted = self.sorted.saturating_sub(1);
        self.due.pop_front().map(|(_, turn)| turn)
    }

    /// The order a stable sort of the whole queue by due time gives (turns due together keep
    /// their closing order), reached by sorting only the turns closed since the last sort and
    /// merging them into the sorted part's tail that is due after the earliest of them. A
    /// sort of the whole queue per sweep copied every waiting turn: a busy capture holds a
    /// window of them, and that was a sixth of its merge.
    fn sort(&mut self) {
        let mut fresh: Vec<(u64, T)> = self.due.drain(self.sorted..).collect();
        fresh.sort_by_key(|(d, _)| *d);
        if let Some(&(first, _)) = fresh.first() {
            let from = self.due.partition_point(|(d, _)| *d <= first);
            let held: Vec<(u64, T)> = self.due.drain(from..).collect();
            merge_by_due(&mut self.due, held, fresh);
        }
        self.sorted = self.due.len();
    }
}

/// Appends `held` and `fresh` (each sorted by due time) to `out` in due order, `held` first
/// among equals (it was closed earlier).
fn merge_by_due<T>(out: &mut VecDeque<(u64, T)>, held: Vec<(u64, T)>, fresh: Vec<(u64, T)>) {
    let mut held = held.into_iter().peekable();
    let mut fresh = fresh.into_iter().peekable();
    loop {
        let from_held = match (held.peek(), fresh.peek()) {
            (Some(h), Some(f)) => h.0 <= f.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return,
        };
        out.extend(if from_held { held.next() } else { fresh.next() });
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
    let mut rx = (turn.rx_stages).map_or_else(|| Stages::absent(&RX_KERNEL), StoredStages::expand);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of input finishes closed turns at most `limit` at a time, in the queue's
    /// order, and says whether any is left.
    #[test]
    fn finish_some_finishes_at_most_its_limit_in_due_order() {
        let mut turns = Turns::default();
        for (due, cookie) in [(30, 3), (10, 1), (20, 2)] {
            let turn = Turn {
                cookie,
                client: true,
                tx: Some((0, 100)),
                rx: None,
                rx_stages: None,
                last_tx_ns: due,
                last_ns: due,
            };
            turns.closing.push(due, turn);
        }
        turns.closing.sort();
        let (index, conns) = (NodeIndex::default(), Conns::default());
        assert!(turns.finish_some(2, &index, &conns, "A", NodeId(0)));
        assert_eq!(turns.done.len(), 2);
        // Exactly `limit` left: all finished, none left.
        assert!(!turns.finish_some(1, &index, &conns, "A", NodeId(0)));
        let ready: Vec<u64> = turns.done.iter().map(|h| h.ready_ns).collect();
        assert_eq!(ready, [10, 20, 30]);
    }

    /// The queue as it was: pushed at the back, popped at the front while due, and sorted
    /// whole (stably) at each sweep.
    #[derive(Default)]
    struct WholeSort(VecDeque<(u64, u32)>);

    impl WholeSort {
        fn pop_due(&mut self, now: u64) -> Option<u32> {
            if self.0.front().is_none_or(|(d, _)| *d > now) {
                return None;
            }
            self.0.pop_front().map(|(_, id)| id)
        }

        fn sort(&mut self) {
            let mut all: Vec<(u64, u32)> = self.0.drain(..).collect();
            all.sort_by_key(|(d, _)| *d);
            self.0 = all.into();
        }
    }

    /// Random pushes (due times going back and forth, many equal), pops of what is due and
    /// sorts: every turn comes out of [`Closing`] when and in the order the whole sort gave.
    #[test]
    fn closing_runs_turns_in_the_order_a_whole_sort_gave() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..40 {
            let (mut closing, mut whole) = (Closing::default(), WholeSort::default());
            let mut now = 100;
            for id in 0..600 {
                match next(10) {
                    0..=5 => {
                        let due = now + next(40);
                        closing.push(due, id);
                        whole.0.push_back((due, id));
                    }
                    6 | 7 => {
                        now += next(15);
                        loop {
                            let (a, b) = (closing.pop_due(now), whole.pop_due(now));
                            assert_eq!(a, b);
                            if a.is_none() {
                                break;
                            }
                        }
                    }
                    _ => {
                        closing.sort();
                        whole.sort();
                    }
                }
                assert!(
                    closing
                        .due
                        .iter()
                        .map(|(d, id)| (*d, *id))
                        .eq(whole.0.iter().copied())
                );
            }
        }
    }
}
