//! "Is this mine?" in a few instructions, before any packet parsing or hash lookup.
//!
//! Three tiers, cheapest first, each an inlined array access (no helper call):
//! 1. [`nothing_traced`]: no connection is traced at all (the recorder is attached but its
//!    filters matched nothing): every hot program returns at once.
//! 2. [`cookie_may_be_traced`] / [`thread_may_be_tracked`] / [`local_port_may_be_traced`]:
//!    slot arrays maintained next to the authoritative hash maps; a miss is a definite "not
//!    traced", a hit is confirmed by the hash map as before. [`thread_slot`] and [`conn_slot`]
//!    go further where a slot names one key alone: the thread's cookie and the connection's
//!    turn come from the arrays, and the hash maps are asked only for shared slots.
//! 3. The hash maps themselves (TRACED_CONNS, TRACKED_THREADS, TUPLES).
//!
//! Slots are written without atomics: two CPUs racing on one slot can lose a collision mark,
//! which makes a traced key look untraced until it is marked again (every traced send and
//! receive re-marks its thread; a connection is marked once at ESTABLISHED, and such a race
//! needs two connections established at the same instant whose cookies share 16 low bits).

use aya_ebpf::maps::Array;
use meshlab_common::{PREFILTER_COLLIDED_COOKIE, PREFILTER_COLLIDED_TID, PREFILTER_SLOTS};

use crate::emit::atomic_add;
use crate::globals::config;
use crate::maps::{
    COOKIE_SLOTS, LOCAL_PORT_BITS, THREAD_COOKIE_SLOTS, TID_SLOTS, TRACED_LIVE, TURN_SLOTS,
};

const SLOT_MASK: u32 = PREFILTER_SLOTS - 1;

/// No traced connection exists, so no TCP socket hook can match.
#[inline(always)]
pub fn nothing_traced() -> bool {
    // SAFETY: array value read at once; a racing update only changes which path this takes.
    TRACED_LIVE
        .get(0)
        .is_none_or(|live| unsafe { core::ptr::read_volatile(live) } == 0)
}

/// [`nothing_traced`], and unix sockets are not traced either (hooks with a unix path).
#[inline(always)]
pub fn no_socket_traced() -> bool {
    config!(trace_unix) == 0 && nothing_traced()
}

/// Whether `cookie` may be in TRACED_CONNS; `false` is definite.
#[inline(always)]
pub fn cookie_may_be_traced(cookie: u64) -> bool {
    let Some(slot) = COOKIE_SLOTS.get(cookie as u32 & SLOT_MASK) else {
        return false;
    };
    cookie != 0 && (*slot == cookie || *slot == PREFILTER_COLLIDED_COOKIE)
}

/// The current turn of traced connection `cookie` is (not) sampled.
#[inline(always)]
pub fn turn_decided(cookie: u64, sampled: u8) {
    if let Some(slot) = TURN_SLOTS.get_ptr_mut(cookie as u32 & SLOT_MASK) {
        // SAFETY: valid array value; only the connection owning the cookie slot reads it.
        unsafe { *slot = sampled };
    }
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

/// What the slot arrays alone say about traced connection `cookie`.
pub enum ConnSlot {
    /// Definitely not in TRACED_CONNS (sock_ops unmarks the slot when it removes it; a zero
    /// cookie, not assigned yet, is never traced).
    Gone,
    /// Traced, and whether its current turn is sampled.
    Traced { sampled: bool },
    /// Another traced connection shares the slot: ask TRACED_CONNS.
    Collided,
}

#[inline(always)]
pub fn conn_slot(cookie: u64) -> ConnSlot {
    let index = cookie as u32 & SLOT_MASK;
    match COOKIE_SLOTS.get(index) {
        Some(slot) if cookie != 0 && *slot == cookie => ConnSlot::Traced {
            sampled: config!(sample_messages_every) <= 1
                || TURN_SLOTS.get(index).is_some_and(|sampled| *sampled != 0),
        },
        Some(slot) if cookie != 0 && *slot == PREFILTER_COLLIDED_COOKIE => ConnSlot::Collided,
        _ => ConnSlot::Gone,
    }
}

/// Whether a traced connection may use local port `port`; `false` is definite.
#[inline(always)]
pub fn local_port_may_be_traced(port: u16) -> bool {
    LOCAL_PORT_BITS
        .get(u32::from(port >> 6))
        .is_some_and(|bits| bits & (1u64 << (port & 63)) != 0)
}

/// sock_ops added `cookie` (local port `port`) to TRACED_CONNS.
#[inline(always)]
pub fn conn_added(cookie: u64, port: u16) {
    if let Some(live) = TRACED_LIVE.get_ptr_mut(0) {
        // SAFETY: valid, 8-byte aligned array value for the program's lifetime.
        unsafe { atomic_add(live, 1) };
    }
    mark(
        &COOKIE_SLOTS,
        cookie as u32 & SLOT_MASK,
        cookie,
        PREFILTER_COLLIDED_COOKIE,
    );
    turn_decided(cookie, 0);
    if let Some(bits) = LOCAL_PORT_BITS.get_ptr_mut(u32::from(port >> 6)) {
        // SAFETY: valid array value; bits are only ever set, a lost race re-sets at next open.
        unsafe { *bits |= 1u64 << (port & 63) };
    }
}

/// sock_ops removed `cookie` from TRACED_CONNS.
#[inline(always)]
pub fn conn_removed(cookie: u64) {
    if let Some(live) = TRACED_LIVE.get_ptr_mut(0) {
        // SAFETY: as in conn_added; adding u64::MAX is subtracting one.
        unsafe { atomic_add(live, u64::MAX) };
    }
    unmark(&COOKIE_SLOTS, cookie as u32 & SLOT_MASK, cookie);
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
