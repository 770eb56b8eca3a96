//! One node's recent kernel events, indexed by connection, direction and stream byte range, and
//! the stage lookups for a message `[start, end)`.
//!
//! Memory is bounded by time: every entry is evicted once it is older than the retention
//! (the `--window`) behind the node's stream frontier. Lookups for a TX message run a window
//! after its definition, lookups for an RX message right when it is defined (its events are in
//! the past), so each sees all of its events while they are still retained.

use super::HashMap;
use super::chunked::{ChunkedDeque, Keyed};

use crate::schema::{Direction, Hook};

use super::chain::{Point, RX_KERNEL, Stages, TX_KERNEL, tx_optional};
use super::event::{KEvent, Origin, Place, RxContext, Stamp};
use super::reader::{ReaderTimeline, SchedEvent};
use super::segments::PointId;
use super::time::{NodeId, NodeTime};

/// An indexed kernel event and the byte range `[start, start + len)` it covers (`len` 0 for a
/// pointer hook). Its [`Stamp`] is kept in parts, with what few events carry (a receive
/// context; a NIC-clock time's error and clock sample) boxed: 64 bytes where the `Stamp` and
/// the other fields whole took 80. The index holds every kernel event of a window, so the
/// size is most of the merge's memory ([`RangeIndex`]).
#[derive(Clone, Debug)]
struct RangeEvent {
    start: u64,
    ns: u64,
    line: u64,
    place: Place,
    rare: Option<Box<RareFields>>,
    len: u32,
    /// The thread the event ran in (the reader, for the copy and the recv return).
    tid: u32,
    node: NodeId,
    file: u16,
    retrans: bool,
}

const _: () = assert!(std::mem::size_of::<RangeEvent>() == 64);

impl Keyed for RangeEvent {
    fn key(&self) -> u64 {
        self.start
    }
}

/// Scheduler and wake-up events are kept in time order, by their stamp.
impl<T> Keyed for (Stamp, T) {
    fn key(&self) -> u64 {
        self.0.ns()
    }
}

/// The fields of a [`RangeEvent`] that only some events carry.
#[derive(Clone, Debug)]
struct RareFields {
    rx: Option<RxContext>,
    error_ns: u64,
    sample: u32,
}

impl RangeEvent {
    /// `ev` covering `[start, start + len)`.
    fn new(ev: &KEvent, start: u64, len: u32) -> RangeEvent {
        let Stamp {
            time,
            error_ns,
            sample,
            origin,
            place,
        } = ev.stamp;
        let rx = ev.extra.rx().copied();
        let rare = (rx.is_some() || error_ns != 0 || sample != u32::MAX).then(|| {
            Box::new(RareFields {
                rx,
                error_ns,
                sample,
            })
        });
        RangeEvent {
            start,
            ns: time.absolute_ns(),
            line: origin.line,
            place,
            rare,
            len,
            tid: ev.tid,
            node: time.node(),
            file: origin.file,
            retrans: ev.retrans,
        }
    }

    fn end(&self) -> u64 {
        self.start + u64::from(self.len)
    }

    fn stamp(&self) -> Stamp {
        let rare = self.rare.as_deref();
        Stamp {
            time: NodeTime::new(self.node, self.ns),
            error_ns: rare.map_or(0, |r| r.error_ns),
            sample: rare.map_or(u32::MAX, |r| r.sample),
            origin: Origin {
                file: self.file,
                line: self.line,
            },
            place: self.place,
        }
    }

    fn rx(&self) -> Option<RxContext> {
        self.rare.as_deref().and_then(|r| r.rx)
    }
}

/// Events keyed by the byte range they cover (`offset`, `offset + len`); several events may
/// share a start (a retransmission, a repeated tcp_sendmsg).
///
/// A deque sorted by start rather than a BTreeMap: a connection's offsets grow with time, so an
/// insert is almost always a push at the back and an eviction (oldest first) a pop at the
/// front, and a lookup is a binary search over chunks of contiguous entries. Out-of-order
/// starts (a retransmission's lower offset) are inserted in the middle, in start order still.
///
/// One deque, no second one in age order: the index holds every kernel event of a window and
/// its stores are most of what indexing costs (round 35 of docs/benchmarks-merge-ab.md), so an
/// entry is 64 bytes, not 64 + 24 for an age-ordered key too.
#[derive(Default)]
struct RangeIndex {
    /// Sorted by start; equal starts in insertion order.
    by_start: ChunkedDeque<RangeEvent>,
    max_len: u64,
    /// `by_start` is also in time order, so the oldest entries are at its front. False once
    /// an entry went in out of order (a retransmission, a late event) until an eviction
    /// finds the order restored.
    time_ordered: bool,
}

impl RangeIndex {
    fn insert(&mut self, ev: RangeEvent) {
        self.max_len = self.max_len.max(u64::from(ev.len));
        match self.by_start.back() {
            None => self.time_ordered = true,
            Some(last) if last.start <= ev.start => self.time_ordered &= last.ns <= ev.ns,
            Some(_) => {
                // After every entry with a start <= `start`: equal starts stay in arrival order.
                let at = self.by_start.partition_point(|start| start <= ev.start);
                self.by_start.insert(at, ev);
                self.time_ordered = false;
                return;
            }
        }
        self.by_start.push_back(ev);
    }

    /// The entries whose start is in `[lo, hi]`, in start order.
    fn starting_within(&self, lo: u64, hi: u64) -> impl Iterator<Item = &RangeEvent> {
        let from = self.by_start.partition_point(|start| start < lo);
        let within = self.by_start.iter_from(from);
        within.take_while(move |e| e.start <= hi)
    }

    /// The earliest first transmission covering `byte`, and whether a retransmission of it was
    /// seen. For pointer hooks (`end` = pointer, start = pointer) use [`Self::first_reaching`].
    fn covering(&self, byte: u64) -> (Option<&RangeEvent>, bool) {
        let lowest_start = byte.saturating_sub(self.max_len);
        let mut best: Option<&RangeEvent> = None;
        let mut retransmitted = false;
        for ev in self.starting_within(lowest_start, byte) {
            if ev.end() <= byte {
                continue;
            }
            if ev.retrans {
                retransmitted = true;
            } else if best.is_none_or(|b| ev.ns < b.ns) {
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
        let repeated = range.take_while(|ev| ev.end() == first.end());
        Some(repeated.fold(first, |a, b| if b.ns < a.ns { b } else { a }))
    }

    /// Drops every entry older than `cutoff_ns`.
    fn evict_before(&mut self, cutoff_ns: u64) {
        let older = |e: &RangeEvent| e.ns < cutoff_ns;
        if self.time_ordered {
            while self.by_start.front().is_some_and(older) {
                self.by_start.pop_front();
            }
        } else {
            self.by_start.retain(|e| !older(e));
            let times = self.by_start.iter().map(|e| e.ns);
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
    entries: ChunkedDeque<T>,
    in_order: bool,
}

impl<T> Default for TimeQueue<T> {
    fn default() -> Self {
        Self {
            entries: ChunkedDeque::default(),
            in_order: true,
        }
    }
}

impl<T: Copy + Keyed> TimeQueue<T> {
    fn push(&mut self, entry: T) {
        if self
            .entries
            .back()
            .is_some_and(|last| last.key() > entry.key())
        {
            self.in_order = false;
        }
        self.entries.push_back(entry);
    }

    fn evict_before(&mut self, cutoff_ns: u64) {
        while self.entries.front().is_some_and(|e| e.key() < cutoff_ns) {
            self.entries.pop_front();
        }
        if self.entries.is_empty() {
            self.in_order = true;
        }
    }

    /// The first entry in arrival order whose time is in `[lo, hi]` and that `pick` accepts.
    fn first_within(&self, lo: u64, hi: u64, pick: impl Fn(&T) -> bool) -> Option<T> {
        if self.in_order {
            let from = self.entries.partition_point(|ns| ns < lo);
            let range = self.entries.iter_from(from);
            range
                .take_while(|e| e.key() <= hi)
                .find(|e| pick(e))
                .copied()
        } else {
            let mut all = self.entries.iter();
            all.find(|e| e.key() >= lo && e.key() <= hi && pick(e))
                .copied()
        }
    }

    /// The entries whose time is in `[lo, hi]` in time order, and the latest one before `lo`.
    fn around(&self, lo: u64, hi: u64) -> (Option<T>, Vec<T>) {
        if self.in_order {
            let from = self.entries.partition_point(|ns| ns < lo);
            let to = self.entries.partition_point(|ns| ns <= hi);
            let before = self.entries.before(from);
            let within = self.entries.range(from, to).copied().collect();
            return (before.copied(), within);
        }
        let before = self.entries.iter().filter(|e| e.key() < lo);
        let before = before.max_by_key(|e| e.key()).copied();
        let mut within: Vec<T> = self
            .entries
            .iter()
            .copied()
            .filter(|e| e.key() >= lo)
            .collect();
        within.retain(|e| e.key() <= hi);
        within.sort_by_key(|e| e.key());
        (before, within)
    }
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
                        .push((ev.stamp, ev.tid));
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
                let len = if hook.is_pointer() { 0 } else { ev.len };
                let index = &mut self.dirs.entry((cookie, dir)).or_default().hooks[slot];
                index.insert(RangeEvent::new(ev, offset, len));
            }
        }
    }

    fn thread_event(&mut self, ev: &KEvent, what: SchedEvent) {
        self.threads
            .entry(ev.tid)
            .or_default()
            .push((ev.stamp, what));
    }

    /// Drops everything older than `cutoff_ns` (node time).
    pub fn evict_before(&mut self, cutoff_ns: u64) {
        self.dirs.retain(|_, d| {
            d.hooks.iter_mut().for_each(|h| h.evict_before(cutoff_ns));
            d.hooks.iter().any(|h| !h.is_empty())
        });
        self.wakeups.retain(|_, q| {
            q.evict_before(cutoff_ns);
            !q.entries.is_empty()
        });
        self.threads.retain(|_, q| {
            q.evict_before(cutoff_ns);
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
            out.points
                .push(point(id, ev.map(RangeEvent::stamp), expected));
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
            netif: netif.map(RangeEvent::stamp),
            tcp: covering(Hook::TcpProbe).map(RangeEvent::stamp),
            ready: reaching(Hook::SkDataReady).map(RangeEvent::stamp),
            copy: copy.map(RangeEvent::stamp),
            ret: ret.map(RangeEvent::stamp),
            reader_tid: copy.or(ret).map(|e| e.tid),
            ..RxFound::default()
        };
        let context = netif.and_then(RangeEvent::rx);
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
            .map_or((None, Vec::new()), |q| q.around(lo, hi));
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
                .and_then(|q| q.first_within(lo, hi, |_| true))
        });
        let hi = hi.unwrap_or(0);
        let switch_in = |e: &(Stamp, SchedEvent)| e.1 == SchedEvent::On;
        found.switch_in = wakeup.and_then(|(w, tid)| {
            self.threads
                .get(&tid)
                .and_then(|q| q.first_within(w.ns(), hi, switch_in))
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

    use super::super::chunked::tests::Rng;
    use super::super::event::Extra;
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
        fn insert(&mut self, ev: RangeEvent) {
            self.seq += 1;
            let key = (ev.start, self.seq);
            self.max_len = self.max_len.max(ev.end() - ev.start);
            self.by_start.insert(key, ev);
        }

        fn covering(&self, byte: u64) -> (Option<u32>, bool) {
            let lowest_start = byte.saturating_sub(self.max_len);
            let mut best: Option<&RangeEvent> = None;
            let mut retransmitted = false;
            for (_, ev) in self.by_start.range((lowest_start, 0)..=(byte, u64::MAX)) {
                if ev.end() <= byte {
                    continue;
                }
                if ev.retrans {
                    retransmitted = true;
                } else if best.is_none_or(|b| ev.stamp().ns() < b.stamp().ns()) {
                    best = Some(ev);
                }
            }
            (best.map(|e| e.tid), retransmitted)
        }

        fn first_reaching(&self, end: u64) -> Option<u32> {
            let mut range = self.by_start.range((end, 0)..).map(|(_, ev)| ev);
            let first = range.next()?;
            let earliest = (range.take_while(|ev| ev.end() == first.end())).fold(first, |a, b| {
                if b.stamp().ns() < a.stamp().ns() {
                    b
                } else {
                    a
                }
            });
            Some(earliest.tid)
        }

        fn evict_before(&mut self, cutoff_ns: u64) {
            self.by_start.retain(|_, ev| ev.stamp().ns() >= cutoff_ns);
        }
    }

    fn kevent(hook: Hook, ns: u64, tid: u32, retrans: bool) -> KEvent {
        KEvent {
            hook,
            stamp: Stamp {
                time: NodeTime::new(NodeId(3), ns),
                error_ns: 0,
                sample: u32::MAX,
                origin: Origin { file: 2, line: 7 },
                place: Place::new(Some(1), Some(4), None, Some(33)),
            },
            tid,
            cookie: Some(9),
            dir: Some(Direction::Tx),
            offset: Some(0),
            len: 0,
            value: None,
            retrans,
            extra: Extra::None,
        }
    }

    fn event(start: u64, end: u64, ns: u64, tid: u32, retrans: bool) -> RangeEvent {
        let ev = kevent(Hook::TcpSendmsg, ns, tid, retrans);
        RangeEvent::new(&ev, start, u32::try_from(end - start).unwrap())
    }

    /// An index entry gives back the event's stamp and receive context whole, with the
    /// rare fields set (a NIC-clock conversion, a receive context) and without.
    #[test]
    fn range_event_keeps_stamp_and_context() {
        let plain = kevent(Hook::TcpSendmsg, 5_000, 8, false);
        let mut converted = kevent(Hook::TxTstampHw, 6_000, 8, true);
        converted.stamp.error_ns = 150;
        converted.stamp.sample = super::super::nic_clock::NIC_SAMPLE_BASE + 4;
        let mut received = kevent(Hook::NetifReceiveSkb, 7_000, 0, false);
        let rx = RxContext {
            irq_entry_ns: Some(6_500),
            softirq_raise_ns: None,
            softirq_entry_ns: Some(6_800),
            irq_expected: true,
            wire: None,
        };
        received.extra = Extra::Rx(Box::new(rx));
        for ev in [plain, converted, received] {
            let entry = RangeEvent::new(&ev, 100, 48);
            assert_eq!(entry.stamp(), ev.stamp);
            assert_eq!(entry.rx(), ev.extra.rx().copied());
            assert_eq!((entry.start, entry.end(), entry.tid), (100, 148, ev.tid));
            assert_eq!(entry.retrans, ev.retrans);
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
                new.insert(event(start, end, ns, tid, retrans));
                old.insert(event(start, end, ns, tid, retrans));
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
