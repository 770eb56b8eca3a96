//! NIC hard IRQs, NET_RX/NET_TX softirqs and napi_poll. They update per-CPU RX context that
//! RX events carry; with `raw_irq_stream` set they are also streamed (NIC evaluation).
//!
//! They fire for every interrupt and softirq on the machine, traced or not: while no
//! connection is traced (and nothing is streamed) they return after one inlined array read,
//! before any map lookup or clock read (see [`idle`]).

use meshlab_common::{Hook, NET_RX_SOFTIRQ, NET_TX_SOFTIRQ};

use crate::emit::{TpArgs, emit, now_ns, tp_entries};
use crate::globals::{config, offset};
use crate::kread::{KernelRead, dev_ifindex};
use crate::maps::{CPU_STATE, CpuState, NIC_IRQS};
use crate::prefilter::nothing_traced;

/// How old a pending IRQ or NET_RX raise may be when a softirq run starts and still belong to
/// it. The hooks skip their work while nothing is traced, so a pending value can be left over
/// from an earlier traced period; a real one is microseconds old.
const PENDING_WINDOW_NS: u64 = 10_000_000;

/// Nothing for these hooks to do: no RX event can want the context and nothing is streamed.
/// `raw_irq_stream` is a frozen read-only global: the verifier drops the dead branch.
#[inline(always)]
fn idle() -> bool {
    config!(raw_irq_stream) == 0 && nothing_traced()
}

#[inline(always)]
fn cpu_state() -> Option<&'static mut CpuState> {
    // SAFETY: per-CPU slot, only touched by programs of this CPU.
    CPU_STATE.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Zeroes one field with a plain store. Adjacent zero stores written as assignments are merged
/// by LLVM into a `memset` call, which BPF runs as a byte-by-byte loop subprogram (24
/// iterations per softirq_exit run, the slowest filtered-out program before this).
#[inline(always)]
pub(crate) fn clear<T: Default>(field: &mut T) {
    // SAFETY: a valid, aligned, exclusive reference.
    unsafe { core::ptr::write_volatile(field, T::default()) };
}

#[inline(always)]
fn stream(hook: Hook, value: i32, irq: u32, ifindex: u32, queue: u32) {
    if config!(raw_irq_stream) == 0 {
        return;
    }
    emit(hook, |ev| {
        ev.value = value;
        ev.irq = irq;
        ev.ifindex = ifindex;
        ev.queue = queue;
        Some(())
    });
}

/// irq:irq_handler_entry(irq, action): only IRQs the loader mapped to a network device.
fn try_irq_entry<C: TpArgs>(ctx: &C) -> Option<()> {
    if idle() {
        return None;
    }
    let irq = ctx.arg_u64(0) as u32;
    // SAFETY: value copied out at once.
    let nic = *unsafe { NIC_IRQS.get(&irq) }?;
    let state = cpu_state()?;
    state.pending_irq = irq;
    state.pending_irq_ns = now_ns();
    // The raise that belongs to this IRQ is the one its handler makes next. An earlier raise
    // (the TX path's netif_tx_wake / TX NAPI schedule in process context, seen in the 6.12
    // guests) happened before this packet arrived: kept, it made the RX chain start before
    // the request was sent and the cross-machine difference negative.
    state.pending_raise_ns = 0;
    stream(Hook::IrqEntry, 0, irq, nic.ifindex, nic.queue);
    Some(())
}
tp_entries!(
    irq_entry_btf,
    irq_entry_raw,
    "irq_handler_entry",
    try_irq_entry
);

fn try_irq_exit<C: TpArgs>(ctx: &C) -> Option<()> {
    if config!(raw_irq_stream) == 0 {
        return None;
    }
    let irq = ctx.arg_u64(0) as u32;
    // SAFETY: value copied out at once.
    let nic = *unsafe { NIC_IRQS.get(&irq) }?;
    stream(
        Hook::IrqExit,
        ctx.arg_u64(2) as i32,
        irq,
        nic.ifindex,
        nic.queue,
    );
    Some(())
}
tp_entries!(irq_exit_btf, irq_exit_raw, "irq_handler_exit", try_irq_exit);

#[inline(always)]
fn net_vector(ctx_vec: u64) -> Option<u32> {
    let vec = ctx_vec as u32;
    (vec == NET_RX_SOFTIRQ || vec == NET_TX_SOFTIRQ).then_some(vec)
}

/// irq:softirq_raise(vec): the first NET_RX raise since the last softirq run started or the last
/// NIC IRQ entered (whichever came later) is kept.
fn try_softirq_raise<C: TpArgs>(ctx: &C) -> Option<()> {
    if idle() {
        return None;
    }
    let vec = net_vector(ctx.arg_u64(0))?;
    if vec == NET_RX_SOFTIRQ {
        let state = cpu_state()?;
        if state.pending_raise_ns == 0 {
            state.pending_raise_ns = now_ns();
        }
    }
    stream(Hook::SoftirqRaise, vec as i32, 0, 0, u32::MAX);
    Some(())
}
tp_entries!(
    softirq_raise_btf,
    softirq_raise_raw,
    "softirq_raise",
    try_softirq_raise
);

fn try_softirq_entry<C: TpArgs>(ctx: &C) -> Option<()> {
    if idle() {
        return None;
    }
    let vec = net_vector(ctx.arg_u64(0))?;
    if vec == NET_RX_SOFTIRQ {
        // This run's context is what happened before it started; later IRQs wait for the next.
        let state = cpu_state()?;
        let now = now_ns();
        state.softirq_entry_ns = now;
        let fresh = |ns: u64| ns != 0 && now.wrapping_sub(ns) < PENDING_WINDOW_NS;
        let irq_fresh = fresh(state.pending_irq_ns);
        state.irq = if irq_fresh { state.pending_irq } else { 0 };
        state.irq_entry_ns = if irq_fresh { state.pending_irq_ns } else { 0 };
        state.softirq_raise_ns = if fresh(state.pending_raise_ns) {
            state.pending_raise_ns
        } else {
            0
        };
        clear(&mut state.pending_irq);
        clear(&mut state.pending_irq_ns);
        clear(&mut state.pending_raise_ns);
    }
    stream(Hook::SoftirqEntry, vec as i32, 0, 0, u32::MAX);
    Some(())
}
tp_entries!(
    softirq_entry_btf,
    softirq_entry_raw,
    "softirq_entry",
    try_softirq_entry
);

/// irq:softirq_exit(vec): the RX context ends here; later RX work starts from a clean state.
/// Not skipped while nothing is traced (a few stores): a connection traced from the middle of
/// a softirq run on must not see a context left over from an earlier traced period.
fn try_softirq_exit<C: TpArgs>(ctx: &C) -> Option<()> {
    let vec = net_vector(ctx.arg_u64(0))?;
    if vec == NET_RX_SOFTIRQ {
        let state = cpu_state()?;
        clear(&mut state.irq);
        clear(&mut state.irq_entry_ns);
        clear(&mut state.softirq_raise_ns);
        clear(&mut state.softirq_entry_ns);
    }
    stream(Hook::SoftirqExit, vec as i32, 0, 0, u32::MAX);
    Some(())
}
tp_entries!(
    softirq_exit_btf,
    softirq_exit_raw,
    "softirq_exit",
    try_softirq_exit
);

/// napi:napi_poll(napi, work, budget): raw stream only.
fn try_napi_poll<C: TpArgs>(ctx: &C) -> Option<()> {
    if config!(raw_irq_stream) == 0 {
        return None;
    }
    let dev: u64 = C::Mem::load(ctx.arg_u64(0), offset!(napi_struct_dev))?;
    emit(Hook::NapiPoll, |ev| {
        ev.ifindex = dev_ifindex::<C::Mem>(dev);
        ev.value = ctx.arg_u64(1) as i32;
        ev.aux = ctx.arg_u64(2);
        Some(())
    });
    Some(())
}
tp_entries!(napi_poll_btf, napi_poll_raw, "napi_poll", try_napi_poll);
