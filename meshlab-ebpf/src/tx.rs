//! TX path: tcp_sendmsg -> net_dev_queue -> (qdisc) -> net_dev_start_xmit -> net_dev_xmit,
//! and the send syscall's return.

use aya_ebpf::macros::{fentry, fexit, kprobe, tracepoint};
use aya_ebpf::programs::{FEntryContext, FExitContext, ProbeContext, TracePointContext};
use meshlab_common::{ConnInfo, Hook, TURN_TX};

use crate::diag::diag_warn;
use crate::emit::{TpArgs, emit, set_conn_tuple, tp_entries};
use crate::globals::{config, offset};
use crate::kread::{
    BtfLoad, KernelRead, ProbeRead, parse_tcp, sampled_sock, skb_ifindex, traced_sock,
};
use crate::maps::{
    INFLIGHT_TX, INFLIGHT_TX_USED, NIC_IFINDEXES, TRACEPOINT_PROBE_HITS, TRACKED_THREADS,
    XMIT_STATE, XmitState,
};
use crate::prefilter::{
    ThreadSlot, no_socket_sampled, nothing_sampled, nothing_traced, thread_added,
    thread_cookie_set, thread_may_be_tracked, thread_slot,
};
use crate::turn::{conn_payload_sampled, unsampled_turn_continues};

/// Marks thread `tid` as owning traced socket `cookie` (for the scheduler hooks).
#[inline(always)]
pub fn track_thread(tid: u32, cookie: u64) {
    // Every traced send and receive passes here, and the thread is almost always tracked
    // already with the same socket: the slot arrays say so without a hash lookup.
    if let ThreadSlot::Alone(known) = thread_slot(tid)
        && known == cookie
    {
        return;
    }
    // A lookup is far cheaper than an LRU update (which takes the map's lock).
    // SAFETY: value compared at once.
    if unsafe { TRACKED_THREADS.get(&tid) } != Some(&cookie) {
        let _ = TRACKED_THREADS.insert(&tid, &cookie, 0);
    }
    // Also repairs a slot mark lost to a race (see prefilter.rs); inlined array accesses.
    // Marked before the cookie is written: a thread racing for the slot sees it collided.
    if !thread_may_be_tracked(tid) {
        thread_added(tid);
    }
    thread_cookie_set(tid, cookie);
}

/// TCP send entry: the socket's write pointer and the bytes this call still has to copy
/// (`bytes` is only evaluated for a traced socket in a sampled turn).
#[inline(always)]
fn on_tcp_sendmsg<M: KernelRead>(sk: u64, bytes: impl FnOnce() -> Option<u64>) -> Option<()> {
    if nothing_traced() {
        return None;
    }
    let (cookie, conn) = traced_sock::<M>(sk)?;
    // The copy loop fires again for every chunk of one send, and one message can take several
    // sends: only a turn's first send needs the write pointer to decide.
    if unsampled_turn_continues(conn, TURN_TX) {
        return None;
    }
    let Some(write_seq) = M::tcp_load::<u32>(sk, offset!(tcp_sock_write_seq)) else {
        diag_warn!(
            "tcp_sendmsg",
            "traced connection {}: reading tcp_sock.write_seq failed",
            cookie
        );
        return None;
    };
    if !conn_payload_sampled(conn, TURN_TX, write_seq) {
        return None;
    }
    let bytes = bytes()?;
    emit(Hook::TcpSendmsg, |ev| {
        ev.cookie = cookie;
        ev.seq = write_seq;
        ev.len = bytes as u32;
        set_conn_tuple(ev, conn.info());
        track_thread(ev.tid, cookie);
        Some(())
    });
    Some(())
}

#[fentry(function = "tcp_sendmsg")]
pub fn tcp_sendmsg_fentry(ctx: FEntryContext) -> i32 {
    // tcp_sendmsg(struct sock *sk, struct msghdr *msg, size_t size)
    let size: u64 = ctx.arg(2);
    let _ = on_tcp_sendmsg::<BtfLoad>(ctx.arg(0), || Some(size));
    0
}

#[kprobe(function = "tcp_sendmsg")]
pub fn tcp_sendmsg_kprobe(ctx: ProbeContext) -> u32 {
    if let (Some(sk), Some(size)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(2)) {
        let _ = on_tcp_sendmsg::<ProbeRead>(sk, || Some(size));
    }
    0
}

/// tcp:tcp_sendmsg_locked(sk, msg, skb, size_goal): fires once per copy loop iteration; each
/// carries the write pointer and the bytes left, so every one names the same message end.
fn try_tcp_sendmsg_locked<C: TpArgs>(ctx: &C) -> Option<()> {
    let msg = ctx.arg_u64(1);
    on_tcp_sendmsg::<C::Mem>(ctx.arg_u64(0), || {
        C::Mem::load(msg, offset!(msghdr_msg_iter) + offset!(iov_iter_count))
    })
}
tp_entries!(
    tcp_sendmsg_locked_btf,
    tcp_sendmsg_locked_raw,
    "tcp_sendmsg_locked",
    try_tcp_sendmsg_locked
);

/// sock:sock_send_length(sk, ret, flags): the send syscall returns.
fn try_send_return<C: TpArgs>(ctx: &C) -> Option<()> {
    on_send_return::<C::Mem, C::Mem>(ctx.arg_u64(0), ctx.arg_u64(1) as i32)
}

/// fexit __sock_sendmsg(struct socket *sock, struct msghdr *msg) = ret: the same point on
/// kernels without the sock_send_length tracepoint (before 6.3) that have the msg_name fix
/// (stable 6.1.57+, 5.15.134+, ...): every send syscall passes __sock_sendmsg there, while
/// sock_sendmsg is left to in-kernel callers (meshlab-user/src/kernel/plan.rs).
#[fexit(function = "__sock_sendmsg")]
pub fn send_return_fexit(ctx: FExitContext) -> i32 {
    let sock: u64 = ctx.arg(0);
    if let Some(sk) = BtfLoad::load::<u64>(sock, offset!(socket_sk)) {
        // `sk` was loaded from a field, not passed in: ProbeRead for its tcp_sock fields
        // (see KernelRead::tcp_load).
        let _ = on_send_return::<BtfLoad, ProbeRead>(sk, ctx.arg::<u64>(2) as i32);
    }
    0
}

/// `Tcp` reads the socket's tcp_sock fields: `M` where `sk` is the program's argument.
#[inline(always)]
fn on_send_return<M: KernelRead, Tcp: KernelRead>(sk: u64, ret: i32) -> Option<()> {
    if no_socket_sampled() {
        return None;
    }
    let Some((cookie, info)) = sampled_sock::<M>(sk) else {
        return crate::unix::on_unix(Hook::SendReturn, sk, ret);
    };
    emit(Hook::SendReturn, |ev| {
        ev.cookie = cookie;
        ev.value = ret;
        let Some(write_seq) = Tcp::tcp_load::<u32>(sk, offset!(tcp_sock_write_seq)) else {
            diag_warn!(
                "send_return",
                "traced connection {}: reading tcp_sock.write_seq failed",
                cookie
            );
            return None;
        };
        ev.seq = write_seq;
        set_conn_tuple(ev, info);
        track_thread(ev.tid, cookie);
        Some(())
    });
    Some(())
}
tp_entries!(
    send_return_btf,
    send_return_raw,
    "sock_send_length",
    try_send_return
);

/// What the TX skb hooks record about a traced, payload-carrying skb.
struct TxSkb {
    cookie: u64,
    info: &'static ConnInfo,
    seq: u32,
    len: u32,
    ifindex: u32,
    queue: u32,
}

/// `None` for untraced skbs, payload-less ones (pure ACKs) and other devices than `--device`.
#[inline(always)]
fn traced_tx_skb<M: KernelRead>(skb: u64) -> Option<TxSkb> {
    if nothing_sampled() {
        return None;
    }
    let sk: u64 = M::load(skb, offset!(sk_buff_sk))?;
    let (cookie, info) = sampled_sock::<M>(sk)?;
    let seg = parse_tcp::<M>(skb)?;
    if seg.len == 0 {
        return None;
    }
    let ifindex = skb_ifindex::<M>(skb);
    let wanted = config!(ifindex);
    if wanted != 0 && wanted != ifindex {
        return None;
    }
    let queue = u32::from(M::load::<u16>(skb, offset!(sk_buff_queue_mapping)).unwrap_or(u16::MAX));
    Some(TxSkb {
        cookie,
        info,
        seq: seg.seq,
        len: seg.len,
        ifindex,
        queue,
    })
}

#[inline(always)]
fn emit_tx_skb(hook: Hook, skb: u64, tx: &TxSkb) {
    emit(hook, |ev| {
        ev.cookie = tx.cookie;
        ev.skb = skb;
        ev.seq = tx.seq;
        ev.len = tx.len;
        ev.ifindex = tx.ifindex;
        ev.queue = tx.queue;
        set_conn_tuple(ev, tx.info);
        Some(())
    });
}

/// net:net_dev_queue(skb): the skb enters the device layer; the qdisc enqueue follows.
fn try_net_dev_queue<C: TpArgs>(ctx: &C) -> Option<()> {
    let skb = ctx.arg_u64(0);
    emit_tx_skb(Hook::NetDevQueue, skb, &traced_tx_skb::<C::Mem>(skb)?);
    Some(())
}
tp_entries!(
    net_dev_queue_btf,
    net_dev_queue_raw,
    "net_dev_queue",
    try_net_dev_queue
);

/// net:net_dev_start_xmit(skb, dev): the qdisc hands the skb to the driver.
fn try_net_dev_start_xmit<C: TpArgs>(ctx: &C) -> Option<()> {
    let skb = ctx.arg_u64(0);
    let tx = traced_tx_skb::<C::Mem>(skb)?;
    let state = XmitState {
        skb,
        cookie: tx.cookie,
        seq: tx.seq,
        len: tx.len,
        ifindex: tx.ifindex,
        queue: tx.queue,
    };
    if let Some(slot) = XMIT_STATE.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, written and read by programs of this CPU only.
        unsafe { *slot = state };
    }
    // SAFETY: presence check only.
    if unsafe { NIC_IFINDEXES.get(&tx.ifindex) }.is_some() {
        match INFLIGHT_TX.insert(&skb, &state, 0) {
            Ok(()) => inflight_tx_used(),
            Err(errno) => diag_warn!(
                "net_dev_start_xmit",
                "traced connection {}: INFLIGHT_TX update failed ({}), its TX completion is lost",
                tx.cookie,
                errno
            ),
        }
    }
    emit_tx_skb(Hook::NetDevStartXmit, skb, &tx);
    Some(())
}
tp_entries!(
    net_dev_start_xmit_btf,
    net_dev_start_xmit_raw,
    "net_dev_start_xmit",
    try_net_dev_start_xmit
);

/// net:net_dev_xmit(skb, rc, dev, skb_len): the driver returned. The skb may already be freed
/// or queued on a veth peer, so its facts come from the matching start_xmit on this CPU.
fn try_net_dev_xmit<C: TpArgs>(ctx: &C) -> Option<()> {
    let skb = ctx.arg_u64(0);
    let state = XMIT_STATE.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, written and read by programs of this CPU only.
    let state = unsafe { &mut *state };
    if state.skb != skb || skb == 0 {
        return None;
    }
    state.skb = 0;
    emit_sent(Hook::NetDevXmit, skb, state, ctx.arg_u64(1) as i32);
    Some(())
}

/// An event about an skb already handed to the driver, from what start_xmit kept of it.
#[inline(always)]
fn emit_sent(hook: Hook, skb: u64, sent: &XmitState, value: i32) {
    emit(hook, |ev| {
        ev.cookie = sent.cookie;
        ev.skb = skb;
        ev.seq = sent.seq;
        ev.len = sent.len;
        ev.ifindex = sent.ifindex;
        ev.queue = sent.queue;
        ev.value = value;
        Some(())
    });
}
tp_entries!(
    net_dev_xmit_btf,
    net_dev_xmit_raw,
    "net_dev_xmit",
    try_net_dev_xmit
);

/// skb:consume_skb(skb, ...): a NIC driver freed a TX skb it was handed: TX completion.
fn try_tx_complete<C: TpArgs>(ctx: &C) -> Option<()> {
    // Runs for every freed skb on the machine: skip the hash lookup while no traced skb was
    // ever handed to a NIC driver (loopback and veth traffic never are).
    if !inflight_tx_seen() {
        return None;
    }
    let skb = ctx.arg_u64(0);
    // SAFETY: value copied out at once.
    let sent = *unsafe { INFLIGHT_TX.get(&skb) }?;
    let _ = INFLIGHT_TX.remove(&skb);
    emit_sent(Hook::TxComplete, skb, &sent, 0);
    Some(())
}
tp_entries!(
    tx_complete_btf,
    tx_complete_raw,
    "consume_skb",
    try_tx_complete
);

/// A traced skb went into INFLIGHT_TX: from now on tx_complete looks freed skbs up.
#[inline(always)]
fn inflight_tx_used() {
    if let Some(used) = INFLIGHT_TX_USED.get_ptr_mut(0) {
        // SAFETY: valid array value; only ever set to 1.
        unsafe {
            if *used == 0 {
                *used = 1;
            }
        }
    }
}

/// Whether INFLIGHT_TX may hold an skb (see INFLIGHT_TX_USED).
#[inline(always)]
fn inflight_tx_seen() -> bool {
    // SAFETY: array value read at once.
    INFLIGHT_TX_USED
        .get(0)
        .is_some_and(|used| unsafe { core::ptr::read_volatile(used) } != 0)
}

/// Classic (perf) tracepoint: only a capability probe for `meshlab doctor`. raw_tp exists on
/// every kernel that has the BPF ring buffer (5.8+), so record never needs this tier.
#[tracepoint(category = "net", name = "net_dev_queue")]
pub fn net_dev_queue_tracepoint(_ctx: TracePointContext) -> u32 {
    if let Some(slot) = TRACEPOINT_PROBE_HITS.get_ptr_mut(0) {
        // SAFETY: valid per-CPU u64 slot; atomic for the same nesting reason as emit::bump.
        unsafe { crate::atomic::atomic_add(slot, 1) };
    }
    0
}
