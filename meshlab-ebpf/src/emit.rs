//! Building and submitting events, with exact accounting of every event that could not be
//! written (HITS = written + DROPS, per hook and CPU).

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns};
use meshlab_common::{ConnInfo, EVENT_FLAG_TUPLE, Event, Hook, event_ring_of_cpu};

use aya_ebpf::bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};

use crate::atomic::atomic_add;
use crate::globals::config;
use crate::maps::{
    DROPS, EVENTS_0, EVENTS_1, EVENTS_2, EVENTS_3, EVENTS_4, EVENTS_5, EVENTS_6, EVENTS_7, HITS,
    WAKEUP_COUNTDOWN,
};
use aya_ebpf::maps::ring_buf::RingBufEntry;

/// CLOCK_MONOTONIC now, the clock of every event.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Reserves an event for `hook` directly in the ring buffer, stamps time, CPU and current
/// task, and lets `fill` complete it; `fill` returning `None` discards it uncounted.
///
/// Filling in place keeps the 136-byte record off the 512-byte BPF stack. Accounting is exact:
/// every event either reaches the buffer or is counted in DROPS, and both count in HITS.
#[inline(always)]
pub fn emit(hook: Hook, fill: impl FnOnce(&mut Event) -> Option<()>) {
    emit_impl(hook, Task::Current, Wakeup::Paced, fill)
}

/// [`emit`] for program types that may not ask for the current task (sock_ops: kernels before
/// 6.x reject `bpf_get_current_pid_tgid` there); pid and tid stay 0.
#[inline(always)]
pub fn emit_without_task(hook: Hook, fill: impl FnOnce(&mut Event) -> Option<()>) {
    emit_impl(hook, Task::Unknown, Wakeup::Paced, fill)
}

/// [`emit_without_task`] that wakes the reader at once when `now` is set (sock_ops, a newly
/// traced connection under `record --attach on-demand`: the reader attaches the hot hooks on
/// that wakeup, so every event it waits for is a traced event missed).
#[inline(always)]
pub fn emit_without_task_waking(
    hook: Hook,
    now: bool,
    fill: impl FnOnce(&mut Event) -> Option<()>,
) {
    let wakeup = if now { Wakeup::Now } else { Wakeup::Paced };
    emit_impl(hook, Task::Unknown, wakeup, fill)
}

/// [`emit`] for an event about a task the hook has already identified (the scheduler hooks):
/// no `bpf_get_current_pid_tgid` call.
#[inline(always)]
pub fn emit_for_task(hook: Hook, pid: u32, tid: u32, fill: impl FnOnce(&mut Event) -> Option<()>) {
    emit_impl(hook, Task::Given { pid, tid }, Wakeup::Paced, fill)
}

/// Whose pid and tid an event carries.
#[derive(Clone, Copy)]
enum Task {
    Current,
    Unknown,
    Given { pid: u32, tid: u32 },
}

/// When the reader learns of an event: at its paced wakeups ([`wakeup_flag`]), or now.
#[derive(Clone, Copy)]
enum Wakeup {
    Paced,
    Now,
}

#[inline(always)]
fn emit_impl(hook: Hook, task: Task, wakeup: Wakeup, fill: impl FnOnce(&mut Event) -> Option<()>) {
    let index = u32::from(hook as u16);
    // SAFETY: helper without preconditions (inlined by the verifier). The program cannot
    // migrate while it runs, so this is also the CPU the event reports.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(mut entry) = reserve_event(cpu) else {
        bump(&HITS, index);
        bump(&DROPS, index);
        return;
    };
    let (pid, tid) = match task {
        Task::Current => {
            let pid_tgid = bpf_get_current_pid_tgid();
            ((pid_tgid >> 32) as u32, pid_tgid as u32)
        }
        Task::Unknown => (0, 0),
        Task::Given { pid, tid } => (pid, tid),
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points to a reserved, exclusively owned, properly aligned record; zeroing it
    // first makes every field initialised before the reference is created. The record is
    // filled in place: built in a local and written once, it came out as memset subprogram
    // calls on the stack plus a copy (tried; `bpftool prog dump xlated`).
    let ev = unsafe {
        zero_event(ev);
        &mut *ev
    };
    ev.ts_ns = now_ns();
    ev.pid = pid;
    ev.tid = tid;
    ev.hook = hook as u16;
    ev.cpu = cpu;
    ev.queue = u32::MAX;
    if fill(ev).is_some() {
        bump(&HITS, index);
        let flag = match wakeup {
            Wakeup::Paced => wakeup_flag(),
            Wakeup::Now => u64::from(BPF_RB_FORCE_WAKEUP),
        };
        entry.submit(flag);
    } else {
        entry.discard(0);
    }
}

/// Reserves an event in the ring of `cpu` ([`meshlab_common::event_ring_of_cpu`]). One arm per
/// ring, each with its own reserve call: the map is an immediate of the call's argument, which
/// is how the verifier knows it (a map address chosen from a table would not load).
#[inline(always)]
fn reserve_event(cpu: u32) -> Option<RingBufEntry<Event>> {
    match event_ring_of_cpu(cpu) {
        0 => EVENTS_0.reserve::<Event>(0),
        1 => EVENTS_1.reserve::<Event>(0),
        2 => EVENTS_2.reserve::<Event>(0),
        3 => EVENTS_3.reserve::<Event>(0),
        4 => EVENTS_4.reserve::<Event>(0),
        5 => EVENTS_5.reserve::<Event>(0),
        6 => EVENTS_6.reserve::<Event>(0),
        _ => EVENTS_7.reserve::<Event>(0),
    }
}

/// Zeroes an event with 17 eight-byte stores. `write_bytes` compiles to a call of the BPF
/// `memset` subprogram, which stores byte by byte: 136 loop iterations (~680 instructions) per
/// event, seen in `bpftool prog dump xlated`.
///
/// # Safety
/// `ev` must be valid for writes and 8-byte aligned (a ring buffer reservation is).
#[inline(always)]
unsafe fn zero_event(ev: *mut Event) {
    const WORDS: usize = core::mem::size_of::<Event>() / 8;
    let words = ev.cast::<u64>();
    let mut i = 0;
    while i < WORDS {
        // SAFETY: i < WORDS keeps the store inside the record; volatile keeps LLVM from
        // folding the stores back into a memset call.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
        i += 1;
    }
}

/// Copies a traced connection's local-view 4-tuple into the event.
#[inline(always)]
pub fn set_conn_tuple(ev: &mut Event, info: &ConnInfo) {
    ev.saddr = info.tuple.local_addr;
    ev.daddr = info.tuple.remote_addr;
    ev.sport = info.tuple.local_port;
    ev.dport = info.tuple.remote_port;
    ev.flags |= EVENT_FLAG_TUPLE;
}

/// BPF_RB_NO_WAKEUP for most events (the reader drains on a timer); a forced wakeup for every
/// `wakeup_events`-th event of this CPU, so the reader never sleeps through more than about
/// 1/16 of the ring. Per ring as well: a CPU writes only its own ring (`reserve_event`), the
/// forced wakeup is of that ring, and the loader divides by the CPUs sharing a ring when there
/// are more CPUs than rings (record.rs `wakeup_events`); the reader's one epoll fd over all
/// rings wakes for any of them and drains them all.
///
/// Counted per CPU instead of asking the ring (`bpf_ringbuf_query(BPF_RB_AVAIL_DATA)` on
/// every event, a helper call: up to ~7 % of a traced program run, docs/benchmarks-kernel.md).
/// Forcing a wakeup on every event above a threshold (as once before) made a lagging reader
/// cost every event an irq_work self-IPI and a waitqueue wakeup (~1 us in a VM); here it is
/// one per `wakeup_events` events whatever the reader does. The countdown is per CPU and not
/// atomic: a program nesting on the same CPU can lose a step, which only moves a wakeup.
#[inline(always)]
fn wakeup_flag() -> u64 {
    let every = u64::from(config!(wakeup_events));
    if every == 0 {
        return 0;
    }
    let Some(left) = WAKEUP_COUNTDOWN.get_ptr_mut(0) else {
        return u64::from(BPF_RB_NO_WAKEUP);
    };
    // SAFETY: per-CPU u64 slot, valid for the program's lifetime.
    unsafe {
        if *left == 0 {
            *left = every - 1;
            u64::from(BPF_RB_FORCE_WAKEUP)
        } else {
            *left -= 1;
            u64::from(BPF_RB_NO_WAKEUP)
        }
    }
}

#[inline(always)]
fn bump(counters: &aya_ebpf::maps::PerCpuArray<u64>, index: u32) {
    if let Some(slot) = counters.get_ptr_mut(index) {
        // Atomic even though the slot is per-CPU: an IRQ-context program (irq_handler_entry)
        // can nest inside a task-context one on the same CPU, and a plain load/add/store would
        // then lose an increment and break the exact HITS = received + DROPS accounting.
        // SAFETY: the map value is a valid, 8-byte aligned u64 for the program's lifetime.
        unsafe { atomic_add(slot, 1) };
    }
}

/// Positional tracepoint arguments, the same for tp_btf and raw_tp programs (both receive the
/// tracepoint's TP_PROTO arguments as an array of u64).
pub trait TpArgs {
    /// How this program type reads the structs its arguments point to.
    type Mem: crate::kread::KernelRead;
    fn arg_u64(&self, n: usize) -> u64;
}

impl TpArgs for aya_ebpf::programs::BtfTracePointContext {
    type Mem = crate::kread::BtfLoad;
    #[inline(always)]
    fn arg_u64(&self, n: usize) -> u64 {
        self.arg(n)
    }
}

impl TpArgs for aya_ebpf::programs::RawTracePointContext {
    type Mem = crate::kread::ProbeRead;
    #[inline(always)]
    fn arg_u64(&self, n: usize) -> u64 {
        self.arg(n)
    }
}

/// Defines the tp_btf and raw_tp entry points of one tracepoint over one generic body.
/// Program names are `<prefix>_btf` and `<prefix>_raw`; the loader picks the tier.
macro_rules! tp_entries {
    ($btf:ident, $raw:ident, $tracepoint:literal, $body:ident) => {
        #[aya_ebpf::macros::btf_tracepoint(function = $tracepoint)]
        pub fn $btf(ctx: aya_ebpf::programs::BtfTracePointContext) -> i32 {
            let _ = $body(&ctx);
            0
        }

        #[aya_ebpf::macros::raw_tracepoint(tracepoint = $tracepoint)]
        pub fn $raw(ctx: aya_ebpf::programs::RawTracePointContext) -> i32 {
            let _ = $body(&ctx);
            0
        }
    };
}

pub(crate) use tp_entries;
