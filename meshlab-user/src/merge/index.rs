//! One node's recent kernel events, indexed by connection, direction and stream byte range, and
//! the stage lookups for a message `[start, end)`.
//!
//! Memory is bounded by time: every entry is evicted once it is older than the retention
//! (the `--window`) behind the node's stream frontier. Lookups for a TX message run a window
//! after its definition, lookups for an RX message right when it is defined (its events are in
//! the past), so each sees all of its events while they are still retained.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::schema::Direction;

use super::event::{Hook, KEvent, RxContext, Stamp};
use super::segments::PointId;

#[derive(Clone, Debug)]
struct RangeEvent {
    end: u64,
    stamp: Stamp,
    retrans: bool,
    rx: Option<Box<RxContext>>,
}

/// Events keyed by the byte range they cover (`offset`, `offset + len`); several events may
/// share a start (a retransmission, a repeated tcp_sendmsg).
#[derive(Default)]
struct RangeIndex {
    by_start: BTreeMap<(u64, u64), RangeEvent>,
    by_age: VecDeque<(u64, (u64, u64))>,
    max_len: u64,
    seq: u64,
}

impl RangeIndex {
    fn insert(&mut self, start: u64, ev: RangeEvent) {
        self.seq += 1;
        let key = (start, self.seq);
        self.max_len = self.max_len.max(ev.end - start);
        self.by_age.push_back((ev.stamp.ns(), key));
        self.by_start.insert(key, ev);
    }

    /// The earliest first transmission covering `byte`, and whether a retransmission of it was
    /// seen. For pointer hooks (`end` = pointer, start = pointer) use [`Self::first_reaching`].
    fn covering(&self, byte: u64) -> (Option<&RangeEvent>, bool) {
        let lowest_start = byte.saturating_sub(self.max_len);
        let mut best: Option<&RangeEvent> = None;
        let mut retransmitted = false;
        for (_, ev) in self.by_start.range((lowest_start, 0)..=(byte, u64::MAX)) {
            if ev.end <= byte {
                continue;
            }
            if ev.retrans {
                retransmitted = true;
            } else if best.is_none_or(|b| ev.stamp.ns() < b.stamp.ns()) {
                best = Some(ev);
            }
        }
        (best, retransmitted)
    }

    /// The earliest event whose pointer reached `end` (data queued / read / written up to it).
    fn first_reaching(&self, end: u64) -> Option<&RangeEvent> {
        let mut range = self.by_start.range((end, 0)..).map(|(_, ev)| ev);
        let first = range.next()?;
        // Pointers grow with time; equal pointers (a repeated event) keep the earliest.
        Some(
            range
                .take_while(|ev| ev.end == first.end)
                .fold(
                    first,
                    |a, b| if b.stamp.ns() < a.stamp.ns() { b } else { a },
                ),
        )
    }

    fn evict_before(&mut self, cutoff_ns: u64) {
        while let Some(&(ts, key)) = self.by_age.front() {
            if ts >= cutoff_ns {
                break;
            }
            self.by_age.pop_front();
            self.by_start.remove(&key);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

const HOOK_SLOTS: usize = 8;

fn slot(hook: Hook) -> Option<usize> {
    Some(match hook {
        Hook::TcpSendmsg | Hook::NetifReceiveSkb => 0,
        Hook::NetDevQueue | Hook::TcpProbe => 1,
        Hook::NetDevStartXmit | Hook::SkDataReady => 2,
        Hook::NetDevXmit | Hook::SkbCopyDatagram => 3,
        Hook::SendReturn | Hook::RecvReturn => 4,
        _ => return None,
    })
}

#[derive(Default)]
struct DirIndex {
    hooks: [RangeIndex; HOOK_SLOTS],
}

/// A stage point found for a message (or not), and whether it had to be observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub id: PointId,
    pub stamp: Option<Stamp>,
    /// Not observed and expected => listed as missing. Optional stages (no IRQ on veth, no
    /// wake-up because the reader was running) are not expected.
    pub expected: bool,
}

impl Point {
    pub fn seen(id: PointId, stamp: Option<Stamp>) -> Point {
        Point {
            id,
            stamp,
            expected: true,
        }
    }
}

/// Stage points of one message plus notes (retransmissions).
#[derive(Debug, Default)]
pub struct Stages {
    pub points: Vec<Point>,
    pub retransmitted: bool,
    /// IRQ/softirq context times of the RX skb's CPU that contradict the skb's order (a later
    /// interrupt on that CPU overwrote them) and were therefore not used.
    pub stale_context: bool,
}

#[derive(Default)]
pub struct NodeIndex {
    dirs: HashMap<(u64, Direction), DirIndex>,
    wakeups: HashMap<u64, VecDeque<(Stamp, u32)>>,
    switch_ins: HashMap<u32, VecDeque<Stamp>>,
}

impl NodeIndex {
    pub fn insert(&mut self, ev: &KEvent) {
        match ev.hook {
            Hook::SchedWakeup => {
                if let Some(cookie) = ev.cookie {
                    self.wakeups
                        .entry(cookie)
                        .or_default()
                        .push_back((ev.stamp, ev.tid));
                }
            }
            Hook::SchedSwitch => {
                if ev.value == Some(1) {
                    self.switch_ins
                        .entry(ev.tid)
                        .or_default()
                        .push_back(ev.stamp);
                }
            }
            hook => {
                let (Some(slot), Some(cookie), Some(dir), Some(offset)) =
                    (slot(hook), ev.cookie, ev.dir, ev.offset)
                else {
                    return;
                };
                let (start, end) = if hook.is_pointer() {
                    (offset, offset)
                } else {
                    (offset, offset + ev.len)
                };
                self.dirs.entry((cookie, dir)).or_default().hooks[slot].insert(
                    start,
                    RangeEvent {
                        end,
                        stamp: ev.stamp,
                        retrans: ev.retrans,
                        rx: ev.rx.clone(),
                    },
                );
            }
        }
    }

    /// Drops everything older than `cutoff_ns` (node time).
    pub fn evict_before(&mut self, cutoff_ns: u64) {
        self.dirs.retain(|_, d| {
            d.hooks.iter_mut().for_each(|h| h.evict_before(cutoff_ns));
            d.hooks.iter().any(|h| !h.is_empty())
        });
        self.wakeups.retain(|_, q| {
            while q.front().is_some_and(|(s, _)| s.ns() < cutoff_ns) {
                q.pop_front();
            }
            !q.is_empty()
        });
        self.switch_ins.retain(|_, q| {
            while q.front().is_some_and(|s| s.ns() < cutoff_ns) {
                q.pop_front();
            }
            !q.is_empty()
        });
    }

    fn hook(&self, cookie: u64, dir: Direction, slot: usize) -> Option<&RangeIndex> {
        self.dirs.get(&(cookie, dir)).map(|d| &d.hooks[slot])
    }

    /// TX stages of `[start, end)`: tcp_sendmsg of the call that copied `start`, and the device
    /// stages of the first transmission of the skb carrying byte `end - 1`.
    pub fn tx_stages(&self, cookie: u64, start: u64, end: u64) -> Stages {
        let mut out = Stages::default();
        let last = end.saturating_sub(1);
        let sendmsg = self
            .hook(cookie, Direction::Tx, 0)
            .and_then(|h| h.covering(start).0);
        out.points
            .push(Point::seen(PointId::TcpSendmsg, sendmsg.map(|e| e.stamp)));
        for (slot, id) in [
            (1, PointId::NetDevQueue),
            (2, PointId::NetDevStartXmit),
            (3, PointId::NetDevXmit),
        ] {
            let (ev, retrans) = self
                .hook(cookie, Direction::Tx, slot)
                .map_or((None, false), |h| h.covering(last));
            out.retransmitted |= retrans;
            out.points.push(Point::seen(id, ev.map(|e| e.stamp)));
        }
        out
    }

    /// RX stages of a message ending at `end`: the skb carrying its last byte from the IRQ to the
    /// copy, the wake-up its queueing caused (if the reader slept) and the recv return.
    pub fn rx_stages(&self, cookie: u64, end: u64) -> Stages {
        let mut out = Stages::default();
        let last = end.saturating_sub(1);
        let (netif, retrans) = self
            .hook(cookie, Direction::Rx, 0)
            .map_or((None, false), |h| h.covering(last));
        out.retransmitted = retrans;
        let rx = netif
            .and_then(|e| e.rx.as_deref().copied())
            .unwrap_or_default();
        let node = netif.map(|e| e.stamp);
        let ctx_point = |id, ns: Option<u64>, expected| Point {
            id,
            stamp: node.zip(ns).map(|(s, ns)| Stamp {
                time: super::time::NodeTime::new(s.time.node(), ns),
                ..s
            }),
            expected,
        };
        // The context is per CPU, not per skb: keep only times in path order before the skb
        // (walking back from it), so a later IRQ on that CPU is never taken for this skb's.
        let mut bound = node.map_or(u64::MAX, |s| s.ns());
        let mut in_order = |ns: Option<u64>| {
            let ns = ns?;
            if ns <= bound {
                bound = ns;
                Some(ns)
            } else {
                out.stale_context = true;
                None
            }
        };
        let softirq_entry = in_order(rx.softirq_entry_ns);
        // Without a NIC IRQ (veth, loopback) NET_RX is raised by the sender's transmit
        // (netif_rx), not by this skb's arrival: that raise is not a receive stage.
        let softirq_raise = in_order(rx.softirq_raise_ns.filter(|_| rx.irq_expected));
        let irq_entry = in_order(rx.irq_entry_ns);
        out.points.extend([
            ctx_point(PointId::IrqEntry, irq_entry, rx.irq_expected),
            ctx_point(PointId::SoftirqRaise, softirq_raise, false),
            ctx_point(PointId::SoftirqEntry, softirq_entry, false),
            Point::seen(PointId::NetifReceiveSkb, node),
        ]);
        let tcp = self
            .hook(cookie, Direction::Rx, 1)
            .and_then(|h| h.covering(last).0);
        out.points
            .push(Point::seen(PointId::TcpProbe, tcp.map(|e| e.stamp)));
        let ready = self
            .hook(cookie, Direction::Rx, 2)
            .and_then(|h| h.first_reaching(end));
        out.points
            .push(Point::seen(PointId::SkDataReady, ready.map(|e| e.stamp)));
        let copy = self
            .hook(cookie, Direction::Rx, 3)
            .and_then(|h| h.covering(last).0);
        let ret = self
            .hook(cookie, Direction::Rx, 4)
            .and_then(|h| h.first_reaching(end));
        // The wake-up the data caused, if the reader was asleep: between queueing and copying.
        // Both bounds must be observed (a lost event must not open the search to stale
        // wake-ups of earlier messages).
        let lo = ready.or(tcp).or(netif).map(|e| e.stamp.ns());
        let hi = copy.or(ret).map(|e| e.stamp.ns());
        let wakeup = lo.zip(hi).and_then(|(lo, hi)| {
            self.wakeups.get(&cookie).and_then(|q| {
                q.iter()
                    .find(|(s, _)| s.ns() >= lo && s.ns() <= hi)
                    .copied()
            })
        });
        let hi = hi.unwrap_or(0);
        let switch_in = wakeup.and_then(|(w, tid)| {
            self.switch_ins
                .get(&tid)
                .and_then(|q| q.iter().find(|s| s.ns() >= w.ns() && s.ns() <= hi).copied())
        });
        out.points.extend([
            Point {
                id: PointId::SchedWakeup,
                stamp: wakeup.map(|(s, _)| s),
                expected: false,
            },
            Point {
                id: PointId::SchedSwitch,
                stamp: switch_in,
                expected: wakeup.is_some(),
            },
            Point::seen(PointId::SkbCopyDatagram, copy.map(|e| e.stamp)),
        ]);
        out.points
            .push(Point::seen(PointId::RecvReturn, ret.map(|e| e.stamp)));
        out
    }
}
