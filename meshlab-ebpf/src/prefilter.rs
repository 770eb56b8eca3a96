//! "Is this mine?" in a few instructions, before any packet parsing or hash lookup.
//!
//! Three tiers, cheapest first, each an inlined array access (no helper call):
//! 1. [`nothing_traced`]: no connection is traced at all (the recorder is attached but its
//!    filters matched nothing): every hot program returns at once. [`nothing_sampled`]: with
//!    `--sample-messages`, no traced connection is in a sampled turn: every hook but the
//!    three that start turns returns at once (both counts share one cache line).
//! 2. [`traced_conn`] / [`rx_conn`] / [`thread_slot`]: slot arrays maintained next to the
//!    authoritative hash maps; an empty slot is a definite "not traced". A slot that names one
//!    key alone answers by itself: CONN_SLOTS holds the whole connection record (tuple,
//!    sequence bases, turn), so a hook of a connection with a slot of its own never asks a
//!    hash map; TUPLE_SLOTS gives netif_receive_skb the cookie of a 4-tuple.
//! 3. The hash maps themselves (TRACED_CONNS, TRACKED_THREADS, TUPLES), for shared slots.
//!
//! Slots are written without atomics: two CPUs racing on one slot can lose a collision mark,
//! which makes a traced key look untraced until it is marked again (every traced send and
//! receive re-marks its thread; a connection is marked once at ESTABLISHED, and such a race
//! needs two connections established at the same instant whose cookies share 16 low bits).

use aya_ebpf::maps::Array;
use meshlab_common::{
    ConnInfo, PREFILTER_COLLIDED_COOKIE, PREFILTER_COLLIDED_TID, PREFILTER_SLOTS, TupleKey,
    tuple_slot_index,
};

use crate::atomic::atomic_add;
use crate::globals::config;
use crate::kread::{Addr, TcpSegment, addr_bytes, addr_words};
use crate::maps::{
    CONN_SLOTS, LIVE_CONNS, LIVE_SAMPLED_TURNS, THREAD_COOKIE_SLOTS, TID_SLOTS, TRACED_CONNS,
    TRACED_LIVE, TUPLE_SLOTS, TUPLES,
};
use crate::turn::{TURN_SAMPLED, retire_turn, set_turn_sampled};

const SLOT_MASK: u32 = PREFILTER_SLOTS - 1;

/// No traced connection exists, so no TCP socket hook can match.
#[inline(always)]
pub fn nothing_traced() -> bool {
    live_count(LIVE_CONNS) == 0
}

/// No TCP socket hook can match a sampled turn: nothing is traced, or with
/// `--sample-messages` no traced connection is in a sampled turn now. For the hooks that only
/// record a turn's events and never start one (all but tcp_sendmsg, netif_receive_skb and
/// tcp_probe): with 1/N sampling they return here for the other N-1 messages without reading
/// the socket (the read of skb->sk alone cost ~55-80 ns, docs/benchmarks-kernel-sampled.md).
#[inline(always)]
pub fn nothing_sampled() -> bool {
    if config!(sample_messages_every) <= 1 {
        return nothing_traced();
    }
    live_count(LIVE_SAMPLED_TURNS) == 0
}

/// [`nothing_sampled`], and unix sockets are not traced either (hooks with a unix path).
#[inline(always)]
pub fn no_socket_sampled() -> bool {
    config!(trace_unix) == 0 && nothing_sampled()
}

#[inline(always)]
fn live_count(index: u32) -> u64 {
    // SAFETY: array value read at once; a racing update only changes which path this takes.
    TRACED_LIVE
        .get(index)
        .map_or(0, |live| unsafe { core::ptr::read_volatile(live) })
}

/// A traced connection as the prefilter found it: its record, and the byte holding the
/// direction of its current turn (a separate cache line for a connection that owns its slot,
/// [`crate::maps::ConnSlot`]; the record's `turn.direction` in TRACED_CONNS). Raw pointers:
/// the hooks that decide turns write both through it while other CPUs read them.
#[derive(Clone, Copy)]
pub struct TracedConn {
    info: *mut ConnInfo,
    direction: *mut u8,
}

impl TracedConn {
    /// The record. Only its turn changes after ESTABLISHED, through the setters below.
    #[inline(always)]
    pub fn info(self) -> &'static ConnInfo {
        // SAFETY: a map value, valid for the program's lifetime (array) or RCU read section
        // (hash map); see traced_conn on concurrent writers.
        unsafe { &*self.info }
    }

    /// Whether the current turn is sampled, read now (not through an earlier [`Self::info`]).
    #[inline(always)]
    pub fn sampled(self) -> bool {
        // SAFETY: as in info.
        unsafe { core::ptr::read_volatile(&raw const (*self.info).turn.sampled) == TURN_SAMPLED }
    }

    /// Records the current turn's decision. Written only when it changes: the line it sits
    /// in is read by every hook of the connection, on both CPUs.
    #[inline(always)]
    pub fn set_sampled(self, sampled: bool) {
        // SAFETY: as in info; the record is 8-byte aligned (an array slot at an 8-byte
        // offset, or a hash map value).
        unsafe { set_turn_sampled(self.info, sampled) }
    }

    /// `TURN_NONE`, `TURN_TX` or `TURN_RX`: the direction of the current turn.
    #[inline(always)]
    pub fn direction(self) -> u8 {
        // SAFETY: as in info; a byte of the same map value.
        unsafe { core::ptr::read_volatile(self.direction) }
    }

    #[inline(always)]
    pub fn set_direction(self, direction: u8) {
        // SAFETY: as in direction.
        unsafe { core::ptr::write_volatile(self.direction, direction) }
    }
}

/// Traced connection `cookie`: in its CONN_SLOTS slot while it owns the slot alone (no hash
/// lookup), else TRACED_CONNS' value. `None`: not traced (sock_ops clears the slot when it
/// removes the connection; a zero cookie, not assigned yet, is never traced).
///
/// Both are written in place by the hooks that decide a turn; fields another CPU may write at
/// the same time (the turn) only ever receive the same decision (turn.rs). A slot taken over
/// between this read and the caller's use of the record (the connection closed and another
/// one whose cookie has the same 16 low bits was established meanwhile) would give one event
/// the newcomer's tuple; the window is a few instructions.
#[inline(always)]
pub fn traced_conn(cookie: u64) -> Option<TracedConn> {
    let slot = CONN_SLOTS.get_ptr_mut(cookie as u32 & SLOT_MASK)?;
    // SAFETY: valid array value for the program's lifetime; the owner is read once.
    let owner = unsafe { core::ptr::read_volatile(&raw const (*slot).cookie) };
    if cookie == 0 {
        return None;
    }
    if owner == cookie {
        // SAFETY: as above; see the note on concurrent writers.
        return Some(unsafe {
            TracedConn {
                info: &raw mut (*slot).info,
                direction: &raw mut (*slot).direction,
            }
        });
    }
    if owner != PREFILTER_COLLIDED_COOKIE {
        return None;
    }
    let info = TRACED_CONNS.get_ptr_mut(&cookie)?;
    Some(TracedConn {
        info,
        // SAFETY: a field of a map value, valid for the program's RCU read section.
        direction: unsafe { &raw mut (*info).turn.direction },
    })
}

/// The traced connection a received segment belongs to, by its local-view 4-tuple (local =
/// the segment's destination): the cookie from TUPLE_SLOTS, confirmed against the record's
/// tuple; TUPLES only when two traced tuples share the slot.
#[inline(always)]
pub fn rx_conn(seg: &TcpSegment) -> Option<(u64, TracedConn)> {
    let index = tuple_index(seg.daddr, seg.dport, seg.saddr, seg.sport);
    // SAFETY: array value read at once.
    let mut cookie = unsafe { core::ptr::read_volatile(TUPLE_SLOTS.get(index)?) };
    if cookie == 0 {
        return None;
    }
    if cookie == PREFILTER_COLLIDED_COOKIE {
        let key = TupleKey {
            local_addr: addr_bytes(seg.daddr),
            remote_addr: addr_bytes(seg.saddr),
            local_port: seg.dport,
            remote_port: seg.sport,
            _pad: 0,
        };
        // SAFETY: value copied out at once.
        cookie = *unsafe { TUPLES.get(&key) }?;
    }
    let conn = traced_conn(cookie)?;
    let tuple = &conn.info().tuple;
    let same = tuple.local_port == seg.dport
        && tuple.remote_port == seg.sport
        && addr_words(&tuple.local_addr) == seg.daddr
        && addr_words(&tuple.remote_addr) == seg.saddr;
    same.then_some((cookie, conn))
}

/// TUPLE_SLOTS index of a local-view 4-tuple ([`tuple_slot_index`]).
#[inline(always)]
fn tuple_index(local: Addr, local_port: u16, remote: Addr, remote_port: u16) -> u32 {
    // Address bytes 12-15 (little endian): the high half of the second word.
    let low = |addr: Addr| (addr[1] >> 32) as u32;
    tuple_slot_index(low(local), local_port, low(remote), remote_port)
}

/// [`tuple_index`] of a connection's recorded tuple.
#[inline(always)]
fn recorded_tuple_index(tuple: &TupleKey) -> u32 {
    tuple_index(
        addr_words(&tuple.local_addr),
        tuple.local_port,
        addr_words(&tuple.remote_addr),
        tuple.remote_port,
    )
}

/// Whether thread `tid` may be in TRACKED_THREADS; `false` is definite.
#[inline(always)]
pub fn thread_may_be_tracked(tid: u32) -> bool {
    let Some(slot) = TID_SLOTS.get(tid & SLOT_MASK) else {
        return false;
    };
    tid != 0 && (*slot == tid || *slot == PREFILTER_COLLIDED_TID)
}

/// What the slot arrays alone say about a thread (no hash lookup).
pub enum ThreadSlot {
    /// Definitely not in TRACKED_THREADS.
    Untracked,
    /// The slot names this thread alone: the cookie of the traced socket it last used.
    Alone(u64),
    /// Another thread shares the slot: ask TRACKED_THREADS.
    Collided,
}

#[inline(always)]
pub fn thread_slot(tid: u32) -> ThreadSlot {
    let index = tid & SLOT_MASK;
    match TID_SLOTS.get(index) {
        // A zero cookie: the thread is being marked right now on another CPU; ask the map.
        Some(slot) if tid != 0 && *slot == tid => match THREAD_COOKIE_SLOTS.get(index) {
            Some(cookie) if *cookie != 0 => ThreadSlot::Alone(*cookie),
            _ => ThreadSlot::Collided,
        },
        Some(slot) if tid != 0 && *slot == PREFILTER_COLLIDED_TID => ThreadSlot::Collided,
        _ => ThreadSlot::Untracked,
    }
}

/// Thread `tid` (already marked in TID_SLOTS) last used traced socket `cookie`.
#[inline(always)]
pub fn thread_cookie_set(tid: u32, cookie: u64) {
    if let Some(slot) = THREAD_COOKIE_SLOTS.get_ptr_mut(tid & SLOT_MASK) {
        // SAFETY: valid array value; only read while TID_SLOTS names this thread alone, and
        // a thread's sends and receives run one at a time.
        unsafe { *slot = cookie };
    }
}

/// sock_ops added connection `cookie` with record `info` to TRACED_CONNS and TUPLES.
#[inline(always)]
pub fn conn_added(cookie: u64, info: &ConnInfo) {
    live_add(LIVE_CONNS, 1);
    if let Some(slot) = CONN_SLOTS.get_ptr_mut(cookie as u32 & SLOT_MASK) {
        // SAFETY: valid array value; see the module note on races.
        unsafe {
            let owner = (*slot).cookie;
            if owner == 0 || owner == cookie {
                // The record first, the owner last: a reader that sees the owner sees it whole
                // where stores stay in order (x86); on weaker memory models a reader may see a
                // stale record for one event, a race of the kind the module note tolerates.
                core::ptr::write_volatile(&raw mut (*slot).info, *info);
                core::ptr::write_volatile(&raw mut (*slot).direction, info.turn.direction);
                core::ptr::write_volatile(&raw mut (*slot).cookie, cookie);
            } else if owner != PREFILTER_COLLIDED_COOKIE {
                // The owner's turn lived in the slot alone: hand it to its map value, which
                // its hooks use from now on.
                // Retired in the slot first, so a hook still holding the slot cannot change
                // (and count) the decision once it has moved.
                let sampled = retire_turn(&raw mut (*slot).info);
                if let Some(owned) = TRACED_CONNS.get_ptr_mut(&owner) {
                    (*owned).turn = (*slot).info.turn;
                    (*owned).turn.sampled = sampled;
                    (*owned).turn.direction = (*slot).direction;
                } else if sampled == TURN_SAMPLED {
                    live_add(LIVE_SAMPLED_TURNS, u64::MAX);
                }
                core::ptr::write_volatile(&raw mut (*slot).cookie, PREFILTER_COLLIDED_COOKIE);
            }
        }
    }
    let index = recorded_tuple_index(&info.tuple);
    mark(&TUPLE_SLOTS, index, cookie, PREFILTER_COLLIDED_COOKIE);
}

/// sock_ops is about to remove connection `cookie` (its TRACED_CONNS value `info`) from the map:
/// its turn leaves the count of sampled turns (from the slot while it owns one, else from its
/// map value; the other copy is never sampled).
///
/// # Safety
/// `info` must be connection `cookie`'s TRACED_CONNS value (8-byte aligned, valid for the
/// program's RCU section).
#[inline(always)]
pub unsafe fn conn_closing(cookie: u64, info: *mut ConnInfo) {
    // SAFETY: the caller's promise.
    let mut was_sampled = unsafe { retire_turn(info) } == TURN_SAMPLED;
    if let Some(slot) = CONN_SLOTS.get_ptr_mut(cookie as u32 & SLOT_MASK) {
        // SAFETY: valid array value; the record sits at an 8-byte offset (maps.rs).
        unsafe {
            if core::ptr::read_volatile(&raw const (*slot).cookie) == cookie {
                was_sampled |= retire_turn(&raw mut (*slot).info) == TURN_SAMPLED;
            }
        }
    }
    if was_sampled {
        live_add(LIVE_SAMPLED_TURNS, u64::MAX);
    }
}

/// sock_ops removed connection `cookie` (4-tuple `tuple`) from TRACED_CONNS.
#[inline(always)]
pub fn conn_removed(cookie: u64, tuple: &TupleKey) {
    // Adding u64::MAX is subtracting one.
    live_add(LIVE_CONNS, u64::MAX);
    if let Some(slot) = CONN_SLOTS.get_ptr_mut(cookie as u32 & SLOT_MASK) {
        // SAFETY: as in conn_added. A collided slot stays collided (the hash map decides).
        unsafe {
            if (*slot).cookie == cookie {
                core::ptr::write_volatile(&raw mut (*slot).cookie, 0);
            }
        }
    }
    unmark(&TUPLE_SLOTS, recorded_tuple_index(tuple), cookie);
}

/// Adds `delta` (u64::MAX: -1) to TRACED_LIVE's count `index`, atomically: sock_ops and the
/// turn deciders of several CPUs change them.
#[inline(always)]
pub fn live_add(index: u32, delta: u64) {
    if let Some(live) = TRACED_LIVE.get_ptr_mut(index) {
        // SAFETY: valid, 8-byte aligned array value for the program's lifetime.
        unsafe { atomic_add(live, delta) };
    }
}

/// Thread `tid` was added to TRACKED_THREADS.
#[inline(always)]
pub fn thread_added(tid: u32) {
    mark(&TID_SLOTS, tid & SLOT_MASK, tid, PREFILTER_COLLIDED_TID);
}

/// Thread `tid` was removed from TRACKED_THREADS.
#[inline(always)]
pub fn thread_removed(tid: u32) {
    unmark(&TID_SLOTS, tid & SLOT_MASK, tid);
}

#[inline(always)]
fn mark<T: Copy + PartialEq + Default>(slots: &Array<T>, index: u32, key: T, collided: T) {
    if let Some(slot) = slots.get_ptr_mut(index) {
        // SAFETY: valid array value for the program's lifetime; see the module note on races.
        unsafe {
            let current = *slot;
            if current == T::default() {
                *slot = key;
            } else if current != key {
                *slot = collided;
            }
        }
    }
}

#[inline(always)]
fn unmark<T: Copy + PartialEq + Default>(slots: &Array<T>, index: u32, key: T) {
    if let Some(slot) = slots.get_ptr_mut(index) {
        // SAFETY: as in mark. A collided slot stays collided (the hash map decides).
        unsafe {
            if *slot == key {
                *slot = T::default();
            }
        }
    }
}
