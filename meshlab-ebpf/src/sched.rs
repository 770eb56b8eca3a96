//! Scheduler: wakeups and switches of threads that own traced sockets, so the socket-queue
//! wait can be split into "woken" and "running".

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use meshlab_common::{Event, Hook};

use crate::emit::{TpArgs, emit, emit_for_task, tp_entries};
use crate::globals::offset;
use crate::kread::KernelRead;
use crate::maps::{CPU_STATE, TRACKED_THREADS};
use crate::prefilter::{ThreadSlot, nothing_sampled, thread_removed, thread_slot, traced_conn};
use crate::turn::turn_sampled;

/// How long after a traced sk_data_ready on this CPU a sched_waking still belongs to it. The
/// wakeup runs synchronously inside sock_def_readable, so microseconds suffice; the bound only
/// guards against a stale state being matched by a later wakeup.
const DATA_READY_WAKE_WINDOW_NS: u64 = 50_000;

/// The thread id of `task` (one read: the prefilter needs nothing else).
#[inline(always)]
fn task_tid<M: KernelRead>(task: u64) -> Option<u32> {
    M::load::<i32>(task, offset!(task_struct_pid)).map(|tid| tid as u32)
}

/// The process id of `task`, read only for tracked threads.
#[inline(always)]
fn task_tgid<M: KernelRead>(task: u64) -> u32 {
    M::load::<i32>(task, offset!(task_struct_tgid)).unwrap_or(0) as u32
}

/// The traced socket whose data-ready (on this CPU, just before `now`) is causing a wakeup.
#[inline(always)]
fn data_ready_cookie(now: u64) -> Option<u64> {
    let state = CPU_STATE.get_ptr(0)?;
    // SAFETY: per-CPU slot, only touched by programs of this CPU.
    let state = unsafe { &*state };
    let recent = now.wrapping_sub(state.data_ready_ns) < DATA_READY_WAKE_WINDOW_NS;
    (state.data_ready_cookie != 0 && recent).then_some(state.data_ready_cookie)
}

/// The traced socket thread `tid` last used, if the thread is tracked and that connection is
/// still traced and in a sampled turn; a thread whose connection closed is forgotten here, so
/// it stops costing events. The slot arrays answer without a hash lookup unless two threads
/// or two connections share a slot.
#[inline(always)]
fn tracked_cookie(tid: u32) -> Option<u64> {
    let cookie = match thread_slot(tid) {
        ThreadSlot::Untracked => return None,
        ThreadSlot::Alone(cookie) => cookie,
        // SAFETY: value copied out at once.
        ThreadSlot::Collided => *unsafe { TRACKED_THREADS.get(&tid) }?,
    };
    let Some(conn) = traced_conn(cookie) else {
        forget_thread(tid);
        return None;
    };
    turn_sampled(conn.info()).then_some(cookie)
}

#[inline(always)]
fn forget_thread(tid: u32) {
    let _ = TRACKED_THREADS.remove(&tid);
    thread_removed(tid);
}

/// sched:sched_waking(p): fires in the waker's context (unlike sched_wakeup, which may run on
/// the wakee's CPU). Only threads that own traced sockets count; when a traced socket's
/// data-ready on this CPU just happened, the wakeup is credited to that socket.
fn try_sched_waking<C: TpArgs>(ctx: &C) -> Option<()> {
    if nothing_sampled() {
        return None;
    }
    let task = ctx.arg_u64(0);
    let tid = task_tid::<C::Mem>(task)?;
    let owned = tracked_cookie(tid)?;
    let pid = task_tgid::<C::Mem>(task);
    emit(Hook::SchedWakeup, |ev| {
        ev.aux = u64::from(ev.tid);
        ev.pid = pid;
        ev.tid = tid;
        // The event's own timestamp: one clock read per wakeup.
        ev.cookie = data_ready_cookie(ev.ts_ns).unwrap_or(owned);
        Some(())
    });
    Some(())
}
tp_entries!(
    sched_waking_btf,
    sched_waking_raw,
    "sched_waking",
    try_sched_waking
);

/// sched:sched_switch(preempt, prev, next, prev_state): value 1 = a tracked thread starts
/// running, 0 = it stops (aux = prev_state).
fn try_sched_switch<C: TpArgs>(ctx: &C) -> Option<()> {
    if nothing_sampled() {
        return None;
    }
    // The tracepoint fires before the switch: `prev` is the current task. A BTF load of its
    // pid is one instruction; on the raw tier (probe reads) the helper is cheaper.
    let prev = ctx.arg_u64(1);
    let prev_tid = if C::Mem::DIRECT {
        task_tid::<C::Mem>(prev).unwrap_or(0)
    } else {
        bpf_get_current_pid_tgid() as u32
    };
    if let Some(cookie) = tracked_cookie(prev_tid) {
        let prev_state = ctx.arg_u64(3);
        let fill = |ev: &mut Event| {
            ev.cookie = cookie;
            ev.value = 0;
            ev.aux = prev_state;
            Some(())
        };
        if C::Mem::DIRECT {
            emit_for_task(Hook::SchedSwitch, task_tgid::<C::Mem>(prev), prev_tid, fill);
        } else {
            emit(Hook::SchedSwitch, fill);
        }
    }
    let next = ctx.arg_u64(2);
    let tid = task_tid::<C::Mem>(next)?;
    let cookie = tracked_cookie(tid)?;
    let pid = task_tgid::<C::Mem>(next);
    emit_for_task(Hook::SchedSwitch, pid, tid, |ev| {
        ev.cookie = cookie;
        ev.value = 1;
        Some(())
    });
    Some(())
}
tp_entries!(
    sched_switch_btf,
    sched_switch_raw,
    "sched_switch",
    try_sched_switch
);
