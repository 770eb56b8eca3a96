//! Per-message sampling (`record --sample-messages 1/N`): which turns of a traced connection
//! are traced. The rule is [`meshlab_common::Turn`]'s; both ends of a connection apply it to the
//! bytes they see, so they pick the same requests without talking (docs/probes.md).

use meshlab_common::{ConnInfo, TURN_TX, message_sampled};

use crate::globals::config;
use crate::prefilter::TracedConn;

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
    info.turn.sampled != 0 || config!(sample_messages_every) <= 1
}

/// The hook deciding `direction`'s turns can return at once, before reading what the decision
/// needs: the turn already runs that way and is not sampled (the rest of an unsampled message
/// costs what an untraced socket costs).
#[inline(always)]
pub fn unsampled_turn_continues(conn: TracedConn, direction: u8) -> bool {
    config!(sample_messages_every) > 1 && conn.direction() == direction && !conn.sampled()
}
