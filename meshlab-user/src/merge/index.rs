//! One node's recent kernel events, indexed by connection, direction and stream byte range, and
//! the stage lookups for a message `[start, end)`.
//!
//! Memory is bounded by time: every entry is evicted once it is older than the retention
//! (the `--window`) behind the node's stream frontier. Lookups for a TX message run a window
//! after its definition, lookups for an RX message right when it is defined (its events are in
//! the past), so each sees all of its events while they are still retained.

use std::collections::VecDeque;

use super::HashMap;

use crate::schema::{Direction, Hook};

use super::chain::{Point, RX_KERNEL, Stages, TX_KERNEL, tx_optional};
use super::event::{KEvent, RxContext, Stamp};
use super::reader::{ReaderTimeline, SchedEvent};
use super::segments::PointId;
use super::time::NodeTime;

/// `d.partition_point(pred)` (`pred` holds on a prefix), found by galloping in from both ends
/// before a binary search: lookups land near one end (an RX message's events are the newest,
/// a TX message's are looked up a window later, among the oldest), and a plain binary search
/// over a window of a connection's events missed the cache on most of its probes (perf:
/// `partition_point` about a quarter of the merge's CPU time on a real capture).
fn partition_point_from_ends<T>(d: &VecDeque<T>, pred: impl Fn(&T) -> bool) -> usize {
    // `pred` holds below `lo` and fails from `hi` on.
    let (mut lo, mut hi) = (0, d.len());
    let mut step = 1;
    while lo < hi {
        let back = hi - step.min(hi - lo);
        if pred(&d[back]) {
            lo = back + 1;
            break;
        }
        hi = back;
        if lo == hi {
            break;
        }
        let front = lo + step.min(hi - lo) - 1;
        if !pred(&d[front]) {
            hi = front;
            break;
        }
        lo = front + 1;
        step *= 2;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(&d[mid]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[derive(Clone, Debug)]
struct RangeEvent {
    end: u64,
    stamp: Stamp,
    /// The thread the event ran in (the reader, for the copy and the recv return).
    tid: u32,
    retrans: bool,
    rx: Option<Box<RxContext>>,
}

// An index entry, `(start, RangeEvent)`: see [`RangeIndex`] for why its size matters.
const _: () = assert!(std::mem::size_of::<(u64, RangeEvent)>() == 80);

/// Events keyed by the byte range they cover (`offset`, `offset + len`); several events may
/// share a start (a retransmission, a repeated tcp_sendmsg).
///
/// A deque sorted by start rather than a BTreeMap: a connection's offsets grow with time, so an
/// insert is almost always a push at the back and an eviction (oldest first) a pop at the
/// front, and a lookup is a binary search over contiguous entries. Out-of-order starts (a
/// retransmission's lower offset) are inserted in the middle, in start order still.
///
/// One deque, no second one in age order: the index holds every kernel event of a window and
/// its stores are most of what indexing costs (round 35 of docs/benchmarks-merge-ab.md), so an
/// entry is 80 bytes, not the 88 + 24 of a keyed entry plus an age-ordered key.
#[derive(Default)]
struct RangeIndex {
    /// Sorted by start; equal starts in insertion order.
    by_start: VecDeque<(u64, RangeEvent)>,
    max_len: u64,
    /// `by_start` is also in time order, so the oldest entries are at its front. False once
    /// an entry went in out of order (a retransmission, a late event) until an eviction
    /// finds the order restored.
    time_ordered: bool,
}

impl RangeIndex {
    fn insert(&mut self, start: u64, ev: RangeEvent) {
        self.max_len = self.max_len.max(ev.end - start);
        match self.by_start.back() {
            None => self.time_ordered = true,
            Some((s, last)) if *s <= start => {
                self.time_ordered &= last.stamp.ns() <= ev.stamp.ns();
            }
            Some(_) => {
                // After every entry with a start <= `start`: equal starts stay in arrival order.
                let at = partition_point_from_ends(&self.by_start, |(s, _)| *s <= start);
                self.by_start.insert(at, (start, ev));
                self.time_ordered = false;
                return;
            }
        }
        self.by_start.push_back((start, ev));
    }

    /// The entries whose start is in `[lo, hi]`, in start order.
    fn starting_within(&self, lo: u64, hi: u64) -> impl Iterator<Item = &RangeEvent> {
        let from = partition_point_from_ends(&self.by_start, |(s, _)| *s < lo);
        let within = self.by_start.range(from..);
        within.take_while(move |(s, _)| *s <= hi).map(|(_, ev)| ev)
    }

    /// The earliest first transmission covering `byte`, and whether a retransmission of it was
    /// seen. For pointer hooks (`end` = pointer, start = pointer) use [`Self::first_reaching`].
    fn covering(&self, byte: u64) -> (Option<&RangeEvent>, bool) {
        let lowest_start = byte.saturating_sub(self.max_len);
        let mut best: Option<&RangeEvent> = None;
        let mut retransmitted = false;
        for ev in self.starting_within(lowest_start, byte) {
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
        let mut range = self.starting_within(end, u64::MAX);
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

    /// Drops every entry older than `cutoff_ns`.
    fn evict_before(&mut self, cutoff_ns: u64) {
        let older = |(_, e): &(u64, RangeEvent)| e.stamp.ns() < cutoff_ns;
        if self.time_ordered {
            while self.by_start.front().is_some_and(older) {
                self.by_start.pop_front();
            }
        } else {
            self.by_start.retain(|e| !older(e));
            let times = self.by_start.iter().map(|(_, e)| e.stamp.ns());
            self.time_ordered = times.is_sorted();
        }
    }

    fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

/// The hooks whose events are indexed by byte range, each with its own [`RangeIndex`] per
/// connection and direction (a hook has one direction, so TX and RX hooks share slots).
const INDEXED_HOOKS: usize = 9;

fn slot(hook: Hook) -> Option<usize> {
    Some(match hook {
        Hook::TcpSendmsg | Hook::NetifReceiveSkb => 0,
        Hook::NetDevQueue | Hook::TcpProbe => 1,
        Hook::NetDevStartXmit | Hook::SkDataReady => 2,
        Hook::NetDevXmit | Hook::SkbCopyDatagram => 3,
        Hook::SendReturn | Hook::RecvReturn => 4,
        Hook::TxComplete => 5,
        Hook::TxTstampSched => 6,
        Hook::TxTstampSw => 7,
        Hook::TxTstampHw => 8,
        _ => return None,
    })
}

#[derive(Default)]
struct DirIndex {
    hooks: [RangeIndex; INDEXED_HOOKS],
}

impl DirIndex {
    /// The range index of `hook`'s events; `dir` is this index's direction, which must be
    /// the hook's (a TX and an RX hook share each slot).
    fn events(&self, dir: Direction, hook: Hook) -> Option<&RangeIndex> {
        debug_assert_eq!(hook.direction(), Some(dir), "{hook:?}");
        slot(hook).map(|slot| &self.hooks[slot])
    }
}

/// What the RX lookups found for one message, before it is laid out in chain order.
#[derive(Default)]
struct RxFound {
    /// The frame's arrival at the NIC (its hardware RX stamp on the node's clock).
    wire: Option<Stamp>,
    irq_entry: Option<Stamp>,
    softirq_raise: Option<Stamp>,
    softirq_entry: Option<Stamp>,
    irq_expected: bool,
    netif: Option<Stamp>,
    tcp: Option<Stamp>,
    ready: Option<Stamp>,
    wakeup: Option<Stamp>,
    switch_in: Option<Stamp>,
    copy: Option<Stamp>,
    ret: Option<Stamp>,
    /// The thread that took the data: the copy's, else the recv return's.
    reader_tid: Option<u32>,
    reader: Option<ReaderTimeline>,
}

impl RxFound {
    /// The found stamps as points in [`RX_KERNEL`] order.
    fn into_stages(self, retransmitted: bool, stale_context: bool) -> Stages {
        let points = RX_KERNEL
            .iter()
            .map(|&id| match id {
                PointId::RxTstampHw => point(id, self.wire, false),
                PointId::IrqEntry => point(id, self.irq_entry, self.irq_expected),
                PointId::SoftirqRaise => point(id, self.softirq_raise, false),
                PointId::SoftirqEntry => point(id, self.softirq_entry, false),
                PointId::NetifReceiveSkb => point(id, self.netif, true),
                PointId::TcpProbe => point(id, self.tcp, true),
                PointId::SkDataReady => point(id, self.ready, true),
                PointId::SchedWakeup => point(id, self.wakeup, false),
                PointId::SchedSwitch => point(id, self.switch_in, self.wakeup.is_some()),
                PointId::SkbCopyDatagram => point(id, self.copy, true),
                _ => point(id, self.ret, true),
            })
            .collect();
        Stages {
            points,
            retransmitted,
            stale_context,
            reader: self.reader,
            thread: self.reader_tid,
        }
    }

    /// Takes the IRQ/softirq times of the skb's CPU that are in path order before the skb;
    /// returns whether some were not (stale context).
    fn set_context(&mut self, rx: RxContext) -> bool {
        // A NIC frame whose CPU context has no NIC IRQ was found by a poll that no IRQ of
        // that CPU started (NAPI's re-poll while interrupts were off, a TX NAPI sharing the
        // softirq run, an RPS backlog): no IRQ is missing, and the raise and softirq entry
        // are not this frame's (the run may have begun before it arrived). Its chain starts
        // where the kernel first saw it, netif_receive_skb; the time before is the network's.
        let polled_without_irq = rx.irq_expected && rx.irq_entry_ns.is_none();
        self.irq_expected = rx.irq_expected && !polled_without_irq;
        let Some(mut node) = self.netif else {
            return false;
        };
        // The context is per CPU, not per skb: keep only times in path order before the skb
        // (walking back from it), so a later IRQ on that CPU is never taken for this skb's.
        let mut stale = false;
        let mut bound = node.ns();
        let mut in_order = |ns: Option<u64>| {
            let ns = ns?;
            if ns <= bound {
                bound = ns;
                Some(ns)
            } else {
                stale = true;
                None
            }
        };
        let softirq_entry = in_order(rx.softirq_entry_ns.filter(|_| !polled_without_irq));
        // Without a NIC IRQ (veth, loopback) NET_RX is raised by the sender's transmit
        // (netif_rx), not by this skb's arrival: that raise is not a receive stage.
        let softirq_raise = in_order(rx.softirq_raise_ns.filter(|_| self.irq_expected));
        let irq_entry = in_order(rx.irq_entry_ns);
        // The NIC stamped the frame before anything of the kernel saw it.
        let wire = rx.wire.filter(|w| in_order(Some(w.ns)).is_some());
        // The context's IRQ (and so the RX queue) is this skb's only when its entry time is.
        if irq_entry.is_none() {
            node.place = node.place.without_irq();
            self.netif = Some(node);
        }
        let at = |ns: Option<u64>| {
            ns.map(|ns| Stamp {
                time: NodeTime::new(node.time.node(), ns),
                ..node
            })
        };
        self.softirq_entry = at(softirq_entry);
        self.softirq_raise = at(softirq_raise);
        self.irq_entry = at(irq_entry);
        self.wire = wire.map(|w| Stamp {
            time: NodeTime::new(node.time.node(), w.ns),
            error_ns: w.error_ns,
            sample: w.sample,
            ..node
        });
        stale
    }
}

fn point(id: PointId, stamp: Option<Stamp>, expected: bool) -> Point {
    Point {
        id,
        stamp,
        expected,
        owner: 0,
    }
}

/// Events of one kind in arrival order, which is node time order unless an event came later
/// than the reorder window allows; lookups binary-search while it is in order (a busy
/// connection or thread holds a whole window of them) and scan otherwise.
struct TimeQueue<T> {
    entries: VecDeque<T>,
    in_order: bool,
}

impl<T> Default for TimeQueue<T> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            in_order: true,
        }
    }
}

impl<T: Copy> TimeQueue<T> {
    fn push(&mut self, entry: T, ns: impl Fn(&T) -> u64) {
        if self
            .entries
            .back()
            .is_some_and(|last| ns(last) > ns(&entry))
        {
            self.in_order = false;
        }
        self.entries.push_back(entry);
    }

    fn evict_before(&mut self, cutoff_ns: u64, ns: impl Fn(&T) -> u64) {
        while self.entries.front().is_some_and(|e| ns(e) < cutoff_ns) {
            self.entries.pop_front();
        }
        if self.entries.is_empty() {
            self.in_order = true;
        }
    }

    /// The first entry in arrival order whose time is in `[lo, hi]` and that `pick` accepts.
    fn first_within(
        &self,
        lo: u64,
        hi: u64,
        ns: impl Fn(&T) -> u64,
        pick: impl Fn(&T) -> bool,
    ) -> Option<T> {
        let from = if self.in_order {
            partition_point_from_ends(&self.entries, |e| ns(e) < lo)
        } else {
            0
        };
        let mut range = self.entries.range(from..);
        if self.in_order {
            range.take_while(|e| ns(e) <= hi).find(|e| pick(e)).copied()
        } else {
            range
                .find(|e| ns(e) >= lo && ns(e) <= hi && pick(e))
                .copied()
        }
    }

    /// The entries whose time is in `[lo, hi]` in time order, and the latest one before `lo`.
    fn around(&self, lo: u64, hi: u64, ns: impl Fn(&T) -> u64) -> (Option<T>, Vec<T>) {
        if self.in_order {
            let from = partition_point_from_ends(&self.entries, |e| ns(e) < lo);
            let to = partition_point_from_ends(&self.entries, |e| ns(e) <= hi).max(from);
            let before = from.checked_sub(1).and_then(|i| self.entries.get(i));
            let within = self.entries.range(from..to).copied().collect();
            return (before.copied(), within);
        }
        let before = self.entries.iter().filter(|e| ns(e) < lo);
        let before = before.max_by_key(|e| ns(e)).copied();
        let mut within: Vec<T> = self
            .entries
            .iter()
            .copied()
            .filter(|e| ns(e) >= lo)
            .collect();
        within.retain(|e| ns(e) <= hi);
        within.sort_by_key(|e| ns(e));
        (before, within)
    }
}

fn wakeup_ns(w: &(Stamp, u32)) -> u64 {
    w.0.ns()
}

fn sched_ns(s: &(Stamp, SchedEvent)) -> u64 {
    s.0.ns()
}

#[derive(Default)]
pub struct NodeIndex {
    dirs: HashMap<(u64, Direction), DirIndex>,
    wakeups: HashMap<u64, TimeQueue<(Stamp, u32)>>,
    /// Per thread: its switches (in, and out with prev_state) and wake-ups.
    threads: HashMap<u32, TimeQueue<(Stamp, SchedEvent)>>,
}

impl NodeIndex {
    pub fn insert(&mut self, ev: &KEvent) {
        match ev.hook {
            Hook::SchedWakeup => {
                if let Some(cookie) = ev.cookie {
                    self.wakeups
                        .entry(cookie)
                        .or_default()
                        .push((ev.stamp, ev.tid), wakeup_ns);
                }
                self.thread_event(ev, SchedEvent::Woken);
            }
            Hook::SchedSwitch => match ev.value {
                Some(1) => self.thread_event(ev, SchedEvent::On),
                Some(0) => self.thread_event(ev, SchedEvent::off(ev.extra.aux())),
                _ => {}
            },
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
                        tid: ev.tid,
                        retrans: ev.retrans,
                        rx: ev.extra.rx().map(|rx| Box::new(*rx)),
                    },
                );
            }
        }
    }

    fn thread_event(&mut self, ev: &KEvent, what: SchedEvent) {
        self.threads
            .entry(ev.tid)
            .or_default()
            .push((ev.stamp, what), sched_ns);
    }

    /// Drops everything older than `cutoff_ns` (node time).
    pub fn evict_before(&mut self, cutoff_ns: u64) {
        self.dirs.retain(|_, d| {
            d.hooks.iter_mut().for_each(|h| h.evict_before(cutoff_ns));
            d.hooks.iter().any(|h| !h.is_empty())
        });
        self.wakeups.retain(|_, q| {
            q.evict_before(cutoff_ns, wakeup_ns);
            !q.entries.is_empty()
        });
        self.threads.retain(|_, q| {
            q.evict_before(cutoff_ns, sched_ns);
            !q.entries.is_empty()
        });
    }

    /// The range indexes of `cookie`'s events in direction `dir`: looked up once per message,
    /// then per hook by [`DirIndex::events`].
    fn dir(&self, cookie: u64, dir: Direction) -> Option<&DirIndex> {
        self.dirs.get(&(cookie, dir))
    }

    /// TX stages of `[start, end)`: tcp_sendmsg of the call that copied `start`, and the device
    /// stages of the first transmission of the skb carrying byte `end - 1`.
    pub fn tx_stages(&self, cookie: u64, start: u64, end: u64) -> Stages {
        let mut out = Stages::default();
        out.points.reserve_exact(TX_KERNEL.len());
        let last = end.saturating_sub(1);
        let tx = self.dir(cookie, Direction::Tx);
        let events = |hook| tx.and_then(|d| d.events(Direction::Tx, hook));
        for id in TX_KERNEL {
            let (ev, retrans) = match id {
                PointId::TcpSendmsg => {
                    let call = events(Hook::TcpSendmsg).and_then(|h| h.covering(start).0);
                    out.thread = call.map(|e| e.tid);
                    (call, false)
                }
                PointId::SendReturn => (
                    events(Hook::SendReturn).and_then(|h| h.first_reaching(end)),
                    false,
                ),
                _ => events(tx_device_hook(id)).map_or((None, false), |h| h.covering(last)),
            };
            out.retransmitted |= retrans;
            // Only a NIC's TX skbs are reclaimed as completions (not veth's, not lo's).
            let expected = !tx_optional(id);
            out.points.push(point(id, ev.map(|e| e.stamp), expected));
        }
        drop_send_return_before_departure(&mut out.points);
        out
    }

    /// RX stages of a message ending at `end`: the skb carrying its last byte from the IRQ to the
    /// copy, the wake-up its queueing caused (if the reader slept) and the recv return.
    pub fn rx_stages(&self, cookie: u64, end: u64) -> Stages {
        let last = end.saturating_sub(1);
        let rx = self.dir(cookie, Direction::Rx);
        let events = |hook| rx.and_then(|d| d.events(Direction::Rx, hook));
        let (netif, retransmitted) =
            events(Hook::NetifReceiveSkb).map_or((None, false), |h| h.covering(last));
        let covering = |hook| events(hook).and_then(|h| h.covering(last).0);
        let reaching = |hook| events(hook).and_then(|h| h.first_reaching(end));
        let copy = covering(Hook::SkbCopyDatagram);
        let ret = reaching(Hook::RecvReturn);
        let mut found = RxFound {
            netif: netif.map(|e| e.stamp),
            tcp: covering(Hook::TcpProbe).map(|e| e.stamp),
            ready: reaching(Hook::SkDataReady).map(|e| e.stamp),
            copy: copy.map(|e| e.stamp),
            ret: ret.map(|e| e.stamp),
            reader_tid: copy.or(ret).map(|e| e.tid),
            ..RxFound::default()
        };
        let context = netif.and_then(|e| e.rx.as_deref().copied());
        let stale_context = found.set_context(context.unwrap_or_default());
        self.find_wakeup(cookie, &mut found);
        self.find_reader_states(&mut found);
        found.into_stages(retransmitted, stale_context)
    }

    /// Data queued without waking its reader (no wake-up between queueing and the copy): the
    /// reader thread's states from the queueing to the copy, which split `rx_socket_queue`.
    fn find_reader_states(&self, found: &mut RxFound) {
        let (Some(ready), Some(tid), None) = (found.ready, found.reader_tid, found.wakeup) else {
            return;
        };
        let Some(hi) = found.copy.or(found.ret) else {
            return;
        };
        found.reader = Some(self.thread_timeline(tid, ready.ns(), hi.ns()));
    }

    /// Thread `tid`'s scheduler states over `[lo, hi]` (it runs at `hi`), from its events in
    /// that range and its last one before.
    fn thread_timeline(&self, tid: u32, lo: u64, hi: u64) -> ReaderTimeline {
        let (before, events) = self
            .threads
            .get(&tid)
            .map_or((None, Vec::new()), |q| q.around(lo, hi, sched_ns));
        let events: Vec<(u64, SchedEvent)> = events.iter().map(|(s, e)| (s.ns(), *e)).collect();
        ReaderTimeline::build(lo, before.map(|b| b.1), &events)
    }

    /// The scheduler states of the one thread that made both the TX and the RX syscalls of a
    /// half (`(tx, rx)`: their [`Stages::thread`]), over the span of the half's `chains` of
    /// points; none when the two were made by different threads (or either is unknown): a
    /// span handed between threads has no one thread whose state would tell.
    pub fn half_thread(
        &self,
        (tx, rx): (Option<u32>, Option<u32>),
        chains: &[&[Point]],
    ) -> Option<ReaderTimeline> {
        let tid = tx.filter(|t| rx == Some(*t))?;
        let points = chains.iter().flat_map(|c| c.iter());
        let ns = points.filter_map(|p| p.stamp.map(|s| s.ns()));
        let (lo, hi) = ns.fold(None, |acc: Option<(u64, u64)>, n| {
            Some(acc.map_or((n, n), |(lo, hi)| (lo.min(n), hi.max(n))))
        })?;
        Some(self.thread_timeline(tid, lo, hi))
    }

    /// The wake-up the data caused, if the reader was asleep: between queueing and copying,
    /// and the switch onto the woken thread after it. Both bounds must be observed (a lost
    /// event must not open the search to stale wake-ups of earlier messages).
    fn find_wakeup(&self, cookie: u64, found: &mut RxFound) {
        let lo = found.ready.or(found.tcp).or(found.netif).map(|s| s.ns());
        let hi = found.copy.or(found.ret).map(|s| s.ns());
        let wakeup = lo.zip(hi).and_then(|(lo, hi)| {
            self.wakeups
                .get(&cookie)
                .and_then(|q| q.first_within(lo, hi, wakeup_ns, |_| true))
        });
        let hi = hi.unwrap_or(0);
        let switch_in = |e: &(Stamp, SchedEvent)| e.1 == SchedEvent::On;
        found.switch_in = wakeup.and_then(|(w, tid)| {
            self.threads
                .get(&tid)
                .and_then(|q| q.first_within(w.ns(), hi, sched_ns, switch_in))
                .map(|(s, _)| s)
        });
        found.wakeup = wakeup.map(|(s, _)| s);
    }
}

/// The send return splits a message's TX path only when its last byte left after the call
/// returned (it waited in the send queue: the peer's window, the congestion window): it must
/// come before the next observed stage. A call that returned after its data left (the usual
/// small message, sent inside the call) or without any later stage observed is not a point.
fn drop_send_return_before_departure(points: &mut [Point]) {
    let Some(at) = points.iter().position(|p| p.id == PointId::SendReturn) else {
        return;
    };
    let next = points[at + 1..].iter().find_map(|p| p.stamp);
    let ret = &mut points[at].stamp;
    if ret.zip(next).is_none_or(|(r, n)| r.ns() >= n.ns()) {
        *ret = None;
    }
}

/// The hook whose event marks a TX device stage (tcp_sendmsg is looked up by its first byte).
fn tx_device_hook(id: PointId) -> Hook {
    match id {
        PointId::NetDevQueue => Hook::NetDevQueue,
        PointId::NetDevStartXmit => Hook::NetDevStartXmit,
        PointId::TxComplete => Hook::TxComplete,
        PointId::TxTstampSched => Hook::TxTstampSched,
        PointId::TxTstampSw => Hook::TxTstampSw,
        PointId::TxTstampHw => Hook::TxTstampHw,
        _ => Hook::NetDevXmit,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::event::Origin;
    use super::*;

    /// The index as it was, a BTreeMap keyed by `(start, seq)`: what the deque must answer.
    /// Its eviction is the definition: every entry older than the cutoff, and no other.
    #[derive(Default)]
    struct Reference {
        by_start: BTreeMap<(u64, u64), RangeEvent>,
        max_len: u64,
        seq: u64,
    }

    impl Reference {
        fn insert(&mut self, start: u64, ev: RangeEvent) {
            self.seq += 1;
            let key = (start, self.seq);
            self.max_len = self.max_len.max(ev.end - start);
            self.by_start.insert(key, ev);
        }

        fn covering(&self, byte: u64) -> (Option<u32>, bool) {
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
            (best.map(|e| e.tid), retransmitted)
        }

        fn first_reaching(&self, end: u64) -> Option<u32> {
            let mut range = self.by_start.range((end, 0)..).map(|(_, ev)| ev);
            let first = range.next()?;
            let earliest = (range.take_while(|ev| ev.end == first.end)).fold(first, |a, b| {
                if b.stamp.ns() < a.stamp.ns() { b } else { a }
            });
            Some(earliest.tid)
        }

        fn evict_before(&mut self, cutoff_ns: u64) {
            self.by_start.retain(|_, ev| ev.stamp.ns() >= cutoff_ns);
        }
    }

    fn event(end: u64, ns: u64, tid: u32, retrans: bool) -> RangeEvent {
        let stamp = Stamp {
            time: NodeTime::new(super::super::time::NodeId(0), ns),
            error_ns: 0,
            sample: u32::MAX,
            origin: Origin { file: 0, line: 0 },
            place: Default::default(),
        };
        RangeEvent {
            end,
            stamp,
            tid,
            retrans,
            rx: None,
        }
    }

    /// A small deterministic generator (xorshift64): no dependency, the same run every time.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Sorted deques of every length up to 70 (some wrapped around their buffer, with
    /// repeated values), every threshold from below the least to above the greatest: the
    /// gallop from both ends finds the index `VecDeque::partition_point` finds.
    #[test]
    fn partition_point_from_ends_is_partition_point() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for len in 0..70u64 {
            let mut d: VecDeque<u64> = VecDeque::with_capacity(8);
            for _ in 0..rng.below(20) {
                d.push_back(0);
                d.pop_front(); // the head moves on: pushes below wrap around
            }
            let mut v = 0;
            for _ in 0..len {
                v += rng.below(3);
                d.push_back(v);
            }
            for t in 0..=v + 2 {
                for pred in [&(|x: &u64| *x < t) as &dyn Fn(&u64) -> bool, &|x: &u64| {
                    *x <= t
                }] {
                    let want = d.partition_point(pred);
                    assert_eq!(partition_point_from_ends(&d, pred), want, "{d:?} {t}");
                }
            }
        }
    }

    /// Mostly growing offsets and times, with retransmissions of lower offsets, repeated
    /// starts, zero-length (pointer) events, times out of order and evictions in between:
    /// every lookup of the deque answers what the BTreeMap answered.
    #[test]
    fn deque_index_answers_what_the_btreemap_answered() {
        for seed in 1..40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (mut new, mut old) = (RangeIndex::default(), Reference::default());
            let (mut offset, mut ns) = (0u64, 1_000u64);
            for tid in 0..400u32 {
                let start = match rng.below(8) {
                    0 => offset.saturating_sub(rng.below(40)),
                    1 => offset,
                    _ => offset + rng.below(3),
                };
                let end = start + [0, 1, 10, 25][rng.below(4) as usize];
                offset = offset.max(end);
                ns = (ns + rng.below(50)).saturating_sub(rng.below(8));
                let retrans = rng.below(6) == 0;
                new.insert(start, event(end, ns, tid, retrans));
                old.insert(start, event(end, ns, tid, retrans));
                if rng.below(10) == 0 {
                    let cutoff = ns.saturating_sub(rng.below(600));
                    new.evict_before(cutoff);
                    old.evict_before(cutoff);
                }
                for byte in offset.saturating_sub(60)..=offset + 2 {
                    let (best, retransmitted) = new.covering(byte);
                    assert_eq!((best.map(|e| e.tid), retransmitted), old.covering(byte));
                    let first = new.first_reaching(byte).map(|e| e.tid);
                    assert_eq!(first, old.first_reaching(byte), "seed {seed} byte {byte}");
                }
                assert_eq!(new.is_empty(), old.by_start.is_empty());
            }
        }
    }
}
