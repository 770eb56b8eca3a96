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

/// Why [`EventRing::drain`] returned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Nothing more committed: a record reserved later is stamped after this moment.
    Empty,
    /// The next record is still being written: its time stamp is not known yet.
    Busy,
    /// `max` records handed; more may follow.
    Max,
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
        };
        ring.pos = ring.consumer_pos().load(Ordering::Acquire);
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

    fn publish(&self) {
        self.consumer_pos().store(self.pos, Ordering::Release);
    }

    /// Hands up to `max` records to `each` (discarded ones are skipped); says why it stopped
    /// (caught up: empty, or the next record still being written).
    fn drain(
        &mut self,
        max: usize,
        mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<Stop> {
        let mut producer = self.producer_pos();
        let mut handed = 0;
        let mut unpublished = 0;
        let result = loop {
            if self.pos == producer {
                self.publish();
                fence(Ordering::SeqCst);
                producer = self.producer_pos();
                if self.pos == producer {
                    break Ok(Stop::Empty);
                }
            }
            if handed == max {
                break Ok(Stop::Max);
            }
            let mut header = self.header();
            if header & BUSY_BIT != 0 {
                self.publish();
                fence(Ordering::SeqCst);
                header = self.header();
                if header & BUSY_BIT != 0 {
                    break Ok(Stop::Busy);
                }
            }
            let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize;
            if len > self.mask {
                break Err(anyhow::anyhow!("ring buffer record of {len} bytes"));
            }
            if header & DISCARD_BIT == 0 {
                let start = self.page + (self.pos & self.mask) + HEADER_BYTES;
                // SAFETY: a committed record: len bytes after its header, inside the double
                // mapping (start - page < size, len <= size); the kernel reuses them only
                // after the consumer position passes them, which happens below, after the
                // borrow ends.
                let record = unsafe {
                    std::slice::from_raw_parts(self.producer.ptr.cast::<u8>().add(start), len)
                };
                if let Err(e) = each(record) {
                    break Err(e);
                }
                handed += 1;
            }
            self.pos += (HEADER_BYTES + len).next_multiple_of(8);
            unpublished += 1;
            if unpublished == PUBLISH_EVERY {
                self.publish();
                unpublished = 0;
            }
        };
        self.publish();
        result
    }
}

impl AsRawFd for EventRing {
    fn as_raw_fd(&self) -> RawFd {
        self.map.fd().as_fd().as_raw_fd()
    }
}

/// Every event ring a CPU writes, read as one, in time order: [`EventRings::drain`] reads a
/// share of the batch from each ring into a reorder buffer and hands on, sorted by time
/// stamp, the records no ring can still precede; readiness is one epoll fd over all rings
/// (registered with tokio in the reader's loop; a forced wakeup on any ring makes it
/// readable).
///
/// Why sorted: the decoder keeps per-connection and per-unix-socket state in the order it
/// sees events (sequence bases from sock_established, unix byte offsets summed send by send),
/// and a thread that migrates between CPUs writes its events to different rings. Read ring by
/// ring, a later send could be decoded before an earlier one (lab_mesh's unix hops showed
/// it). The horizon: a record is stamped after its reservation, so once a ring was read
/// empty, every record it gets later is stamped after the moment the drain started; a ring
/// read to its share, or stopped at a record still being written, bounds the horizon by the
/// last stamp read from it. Records stamped later wait for the next drain (at most the
/// session's drain pause, 10 ms while events come); [`EventRings::flush`] hands on the rest.
pub struct EventRings {
    rings: Vec<EventRing>,
    /// epoll over the rings' fds (level-triggered), closed on drop.
    epoll: OwnedFd,
    /// Records read but not handed on yet: (time stamp, start in `bytes`, length).
    waiting: Vec<(u64, usize, usize)>,
    bytes: Vec<u8>,
    /// Where the records that keep waiting are moved at each hand-on (swapped with `bytes`).
    spare: Vec<u8>,
}

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
        let mut rings = Vec::with_capacity(used.len());
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
            rings.push(ring);
        }
        Ok(EventRings {
            rings,
            epoll,
            waiting: Vec::new(),
            bytes: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// Reads up to `max` records, an equal share from every ring in ring order, and hands to
    /// `each`, in time stamp order, every record read so far that no ring can precede; true
    /// when every ring has caught up (records stamped after the horizon may still wait).
    pub fn drain(
        &mut self,
        max: usize,
        mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<bool> {
        let mut horizon = monotonic_ns();
        let share = max.div_ceil(self.rings.len()).max(1);
        let mut caught_up = true;
        for ring in &mut self.rings {
            let mut last = None;
            let (waiting, bytes) = (&mut self.waiting, &mut self.bytes);
            let stop = ring.drain(share, |record| {
                let ts = stamp(record)?;
                waiting.push((ts, bytes.len(), record.len()));
                bytes.extend_from_slice(record);
                last = Some(ts);
                Ok(())
            })?;
            if stop != Stop::Empty {
                // Later records of this ring may be stamped from its last one read on (a ring
                // is in stamp order up to the few ns between reservation and stamp; a record
                // still being written was reserved after the last one read).
                horizon = horizon.min(last.unwrap_or(0));
            }
            caught_up &= stop != Stop::Max;
        }
        self.hand_on(horizon, &mut each)?;
        Ok(caught_up)
    }

    /// Hands on every waiting record, in time stamp order (the programs are detached).
    pub fn flush(
        &mut self,
        mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.hand_on(u64::MAX, &mut each)
    }

    /// Hands on the waiting records stamped at or before `horizon`, oldest first (ties in the
    /// order read); keeps the others.
    fn hand_on(
        &mut self,
        horizon: u64,
        each: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.waiting.sort_by_key(|&(ts, _, _)| ts);
        let ready = self.waiting.partition_point(|&(ts, _, _)| ts <= horizon);
        for &(_, start, len) in &self.waiting[..ready] {
            each(&self.bytes[start..start + len])?;
        }
        // The rest moves to the front of the spare buffer, which becomes the buffer: both keep
        // their capacity, so a drain allocates nothing once they have grown to a batch.
        let (bytes, spare) = (&self.bytes, &mut self.spare);
        spare.clear();
        for record in &mut self.waiting[ready..] {
            let (start, len) = (record.1, record.2);
            record.1 = spare.len();
            spare.extend_from_slice(&bytes[start..start + len]);
        }
        self.waiting.drain(..ready);
        std::mem::swap(&mut self.bytes, &mut self.spare);
        Ok(())
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
