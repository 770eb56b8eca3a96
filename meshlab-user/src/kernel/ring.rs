//! The event ring buffers (one per CPU, `EVENTS_n`) read straight from their memory mappings,
//! a batch at a time.
//!
//! aya's `RingBuf` hands out one record per call and publishes the consumer position after
//! every record; the recorder paid for the returned item (a store-forwarding stall on the
//! item it copies out, seen in `perf record` of a capture to /dev/null) and for a store per
//! event to the cache line every producer reads (`bpf_ringbuf_query` in
//! meshlab-ebpf's wakeup_flag, the kernel's reserve). Here a batch of records goes to one
//! closure in one loop, and the position is published every [`PUBLISH_EVERY`] records, when
//! the reader catches up, and at the end of the batch.
//!
//! The protocol is the kernel's (kernel/bpf/ringbuf.c) and libbpf's: the producer position
//! is read with Acquire, a record header with Acquire (the kernel commits it with a fully
//! ordered xchg), the consumer position published with Release; before deciding the buffer
//! is empty, a full fence and a second look, so that either the reader sees a record being
//! committed or its producer sees the published position.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering, fence};

use anyhow::{Context, bail, ensure};
use aya::Ebpf;
use aya::maps::{Map, MapData};

/// Record header bits (include/uapi/linux/bpf.h).
const BUSY_BIT: u32 = 1 << 31;
const DISCARD_BIT: u32 = 1 << 30;
/// Record header: length and flags (u32), page offset (u32).
const HEADER_BYTES: usize = 8;
/// Records consumed between two publications of the consumer position inside a batch: space
/// comes back to the producers in steps of ~37 KB (of 144-byte records) of an 8 MiB ring.
const PUBLISH_EVERY: usize = 256;
/// One shared memory mapping of the ring buffer's fd, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, prot: i32, offset: usize) -> anyhow::Result<Mapping> {
        let offset = libc::off_t::try_from(offset).context("ring buffer mmap offset")?;
        // SAFETY: a new shared mapping of a BPF ring buffer fd; the kernel checks the length,
        // protection and offset (the consumer page is the only writable one).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "mmap of the ring buffer: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this struct created; nothing refers to it once it is dropped
        // (EventRing hands out slices only for the duration of a drain call).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// What is at a ring's consumer position (discarded records skipped).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Head {
    /// A committed record, with its time stamp.
    Record(u64),
    /// Nothing more committed: a record reserved later is stamped after this moment.
    Empty,
    /// The next record is still being written: its time stamp is not known yet.
    Busy,
}

/// A source of records in the order its producers reserved them: a ring's reading side, or a
/// test's script (the merge in [`merge`] does not depend on the memory mappings).
trait Source {
    /// The record at the read position, skipping discarded ones; [`Head::Empty`] only after
    /// publishing the position (so a producer that commits later wakes the reader).
    fn peek(&mut self) -> anyhow::Result<Head>;
    /// Hands the record [`Self::peek`] found to `each` and moves past it.
    fn take(&mut self, each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>) -> anyhow::Result<()>;
    /// Gives the space read back to the producers.
    fn publish(&mut self);
}

pub struct EventRing {
    /// Keeps the map's fd open while the mappings are in use.
    map: MapData,
    /// The consumer page (read-write): the consumer position at its start.
    consumer: Mapping,
    /// The producer page (the producer position at its start), then the data pages twice, so
    /// a record that wraps around the end is contiguous.
    producer: Mapping,
    /// Ring size in bytes (a power of two) minus one.
    mask: usize,
    page: usize,
    /// Consumer position: bytes consumed since the ring was created.
    pos: usize,
    /// The producer position last read (re-read when the reader catches up with it).
    produced: usize,
    /// Length of the committed record at `pos` (set by `peek`).
    len: usize,
    /// Records passed since the position was last published.
    unpublished: usize,
}

// SAFETY: EventRing owns its mappings and the fd behind them; the raw pointers are only
// dereferenced through &mut self, so moving it to another thread moves all access with it.
unsafe impl Send for EventRing {}

impl EventRing {
    pub fn new(map: Map) -> anyhow::Result<EventRing> {
        let Map::RingBuf(map) = map else {
            bail!("an EVENTS_n map is not a ring buffer map");
        };
        let size = map.info()?.max_entries() as usize;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })?;
        ensure!(
            size.is_power_of_two() && size >= page,
            "ring buffer of {size} bytes: not a power-of-two number of pages"
        );
        let fd = map.fd().as_fd().as_raw_fd();
        let consumer = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd, page + 2 * size, libc::PROT_READ, page)?;
        let mut ring = EventRing {
            map,
            consumer,
            producer,
            mask: size - 1,
            page,
            pos: 0,
            produced: 0,
            len: 0,
            unpublished: 0,
        };
        ring.pos = ring.consumer_pos().load(Ordering::Acquire);
        ring.produced = ring.pos;
        Ok(ring)
    }

    fn consumer_pos(&self) -> &AtomicUsize {
        // SAFETY: the consumer page starts with the kernel's unsigned long consumer_pos,
        // page aligned; the mapping lives as long as self.
        unsafe { &*self.consumer.ptr.cast::<AtomicUsize>() }
    }

    fn producer_pos(&self) -> usize {
        // SAFETY: as consumer_pos, for the producer page; the kernel writes it with Release.
        unsafe { &*self.producer.ptr.cast::<AtomicUsize>() }.load(Ordering::Acquire)
    }

    /// The header word of the record at the consumer position.
    fn header(&self) -> u32 {
        let offset = self.page + (self.pos & self.mask);
        // SAFETY: offset is inside the first copy of the data pages and 8-byte aligned (the
        // kernel aligns every record to 8 bytes).
        unsafe {
            &*self
                .producer
                .ptr
                .cast::<u8>()
                .add(offset)
                .cast::<AtomicU32>()
        }
        .load(Ordering::Acquire)
    }

    /// Moves past the record at the position (its header plus `len` bytes, 8-byte aligned).
    fn advance(&mut self, len: usize) {
        self.pos += (HEADER_BYTES + len).next_multiple_of(8);
        self.unpublished += 1;
        if self.unpublished == PUBLISH_EVERY {
            self.publish();
        }
    }

    /// The committed record's bytes at the position.
    fn record(&self) -> &[u8] {
        let start = self.page + (self.pos & self.mask) + HEADER_BYTES;
        // SAFETY: a committed record (peek saw its header without the busy bit): `len` bytes
        // after its header, inside the double mapping (start - page < size, len <= size); the
        // kernel reuses them only after the consumer position passes them, which happens
        // after the borrow ends.
        unsafe { std::slice::from_raw_parts(self.producer.ptr.cast::<u8>().add(start), self.len) }
    }
}

impl Source for EventRing {
    fn peek(&mut self) -> anyhow::Result<Head> {
        loop {
            if self.pos == self.produced {
                self.produced = self.producer_pos();
                if self.pos == self.produced {
                    self.publish();
                    fence(Ordering::SeqCst);
                    self.produced = self.producer_pos();
                    if self.pos == self.produced {
                        return Ok(Head::Empty);
                    }
                }
            }
            let mut header = self.header();
            if header & BUSY_BIT != 0 {
                self.publish();
                fence(Ordering::SeqCst);
                header = self.header();
                if header & BUSY_BIT != 0 {
                    return Ok(Head::Busy);
                }
            }
            let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize;
            ensure!(len <= self.mask, "ring buffer record of {len} bytes");
            if header & DISCARD_BIT != 0 {
                self.advance(len);
                continue;
            }
            self.len = len;
            return stamp(self.record()).map(Head::Record);
        }
    }

    fn take(&mut self, each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>) -> anyhow::Result<()> {
        each(self.record())?;
        self.advance(self.len);
        Ok(())
    }

    fn publish(&mut self) {
        self.consumer_pos().store(self.pos, Ordering::Release);
        self.unpublished = 0;
    }
}

impl AsRawFd for EventRing {
    fn as_raw_fd(&self) -> RawFd {
        self.map.fd().as_fd().as_raw_fd()
    }
}

/// Every event ring a CPU writes, read as one, in time order, in place: [`EventRings::drain`]
/// merges the rings through their memory mappings (each ring's next committed record, its
/// time stamp read where it lies; the earliest is handed on and only that ring's consumer
/// position moves), so a record is neither copied nor sorted; readiness is one epoll fd over
/// all rings (registered with tokio in the reader's loop; a forced wakeup on any ring makes it
/// readable).
///
/// Why in time order: the decoder keeps per-connection and per-unix-socket state in the order
/// it sees events (sequence bases from sock_established, unix byte offsets summed send by
/// send), and a thread that migrates between CPUs writes its events to different rings. Read
/// ring by ring, a later send could be decoded before an earlier one (lab_mesh's unix hops
/// showed it).
///
/// The horizon: a record is stamped after its reservation, so a ring read empty gets only
/// records stamped after the moment the drain started; a ring whose next record is still
/// being written bounds the drain by the last stamp handed on from it. A record stamped
/// after the horizon stays in its ring for the next drain (at most the session's drain pause,
/// 10 ms while events come); [`EventRings::flush`] hands on the rest once the programs are
/// detached.
///
/// Within one ring the merge keeps the ring's order, the order of reservation, as the single
/// ring of before did for every CPU: a program interrupted between its reservation and its
/// clock read by a nested program on the same CPU (or, past 8 CPUs, two CPUs sharing a ring)
/// leaves a later stamp ahead of an earlier one, and that pair is handed on in ring order,
/// not re-sorted. The inversion is as long as the nested program ran; a record of another
/// ring can come out between the two only if its stamp falls inside it (record_rings checks
/// that every step back in time is covered by such an inversion of the record's own ring).
pub struct EventRings {
    lanes: Vec<Lane<EventRing>>,
    /// epoll over the rings' fds (level-triggered), closed on drop.
    epoll: OwnedFd,
}

/// How long [`EventRings::flush`] waits for a record still being written (a program that ran
/// while it was detached) before leaving it.
const FLUSH_BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

impl EventRings {
    /// Takes the rings `used` (indexes into `names::MAP_EVENTS`: the ones a possible CPU
    /// writes, loader::event_rings_used) out of `ebpf` and maps them.
    pub fn new(ebpf: &mut Ebpf, used: &[usize]) -> anyhow::Result<EventRings> {
        ensure!(!used.is_empty(), "no event ring to read");
        // SAFETY: epoll_create1 has no preconditions; the fd is checked and then owned.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            bail!("epoll_create1: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a new fd that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut lanes = Vec::with_capacity(used.len());
        for &index in used {
            let name = meshlab_common::names::MAP_EVENTS[index];
            let map = ebpf
                .take_map(name)
                .with_context(|| format!("{name} ring buffer missing"))?;
            let ring = EventRing::new(map).with_context(|| format!("event ring {name}"))?;
            let mut event = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: index as u64,
            };
            // SAFETY: both fds are open; the kernel copies the event.
            let added = unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    ring.as_raw_fd(),
                    &raw mut event,
                )
            };
            if added < 0 {
                bail!("epoll_ctl({name}): {}", std::io::Error::last_os_error());
            }
            lanes.push(Lane::new(ring));
        }
        Ok(EventRings { lanes, epoll })
    }

    /// Hands up to `max` records to `each`, in time stamp order across the rings, each ring in
    /// its own order, up to the horizon; true when the rings have caught up (what is left
    /// is stamped after the horizon or still being written).
    pub fn drain(
        &mut self,
        max: usize,
        mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<bool> {
        merge(&mut self.lanes, max, monotonic_ns(), false, &mut each)
    }

    /// Hands on every record left, in the same order (the programs are detached): waits up
    /// to [`FLUSH_BUSY_WAIT`] for a record still being written, then leaves it.
    pub fn flush(
        &mut self,
        mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        flush(&mut self.lanes, FLUSH_BUSY_WAIT, &mut each)
    }
}

/// A ring with the merge's view of it: its next record, and the last stamp handed on.
struct Lane<R> {
    ring: R,
    head: Head,
    last: u64,
}

impl<R: Source> Lane<R> {
    fn new(ring: R) -> Lane<R> {
        Lane {
            ring,
            head: Head::Empty,
            last: 0,
        }
    }
}

/// The k-way merge: hands on up to `max` records, always the earliest next record of the
/// lanes, while it is stamped at or before the bound (`horizon`, lowered to the last stamp
/// handed on from each lane whose next record is still being written, unless `past_busy`);
/// true when it stopped for another reason than `max`. Publishes every lane's position.
fn merge<R: Source>(
    lanes: &mut [Lane<R>],
    max: usize,
    horizon: u64,
    past_busy: bool,
    each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    let result = merge_unpublished(lanes, max, horizon, past_busy, each);
    for lane in lanes.iter_mut() {
        lane.ring.publish();
    }
    result
}

fn merge_unpublished<R: Source>(
    lanes: &mut [Lane<R>],
    max: usize,
    horizon: u64,
    past_busy: bool,
    each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    let mut bound = horizon;
    for lane in lanes.iter_mut() {
        lane.head = lane.ring.peek()?;
        if lane.head == Head::Busy && !past_busy {
            bound = bound.min(lane.last);
        }
    }
    let mut handed = 0;
    loop {
        let Some((i, ts)) = earliest(lanes) else {
            return Ok(true);
        };
        if ts > bound {
            return Ok(true);
        }
        if handed == max {
            return Ok(false);
        }
        let lane = &mut lanes[i];
        lane.ring.take(each)?;
        lane.last = ts;
        handed += 1;
        lane.head = lane.ring.peek()?;
        if lane.head == Head::Busy && !past_busy {
            bound = bound.min(ts);
        }
    }
}

/// The lane whose next record is stamped earliest (the first such lane on a tie), and the
/// stamp.
fn earliest<R>(lanes: &[Lane<R>]) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for (i, lane) in lanes.iter().enumerate() {
        if let Head::Record(ts) = lane.head
            && best.is_none_or(|(_, b)| ts < b)
        {
            best = Some((i, ts));
        }
    }
    best
}

/// Merges every lane to its end, waiting up to `busy_wait` for records still being written,
/// then past them (they are left in their ring, uncounted: a warning says how many lanes).
fn flush<R: Source>(
    lanes: &mut [Lane<R>],
    busy_wait: std::time::Duration,
    each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + busy_wait;
    loop {
        merge(lanes, usize::MAX, u64::MAX, false, each)?;
        if !lanes.iter().any(|l| l.head == Head::Busy) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            merge(lanes, usize::MAX, u64::MAX, true, each)?;
            let busy = lanes.iter().filter(|l| l.head == Head::Busy).count();
            log::warn!("{busy} event ring(s) stopped at a record never committed");
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// An event record's time stamp (`Event::ts_ns`, its first field).
fn stamp(record: &[u8]) -> anyhow::Result<u64> {
    let bytes = record
        .get(..8)
        .context("ring buffer record shorter than a time stamp")?;
    Ok(u64::from_ne_bytes(bytes.try_into()?))
}

/// CLOCK_MONOTONIC now, the programs' clock (bpf_ktime_get_ns).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

impl AsRawFd for EventRings {
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use super::{Head, Lane, Source, flush, merge};

    /// A ring's contents in reservation order.
    #[derive(Clone, Copy)]
    enum Item {
        Record(u64),
        Discarded,
        /// Still being written for this many more peeks, then a committed record.
        Busy(u32, u64),
    }

    struct Script(VecDeque<Item>);

    impl Source for Script {
        fn peek(&mut self) -> anyhow::Result<Head> {
            loop {
                return Ok(match self.0.front_mut() {
                    None => Head::Empty,
                    Some(Item::Discarded) => {
                        self.0.pop_front();
                        continue;
                    }
                    Some(Item::Record(ts)) => Head::Record(*ts),
                    Some(item @ Item::Busy(0, _)) => {
                        let Item::Busy(_, ts) = *item else {
                            unreachable!()
                        };
                        *item = Item::Record(ts);
                        Head::Record(ts)
                    }
                    Some(Item::Busy(n, _)) => {
                        *n -= 1;
                        Head::Busy
                    }
                });
            }
        }

        fn take(
            &mut self,
            each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
        ) -> anyhow::Result<()> {
            let Some(Item::Record(ts)) = self.0.pop_front() else {
                panic!("take without a committed record");
            };
            each(&ts.to_ne_bytes())
        }

        fn publish(&mut self) {}
    }

    fn lanes(rings: &[&[Item]]) -> Vec<Lane<Script>> {
        rings
            .iter()
            .map(|r| Lane::new(Script(r.iter().copied().collect())))
            .collect()
    }

    fn records(stamps: &[u64]) -> Vec<Item> {
        stamps.iter().map(|&ts| Item::Record(ts)).collect()
    }

    /// One merge: the stamps handed on, and whether it caught up.
    fn run(lanes: &mut [Lane<Script>], max: usize, horizon: u64) -> (Vec<u64>, bool) {
        let mut out = Vec::new();
        let caught_up = merge(lanes, max, horizon, false, &mut |r: &[u8]| {
            out.push(u64::from_ne_bytes(r.try_into()?));
            Ok(())
        })
        .unwrap();
        (out, caught_up)
    }

    fn left(lanes: &[Lane<Script>]) -> Vec<usize> {
        lanes.iter().map(|l| l.ring.0.len()).collect()
    }

    #[test]
    fn rings_merge_in_stamp_order_and_later_stamps_wait_in_their_ring() {
        let a = records(&[1, 4, 6, 12]);
        let mut b = records(&[2, 3]);
        b.insert(1, Item::Discarded);
        b.push(Item::Record(9));
        let mut l = lanes(&[&a, &b]);
        assert_eq!(run(&mut l, 100, 10), (vec![1, 2, 3, 4, 6, 9], true));
        assert_eq!(
            left(&l),
            [1, 0],
            "12 is after the horizon: still in its ring"
        );
        assert_eq!(run(&mut l, 100, 20), (vec![12], true));
    }

    #[test]
    fn a_full_batch_is_not_caught_up_and_the_next_one_goes_on() {
        let mut l = lanes(&[&records(&[1, 3, 5]), &records(&[2, 4])]);
        assert_eq!(run(&mut l, 3, 100), (vec![1, 2, 3], false));
        assert_eq!(run(&mut l, 3, 100), (vec![4, 5], true));
        assert_eq!(run(&mut l, 3, 100), (vec![], true));
    }

    #[test]
    fn a_record_being_written_bounds_the_others_by_its_rings_last_stamp() {
        // Ring a: 3, then a record still being written (reserved after 3 was): nothing of
        // ring b stamped after 3 may go before it.
        let a = [Item::Record(3), Item::Busy(u32::MAX, 4), Item::Record(8)];
        let mut l = lanes(&[&a, &records(&[1, 5, 7])]);
        assert_eq!(run(&mut l, 100, 100), (vec![1, 3], true));
        assert_eq!(left(&l), [2, 2]);
        // Busy from the start, nothing read from that ring yet: nothing goes.
        let mut l = lanes(&[&[Item::Busy(u32::MAX, 4)], &records(&[1, 5])]);
        assert_eq!(run(&mut l, 100, 100), (vec![], true));
    }

    #[test]
    fn a_ring_keeps_its_own_order_when_a_nested_program_stamped_earlier() {
        // Ring a: a program reserved, was interrupted by a nested one (reserved next, stamped
        // 5), then stamped 10 itself. The pair stays in ring order; ring b's 7 goes first.
        let mut l = lanes(&[&records(&[10, 5, 20]), &records(&[7, 30])]);
        assert_eq!(run(&mut l, 100, 100), (vec![7, 10, 5, 20, 30], true));
    }

    #[test]
    fn flush_waits_for_a_record_being_written_then_leaves_one_never_committed() {
        let mut out = Vec::new();
        let mut each = |r: &[u8]| {
            out.push(u64::from_ne_bytes(r.try_into()?));
            Ok(())
        };
        let a = [Item::Busy(3, 2), Item::Record(6)];
        let mut l = lanes(&[&a, &records(&[1, 3, 9])]);
        flush(&mut l, Duration::from_secs(5), &mut each).unwrap();
        assert_eq!(left(&l), [0, 0]);
        let a = [Item::Busy(u32::MAX, 2), Item::Record(6)];
        let mut l = lanes(&[&a, &records(&[1, 3])]);
        flush(&mut l, Duration::ZERO, &mut each).unwrap();
        assert_eq!(out, [1, 2, 3, 6, 9, 1, 3]);
        assert_eq!(
            left(&l),
            [2, 0],
            "the uncommitted record and the one behind it stay"
        );
    }
}
