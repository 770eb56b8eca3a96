//! Per-message sampling (`record --sample-messages 1/N`): which turns of a traced connection
//! are traced. The rule is [`meshlab_common::Turn`]'s; both ends of a connection apply it to the
//! bytes they see, so they pick the same requests without talking (docs/probes.md).

use core::mem::{offset_of, size_of};

use meshlab_common::{ConnInfo, TURN_TX, Turn, message_sampled};

use crate::atomic::{compare_exchange, fetch_or};
use crate::globals::config;
use crate::maps::LIVE_SAMPLED_TURNS;
use crate::prefilter::{TracedConn, live_add};

/// `Turn::sampled` of a sampled turn (0: not sampled; 2 and 3: retired, [`retire_turn`]).
pub const TURN_SAMPLED: u8 = 1;
/// OR-ed into `Turn::sampled` when a record stops holding its connection's turn.
const TURN_RETIRED_BIT: u8 = 2;

/// The record's 8-byte word that holds `turn` (with `sample_hash`, which never changes): the
/// sampled byte changes by atomics on it, as `turn.direction` may change beside it (a record
/// in the hash map keeps the direction there).
const TURN_WORD: usize = offset_of!(ConnInfo, sample_hash);
const SAMPLED_SHIFT: u32 =
    ((offset_of!(ConnInfo, turn) + offset_of!(Turn, sampled) - TURN_WORD) * 8) as u32;
const _: () = assert!(TURN_WORD % 8 == 0);
const _: () = assert!(offset_of!(ConnInfo, turn) + size_of::<Turn>() == TURN_WORD + 8);

/// The sampled byte of a turn word.
#[inline(always)]
fn sampled_byte(word: u64) -> u8 {
    (word >> SAMPLED_SHIFT) as u8
}

/// Sets the sampled byte of the record at `info` to `sampled` and keeps TRACED_LIVE's count of
/// connections in a sampled turn (prefilter::nothing_sampled) exact: only the CPU whose
/// compare-and-exchange changed the byte counts, so two CPUs deciding the same turn count it
/// once, and a retired record is left alone.
///
/// # Safety
/// `info` points to a record in a map value at an 8-byte aligned address.
#[inline(always)]
pub unsafe fn set_turn_sampled(info: *mut ConnInfo, sampled: bool) {
    let value = u8::from(sampled);
    // SAFETY: the word lies inside the record (asserted above), 8-byte aligned.
    let word = unsafe { info.cast::<u8>().add(TURN_WORD).cast::<u64>() };
    // A failed exchange means the direction byte beside it changed meanwhile: try again.
    for _ in 0..4 {
        // SAFETY: as above.
        let old = unsafe { core::ptr::read_volatile(word) };
        let current = sampled_byte(old);
        if current == value || current & TURN_RETIRED_BIT != 0 {
            return;
        }
        let new = (old & !(0xff << SAMPLED_SHIFT)) | u64::from(value) << SAMPLED_SHIFT;
        // SAFETY: as above.
        if unsafe { compare_exchange(word, old, new) } == old {
            live_add(LIVE_SAMPLED_TURNS, if sampled { 1 } else { u64::MAX });
            return;
        }
    }
}

/// Marks the record at `info` retired (the connection closed, or its turn moves to another
/// record) and returns the sampled byte it held: the caller takes over its place in the count.
///
/// # Safety
/// As [`set_turn_sampled`].
#[inline(always)]
pub unsafe fn retire_turn(info: *mut ConnInfo) -> u8 {
    // SAFETY: as in set_turn_sampled.
    let word = unsafe { info.cast::<u8>().add(TURN_WORD).cast::<u64>() };
    // SAFETY: as above.
    let old = unsafe { fetch_or(word, u64::from(TURN_RETIRED_BIT) << SAMPLED_SHIFT) };
    sampled_byte(old)
}

/// Payload of traced connection `conn` flows in `direction` (TURN_TX or TURN_RX) from sequence
/// number `seq`. A change of direction starts a new turn; a request turn decides by the stream
/// offset of its first byte, a response turn keeps the decision of the request it answers.
/// Returns whether the turn is sampled. Called by the hooks that see a message's bytes first:
/// tcp_sendmsg (TX), netif_receive_skb and tcp_probe (RX). A racing update of the same turn on
/// another CPU writes the same decision (it is a function of the same byte).
///
/// The direction changes with every message; the decision, in the line every other hook
/// reads, only when it differs from the last request's (maps.rs `ConnSlot`).
#[inline(always)]
pub fn conn_payload_sampled(conn: TracedConn, direction: u8, seq: u32) -> bool {
    let every = config!(sample_messages_every);
    if every <= 1 {
        return true;
    }
    if conn.direction() == direction {
        return conn.sampled();
    }
    conn.set_direction(direction);
    let info = conn.info();
    let sent = direction == TURN_TX;
    if sent != (info.turn.requests_are_sent != 0) {
        return conn.sampled();
    }
    let base = if sent { info.snd_base } else { info.rcv_base };
    let sampled = message_sampled(info.sample_hash, seq.wrapping_sub(base), every);
    conn.set_sampled(sampled);
    sampled
}

/// Whether the current turn of a traced connection (its record) is sampled: the hooks after a
/// turn's first one only read the decision.
#[inline(always)]
pub fn turn_sampled(info: &ConnInfo) -> bool {
    info.turn.sampled == TURN_SAMPLED || config!(sample_messages_every) <= 1
}

/// The hook deciding `direction`'s turns can return at once, before reading what the decision
/// needs: the turn already runs that way and is not sampled (the rest of an unsampled message
/// costs what an untraced socket costs).
#[inline(always)]
pub fn unsampled_turn_continues(conn: TracedConn, direction: u8) -> bool {
    config!(sample_messages_every) > 1 && conn.direction() == direction && !conn.sampled()
}
