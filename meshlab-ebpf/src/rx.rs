//! RX path: netif_receive_skb -> tcp_probe -> sk_data_ready -> (wakeup) ->
//! skb_copy_datagram_iovec -> recv return.

use meshlab_common::{EVENT_FLAG_TUPLE, Event, Hook, TURN_RX};

use crate::diag::diag_warn;
use crate::emit::{TpArgs, emit, set_conn_tuple, tp_entries};
use crate::globals::{config, offset};
use crate::irq::clear;
use crate::kread::{
    BtfLoad, KernelRead, ProbeRead, addr_bytes, parse_tcp, read_word, sampled_sock, skb_ifindex,
    skb_shinfo, tcp_skb_cb_range, traced_sock, untrusted_tcp_load,
};
use crate::maps::{CPU_STATE, NIC_IRQS};
use crate::prefilter::{no_socket_sampled, nothing_sampled, nothing_traced, rx_conn};
use crate::turn::{conn_payload_sampled, unsampled_turn_continues};
use crate::tx::track_thread;

/// The CPU context of a frame netif_receive_skb takes (`ev.ifindex` set): the running NET_RX
/// softirq's ([`attach_cpu_context`]), after one correction. A NIC IRQ that came during the
/// run is the frame's when it is of the frame's device and queue: a device raises no IRQ while
/// its NAPI is scheduled, so a frame of it polled after that IRQ arrived after it. Where the
/// running net_rx_action polls a device scheduled meanwhile itself (kernels whose
/// `softnet_data` has `in_net_rx_action`: 6.12 and 6.18 do, 6.1 does not), that IRQ gets no
/// softirq entry of its own and the run's IRQ, raise and entry came before the frame arrived.
/// The pending IRQ then becomes the run's context, without a softirq entry (for this frame and
/// the device's next ones in the run; a later IRQ during the run moves it on again). On every
/// kernel the same holds for an IRQ that lands between the softirq's entry and the action's
/// first look at its poll list (seen on 6.1 in the two-guest scenario); elsewhere on 6.1 the
/// raise starts a new run, whose entry promotes the IRQ as before. An IRQ taken while this
/// program ran, after its clock read (`ev.ts_ns`), is not this frame's: it stays pending for
/// the next (CI-65 saw one promoted 81 µs after its frame under TCG, 1 frame of 3191).
#[inline(always)]
fn netif_context(ev: &mut Event) {
    if let Some(state) = CPU_STATE.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only touched by programs of this CPU.
        let state = unsafe { &mut *state };
        // A NIC IRQ is pending (never on veth or loopback: one test on the common path),
        // we are in a run (softirq_exit zeroes both times) and it came after the run's entry
        // or its last promoted IRQ, and before the frame's stamp.
        let pending = state.pending_irq_ns;
        if pending != 0
            && pending <= ev.ts_ns
            && pending > state.softirq_entry_ns.max(state.irq_entry_ns)
            && (state.softirq_entry_ns | state.irq_entry_ns) != 0
        {
            // A hard IRQ may interrupt this program and its handler's programs rewrite the
            // pending fields: the IRQ and its raise are copied out once, and promoted only if
            // no newer IRQ came meanwhile (checked after the lookup). One that came stays
            // pending: it is after this frame's stamp.
            let (irq, raise) = (state.pending_irq, state.pending_raise_ns);
            // SAFETY: a plain read of this CPU's slot; volatile, so it is read again here.
            let unchanged =
                || unsafe { core::ptr::read_volatile(&state.pending_irq_ns) } == pending;
            if irq_of_frame(irq, ev.ifindex, ev.queue) && unchanged() {
                state.irq = irq;
                state.irq_entry_ns = pending;
                state.softirq_raise_ns = raise;
                clear(&mut state.softirq_entry_ns);
                clear(&mut state.pending_irq);
                clear(&mut state.pending_irq_ns);
                clear(&mut state.pending_raise_ns);
            }
        }
    }
    attach_cpu_context(ev);
}

/// Whether NIC IRQ `irq` is of the device `ifindex` and of the frame's RX `queue` (when both
/// are known; `u32::MAX` is an unknown queue).
#[inline(always)]
fn irq_of_frame(irq: u32, ifindex: u32, queue: u32) -> bool {
    // SAFETY: value copied out at once.
    let Some(nic) = (unsafe { NIC_IRQS.get(&irq) }).copied() else {
        return false;
    };
    if nic.ifindex != ifindex {
        return false;
    }
    nic.queue == u32::MAX || queue == u32::MAX || queue == nic.queue
}

/// The RX queue a driver recorded for the skb (`skb_record_rx_queue` stores queue + 1 in
/// `queue_mapping`), `u32::MAX` when none did; read as the kernel's `skb_get_rx_queue` reads
/// it (on veth the field still holds the sender's TX queue: the merge uses it for NICs only).
/// It tells apart the frames of two queues of one NIC whose softirq runs share a CPU, which the
/// CPU's context cannot.
#[inline(always)]
fn rx_queue<M: KernelRead>(skb: u64) -> u32 {
    match M::load::<u16>(skb, offset!(sk_buff_queue_mapping)) {
        Some(mapping) if mapping != 0 => u32::from(mapping) - 1,
        _ => u32::MAX,
    }
}

/// Copies this CPU's IRQ/softirq context into an RX event, so a message's RX path is complete
/// without streaming every interrupt.
#[inline(always)]
fn attach_cpu_context(ev: &mut Event) {
    if let Some(state) = CPU_STATE.get_ptr(0) {
        // SAFETY: per-CPU slot, only touched by programs of this CPU.
        let state = unsafe { &*state };
        ev.irq = state.irq;
        ev.irq_entry_ns = state.irq_entry_ns;
        ev.softirq_raise_ns = state.softirq_raise_ns;
        ev.softirq_entry_ns = state.softirq_entry_ns;
    }
}

/// net:netif_receive_skb(skb): the stack takes the skb. No socket yet: the connection is found
/// by the 4-tuple sock_ops recorded.
fn try_netif_receive_skb<C: TpArgs>(ctx: &C) -> Option<()> {
    if nothing_traced() {
        return None;
    }
    let skb = ctx.arg_u64(0);
    let seg = parse_tcp::<C::Mem>(skb)?;
    if seg.len == 0 {
        return None;
    }
    let (cookie, conn) = rx_conn(&seg)?;
    let ifindex = skb_ifindex::<C::Mem>(skb);
    let wanted = config!(ifindex);
    if wanted != 0 && wanted != ifindex {
        return None;
    }
    if !conn_payload_sampled(conn, TURN_RX, seg.seq) {
        return None;
    }
    emit(Hook::NetifReceiveSkb, |ev| {
        ev.cookie = cookie;
        ev.skb = skb;
        ev.seq = seg.seq;
        ev.len = seg.len;
        ev.ifindex = ifindex;
        ev.saddr = addr_bytes(seg.daddr);
        ev.daddr = addr_bytes(seg.saddr);
        ev.sport = seg.dport;
        ev.dport = seg.sport;
        ev.flags |= EVENT_FLAG_TUPLE;
        if config!(rx_hw_timestamps) != 0 {
            ev.aux = rx_hw_timestamp::<C::Mem>(skb);
        }
        ev.queue = rx_queue::<C::Mem>(skb);
        netif_context(ev);
        Some(())
    });
    Some(())
}
tp_entries!(
    netif_receive_skb_btf,
    netif_receive_skb_raw,
    "netif_receive_skb",
    try_netif_receive_skb
);

/// `skb_hwtstamps(skb)->hwtstamp`: the NIC clock's time of the frame's arrival, 0 when the
/// driver set none. Only with `record --hw-timestamps` (`Config::rx_hw_timestamps`, a
/// read-only constant: without it the verifier drops the reads).
#[inline(always)]
fn rx_hw_timestamp<M: KernelRead>(skb: u64) -> u64 {
    // Behind skb->head, a plain pointer: a cast word load where the kernel allows it, else
    // a helper read (kread.rs).
    skb_shinfo::<M>(skb)
        .and_then(|shinfo| read_word::<M>(shinfo + offset!(skb_shared_info_hwtstamps) as u64))
        .unwrap_or(0)
}

/// tcp:tcp_probe(sk, skb): TCP processes a segment of an established socket. The range comes
/// from TCP_SKB_CB (end_seq - seq; a FIN counts one).
fn try_tcp_probe<C: TpArgs>(ctx: &C) -> Option<()> {
    if nothing_traced() {
        return None;
    }
    let (cookie, conn) = traced_sock::<C::Mem>(ctx.arg_u64(0))?;
    // Most segments of a message come after netif_receive_skb decided its turn.
    if unsampled_turn_continues(conn, TURN_RX) {
        return None;
    }
    let skb = ctx.arg_u64(1);
    let Some((seq, end_seq)) = tcp_skb_cb_range::<C::Mem>(skb) else {
        diag_warn!(
            "tcp_probe",
            "traced connection {}: reading TCP_SKB_CB(skb) seq/end_seq failed",
            cookie
        );
        return None;
    };
    let len = end_seq.wrapping_sub(seq);
    if len == 0 || !conn_payload_sampled(conn, TURN_RX, seq) {
        return None;
    }
    emit(Hook::TcpProbe, |ev| {
        ev.cookie = cookie;
        ev.skb = skb;
        ev.seq = seq;
        ev.len = len;
        set_conn_tuple(ev, conn.info());
        attach_cpu_context(ev);
        Some(())
    });
    Some(())
}
tp_entries!(tcp_probe_btf, tcp_probe_raw, "tcp_probe", try_tcp_probe);

/// sock:sk_data_ready(sk): data is queued and readers are about to be woken. Remembered per
/// CPU so the sched_waking that follows can be tied to this socket.
fn try_sk_data_ready<C: TpArgs>(ctx: &C) -> Option<()> {
    if no_socket_sampled() {
        return None;
    }
    let sk = ctx.arg_u64(0);
    let Some((cookie, info)) = sampled_sock::<C::Mem>(sk) else {
        return crate::unix::on_unix(Hook::SkDataReady, sk, 0);
    };
    let Some(rcv_nxt) = C::Mem::tcp_load::<u32>(sk, offset!(tcp_sock_rcv_nxt)) else {
        diag_warn!(
            "sk_data_ready",
            "traced connection {}: reading tcp_sock.rcv_nxt failed",
            cookie
        );
        return None;
    };
    emit(Hook::SkDataReady, |ev| {
        ev.cookie = cookie;
        ev.seq = rcv_nxt;
        set_conn_tuple(ev, info);
        if let Some(state) = CPU_STATE.get_ptr_mut(0) {
            // SAFETY: per-CPU slot, only touched by programs of this CPU.
            unsafe {
                (*state).data_ready_ns = ev.ts_ns;
                (*state).data_ready_cookie = cookie;
            }
        }
        Some(())
    });
    Some(())
}
tp_entries!(
    sk_data_ready_btf,
    sk_data_ready_raw,
    "sk_data_ready",
    try_sk_data_ready
);

/// skb:skb_copy_datagram_iovec(skb, len): recvmsg copies a queued skb to user memory.
/// The copy starts at the socket's `copied_seq` (tcp_recvmsg copies from there and advances
/// it after the copy), not at the skb's first byte: a reader taking a large skb in several
/// recv calls copies its middle and end, and the event must name the bytes it copied. The
/// skb's sequence number is the fallback when the socket cannot be read.
fn try_skb_copy<C: TpArgs>(ctx: &C) -> Option<()> {
    if nothing_sampled() {
        return None;
    }
    let skb = ctx.arg_u64(0);
    let sk: u64 = C::Mem::load(skb, offset!(sk_buff_sk))?;
    let (cookie, info) = sampled_sock::<C::Mem>(sk)?;
    // skb->sk is an RCU pointer, which bpf_skc_to_tcp_sock refuses: bpf_rdonly_cast where
    // the kernel has it, else a helper read.
    let seq = untrusted_tcp_load::<C::Mem, u32>(sk, offset!(tcp_sock_copied_seq))
        .or_else(|| tcp_skb_cb_range::<C::Mem>(skb).map(|(seq, _)| seq))
        .unwrap_or(0);
    let len = ctx.arg_u64(1) as u32;
    emit(Hook::SkbCopyDatagram, |ev| {
        ev.cookie = cookie;
        ev.skb = skb;
        ev.seq = seq;
        ev.len = len;
        set_conn_tuple(ev, info);
        Some(())
    });
    Some(())
}
tp_entries!(
    skb_copy_btf,
    skb_copy_raw,
    "skb_copy_datagram_iovec",
    try_skb_copy
);

/// sock:sock_recv_length(sk, ret, flags): the recv syscall returns.
fn try_recv_return<C: TpArgs>(ctx: &C) -> Option<()> {
    on_recv_return::<C::Mem, C::Mem>(ctx.arg_u64(0), ctx.arg_u64(1) as i32)
}

/// fexit sock_recvmsg(struct socket *sock, struct msghdr *msg, int flags) = ret: the same
/// point on kernels without the sock_recv_length tracepoint (before 6.3).
#[aya_ebpf::macros::fexit(function = "sock_recvmsg")]
pub fn recv_return_fexit(ctx: aya_ebpf::programs::FExitContext) -> i32 {
    let sock: u64 = ctx.arg(0);
    if let Some(sk) = BtfLoad::load::<u64>(sock, offset!(socket_sk)) {
        // `sk` was loaded from a field: see KernelRead::tcp_load.
        let _ = on_recv_return::<BtfLoad, ProbeRead>(sk, ctx.arg::<u64>(3) as i32);
    }
    0
}

/// `Tcp` reads the socket's tcp_sock fields: `M` where `sk` is the program's argument.
#[inline(always)]
fn on_recv_return<M: KernelRead, Tcp: KernelRead>(sk: u64, ret: i32) -> Option<()> {
    if no_socket_sampled() {
        return None;
    }
    let Some((cookie, info)) = sampled_sock::<M>(sk) else {
        return crate::unix::on_unix(Hook::RecvReturn, sk, ret);
    };
    let Some(copied_seq) = Tcp::tcp_load::<u32>(sk, offset!(tcp_sock_copied_seq)) else {
        diag_warn!(
            "recv_return",
            "traced connection {}: reading tcp_sock.copied_seq failed",
            cookie
        );
        return None;
    };
    emit(Hook::RecvReturn, |ev| {
        ev.cookie = cookie;
        ev.value = ret;
        ev.seq = copied_seq;
        set_conn_tuple(ev, info);
        track_thread(ev.tid, cookie);
        Some(())
    });
    Some(())
}
tp_entries!(
    recv_return_btf,
    recv_return_raw,
    "sock_recv_length",
    try_recv_return
);
