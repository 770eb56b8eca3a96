//! sock_ops (cgroup2): decides at ESTABLISHED whether a connection is traced, records its
//! cookie, 4-tuple and sequence bases, and forgets it at close.

use aya_ebpf::EbpfContext;
use aya_ebpf::helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie};
use aya_ebpf::macros::sock_ops;
use aya_ebpf::programs::SockOpsContext;
use meshlab_common::{
    AF_INET, AF_INET6, EVENT_FLAG_ACTIVE_OPEN, FILTER_ADDRS, FILTER_PORTS, Hook, MAX_TRACED_CONNS,
    TURN_NONE, TupleKey, Turn, conn_sample_hash, conn_sampled,
};

use crate::diag::{diag_error, diag_warn};
use crate::emit::{emit_without_task, emit_without_task_waking, set_conn_tuple};
use crate::globals::config;
use crate::kread::ipv4_mapped;
use crate::maps::{FILTER_ADDR_SET, FILTER_PORT_SET, SCRATCH_CONN, TRACED_CONNS, TUPLES};
use crate::prefilter::{conn_added, conn_closing, conn_removed};
use crate::tstamp::{
    BPF_SOCK_OPS_TSTAMP_ACK_CB, BPF_SOCK_OPS_TSTAMP_SCHED_CB, BPF_SOCK_OPS_TSTAMP_SENDMSG_CB,
    on_sendmsg, on_timestamp, request_callbacks,
};

// include/uapi/linux/bpf.h; stable UAPI values.
const BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB: u32 = 4;
const BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: u32 = 5;
const BPF_SOCK_OPS_STATE_CB: u32 = 10;
const BPF_SOCK_OPS_STATE_CB_FLAG: i32 = 1 << 2;
/// include/net/tcp_states.h
const TCP_CLOSE: u32 = 7;

/// Reads one `bpf_sock_ops` context field. The verifier only allows context loads at a
/// constant offset from the unmodified context pointer; a volatile load of the field's own
/// address keeps LLVM from reusing a shifted base pointer for neighbouring fields.
macro_rules! ctx_field {
    ($ctx:expr, $($field:tt)+) => {
        // SAFETY: `ops` is the program's context; the field exists in every kernel's
        // bpf_sock_ops (UAPI), and the verifier rewrites the load into a socket access.
        unsafe { core::ptr::read_volatile(&raw const (*$ctx.ops).$($field)+) }
    };
}

#[sock_ops]
pub fn meshlab_sock_ops(ctx: SockOpsContext) -> u32 {
    match ctx_field!(ctx, op) {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => {
            let _ = try_established(&ctx, true);
        }
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => {
            let _ = try_established(&ctx, false);
        }
        BPF_SOCK_OPS_STATE_CB if ctx_field!(ctx, __bindgen_anon_1.args[1]) == TCP_CLOSE => {
            let _ = try_closed(&ctx);
        }
        BPF_SOCK_OPS_TSTAMP_SENDMSG_CB => {
            let _ = on_sendmsg(&ctx);
        }
        op @ BPF_SOCK_OPS_TSTAMP_SCHED_CB..=BPF_SOCK_OPS_TSTAMP_ACK_CB => {
            let _ = on_timestamp(&ctx, op);
        }
        _ => {}
    }
    // sock_ops programs return 1 to let the operation proceed.
    1
}

/// Writes the connection's local-view 4-tuple (ports in host byte order) into `tuple`.
fn fill_tuple(ctx: &SockOpsContext, tuple: &mut TupleKey) -> Option<()> {
    let family = ctx_field!(ctx, family) as u16;
    if family == AF_INET {
        tuple.local_addr = ipv4_mapped(ctx_field!(ctx, local_ip4).to_ne_bytes());
        tuple.remote_addr = ipv4_mapped(ctx_field!(ctx, remote_ip4).to_ne_bytes());
    } else if family == AF_INET6 {
        let local = [
            ctx_field!(ctx, local_ip6[0]),
            ctx_field!(ctx, local_ip6[1]),
            ctx_field!(ctx, local_ip6[2]),
            ctx_field!(ctx, local_ip6[3]),
        ];
        let remote = [
            ctx_field!(ctx, remote_ip6[0]),
            ctx_field!(ctx, remote_ip6[1]),
            ctx_field!(ctx, remote_ip6[2]),
            ctx_field!(ctx, remote_ip6[3]),
        ];
        tuple.local_addr = ip6_bytes(local);
        tuple.remote_addr = ip6_bytes(remote);
    } else {
        return None;
    }
    tuple.local_port = ctx_field!(ctx, local_port) as u16;
    // UAPI: remote_port holds the network-order port in its upper 16 bits on little endian.
    tuple.remote_port = u16::from_be((ctx_field!(ctx, remote_port) >> 16) as u16);
    tuple._pad = 0;
    Some(())
}

fn ip6_bytes(words: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let b = words[i].to_ne_bytes();
        out[i * 4] = b[0];
        out[i * 4 + 1] = b[1];
        out[i * 4 + 2] = b[2];
        out[i * 4 + 3] = b[3];
        i += 1;
    }
    out
}

/// The in-kernel filters: namespace, ports, addresses, then 1/N connection sampling. `Some`:
/// traced, with the connection's sample hash (also the seed of message sampling).
fn wanted(ctx: &SockOpsContext, tuple: &TupleKey) -> Option<u32> {
    let netns = config!(netns_cookie);
    // SAFETY: sock_ops may call bpf_get_netns_cookie with its context (5.15+).
    if netns != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } != netns {
        return None;
    }
    let flags = config!(filter_flags);
    // SAFETY (map gets): only presence is checked.
    if flags & FILTER_PORTS != 0
        && unsafe { FILTER_PORT_SET.get(&tuple.local_port) }.is_none()
        && unsafe { FILTER_PORT_SET.get(&tuple.remote_port) }.is_none()
    {
        return None;
    }
    if flags & FILTER_ADDRS != 0
        && unsafe { FILTER_ADDR_SET.get(&tuple.local_addr) }.is_none()
        && unsafe { FILTER_ADDR_SET.get(&tuple.remote_addr) }.is_none()
    {
        return None;
    }
    let hash = conn_sample_hash(
        &tuple.local_addr,
        tuple.local_port,
        &tuple.remote_addr,
        tuple.remote_port,
    );
    if !conn_sampled(hash, config!(sample_every)) {
        return None;
    }
    Some(hash)
}

fn try_established(ctx: &SockOpsContext, active: bool) -> Option<()> {
    let Some(info) = SCRATCH_CONN.get_ptr_mut(0) else {
        diag_error!("sock_ops", "per-CPU scratch slot SCRATCH_CONN[0] missing");
        return None;
    };
    // SAFETY: per-CPU scratch slot; sock_ops runs with bottom halves or preemption disabled
    // for the duration of the program, so nothing else on this CPU uses it meanwhile.
    let info = unsafe { &mut *info };
    fill_tuple(ctx, &mut info.tuple)?;
    info.sample_hash = wanted(ctx, &info.tuple)?;
    info.turn = Turn {
        direction: TURN_NONE,
        sampled: 0,
        requests_are_sent: u8::from(active),
        _pad: 0,
    };
    // Also makes the kernel assign the cookie, so tracepoints that read sk_cookie see it.
    // SAFETY: helper valid for sock_ops contexts.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let (snd_nxt, rcv_nxt) = (ctx_field!(ctx, snd_nxt), ctx_field!(ctx, rcv_nxt));
    info.snd_base = snd_nxt;
    info.rcv_base = rcv_nxt;
    if let Err(errno) = TRACED_CONNS.insert(&cookie, &*info, 0) {
        diag_warn!(
            "sock_ops",
            "connection {} not traced: TRACED_CONNS update failed ({})",
            cookie,
            errno
        );
        return None;
    }
    if let Err(errno) = TUPLES.insert(&info.tuple, &cookie, 0) {
        diag_warn!(
            "sock_ops",
            "connection {} not traced: TUPLES update failed ({})",
            cookie,
            errno
        );
        return None;
    }
    conn_added(cookie, info);
    // Ask for STATE_CB so the connection leaves the maps when it closes.
    let _ = ctx
        .set_cb_flags(ctx_field!(ctx, bpf_sock_ops_cb_flags) as i32 | BPF_SOCK_OPS_STATE_CB_FLAG);
    request_callbacks(ctx);

    // Passive opens complete in softirq context: the current task would be unrelated anyway.
    let wake = config!(wake_on_traced) != 0;
    emit_without_task_waking(Hook::SockEstablished, wake, |ev| {
        ev.cookie = cookie;
        ev.seq = snd_nxt;
        ev.aux = u64::from(rcv_nxt);
        if active {
            ev.flags |= EVENT_FLAG_ACTIVE_OPEN;
        }
        set_conn_tuple(ev, info);
        Some(())
    });
    Some(())
}

fn try_closed(ctx: &SockOpsContext) -> Option<()> {
    // SAFETY: helper valid for sock_ops contexts.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // Only connections sock_ops traced ask for STATE_CB (try_established), so a miss means
    // this recording lost it, or an earlier recording traced it.
    let Some(record) = TRACED_CONNS.get_ptr_mut(&cookie) else {
        diag_warn!(
            "sock_ops",
            "closed connection {} was not in TRACED_CONNS: evicted (more than {} traced at once) or traced by an earlier recording",
            cookie,
            MAX_TRACED_CONNS
        );
        return None;
    };
    // SAFETY: `record` is the connection's TRACED_CONNS value, valid for this run: copied out
    // before conn_closing retires its turn.
    let info = unsafe { *record };
    // SAFETY: as above.
    unsafe { conn_closing(cookie, record) };
    let _ = TUPLES.remove(&info.tuple);
    if TRACED_CONNS.remove(&cookie).is_ok() {
        conn_removed(cookie, &info.tuple);
    }
    emit_without_task(Hook::SockClosed, |ev| {
        ev.cookie = cookie;
        set_conn_tuple(ev, &info);
        Some(())
    });
    Some(())
}
