//! The guests' shell text for `cargo xtask truth --vm`: guest A records and runs the client
//! rounds, switching each round's cause on or off; guest B records and serves, and starts or
//! stops the CPU hog when A asks (a file in the directory both guests share).

use std::path::Path;

use crate::truth_cause::Cause;
use crate::vm_two_machines::{B_READY, GuestScripts, RECORDER_READY};

/// B's exit trap: tell A it is done, and end a hog still running (an `exit 1` of a failed
/// check leaves it; the normal end kills it and clears `$HOG`). The two-machine scenario's
/// `B_DONE_ON_EXIT` plus the hog.
const B_EXIT: &str =
    "trap 'touch \"$MESHLAB_VM_SHARED/b.done\"; [ -z \"$HOG\" ] || kill $HOG' EXIT; ";

/// The lab server's port and address in guest B (the private link, vm/spec.rs).
pub const PORT: u16 = 9000;
pub const SERVER_ADDR: &str = "10.213.0.2";
/// netem's delay and loss on A's eth0 in the runs with the cause. 5 ms, not 1: requests of
/// these TCG guests take 1-10 ms end to end and their run medians vary by milliseconds from
/// run to run (a quick run's 1 ms delay "added" 6.2 ms), so a smaller delay drowns.
pub const NETEM_DELAY: &str = "delay 5ms";
pub const NETEM_LOSS: &str = "loss 1%";
/// The wire relay's one-way delay in the runs with `wire-delay` (the same round trip as the
/// netem delay), and without it.
pub const WIRE_DELAY_US: u64 = 2500;
const WIRE_BASE_US: u64 = 0;
/// Guest B: the server (and in A the client) runs on CPU 0; the hog of the IRQ causes runs on
/// CPU 1 (a spinning shell, or the loopback flood); B's NIC RX IRQ is on CPU 2 (idle) except
/// in the runs with the cause.
pub const APP_CPU: usize = 0;
pub const HOG_CPU: usize = 1;
pub const IDLE_IRQ_CPU: usize = 2;
/// The loopback flood of `irq-softirq-load` in B: a lab server on this port of 127.0.0.1 and a
/// client with this many connections sending as fast as replies come (the recorder, on
/// `PORT`, filters it out), both pinned to `HOG_CPU`.
const FLOOD_PORT: u16 = 9100;
const FLOOD_CONNECTIONS: usize = 8;
const FLOOD_PAYLOAD: usize = 65536;
/// The flood of `irq-nic-flood` from A to a second lab server on B (`FLOOD_PORT` of
/// `SERVER_ADDR`): many small requests, so B's NIC queue and its NAPI polls carry many frames
/// (the packet rate, not the bytes, is what a poll's work grows with). Client and server on
/// `HOG_CPU` of their guest.
const NIC_FLOOD_CONNECTIONS: usize = 16;
const NIC_FLOOD_PAYLOAD: usize = 64;

/// The states A asks B for, each run: (state, the CPU B's NIC RX IRQ goes to). `busy`/`idle`
/// with the spinning hog, `loadbusy`/`loadidle` with the loopback flood, `rtbusy`/`rtidle`
/// with the real-time hog; `stop` (after each run) ends the hog and puts the IRQ back on the
/// idle CPU.
pub const IRQ_STATES: [(&str, usize); 6] = [
    ("busy", HOG_CPU),
    ("idle", IDLE_IRQ_CPU),
    ("loadbusy", HOG_CPU),
    ("loadidle", IDLE_IRQ_CPU),
    ("rtbusy", HOG_CPU),
    ("rtidle", IDLE_IRQ_CPU),
];

/// The state A asks B for before a run of an IRQ cause (`on`: with it), and its IRQ CPU.
pub fn irq_state(cause: Cause, on: bool) -> (&'static str, usize) {
    let [busy, idle, load_busy, load_idle, rt_busy, rt_idle] = IRQ_STATES;
    let (with, without) = match cause {
        Cause::IrqSoftirqLoad => (load_busy, load_idle),
        Cause::IrqRtBusyCpu => (rt_busy, rt_idle),
        _ => (busy, idle),
    };
    if on { with } else { without }
}

/// The real-time hog of `irq-rt-busy-cpu`: SCHED_FIFO above the IRQ threads `threadirqs`
/// starts (SCHED_FIFO 50), so a threaded NIC IRQ on its CPU waits for the end of its spin. It
/// spins `RT_HOG_SPIN_US` and sleeps `RT_HOG_SLEEP_US`: an IRQ arrives inside a spin 6 times
/// in 7 and waits the rest of it (3 ms on average, more than the run-to-run spread of these
/// guests' medians); the sleep keeps the hog under the kernel's real-time throttling (95 % of
/// a CPU) and lets that CPU's other tasks run; the client's pace walks through the cycle
/// (truth_cause.rs, the cause's workload); and a wait stays under the 10 ms after which the
/// recorder takes an IRQ for a stale one (meshlab-ebpf irq.rs `PENDING_WINDOW_NS`).
const RT_HOG_PRIORITY: u8 = 60;
const RT_HOG_SPIN_US: u64 = 6000;
const RT_HOG_SLEEP_US: u64 = 1000;

/// `xtask guest-hog`: spin `spin_us` on the CPU, sleep `sleep_us`, forever (the guest script
/// sets its CPU and policy).
pub fn guest_hog(spin_us: u64, sleep_us: u64) -> ! {
    let (spin, sleep) = (
        std::time::Duration::from_micros(spin_us),
        std::time::Duration::from_micros(sleep_us),
    );
    loop {
        let start = std::time::Instant::now();
        while start.elapsed() < spin {
            std::hint::spin_loop();
        }
        std::thread::sleep(sleep);
    }
}
/// vCPUs per guest in the boots of the IRQ causes (the `vm run` option applies to both
/// guests).
pub const IRQ_GUEST_CPUS: usize = 3;

/// vCPUs per guest for a cause's boot: one where a second is not needed. Under TCG a wake-up
/// on another vCPU wakes a halted host thread: with three vCPUs the same request took
/// 3-15 ms end to end (a quick run's per-run p50s), so only the IRQ cause pays for them.
pub fn guest_cpus(cause: Cause) -> usize {
    if cause.needs_spare_cpus() {
        IRQ_GUEST_CPUS
    } else {
        1
    }
}
/// How long the recorders may run; they are stopped after the last round.
const RECORD_LIMIT: &str = "3600s";

/// One client run of the plan: the cause and whether it is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRun {
    pub cause: Cause,
    pub on: bool,
}

/// Every cause once without and once with it per round, alternating which goes first from
/// round to round (and from cause to cause), so slow drift favours neither condition.
pub fn plan(causes: &[Cause], rounds: usize) -> Vec<PlannedRun> {
    let mut runs = Vec::new();
    for round in 0..rounds {
        for (index, &cause) in causes.iter().enumerate() {
            for k in 0..2 {
                let on = (round + index + k) % 2 == 1;
                runs.push(PlannedRun { cause, on });
            }
        }
    }
    runs
}

/// The name of a cause in the rounds file (clap's value name, e.g. `netem-delay`).
pub fn cause_slug(cause: Cause) -> String {
    clap::ValueEnum::to_possible_value(&cause)
        .map(|v| v.get_name().to_owned())
        .unwrap_or_else(|| format!("{cause:?}"))
}

/// Shell text run in guest A before a run of `cause` (`on`: with it) and after it. netem:
/// the qdisc only in the runs with the cause. The IRQ causes: B runs the hog on `HOG_CPU` in
/// both conditions (the host's CPUs carry the same load), the IRQ goes to the hog's CPU or to
/// the idle `IDLE_IRQ_CPU`; B stops the hog after the run.
fn around_run(meshlab: &Path, cause: Cause, on: bool) -> (String, String) {
    let netem = |params: &str| {
        if on {
            (
                format!("tc qdisc replace dev eth0 root netem {params} || exit 1; "),
                "tc qdisc del dev eth0 root || exit 1; ".to_owned(),
            )
        } else {
            (String::new(), String::new())
        }
    };
    match cause {
        Cause::NetemDelay => netem(NETEM_DELAY),
        Cause::NetemLoss => netem(NETEM_LOSS),
        Cause::IrqBusyCpu | Cause::IrqSoftirqLoad | Cause::IrqRtBusyCpu => {
            (ask_b(irq_state(cause, on).0), ask_b("stop"))
        }
        Cause::WireDelay if on => (ask_relay(WIRE_DELAY_US), ask_relay(WIRE_BASE_US)),
        Cause::WireDelay => (String::new(), String::new()),
        Cause::IrqNicFlood if on => (
            nic_flood_start(meshlab),
            "kill $FLOOD; wait $FLOOD; ".to_owned(),
        ),
        Cause::IrqNicFlood => (String::new(), String::new()),
        other => unreachable!("{other:?} is not a guest cause"),
    }
}

/// A starts the flood on B's NIC (`$FLOOD`) and gives it a second to reach its rate.
fn nic_flood_start(meshlab: &Path) -> String {
    format!(
        "taskset -c {HOG_CPU} {m} lab client --connect {SERVER_ADDR}:{FLOOD_PORT} \
         --concurrency {NIC_FLOOD_CONNECTIONS} --payload {NIC_FLOOD_PAYLOAD} --qps 0 --warmup 0s \
         --duration {RECORD_LIMIT} > /dev/null & FLOOD=$!; sleep 1; ",
        m = meshlab.display(),
    )
}

/// A asks the host's wire relay for a one-way delay (request `$wirereq`, in order: the
/// relay's epochs, vm/wire.rs) and waits until it applies to the frames from then on.
fn ask_relay(delay_us: u64) -> String {
    format!(
        "wirereq=$((wirereq+1)); touch \"$MESHLAB_VM_SHARED/wire.set.$wirereq.{delay_us}\"; \
         for i in $(seq 1000); do [ -f \"$MESHLAB_VM_SHARED/wire.ack.$wirereq\" ] && break; sleep 0.02; done; \
         [ -f \"$MESHLAB_VM_SHARED/wire.ack.$wirereq\" ] || exit 1; "
    )
}

/// `vm run` options for a boot whose runs include the wire delay: the relay between the
/// guests from the start, at the base delay, logging what each epoch's frames really took.
pub fn wire_args(runs: &[PlannedRun], dir: &Path) -> Vec<String> {
    if !runs.iter().any(|r| r.cause == Cause::WireDelay) {
        return Vec::new();
    }
    vec![
        "--wire-delay-us".into(),
        WIRE_BASE_US.to_string(),
        "--wire-log".into(),
        dir.join("wire.log").display().to_string(),
    ]
}

/// A asks B for an IRQ state (request `$irqreq`, in order) and waits for B's acknowledgement.
fn ask_b(state: &str) -> String {
    format!(
        "irqreq=$((irqreq+1)); touch \"$MESHLAB_VM_SHARED/irq.$irqreq.{state}\"; \
         for i in $(seq 1000); do [ -f \"$MESHLAB_VM_SHARED/irq.ack.$irqreq\" ] && break; sleep 0.02; done; \
         [ -f \"$MESHLAB_VM_SHARED/irq.ack.$irqreq\" ] || exit 1; "
    )
}

/// Both guests' shell text: `meshlab` and `xtask` are host-built binaries (the guests see the
/// host's root), `dir` the run directory mounted read-write in both.
pub fn guest_scripts(
    meshlab: &Path,
    xtask: &Path,
    dir: &Path,
    runs: &[PlannedRun],
    seconds: u64,
) -> GuestScripts {
    let setup = BSetup {
        irq: runs.iter().any(|r| r.cause.needs_spare_cpus()),
        nic_flood: runs.iter().any(|r| r.cause == Cause::IrqNicFlood),
        threaded_irqs: runs.iter().any(|r| r.cause.threaded_irqs()),
        xtask,
    };
    let mut a = guest_a(meshlab, dir, runs, seconds, setup.nic_flood);
    if setup.irq {
        // A needs one CPU; the others stay offline for the whole run.
        a = format!("{}{a}", cpus_online(false));
    }
    GuestScripts {
        a,
        b: guest_b(meshlab, dir, &setup),
    }
}

/// The kernel parameters a cause's guests boot with: `threadirqs` where it needs IRQ threads.
pub fn boot_params(cause: Cause) -> &'static [&'static str] {
    if cause.threaded_irqs() {
        &["threadirqs"]
    } else {
        &[]
    }
}

/// `vm run` options for a boot of these runs' causes (one boot has one set of kernel
/// parameters: truth_vm.rs `boot_groups` groups the causes by theirs).
pub fn kernel_args(runs: &[PlannedRun]) -> Vec<String> {
    let params: std::collections::BTreeSet<&str> = (runs.iter())
        .flat_map(|r| boot_params(r.cause))
        .copied()
        .collect();
    (params.into_iter())
        .flat_map(|p| ["--kernel-arg".to_owned(), p.to_owned()])
        .collect()
}

/// What guest B sets up for a boot's runs.
struct BSetup<'a> {
    /// Spare vCPUs: the NIC IRQ moved between them, the hogs on one.
    irq: bool,
    /// A second server for A's flood on B's NIC.
    nic_flood: bool,
    /// The guests boot with `threadirqs`: B fails unless its NIC IRQ has a thread.
    threaded_irqs: bool,
    /// The xtask binary: its `guest-hog` is the real-time hog.
    xtask: &'a Path,
}

/// Takes the extra vCPUs of the IRQ boot off- or online. Under multi-threaded TCG a guest
/// kernel patching its text (static keys flipped when the recorder attaches or detaches its
/// programs: text_poke_bp's int3) while another vCPU runs can hit a stale int3: a full run's
/// guest A died with "Oops: int3" in try_to_wake_up during the recorder's start. With one
/// vCPU online nothing else runs kernel text.
fn cpus_online(online: bool) -> String {
    format!(
        "for c in $(seq 1 {last}); do echo {flag} > /sys/devices/system/cpu/cpu$c/online || exit 1; done; ",
        last = IRQ_GUEST_CPUS - 1,
        flag = u8::from(online),
    )
}

/// `now`: CLOCK_MONOTONIC in ns, the clock of the recorder's timestamps and so of the merged
/// requests' `start_ns` (A is the client: its clock).
const NOW: &str = "now() { awk '/^now at/ {print $3; exit}' /proc/timer_list; }; ";

fn record(meshlab: &Path, dir: &Path, node: &str) -> String {
    format!(
        "{NOW}{m} record -o {d}/{lower}.capture --node {node} --port {PORT} \
         --duration {RECORD_LIMIT} --ready-file /run/rec.ready & REC=$!; {RECORDER_READY}",
        m = meshlab.display(),
        d = dir.display(),
        lower = node.to_lowercase(),
    )
}

/// A: record; once B listens, one untimed client run (the link and B's accept are up after
/// it); then every planned run: switch the cause, run the client, note the run's span on
/// A's monotonic clock, switch it back. A always tells B it is done, also on failure. With the
/// NIC flood among the runs A's spare vCPUs (offline for the recorder's attach, see
/// [`cpus_online`]) come online for the flood's client, and go offline again before the
/// recorder detaches.
fn guest_a(
    meshlab: &Path,
    dir: &Path,
    runs: &[PlannedRun],
    seconds: u64,
    with_nic_flood: bool,
) -> String {
    let (m, d) = (meshlab.display(), dir.display());
    let client = |cause: Cause, secs: u64| {
        let workload = cause.workload();
        format!(
            "taskset -c {APP_CPU} {m} lab client --connect {SERVER_ADDR}:{PORT} --payload {} \
             --qps {} --warmup 0s --duration {secs}s > /dev/null",
            workload.payload, workload.qps
        )
    };
    let mut text = format!(
        "trap 'touch \"$MESHLAB_VM_SHARED/a.done\"' EXIT; {record}{online}\
         {B_READY}\
         modprobe sch_netem || exit 1; irqreq=0; wirereq=0; \
         ok=; for i in $(seq 120); do {first} && ok=1 && break; sleep 0.5; done; [ -n \"$ok\" ] || exit 1; ",
        record = record(meshlab, dir, "A"),
        online = if with_nic_flood {
            cpus_online(true)
        } else {
            String::new()
        },
        first = client(runs.first().map_or(Cause::NetemDelay, |r| r.cause), 1),
    );
    for run in runs {
        let on_off = if run.on { "on" } else { "off" };
        let (before, after) = around_run(meshlab, run.cause, run.on);
        text.push_str(&before);
        text.push_str(&format!(
            "start=$(now); {client} || exit 1; echo \"{slug} {on_off} $start $(now)\" >> {d}/rounds; ",
            client = client(run.cause, seconds),
            slug = cause_slug(run.cause),
        ));
        text.push_str(&after);
    }
    if with_nic_flood {
        text.push_str(&cpus_online(false));
    }
    text.push_str("kill -INT $REC; wait $REC");
    text
}

/// B: record; put the NIC's RX IRQ on the idle CPU, serve on `APP_CPU`; until A is done, set
/// the IRQ state A asks for (one of [`IRQ_STATES`]: the hog runs, the IRQ on its CPU or on the
/// idle one; `stop`: no hog, IRQ on the idle CPU), log the IRQ's /proc/interrupts line at each
/// switch (b.irq-log: where the IRQs of each run went) and acknowledge. With the NIC flood
/// among the runs, its server listens on `HOG_CPU` from the start (idle in the runs without).
fn guest_b(meshlab: &Path, dir: &Path, setup: &BSetup) -> String {
    let (m, d) = (meshlab.display(), dir.display());
    let (irq, with_nic_flood) = (setup.irq, setup.nic_flood);
    let idle_mask = 1u32 << IDLE_IRQ_CPU;
    let shared = "$MESHLAB_VM_SHARED";
    // Without the IRQ cause (one vCPU) A never asks for a state: the loop only waits.
    let irq_setup = if irq {
        format!(
            "irq=$(awk -F: '/-input\\./ {{print $1+0; exit}}' /proc/interrupts); [ -n \"$irq\" ] || exit 1; \
             echo {idle_mask:x} > /proc/irq/$irq/smp_affinity || exit 1; {threaded}",
            // The IRQ's handler thread is named irq/N-DEVICE (comm, 15 characters).
            threaded = if setup.threaded_irqs {
                "grep -qs \"^irq/$irq-\" /proc/[0-9]*/comm || { echo \"IRQ $irq has no thread\" >&2; exit 1; }; "
            } else {
                ""
            },
        )
    } else {
        String::new()
    };
    // The recorder attaches and detaches its programs with the extra vCPUs offline.
    let (offline, online) = if irq {
        (cpus_online(false), cpus_online(true))
    } else {
        (String::new(), String::new())
    };
    let (flood_server, flood_stop) = if with_nic_flood {
        (
            format!(
                "taskset -c {HOG_CPU} {m} lab server --listen {SERVER_ADDR}:{FLOOD_PORT} & FSRV=$!; {}",
                listening(FLOOD_PORT)
            ),
            "kill -INT $FSRV; wait $FSRV; ",
        )
    } else {
        (String::new(), "")
    };
    let states: Vec<&str> = IRQ_STATES.iter().map(|(s, _)| *s).collect();
    let masks: String = (IRQ_STATES.iter())
        .map(|(s, cpu)| format!("{s}) mask={:x};; ", 1u32 << cpu))
        .collect();
    format!(
        "{B_EXIT}{offline}{record}{online}{irq_setup}\
         {flood_server}taskset -c {APP_CPU} {m} lab server --listen {SERVER_ADDR}:{PORT} & SRV=$!; \
         {listening}touch \"{shared}/b.ready\"; HOG=; n=0; \
         while [ ! -f \"{shared}/a.done\" ]; do next=$((n+1)); state=; \
           for s in {states} stop; do [ -f \"{shared}/irq.$next.$s\" ] && state=$s; done; \
           if [ -z \"$state\" ]; then sleep 0.02; continue; fi; \
           if [ $state = stop ]; then kill $HOG; wait $HOG; HOG=; \
           elif [ -z \"$HOG\" ]; then case $state in load*) {flood};; rt*) {rt_hog};; *) {spin};; esac; fi; \
           case $state in {masks}*) mask={idle_mask:x};; esac; \
           echo $mask > /proc/irq/$irq/smp_affinity || exit 1; \
           echo \"$state $(grep \"^ *$irq:\" /proc/interrupts)\" >> {d}/b.irq-log; \
           n=$next; touch \"{shared}/irq.ack.$n\"; \
         done; [ -z \"$HOG\" ] || kill $HOG; HOG=; \
         kill -INT $SRV; wait $SRV; {flood_stop}{offline}kill -INT $REC; wait $REC",
        record = record(meshlab, dir, "B"),
        listening = listening(PORT),
        states = states.join(" "),
        spin = format_args!("taskset -c {HOG_CPU} sh -c 'while :; do :; done' & HOG=$!"),
        flood = flood(meshlab),
        rt_hog = rt_hog(setup.xtask),
    )
}

/// The real-time hog on `HOG_CPU` in `$HOG`; B fails unless it runs SCHED_FIFO.
fn rt_hog(xtask: &Path) -> String {
    format!(
        "taskset -c {HOG_CPU} chrt -f {RT_HOG_PRIORITY} {x} guest-hog --spin-us {RT_HOG_SPIN_US} \
         --sleep-us {RT_HOG_SLEEP_US} & HOG=$!; sleep 0.5; \
         chrt -p $HOG | grep -q SCHED_FIFO || {{ echo 'the real-time hog is not SCHED_FIFO' >&2; exit 1; }}",
        x = xtask.display(),
    )
}

/// Waits until a TCP socket listens on `port` (/proc/net/tcp: local port in hex, state 0A).
fn listening(port: u16) -> String {
    format!("until grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp; do sleep 0.1; done; ")
}

/// The loopback flood on `HOG_CPU`: a lab server and, once it listens, a client sending as
/// fast as replies come; `$HOG` holds both processes.
fn flood(meshlab: &Path) -> String {
    let m = meshlab.display();
    format!(
        "taskset -c {HOG_CPU} {m} lab server --listen 127.0.0.1:{FLOOD_PORT} & HOG=$!; \
         {listening}taskset -c {HOG_CPU} {m} lab client --connect 127.0.0.1:{FLOOD_PORT} \
         --concurrency {FLOOD_CONNECTIONS} --payload {FLOOD_PAYLOAD} --qps 0 --warmup 0s --duration {RECORD_LIMIT} \
         > /dev/null & HOG=\"$HOG $!\"",
        listening = listening(FLOOD_PORT),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_interleaves_every_cause_and_alternates_the_first_condition() {
        let runs = plan(&[Cause::NetemDelay, Cause::IrqBusyCpu], 2);
        let conditions: Vec<(Cause, bool)> = runs.iter().map(|r| (r.cause, r.on)).collect();
        assert_eq!(
            conditions,
            [
                (Cause::NetemDelay, false),
                (Cause::NetemDelay, true),
                (Cause::IrqBusyCpu, true),
                (Cause::IrqBusyCpu, false),
                (Cause::NetemDelay, true),
                (Cause::NetemDelay, false),
                (Cause::IrqBusyCpu, false),
                (Cause::IrqBusyCpu, true),
            ]
        );
    }

    #[test]
    fn a_switches_each_cause_on_only_around_its_own_run() {
        // netem-loss: off then on; irq-busy-cpu: on then off.
        let runs = plan(&[Cause::NetemLoss, Cause::IrqBusyCpu], 1);
        let a = guest_a(Path::new("/m"), Path::new("/d"), &runs, 2, false);
        // Without first, then with: the qdisc appears after the run without it.
        let off = a.find("echo \"netem-loss off").expect("off run");
        let add = a.find("netem loss 1%").expect("netem added");
        let on = a.find("echo \"netem-loss on").expect("on run");
        let del = a.find("tc qdisc del dev eth0 root").expect("netem removed");
        assert!(off < add && add < on && on < del, "{a}");
        // The IRQ cause: B is asked for each run's state (the hog spins in both) and to stop
        // after it; every request waits for B's acknowledgement.
        let idle = a.find("irq.$irqreq.idle").expect("idle IRQ CPU");
        let busy = a.find("irq.$irqreq.busy").expect("busy IRQ CPU");
        let busy_run = a.find("echo \"irq-busy-cpu on").expect("busy run");
        let stops: Vec<usize> = a
            .match_indices("irq.$irqreq.stop")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(stops.len(), 2, "{a}");
        assert!(
            busy < busy_run && busy_run < stops[0] && stops[0] < idle,
            "{a}"
        );
        assert_eq!(
            a.matches("[ -f \"$MESHLAB_VM_SHARED/irq.ack.$irqreq\" ] || exit 1")
                .count(),
            4,
            "{a}"
        );
        assert!(a.ends_with("kill -INT $REC; wait $REC"), "{a}");
    }

    #[test]
    fn the_softirq_load_cause_asks_for_the_flood_states() {
        // irq-softirq-load alone: off then on.
        let runs = plan(&[Cause::IrqSoftirqLoad], 1);
        let a = guest_a(Path::new("/m"), Path::new("/d"), &runs, 2, false);
        let idle = a.find("irq.$irqreq.loadidle").expect("flood, idle IRQ CPU");
        let off = a.find("echo \"irq-softirq-load off").expect("off run");
        let busy = a
            .find("irq.$irqreq.loadbusy")
            .expect("flood, IRQ on its CPU");
        let on = a.find("echo \"irq-softirq-load on").expect("on run");
        assert!(idle < off && off < busy && busy < on, "{a}");
        assert!(!a.contains("irq.$irqreq.busy"), "{a}");
        assert_eq!(
            irq_state(Cause::IrqSoftirqLoad, true),
            ("loadbusy", HOG_CPU)
        );
        assert_eq!(irq_state(Cause::IrqBusyCpu, false), ("idle", IDLE_IRQ_CPU));
        assert_eq!(guest_cpus(Cause::IrqSoftirqLoad), IRQ_GUEST_CPUS);
    }

    #[test]
    fn the_relay_delays_only_the_runs_with_the_wire_cause() {
        let runs = plan(&[Cause::WireDelay], 1);
        let a = guest_a(Path::new("/m"), Path::new("/d"), &runs, 2, false);
        let off = a.find("echo \"wire-delay off").expect("off run");
        let set = a.find("wire.set.$wirereq.2500").expect("delay set");
        let on = a.find("echo \"wire-delay on").expect("on run");
        let reset = a.find("wire.set.$wirereq.0").expect("delay reset");
        assert!(off < set && set < on && on < reset, "{a}");
        assert_eq!(
            a.matches("wire.ack.$wirereq\" ] || exit 1").count(),
            2,
            "{a}"
        );
        let args = wire_args(&runs, Path::new("/d"));
        assert_eq!(args, ["--wire-delay-us", "0", "--wire-log", "/d/wire.log"]);
        assert!(wire_args(&plan(&[Cause::NetemDelay], 1), Path::new("/d")).is_empty());
    }

    #[test]
    fn b_moves_the_nic_irq_between_the_idle_and_the_hogs_cpu() {
        let b = guest_b(Path::new("/m"), Path::new("/d"), &b_setup(true, false));
        // CPU 2 (mask 4) at the start and by default, CPU 1 (mask 2) only when busy.
        assert!(b.contains("echo 4 > /proc/irq/$irq/smp_affinity"), "{b}");
        assert!(
            b.contains("case $state in busy) mask=2;; idle) mask=4;; loadbusy) mask=2;; loadidle) mask=4;; rtbusy) mask=2;; rtidle) mask=4;; *) mask=4;; esac;"),
            "{b}"
        );
        assert!(
            !b.contains("/proc/[0-9]*/comm"),
            "no IRQ threads asked for: {b}"
        );
        // The flood's server and client, both on the hog's CPU, both in $HOG.
        assert!(
            b.contains("load*) taskset -c 1 /m lab server --listen 127.0.0.1:9100 & HOG=$!;"),
            "{b}"
        );
        assert!(b.contains(":238C 00000000:0000 0A"), "{b}");
        assert!(
            b.contains("taskset -c 1 /m lab client --connect 127.0.0.1:9100"),
            "{b}"
        );
        assert!(b.contains("& HOG=\"$HOG $!\";;"), "{b}");
        assert!(b.contains("taskset -c 0 /m lab server"), "{b}");
        assert!(b.contains("taskset -c 1 sh -c"), "{b}");
        assert!(b.contains(":2328 00000000:0000 0A"), "{b}");
        assert!(b.contains(">> /d/b.irq-log"), "{b}");
        // The recorder starts and stops with CPUs 1 and 2 offline, the runs have them online.
        let offline = "for c in $(seq 1 2); do echo 0 > /sys/devices/system/cpu/cpu$c/online";
        let online = "for c in $(seq 1 2); do echo 1 > /sys/devices/system/cpu/cpu$c/online";
        let starts = b.find(" record -o ").expect("recorder");
        let stops = b.find("kill -INT $REC").expect("recorder stop");
        assert!(b.starts_with(&format!("{B_EXIT}{offline}")), "{b}");
        assert!(
            b.find(online).is_some_and(|i| i > starts && i < stops),
            "{b}"
        );
        assert!(
            b.rfind(offline).is_some_and(|i| i > starts && i < stops),
            "{b}"
        );
        // One vCPU (the netem boots): no IRQ to move.
        let one_cpu = guest_b(Path::new("/m"), Path::new("/d"), &b_setup(false, false));
        assert!(!one_cpu.contains("smp_affinity > "), "{one_cpu}");
        assert!(!one_cpu.contains("echo 4 >"), "{one_cpu}");
        assert!(one_cpu.contains("taskset -c 0 /m lab server"), "{one_cpu}");
    }

    fn b_setup(irq: bool, nic_flood: bool) -> BSetup<'static> {
        BSetup {
            irq,
            nic_flood,
            threaded_irqs: false,
            xtask: Path::new("/x"),
        }
    }

    /// The real-time hog: A asks for `rtbusy`/`rtidle`; B checks its NIC IRQ has a thread
    /// before the runs, starts xtask's hog under SCHED_FIFO above the IRQ threads on the hog's
    /// CPU and checks its policy; the boot gets `threadirqs`, and only this cause's.
    #[test]
    fn the_rt_hog_runs_above_the_irq_threads_of_a_threadirqs_boot() {
        let runs = plan(&[Cause::IrqRtBusyCpu], 1);
        let scripts = guest_scripts(Path::new("/m"), Path::new("/x"), Path::new("/d"), &runs, 2);
        let (a, b) = (&scripts.a, &scripts.b);
        let idle = a.find("irq.$irqreq.rtidle").expect(a);
        let off = a.find("echo \"irq-rt-busy-cpu off").expect(a);
        let busy = a.find("irq.$irqreq.rtbusy").expect(a);
        let on = a.find("echo \"irq-rt-busy-cpu on").expect(a);
        assert!(idle < off && off < busy && busy < on, "{a}");
        let thread_check = b
            .find("grep -qs \"^irq/$irq-\" /proc/[0-9]*/comm || {")
            .expect(b);
        assert!(thread_check < b.find("b.ready").expect(b), "{b}");
        assert!(
            b.contains(
                "rt*) taskset -c 1 chrt -f 60 /x guest-hog --spin-us 6000 --sleep-us 1000 & HOG=$!;"
            ),
            "{b}"
        );
        assert!(b.contains("chrt -p $HOG | grep -q SCHED_FIFO || {"), "{b}");
        assert_eq!(kernel_args(&runs), ["--kernel-arg", "threadirqs"]);
        assert!(kernel_args(&plan(&[Cause::IrqBusyCpu], 1)).is_empty());
        assert_eq!(irq_state(Cause::IrqRtBusyCpu, true), ("rtbusy", HOG_CPU));
        assert_eq!(
            irq_state(Cause::IrqRtBusyCpu, false),
            ("rtidle", IDLE_IRQ_CPU)
        );
        assert_eq!(guest_cpus(Cause::IrqRtBusyCpu), IRQ_GUEST_CPUS);
    }

    /// The NIC flood: B's flood server listens from the start on its spare CPU, A starts the
    /// flood's client before each run with the cause and stops it after, on a spare vCPU that
    /// is online only while the recorder is attached.
    #[test]
    fn the_nic_flood_runs_from_a_to_a_second_server_on_b() {
        let runs = plan(&[Cause::IrqNicFlood], 1);
        let scripts = guest_scripts(Path::new("/m"), Path::new("/x"), Path::new("/d"), &runs, 2);
        let (a, b) = (&scripts.a, &scripts.b);
        let flood_server = format!(
            "taskset -c 1 /m lab server --listen {SERVER_ADDR}:9100 & FSRV=$!; {}",
            listening(FLOOD_PORT)
        );
        let serves = b.find(&flood_server).expect(b);
        assert!(serves < b.find("b.ready").expect(b), "{b}");
        assert!(b.contains("kill -INT $FSRV; wait $FSRV; "), "{b}");
        let start = a.find(&nic_flood_start(Path::new("/m"))).expect(a);
        assert!(a.contains("--concurrency 16 --payload 64 --qps 0"), "{a}");
        let on_run = a.find("irq-nic-flood on").expect(a);
        let stop = a.find("kill $FLOOD; wait $FLOOD; ").expect(a);
        assert!(start < on_run && on_run < stop, "{a}");
        assert_eq!(
            a.matches("& FLOOD=$!").count(),
            1,
            "one run with the cause: {a}"
        );
        let online = a.find(&cpus_online(true)).expect(a);
        let ready = a.find(RECORDER_READY).expect(a);
        let offline_last = a.rfind(&cpus_online(false)).expect(a);
        let stops = a.find("kill -INT $REC").expect(a);
        assert!(a.starts_with(&cpus_online(false)), "{a}");
        assert!(ready < online && online < start, "{a}");
        assert!(stop < offline_last && offline_last < stops, "{a}");
        assert_eq!(guest_cpus(Cause::IrqNicFlood), IRQ_GUEST_CPUS);
    }
}
