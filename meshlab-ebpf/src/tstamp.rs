//! Socket TX timestamps through sock_ops (kernel 6.15+): for sampled sends of traced
//! connections the kernel calls sock_ops again when the send's last byte enters the qdisc,
//! gets its driver (software) timestamp, its NIC (hardware) timestamp and its ACK.
//!
//! Turning them on per send takes the kfunc `bpf_sock_ops_enable_tx_tstamp`, which aya 0.14
//! cannot call: [`enable_tx_tstamp`] emits placeholder calls the loader rewrites into kfunc
//! calls (meshlab_common::KFUNC_CALL_PLACEHOLDERS, docs/toolchain.md).

use aya_ebpf::EbpfContext;
use aya_ebpf::helpers::generated::{bpf_get_socket_cookie, bpf_setsockopt};
use aya_ebpf::programs::SockOpsContext;
use meshlab_common::{
    Hook, KFUNC_PLACEHOLDER_CAST_TO_KERN_CTX, KFUNC_PLACEHOLDER_ENABLE_TX_TSTAMP,
};

use crate::emit::{emit_without_task, set_conn_tuple};
use crate::globals::{config, offset};
use crate::kread::{ProbeRead, read, skb_shinfo};
use crate::prefilter::traced_conn;
use crate::turn::turn_sampled;

// include/uapi/linux/bpf.h (6.15+); stable UAPI values.
pub const BPF_SOCK_OPS_TSTAMP_SCHED_CB: u32 = 16;
pub const BPF_SOCK_OPS_TSTAMP_SND_SW_CB: u32 = 17;
pub const BPF_SOCK_OPS_TSTAMP_SND_HW_CB: u32 = 18;
pub const BPF_SOCK_OPS_TSTAMP_ACK_CB: u32 = 19;
pub const BPF_SOCK_OPS_TSTAMP_SENDMSG_CB: u32 = 20;
const SOL_SOCKET: i32 = 1;
const SK_BPF_CB_FLAGS: i32 = 1009;
const SK_BPF_CB_TX_TIMESTAMPING: i32 = 1;

/// At ESTABLISHED of a traced connection: ask for the TSTAMP_SENDMSG callback on it. Only
/// traced sockets get it, so untraced traffic pays nothing.
#[inline(always)]
pub fn request_callbacks(ctx: &SockOpsContext) {
    if config!(tx_timestamps) == 0 {
        return;
    }
    let mut flags = SK_BPF_CB_TX_TIMESTAMPING;
    // SAFETY: bpf_setsockopt is valid in sock_ops; optval points to a live i32 of optlen bytes.
    // A kernel refusing it (before 6.15) just never calls back; doctor says whether it can.
    let _ = unsafe {
        bpf_setsockopt(
            ctx.as_ptr(),
            SOL_SOCKET,
            SK_BPF_CB_FLAGS,
            (&raw mut flags).cast(),
            core::mem::size_of::<i32>() as i32,
        )
    };
}

/// TSTAMP_SENDMSG: a send of a traced connection just queued its bytes. Timestamps are asked
/// for sampled turns only (`--sample-messages`), as every other TX hook records.
#[inline(always)]
pub fn on_sendmsg(ctx: &SockOpsContext) -> Option<()> {
    if config!(tx_timestamps) == 0 {
        return None;
    }
    // SAFETY: helper valid for sock_ops contexts.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if !turn_sampled(traced_conn(cookie)?.info()) {
        return None;
    }
    // SAFETY: the op is TSTAMP_SENDMSG (the kfunc's precondition) and ctx is the program's
    // unmodified context.
    unsafe { enable_tx_tstamp(ctx) };
    Some(())
}

/// `bpf_sock_ops_enable_tx_tstamp(bpf_cast_to_kern_ctx(ctx), 0)`: marks the skb holding the
/// send's last byte (SKBTX_BPF) and sets its tskey to that byte's sequence number. One asm
/// block so the typed kernel-context pointer never leaves r0/r1 between the two calls.
///
/// # Safety
/// Only in TSTAMP_SENDMSG, with the program's context.
#[inline(always)]
unsafe fn enable_tx_tstamp(ctx: &SockOpsContext) {
    // SAFETY: guaranteed by the caller; the calls clobber r0-r5 only, as declared.
    unsafe {
        core::arch::asm!(
            "call {cast}",
            "r1 = r0",
            "r2 = 0",
            "call {enable}",
            cast = const KFUNC_PLACEHOLDER_CAST_TO_KERN_CTX,
            enable = const KFUNC_PLACEHOLDER_ENABLE_TX_TSTAMP,
            inout("r1") ctx.as_ptr() => _,
            out("r0") _,
            out("r2") _,
            out("r3") _,
            out("r4") _,
            out("r5") _,
        );
    }
}

/// TSTAMP_SCHED / SND_SW / SND_HW / ACK of a marked send: one event, keyed like every TX
/// stage by the cookie and the sequence number of the send's last byte (the skb's tskey).
#[inline(always)]
pub fn on_timestamp(ctx: &SockOpsContext, op: u32) -> Option<()> {
    // A read-only constant: without timestamps the verifier drops what follows, and with it
    // the `skb_hwtstamp` context field that kernels before 6.2 refuse to load (the 6.1 guest).
    if config!(tx_timestamps) == 0 {
        return None;
    }
    let hook = match op {
        BPF_SOCK_OPS_TSTAMP_SCHED_CB => Hook::TxTstampSched,
        BPF_SOCK_OPS_TSTAMP_SND_SW_CB => Hook::TxTstampSw,
        BPF_SOCK_OPS_TSTAMP_SND_HW_CB => Hook::TxTstampHw,
        _ => Hook::TxTstampAck,
    };
    // SAFETY: helper valid for sock_ops contexts.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let info = traced_conn(cookie)?.info();
    let tskey = skb_tskey(ctx)?;
    let hw = if hook == Hook::TxTstampHw {
        // SAFETY: UAPI context field, rewritten by the verifier into skb_hwtstamps(skb).
        unsafe { core::ptr::read_volatile(&raw const (*ctx.ops).skb_hwtstamp) }
    } else {
        0
    };
    emit_without_task(hook, |ev| {
        ev.cookie = cookie;
        ev.seq = tskey;
        ev.len = 1;
        ev.aux = hw;
        set_conn_tuple(ev, info);
        Some(())
    });
    Some(())
}

/// `skb_shinfo(kctx->skb)->tskey`. At run time the sock_ops context register holds the
/// kernel's `struct bpf_sock_ops_kern *`, so its fields are read at their BTF offsets; the
/// UAPI context does not expose tskey.
#[inline(always)]
fn skb_tskey(ctx: &SockOpsContext) -> Option<u32> {
    let kctx = ctx.as_ptr() as u64;
    let skb: u64 = read(kctx, offset!(sock_ops_kern_skb))?;
    read(
        skb_shinfo::<ProbeRead>(skb)?,
        offset!(skb_shared_info_tskey),
    )
}
