//! `cargo xtask bench helpers`: what the pieces of a traced event cost, each as its own tiny
//! raw-instruction program on one busy raw tracepoint (netif_receive_skb), side by side.
//!
//! Every program runs on the same tracepoint hits, so they all see the same traffic, CPU and
//! noise; the attach order (which is the run order) rotates every round so no program is
//! always first after the dispatch. ns/run comes from the kernel's BPF statistics, as for the
//! recorder's programs (crate::bpfstats); `mb_empty` is the floor and each program's cost above
//! it is the median of its per-round differences. The workload is 1-byte UDP datagrams to a
//! loopback socket: each one passes netif_receive_skb once. `--senders 2` sends from both
//! CPUs at once, so two CPUs write each shared ring, as the recorder's one ring did before
//! per-CPU rings; the `_pcpu` variants pick one of two rings by CPU, as emit() now does.
//!
//! The ring buffers are drained (consumer moved to the producer) every [`DRAIN_EVERY`] sends,
//! so reservations never fail; the report says how full they got.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use anyhow::Result;

use crate::bench_merge::machine;
use crate::bpfraw::{
    Asm, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_RB_NO_WAKEUP, R0, R1, R2, R3, R4, R6,
    R7, R8, R10, RingDrain, attach_raw_tp, helper, load_raw_tp, map_create,
};
use crate::bpfstats::{self, ProgramCost, StatsEnabled};
use crate::machine_cpu::loadavg;

#[derive(clap::Args)]
pub struct HelpersArgs {
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// UDP datagrams sent per round by each sender.
    #[arg(long, default_value_t = 200_000)]
    packets: u64,
    /// Sender threads, thread k pinned to CPU k. With 2, both CPUs write the same rings at
    /// once, as the recorder's programs do when client and server run on different CPUs.
    #[arg(long, default_value_t = 1)]
    senders: usize,
}

const TRACEPOINT: &str = "netif_receive_skb";
/// The recorder's default ring size (meshlab_common::DEFAULT_RING_BYTES).
const RING_BYTES: u32 = 8 << 20;
const DRAIN_EVERY: u64 = 2048;
/// Bytes of `meshlab_common::Event`; in the ring a record also takes an 8-byte header.
const EVENT_BYTES: i32 = 136;
/// The recorder's forced-wakeup period per CPU at the default ring on 2 CPUs
/// (meshlab-user/src/kernel/record.rs `wakeup_events`: 8 MiB / 16 / 144 B / 2).
const WAKEUP_EVERY: i32 = 1820;
const FLOOR: &str = "mb_empty";

/// One measured program: its bpftool name, what it does, and how it is built.
struct Variant {
    name: &'static str,
    what: &'static str,
    /// Rings of its own: 0, 1 (shared by all CPUs) or 2 (CPU 0 writes the first, every other
    /// CPU the second: on a 2-CPU machine a ring per CPU, as meshlab-ebpf's emit()).
    rings: usize,
    build: fn(&mut Asm, &Maps),
}

/// The maps a variant may use: its own rings (if it has any) and a shared per-CPU array whose
/// slot 0 is a counter (like HITS) and slot 1 a wakeup countdown (like WAKEUP_COUNTDOWN).
struct Maps<'a> {
    rings: Vec<&'a OwnedFd>,
    counters: &'a OwnedFd,
    slots: &'a SlotMaps,
}

/// A lock-free ring of fixed-size slots per CPU in a plain array map, the alternative to a
/// BPF ring buffer measured by the `mb_slot_` variants: CPU c owns slots
/// `c << SLOT_SHIFT ..`; a slot is an 8-byte commit word then an Event. `ctl` is a per-CPU
/// array whose one value holds the CPU's head (slots reserved, taken with an atomic
/// fetch-add because a program in IRQ context can nest inside another on the same CPU) and
/// the consumer position last read (the shared one is read again only when the cached one
/// says the CPU's slots may be full).
struct SlotMaps {
    slots: OwnedFd,
    ctl: OwnedFd,
}

/// Slots per CPU: 1 << SLOT_SHIFT (16384 x 144 B = 2.25 MiB).
const SLOT_SHIFT: i32 = 14;
/// Bytes of a slot: the commit word and an Event.
const SLOT_BYTES: u32 = 8 + EVENT_BYTES as u32;

impl SlotMaps {
    fn new() -> Result<SlotMaps> {
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u32;
        Ok(SlotMaps {
            slots: map_create(
                BPF_MAP_TYPE_ARRAY,
                SLOT_BYTES,
                cpus << SLOT_SHIFT,
                "mb_slots",
            )?,
            ctl: map_create(BPF_MAP_TYPE_PERCPU_ARRAY, 16, 1, "mb_slot_ctl")?,
        })
    }
}

impl Maps<'_> {
    fn ring(&self) -> &OwnedFd {
        self.rings.first().expect("variant declared rings > 0")
    }

    /// r1 = the ring of this CPU: the first for CPU 0, the second for any other (the
    /// verifier inlines bpf_get_smp_processor_id; each path loads its map as an immediate).
    fn ring_of_cpu(&self, a: &mut Asm) {
        let [first, second] = self.rings[..] else {
            panic!("a _pcpu variant declares rings: 2");
        };
        a.call(helper::GET_SMP_PROCESSOR_ID);
        let other = a.jne_zero_fwd(R0);
        a.ld_map(R1, first);
        let join = a.ja_fwd();
        a.label_here(other).ld_map(R1, second).label_here(join);
    }
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: FLOOR,
        what: "`r0 = 0; exit`: dispatch + statistics, the floor",
        rings: 0,
        build: |_, _| {},
    },
    Variant {
        name: "mb_ktime",
        what: "bpf_ktime_get_ns",
        rings: 0,
        build: |a, _| {
            a.call(helper::KTIME_GET_NS);
        },
    },
    Variant {
        name: "mb_pid_tgid",
        what: "bpf_get_current_pid_tgid",
        rings: 0,
        build: |a, _| {
            a.call(helper::GET_CURRENT_PID_TGID);
        },
    },
    Variant {
        name: "mb_cur_task",
        what: "bpf_get_current_task (the verifier may inline it)",
        rings: 0,
        build: |a, _| {
            a.call(helper::GET_CURRENT_TASK);
        },
    },
    Variant {
        name: "mb_cpu_id",
        what: "bpf_get_smp_processor_id (inlined by the verifier)",
        rings: 0,
        build: |a, _| {
            a.call(helper::GET_SMP_PROCESSOR_ID);
        },
    },
    Variant {
        name: "mb_pcpu_add",
        what: "per-CPU array lookup (inlined) + atomic add (HITS)",
        rings: 0,
        build: |a, m| counter_add(a, m, 0),
    },
    Variant {
        name: "mb_probe_rd8",
        what: "bpf_probe_read_kernel of 8 bytes of the skb",
        rings: 0,
        build: |a, _| {
            a.ldx_u64(R3, R1, 0)
                .mov_reg(R1, R10)
                .add_imm(R1, -8)
                .mov_imm(R2, 8)
                .call(helper::PROBE_READ_KERNEL);
        },
    },
    Variant {
        name: "mb_rb_32",
        what: "ringbuf reserve 24 B + submit (32 B in the ring with its 8-byte header)",
        rings: 1,
        build: |a, m| reserve_submit(a, m, 24, |_| {}),
    },
    Variant {
        name: "mb_rb_64",
        what: "ringbuf reserve 56 B + submit (64 B in the ring)",
        rings: 1,
        build: |a, m| reserve_submit(a, m, 56, |_| {}),
    },
    Variant {
        name: "mb_rb_144",
        what: "ringbuf reserve 136 B (an Event) + submit (144 B in the ring)",
        rings: 1,
        build: |a, m| reserve_submit(a, m, EVENT_BYTES, |_| {}),
    },
    Variant {
        name: "mb_rb_144_zero",
        what: "as mb_rb_144 + 17 eight-byte zero stores (emit's zero_event)",
        rings: 1,
        build: |a, m| reserve_submit(a, m, EVENT_BYTES, zero_event),
    },
    Variant {
        name: "mb_rb_144_pcpu",
        what: "as mb_rb_144, in the ring of this CPU (one of two, chosen by \
               bpf_get_smp_processor_id)",
        rings: 2,
        build: |a, m| {
            m.ring_of_cpu(a);
            reserve_in_r1(a, EVENT_BYTES, |_| {});
        },
    },
    Variant {
        name: "mb_rb_out_64",
        what: "56 B zeroed on the stack + bpf_ringbuf_output (one helper: reserve, copy, submit)",
        rings: 1,
        build: |a, m| stack_output(a, m, 56),
    },
    Variant {
        name: "mb_rb_out_144",
        what: "136 B zeroed on the stack + bpf_ringbuf_output",
        rings: 1,
        build: |a, m| stack_output(a, m, EVENT_BYTES),
    },
    Variant {
        name: "mb_emit_like",
        what: "all of emit(): reserve 136, zero, ktime, pid_tgid, cpu, HITS add, countdown, \
               submit",
        rings: 1,
        build: |a, m| {
            a.ld_map(R1, m.ring());
            emit_like(a, m);
        },
    },
    Variant {
        name: "mb_slot_144",
        what: "a 136 B Event zeroed in a lock-free per-CPU slot ring in an array map (head \
               fetch-add, capacity check against a cached consumer position, inlined array \
               lookups, commit word)",
        rings: 0,
        build: |a, m| slot_write(a, m, |a| zero_event_at(a, 8)),
    },
    Variant {
        name: "mb_emit_slot",
        what: "as mb_emit_like, in the slot ring of mb_slot_144 instead of a ring buffer",
        rings: 0,
        build: |a, m| slot_write(a, m, |a| emit_fields(a, m, 8)),
    },
    Variant {
        name: "mb_emit_pcpu",
        what: "as mb_emit_like, in the ring of this CPU (as meshlab-ebpf's emit() since \
               per-CPU rings)",
        rings: 2,
        build: |a, m| {
            m.ring_of_cpu(a);
            emit_like(a, m);
        },
    },
];

/// `counters[slot] += 1` atomically, as emit::bump.
fn counter_add(a: &mut Asm, m: &Maps, slot: i32) {
    a.st_u32(R10, -4, slot)
        .ld_map(R1, m.counters)
        .mov_reg(R2, R10)
        .add_imm(R2, -4)
        .call(helper::MAP_LOOKUP_ELEM);
    let none = a.jeq_zero_fwd(R0);
    a.mov_imm(R1, 1).atomic_add_u64(R0, 0, R1).label_here(none);
}

/// Reserve `size` bytes in the variant's ring, let `fill` write the record (its pointer in r6),
/// submit without wakeup.
fn reserve_submit(a: &mut Asm, m: &Maps, size: i32, fill: impl FnOnce(&mut Asm)) {
    a.ld_map(R1, m.ring());
    reserve_in_r1(a, size, fill);
}

/// [`reserve_submit`] in the ring already in r1.
fn reserve_in_r1(a: &mut Asm, size: i32, fill: impl FnOnce(&mut Asm)) {
    a.mov_imm(R2, size)
        .mov_imm(R3, 0)
        .call(helper::RINGBUF_RESERVE);
    let failed = a.jeq_zero_fwd(R0);
    a.mov_reg(R6, R0);
    fill(a);
    a.mov_reg(R1, R6)
        .mov_imm(R2, BPF_RB_NO_WAKEUP)
        .call(helper::RINGBUF_SUBMIT)
        .label_here(failed);
}

/// A record of `size` bytes zeroed on the stack, written with one bpf_ringbuf_output call.
fn stack_output(a: &mut Asm, m: &Maps, size: i32) {
    for word in 0..size / 8 {
        a.st_u64(R10, (-size + word * 8) as i16, 0);
    }
    a.ld_map(R1, m.ring())
        .mov_reg(R2, R10)
        .add_imm(R2, -size)
        .mov_imm(R3, size)
        .mov_imm(R4, BPF_RB_NO_WAKEUP)
        .call(helper::RINGBUF_OUTPUT);
}

fn zero_event(a: &mut Asm) {
    zero_event_at(a, 0);
}

/// 17 eight-byte zero stores at r6 + `at`.
fn zero_event_at(a: &mut Asm, at: i16) {
    for word in 0..EVENT_BYTES / 8 {
        a.st_u64(R6, at + (word * 8) as i16, 0);
    }
}

/// Reserves this CPU's next slot of [`SlotMaps`], lets `fill` write the Event at r6 + 8 and
/// commits it (the commit word = head + 1, written last; on x86 stores are not reordered
/// with other stores, so a reader that sees the word sees the record).
fn slot_write(a: &mut Asm, m: &Maps, fill: impl FnOnce(&mut Asm)) {
    a.call(helper::GET_SMP_PROCESSOR_ID)
        .mov_reg(R8, R0)
        .lsh_imm(R8, SLOT_SHIFT)
        .st_u32(R10, -4, 0)
        .ld_map(R1, &m.slots.ctl)
        .mov_reg(R2, R10)
        .add_imm(R2, -4)
        .call(helper::MAP_LOOKUP_ELEM);
    let no_ctl = a.jeq_zero_fwd(R0);
    a.mov_reg(R7, R0)
        .ldx_u64(R1, R7, 0)
        .ldx_u64(R2, R7, 8)
        .sub_reg(R1, R2);
    let may_be_full = a.jgt_imm_fwd(R1, (1 << SLOT_SHIFT) - 16);
    let room = a.ja_fwd();
    // The bench has no reader: reading the consumer position again finds everything read.
    a.label_here(may_be_full)
        .ldx_u64(R1, R7, 0)
        .stx_u64(R7, 8, R1)
        .label_here(room)
        .mov_imm(R1, 1)
        .atomic_fetch_add_u64(R7, 0, R1)
        .mov_reg(R7, R1)
        .add_imm(R7, 1)
        .and_imm(R1, (1 << SLOT_SHIFT) - 1)
        .add_reg(R1, R8)
        .stx_u32(R10, -8, R1)
        .ld_map(R1, &m.slots.slots)
        .mov_reg(R2, R10)
        .add_imm(R2, -8)
        .call(helper::MAP_LOOKUP_ELEM);
    let no_slot = a.jeq_zero_fwd(R0);
    a.mov_reg(R6, R0);
    fill(a);
    a.stx_u64(R6, 0, R7).label_here(no_slot).label_here(no_ctl);
}

/// What meshlab-ebpf's emit() does around a hook's own fields (emit.rs), at Event's offsets:
/// ts_ns 0, pid/tid 56, cpu 120, queue 128; the ring is already in r1.
fn emit_like(a: &mut Asm, m: &Maps) {
    a.mov_imm(R2, EVENT_BYTES)
        .mov_imm(R3, 0)
        .call(helper::RINGBUF_RESERVE);
    let failed = a.jeq_zero_fwd(R0);
    a.mov_reg(R6, R0);
    emit_fields(a, m, 0);
    a.mov_reg(R1, R6)
        .call(helper::RINGBUF_SUBMIT)
        .label_here(failed);
}

/// emit()'s work on a record at r6 + `at`; leaves the submit flag in r2.
fn emit_fields(a: &mut Asm, m: &Maps, at: i16) {
    zero_event_at(a, at);
    a.call(helper::KTIME_GET_NS).stx_u64(R6, at, R0);
    a.call(helper::GET_CURRENT_PID_TGID)
        .stx_u64(R6, at + 56, R0);
    a.call(helper::GET_SMP_PROCESSOR_ID)
        .stx_u32(R6, at + 120, R0);
    a.st_u32(R6, at + 128, -1);
    counter_add(a, m, 0);
    countdown_flag(a, m);
}

/// r2 = the submit flag of emit::wakeup_flag: a forced wakeup (2) every WAKEUP_EVERY events of
/// this CPU, none (1) otherwise; the countdown is counters[1].
fn countdown_flag(a: &mut Asm, m: &Maps) {
    a.st_u32(R10, -4, 1)
        .ld_map(R1, m.counters)
        .mov_reg(R2, R10)
        .add_imm(R2, -4)
        .call(helper::MAP_LOOKUP_ELEM)
        .mov_imm(R2, BPF_RB_NO_WAKEUP);
    let none = a.jeq_zero_fwd(R0);
    a.ldx_u64(R1, R0, 0);
    let counting = a.jne_zero_fwd(R1);
    a.st_u64(R0, 0, WAKEUP_EVERY - 1).mov_imm(R2, 2);
    let done = a.ja_fwd();
    a.label_here(counting)
        .add_imm(R1, -1)
        .stx_u64(R0, 0, R1)
        .label_here(none)
        .label_here(done);
}

/// A loaded variant; its `rings` are drained between sends.
struct Loaded {
    program: OwnedFd,
    rings: Vec<RingDrain>,
}

fn load_all(counters: &OwnedFd) -> Result<Vec<Loaded>> {
    let slots = SlotMaps::new()?;
    let mut loaded = Vec::new();
    for variant in VARIANTS {
        let rings = (0..variant.rings)
            .map(|_| RingDrain::new(RING_BYTES, variant.name))
            .collect::<Result<Vec<_>>>()?;
        let maps = Maps {
            rings: rings.iter().map(|r| &r.map).collect(),
            counters,
            slots: &slots,
        };
        let mut asm = Asm::default();
        (variant.build)(&mut asm, &maps);
        asm.exit_zero();
        let program = load_raw_tp(variant.name, &asm)?;
        loaded.push(Loaded { program, rings });
    }
    Ok(loaded)
}

pub fn run(args: HelpersArgs) -> Result<()> {
    let load_before = loadavg();
    let counters = map_create(BPF_MAP_TYPE_PERCPU_ARRAY, 8, 2, "mb_counters")?;
    let loaded = load_all(&counters)?;
    let _stats = StatsEnabled::on()?;
    let mut rounds: Vec<Vec<ProgramCost>> = Vec::new();
    let mut ring_full = false;
    for round in 0..args.rounds {
        // Attach order = run order on the tracepoint: rotated, so each program leads in turn.
        let n = loaded.len();
        let links = (0..n)
            .map(|k| attach_raw_tp(&loaded[(round + k) % n].program, TRACEPOINT))
            .collect::<Result<Vec<_>>>()?;
        let costs = bpfstats::costs_over(std::process::id(), || {
            ring_full |= send_datagrams(args.packets, args.senders, &loaded)?;
            Ok(())
        })?;
        drop(links);
        eprintln!("bench helpers: round {round} done");
        rounds.push(costs);
    }
    let backlog = loaded
        .iter()
        .flat_map(|l| l.rings.iter().map(RingDrain::max_backlog))
        .max()
        .unwrap_or(0);
    let load = format!("{load_before} before, {} after", loadavg());
    print!("{}", report(&args, &rounds, &load, backlog, ring_full));
    Ok(())
}

/// Sends `packets` 1-byte UDP datagrams over loopback from each of `senders` threads (thread
/// k pinned to CPU k), each draining the rings every DRAIN_EVERY of its sends (a sender
/// preempted on this busy machine must not let the rings fill); returns whether a ring may
/// have filled up (reservations failing would skew its figure).
fn send_datagrams(packets: u64, senders: usize, loaded: &[Loaded]) -> Result<bool> {
    // Every sender is a spawned thread, so pinning never narrows this process's own CPU set
    // (machine() and bpftool run from it).
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..senders)
            .map(|cpu| scope.spawn(move || send_pinned(cpu, packets, loaded)))
            .collect();
        let mut full = false;
        for sender in threads {
            full |= sender
                .join()
                .map_err(|_| anyhow::anyhow!("a sender thread panicked"))??;
        }
        Ok(full)
    })
}

fn send_pinned(cpu: usize, packets: u64, loaded: &[Loaded]) -> Result<bool> {
    // SAFETY: sched_setaffinity of the calling thread with a zero-initialised cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            anyhow::bail!(
                "pinning a sender to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let receiver = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let sender = std::net::UdpSocket::bind("127.0.0.1:0")?;
    sender.connect(receiver.local_addr()?)?;
    let mut full = false;
    for i in 0..packets {
        // The receiver never reads: a full receive queue drops the datagram after
        // netif_receive_skb, which is all the tracepoint needs. ECONNREFUSED cannot happen
        // while the receiver is bound.
        sender.send(&[0])?;
        if i % DRAIN_EVERY == 0 {
            for ring in loaded.iter().flat_map(|l| &l.rings) {
                full |= ring.drain();
            }
        }
    }
    Ok(full)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Program name -> its ns/run in each round (rounds where it did not run are left out).
fn per_round(rounds: &[Vec<ProgramCost>]) -> BTreeMap<&str, Vec<(usize, f64, u64)>> {
    let mut out: BTreeMap<&str, Vec<(usize, f64, u64)>> = BTreeMap::new();
    for (r, costs) in rounds.iter().enumerate() {
        for c in costs.iter().filter(|c| c.runs > 0) {
            out.entry(&c.name)
                .or_default()
                .push((r, c.ns_per_run, c.runs));
        }
    }
    out
}

fn report(
    args: &HelpersArgs,
    rounds: &[Vec<ProgramCost>],
    load: &str,
    backlog: u64,
    full: bool,
) -> String {
    let by_name = per_round(rounds);
    let floor: BTreeMap<usize, f64> = by_name
        .get(FLOOR)
        .map(|v| v.iter().map(|&(r, ns, _)| (r, ns)).collect())
        .unwrap_or_default();
    let mut text = format!(
        "Raw-instruction programs side by side on raw_tp {TRACEPOINT} ({} rounds of {} loopback \
         UDP datagrams from each of {} sender threads pinned to CPUs 0..; attach order rotated \
         per round; `kernel.bpf_stats_enabled`). On {}, \
         load average {load}. Rings: {RING_BYTES} B each, at most {backlog} B unconsumed at a \
         drain{}.\n\n\
         | program | what it runs | runs per round | ns/run median (min-max) | above {FLOOR} ns (median of per-round differences) |\n\
         |---|---|---|---|---|\n",
        args.rounds,
        args.packets,
        args.senders,
        machine(),
        if full {
            " (A RING MAY HAVE FILLED: its reservations failed)"
        } else {
            ""
        },
    );
    for variant in VARIANTS {
        let Some(runs) = by_name.get(variant.name) else {
            text += &format!("| {} | {} | 0 | - | - |\n", variant.name, variant.what);
            continue;
        };
        let ns: Vec<f64> = runs.iter().map(|&(_, ns, _)| ns).collect();
        let (lo, hi) = ns
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let above: Vec<f64> = runs
            .iter()
            .filter_map(|&(r, ns, _)| floor.get(&r).map(|f| ns - f))
            .collect();
        let count = median(runs.iter().map(|&(_, _, n)| n as f64).collect());
        text += &format!(
            "| {} | {} | {count:.0} | {:.1} ({lo:.1}-{hi:.1}) | {:+.1} |\n",
            variant.name,
            variant.what,
            median(ns),
            median(above)
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_jumps_land_after_the_skipped_instructions() {
        let mut a = Asm::default();
        let j = a.jeq_zero_fwd(R0);
        a.mov_imm(R1, 1).mov_imm(R2, 2).label_here(j);
        // jeq r0, 0, +2: offset in bits 16..32.
        assert_eq!(a.insns()[0], 0x0002_0015);
        assert_eq!(a.insns()[1], 0x0000_0001_0000_01b7);
    }

    #[test]
    fn the_floor_difference_is_paired_per_round() {
        let cost = |name: &str, ns: f64| ProgramCost {
            name: name.into(),
            runs: 10,
            ns_per_run: ns,
            bytes_xlated: 8,
            bytes_jited: 8,
        };
        // Round 1 is slow for everyone: the paired difference stays 20.
        let rounds = vec![
            vec![cost(FLOOR, 50.0), cost("mb_ktime", 70.0)],
            vec![cost(FLOOR, 90.0), cost("mb_ktime", 110.0)],
            vec![cost(FLOOR, 55.0), cost("mb_ktime", 75.0)],
        ];
        let args = HelpersArgs {
            rounds: 3,
            packets: 1,
            senders: 1,
        };
        let text = report(&args, &rounds, "0 0 0", 0, false);
        let row = text.lines().find(|l| l.starts_with("| mb_ktime")).unwrap();
        assert!(row.ends_with("| 10 | 75.0 (70.0-110.0) | +20.0 |"), "{row}");
    }
}
