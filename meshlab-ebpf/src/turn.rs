//! Per-message sampling (`record --sample-messages 1/N`): which turns of a traced connection
//! are traced. The rule is [`meshlab_common::Turn`]'s; both ends of a connection apply it to the
//! bytes they see, so they pick the same requests without talking (docs/probes.md).

use meshlab_common::{ConnInfo, TURN_TX, message_sampled};

use crate::globals::config;

/// Payload of a traced connection (its record, [`crate::prefilter::traced_conn`]) flows in
/// `direction` (TURN_TX or TURN_RX) from sequence number `seq`. A change of direction starts a
/// new turn; a request turn decides by the stream offset of its first byte, a response turn
/// keeps the decision of the request it answers. Returns whether the turn is sampled. Called
/// by the hooks that see a message's bytes first: tcp_sendmsg (TX), netif_receive_skb and
/// tcp_probe (RX). A racing update of the same turn on another CPU writes the same decision
/// (it is a function of the same byte).
#[inline(always)]
pub fn conn_payload_sampled(info: &mut ConnInfo, direction: u8, seq: u32) -> bool {
    let every = config!(sample_messages_every);
    if every <= 1 {
        return true;
    }
    if info.turn.direction != direction {
        info.turn.direction = direction;
        let sent = direction == TURN_TX;
        if sent == (info.turn.requests_are_sent != 0) {
            let base = if sent { info.snd_base } else { info.rcv_base };
            let offset = seq.wrapping_sub(base);
            info.turn.sampled = u8::from(message_sampled(info.sample_hash, offset, every));
        }
    }
    info.turn.sampled != 0
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
pub fn unsampled_turn_continues(info: &ConnInfo, direction: u8) -> bool {
    config!(sample_messages_every) > 1 && info.turn.direction == direction && info.turn.sampled == 0
}
