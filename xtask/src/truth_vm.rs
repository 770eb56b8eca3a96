//! `cargo xtask truth --vm`: the causes this host kernel cannot inject, in the two qemu guests
//! (docs/vm.md): netem delay and loss on guest A's NIC, and guest B's virtio-net RX IRQ pinned
//! to a CPU where a hog spins. One boot of both guests runs every planned round
//! (truth_vm_script.rs); both guests record the whole time, the host merges the two
//! recordings across the guests' real clock skew and cuts the merged requests into rounds by
//! each round's span on A's monotonic clock. Per round the same medians as the host harness
//! (`truth::request_stats`), the same table (`truth::print_table`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::truth;
use crate::truth_cause::{Cause, VM_CAUSES, VM_NAMED_CAUSES};
use crate::truth_retransmit::{self, retransmissions};
use crate::truth_stats::{self, RunStats, TableSetting};
use crate::truth_vm_script::{
    self, HOG_CPU, IRQ_GUEST_CPUS, PlannedRun, boot_params, cause_slug, guest_cpus, irq_state,
};
use crate::vm::GUEST_STOPPED_EXIT;
use crate::{read_ndjson, run_cmd, run_cmd_status, target_dir, vm_wire_rounds};

/// The guests' kernel: 6.12 has every tier the merge needs for complete requests (6.1 has no
/// sk_data_ready tier, vm_scenarios.rs).
const KERNEL: &str = "6.12";
const GUEST_MEMORY_MIB: &str = "768";
/// A round with fewer complete requests is an error, not a median.
const MIN_REQUESTS_PER_ROUND: usize = 20;

pub struct VmTruth {
    pub rounds: usize,
    pub seconds: u64,
    pub causes: Vec<Cause>,
    pub keep: Option<PathBuf>,
    pub debug: bool,
    pub breakdown: bool,
}

/// `cargo xtask truth --vm`.
pub fn run_args(args: truth::TruthArgs) -> Result<()> {
    let (rounds, seconds) = truth::run_shape(&args)?;
    run(VmTruth {
        rounds,
        seconds,
        causes: args.causes,
        keep: args.keep,
        debug: args.debug,
        breakdown: args.breakdown,
    })
}

pub fn run(args: VmTruth) -> Result<()> {
    let causes = if args.causes.is_empty() {
        VM_CAUSES.to_vec()
    } else {
        (VM_CAUSES.into_iter().chain(VM_NAMED_CAUSES))
            .filter(|c| args.causes.contains(c))
            .collect()
    };
    let meshlab = truth::build_meshlab(args.debug)?;
    let dir = RunDir::new(args.keep.clone())?;
    let mut boots = Vec::new();
    for (index, (cpus, group)) in boot_groups(&causes).into_iter().enumerate() {
        let boot_dir = dir.path.join(format!("boot{index}"));
        boots.push(Boot::run(
            &meshlab,
            &boot_dir,
            group,
            cpus,
            args.rounds,
            args.seconds,
        )?);
    }
    report(&boots, &args)?;
    dir.succeeded();
    Ok(())
}

/// The table over every boot's runs, then what the guests' own logs say about the causes
/// (retransmissions, the relay's delays, where B's IRQ fired); those checks can still fail.
fn report(boots: &[Boot], args: &VmTruth) -> Result<()> {
    let mut results: BTreeMap<(Cause, bool), Vec<RunStats>> = BTreeMap::new();
    for boot in boots {
        for (key, stats) in round_stats(&boot.requests, &boot.rounds)? {
            results.entry(key).or_default().extend(stats);
        }
    }
    let shapes: Vec<String> = boots.iter().map(|b| boot_shape(&b.causes)).collect();
    let title = format!(
        "kernel-only recording, two qemu guests (kernel {KERNEL}, TCG; per boot: {}), c=1, \
         {} interleaved round(s) x {}s per run",
        shapes.join("; "),
        args.rounds,
        args.seconds
    );
    let setting = TableSetting {
        title,
        self_cost: false,
    };
    truth_stats::print_table(&results, &setting);
    print_retransmissions(boots);
    let with = |cause: Cause| boots.iter().filter(move |b| b.causes.contains(&cause));
    for boot in with(Cause::WireDelay) {
        print_relay_delays(&boot.dir)?;
    }
    for boot in boots
        .iter()
        .filter(|b| b.causes.iter().any(|c| c.moves_irq()))
    {
        print_irq_placement(&boot.dir, &boot.causes)?;
    }
    if args.breakdown {
        truth_stats::print_breakdowns(&results);
    }
    Ok(())
}

/// How a boot's guests ran, for the table's title: `3 vCPUs, threadirqs: irq-rt-busy-cpu`.
fn boot_shape(causes: &[Cause]) -> String {
    let params: String = (boot_params(causes[0]).iter())
        .map(|p| format!(", {p}"))
        .collect();
    let names: Vec<String> = causes.iter().map(|&c| cause_slug(c)).collect();
    format!(
        "{} vCPU(s){params}: {}",
        guest_cpus(causes[0]),
        names.join(" ")
    )
}

/// The causes grouped by the guests they need (vCPUs, IRQ threads), one boot per group, in
/// table order.
fn boot_groups(causes: &[Cause]) -> Vec<(usize, Vec<Cause>)> {
    let mut groups: Vec<(usize, Vec<Cause>)> = Vec::new();
    let boot = |cause: Cause| (guest_cpus(cause), boot_params(cause));
    for &cause in causes {
        match groups.iter_mut().find(|(_, g)| boot(g[0]) == boot(cause)) {
            Some((_, group)) => group.push(cause),
            None => groups.push((guest_cpus(cause), vec![cause])),
        }
    }
    groups
}

/// One boot of both guests: its causes, its directory, the merged requests and the rounds.
struct Boot {
    causes: Vec<Cause>,
    dir: PathBuf,
    requests: Vec<serde_json::Value>,
    rounds: Vec<GuestRound>,
}

impl Boot {
    fn run(
        meshlab: &Path,
        dir: &Path,
        causes: Vec<Cause>,
        cpus: usize,
        rounds: usize,
        seconds: u64,
    ) -> Result<Self> {
        let runs = truth_vm_script::plan(&causes, rounds);
        let started = std::time::Instant::now();
        boot_and_run(meshlab, dir, &runs, seconds, cpus)?;
        eprintln!(
            "truth --vm: guests ({cpus} vCPU(s) each) done in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        let requests = merge(meshlab, dir)?;
        let rounds = read_rounds(&dir.join("rounds"))?;
        ensure!(
            rounds.len() == runs.len(),
            "{} rounds in the rounds file, {} planned",
            rounds.len(),
            runs.len()
        );
        Ok(Self {
            causes,
            dir: dir.to_owned(),
            requests,
            rounds,
        })
    }
}

/// Boots both guests (`xtask vm run`: its guards stop the guests on every exit path, the
/// qdiscs and the hog live and die inside them) and waits for both scripts, in an emptied
/// `dir` (the guests append to some of its files: a kept directory's earlier run must not mix
/// into this one). When a guest stops without a status after its command started (`vm run`
/// exits [`GUEST_STOPPED_EXIT`]: a TCG flake of these three-vCPU boots, with nothing on the
/// console, docs/truth.md, which failed CI-66), both boot again, once, in the emptied
/// directory: the scripts write only there, and a second stop fails the run. (The first
/// boot's console logs, whose paths `vm run` printed, stay for an hour: `vm::guest`'s
/// `DEAD_RUN_LOGS_KEPT`.)
fn boot_and_run(
    meshlab: &Path,
    dir: &Path,
    runs: &[PlannedRun],
    seconds: u64,
    cpus: usize,
) -> Result<()> {
    let scripts = truth_vm_script::guest_scripts(meshlab, &crate::self_exe()?, dir, runs, seconds);
    // Boot and recorder start-up (~30 s under TCG), then per run its seconds plus the client's
    // start and the cause's switch.
    let timeout = 180 + runs.len() as u64 * (seconds + 15);
    let mut vm_run = Command::new(crate::self_exe()?);
    dies_with_parent(&mut vm_run)
        .args(["vm", "run", "--kernel", KERNEL, "--cpus", &cpus.to_string()])
        .args(["--memory", GUEST_MEMORY_MIB])
        .args(["--timeout", &timeout.to_string(), "--rw"])
        .arg(dir)
        .args(truth_vm_script::wire_args(runs, dir))
        .args(truth_vm_script::kernel_args(runs))
        .args(["--a", &scripts.a, "--b", &scripts.b]);
    for attempt in 1u32.. {
        empty_dir(dir)?;
        let (what, status) = run_cmd_status(&mut vm_run)?;
        match after_boot(status.code(), attempt) {
            AfterBoot::Done => return Ok(()),
            AfterBoot::BootAgain => eprintln!(
                "truth --vm: a guest stopped without a status after its command started (vm run \
                 exit {GUEST_STOPPED_EXIT}): booting both again, once"
            ),
            AfterBoot::Fail => bail!("`{what}` failed: {status} (boot {attempt})"),
        }
    }
    unreachable!("the loop returns or fails")
}

#[derive(Debug, PartialEq)]
enum AfterBoot {
    Done,
    BootAgain,
    Fail,
}

/// What `vm run`'s exit `code` after boot number `attempt` (from 1) calls for.
fn after_boot(code: Option<i32>, attempt: u32) -> AfterBoot {
    match (code, attempt) {
        (Some(0), _) => AfterBoot::Done,
        (Some(GUEST_STOPPED_EXIT), 1) => AfterBoot::BootAgain,
        _ => AfterBoot::Fail,
    }
}

/// Removes `dir` with what is in it, and creates it empty.
fn empty_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("emptying {}", dir.display()));
        }
        _ => {}
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// SIGTERM to `cmd`'s process when this one dies, also without unwinding (SIGKILL): `vm run`
/// then stops both guests and removes its run directory on its SIGTERM path (docs/vm.md,
/// Cleanup) instead of running on until its timeout.
fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// `meshlab merge` of both guests' recordings; the merged requests.
fn merge(meshlab: &Path, dir: &Path) -> Result<Vec<serde_json::Value>> {
    let merged = dir.join("merged.ndjson");
    run_cmd(
        Command::new(meshlab)
            .arg("merge")
            .args([dir.join("a.capture"), dir.join("b.capture")])
            .arg("-o")
            .arg(&merged),
    )?;
    let mut records = read_ndjson(&merged)?;
    records.retain(|r| r["type"] == "request");
    Ok(records)
}

/// One client run of guest A as it happened: the cause, whether it was in force, and the run's
/// span on A's CLOCK_MONOTONIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestRound {
    pub cause: Cause,
    pub on: bool,
    pub start_ns: i64,
    pub end_ns: i64,
}

/// The rounds file A writes: `CAUSE on|off START_NS END_NS` per run.
fn read_rounds(path: &Path) -> Result<Vec<GuestRound>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    (text.lines().enumerate())
        .map(|(index, line)| {
            parse_round(line).with_context(|| format!("{}:{}: {line:?}", path.display(), index + 1))
        })
        .collect()
}

fn parse_round(line: &str) -> Result<GuestRound> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    ensure!(fields.len() == 4, "expected CAUSE on|off START_NS END_NS");
    let cause = (VM_CAUSES.into_iter().chain(VM_NAMED_CAUSES))
        .find(|&c| cause_slug(c) == fields[0])
        .with_context(|| format!("unknown guest cause {:?}", fields[0]))?;
    let on = match fields[1] {
        "on" => true,
        "off" => false,
        other => anyhow::bail!("condition {other:?} is neither on nor off"),
    };
    let start_ns: i64 = fields[2].parse().context("START_NS")?;
    let end_ns: i64 = fields[3].parse().context("END_NS")?;
    ensure!(start_ns < end_ns, "the run ends before it starts");
    Ok(GuestRound {
        cause,
        on,
        start_ns,
        end_ns,
    })
}

/// The requests that started inside the round (A's clock).
fn inside<'a>(
    requests: &'a [serde_json::Value],
    round: &'a GuestRound,
) -> impl Iterator<Item = &'a serde_json::Value> {
    requests.iter().filter(|r| {
        r["start_ns"]
            .as_i64()
            .is_some_and(|t| t >= round.start_ns && t <= round.end_ns)
    })
}

/// Per round the host harness's medians, grouped by (cause, in force).
fn round_stats(
    requests: &[serde_json::Value],
    rounds: &[GuestRound],
) -> Result<BTreeMap<(Cause, bool), Vec<RunStats>>> {
    let mut results: BTreeMap<(Cause, bool), Vec<RunStats>> = BTreeMap::new();
    for (index, round) in rounds.iter().enumerate() {
        let stats = truth_stats::request_stats(inside(requests, round), round.cause)
            .with_context(|| format!("round {index}: {round:?}"))?;
        ensure!(
            stats.requests >= MIN_REQUESTS_PER_ROUND,
            "round {index} ({round:?}): only {} complete requests",
            stats.requests
        );
        eprintln!(
            "truth --vm: run {index:>2} {:<28} {:<7} e2e p50 {:>9.1} us, {} {:>9.1} us ({} complete requests)",
            round.cause.name(),
            if round.on { "cause" } else { "without" },
            stats.e2e_p50_ns / 1e3,
            round.cause.target_name(),
            stats.target_p50_ns / 1e3,
            stats.requests,
        );
        results
            .entry((round.cause, round.on))
            .or_default()
            .push(stats);
    }
    Ok(results)
}

/// Per cause and condition: how many requests the merge marked retransmitted, and for the
/// complete ones their mean e2e and the share of it in the cause's target segments.
fn print_retransmissions(boots: &[Boot]) {
    truth_retransmit::print_header();
    for boot in boots {
        for &cause in &boot.causes {
            for on in [false, true] {
                let of_condition = (boot.rounds.iter()).filter(|r| r.cause == cause && r.on == on);
                let requests = of_condition.flat_map(|r| inside(&boot.requests, r));
                let counts = retransmissions(requests, |r| truth_stats::target_ns(r, cause));
                truth_retransmit::print_row(cause.name(), cause.target_name(), on, &counts);
            }
        }
    }
}

/// What the relay really added per round trip (both directions' median per-frame delay, host
/// clock, `wire.log`), in its epochs with the cause and without: the relay switches to the
/// cause's delay before each run with it (odd epochs) and back after it (even epochs, 0 the
/// start).
fn print_relay_delays(dir: &Path) -> Result<()> {
    let realized = vm_wire_rounds::realized_round_trips(&dir.join("wire.log"))?;
    let (with, without) = split_epochs(&realized);
    println!(
        "\nwire relay, realized round trip per epoch (us): with the cause {:?}, without {:?}",
        with.iter().map(|ns| ns / 1000).collect::<Vec<_>>(),
        without.iter().map(|ns| ns / 1000).collect::<Vec<_>>()
    );
    ensure!(
        !with.is_empty(),
        "wire.log has no epoch with the cause's delay"
    );
    Ok(())
}

/// Odd epochs (the cause's delay) and even ones (the base delay).
fn split_epochs(realized: &BTreeMap<u64, i64>) -> (Vec<i64>, Vec<i64>) {
    let (odd, even): (Vec<_>, Vec<_>) = realized.iter().partition(|(epoch, _)| *epoch % 2 == 1);
    let values = |v: Vec<(&u64, &i64)>| v.into_iter().map(|(_, ns)| *ns).collect();
    (values(odd), values(even))
}

/// One line of b.irq-log: the state B switched to and the IRQ's counts per CPU right after.
#[derive(Debug, PartialEq)]
struct IrqSwitch {
    state: String,
    counts: Vec<u64>,
}

/// `STATE IRQ: COUNT... CHIP... NAME` (the IRQ's line of /proc/interrupts after the state).
fn parse_irq_switch(line: &str) -> Result<IrqSwitch> {
    let mut words = line.split_whitespace();
    let state = words.next().context("empty line")?.to_owned();
    ensure!(
        words.next().is_some_and(|w| w.ends_with(':')),
        "no IRQ line after the state: {line:?}"
    );
    let counts: Vec<u64> = words.map_while(|w| w.parse().ok()).collect();
    ensure!(
        counts.len() == IRQ_GUEST_CPUS,
        "{} CPU counts in {line:?}",
        counts.len()
    );
    Ok(IrqSwitch { state, counts })
}

/// Per state (`busy`, `idle`): the IRQs between its switch and the next one (its run), summed
/// per CPU.
fn irqs_per_state(switches: &[IrqSwitch]) -> BTreeMap<String, Vec<u64>> {
    let mut per_state: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for pair in switches.windows(2) {
        if pair[0].state == "stop" {
            continue;
        }
        let sums = per_state
            .entry(pair[0].state.clone())
            .or_insert_with(|| vec![0; IRQ_GUEST_CPUS]);
        for (cpu, sum) in sums.iter_mut().enumerate() {
            *sum += pair[1].counts[cpu].saturating_sub(pair[0].counts[cpu]);
        }
    }
    per_state
}

/// B's NIC RX IRQ must have fired where each run put it: on the hog's CPU in the runs with
/// the cause, on the idle CPU in the others (every state the runs of the boot's `causes` ask
/// for).
fn print_irq_placement(dir: &Path, causes: &[Cause]) -> Result<()> {
    let path = dir.join("b.irq-log");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let switches = (text.lines())
        .map(parse_irq_switch)
        .collect::<Result<Vec<_>>>()?;
    let per_state = irqs_per_state(&switches);
    println!("\nB's NIC RX IRQ per CPU in the runs of the IRQ causes (the hog on CPU {HOG_CPU}):");
    let asked = (causes.iter().filter(|c| c.moves_irq()))
        .flat_map(|&c| [irq_state(c, true), irq_state(c, false)]);
    for (state, cpu) in asked {
        let counts = per_state.get(state).map_or(&[][..], Vec::as_slice);
        println!("  {state} (IRQ on CPU {cpu}): {counts:?}");
        check_pinned(counts, cpu).with_context(|| format!("the {state} runs"))?;
    }
    Ok(())
}

/// IRQs that may land on the old CPU per switch: one in flight while the affinity changed
/// (a quick run had 1 of 58).
const STRAY_IRQS: u64 = 2;

/// All but 1 % (at least `STRAY_IRQS`) of the IRQs on `cpu`.
fn check_pinned(per_cpu: &[u64], cpu: usize) -> Result<()> {
    let total: u64 = per_cpu.iter().sum();
    let on_cpu = per_cpu.get(cpu).copied().unwrap_or(0);
    ensure!(
        total > 0 && total - on_cpu <= (total / 100).max(STRAY_IRQS),
        "B's NIC IRQ was not pinned to CPU {cpu}: {per_cpu:?}"
    );
    Ok(())
}

/// The run's directory, in both guests at the same path; removed after a successful run
/// unless kept, kept (and named) after a failure for the recordings.
struct RunDir {
    path: PathBuf,
    keep: bool,
    ok: bool,
}

impl RunDir {
    fn new(keep: Option<PathBuf>) -> Result<Self> {
        let (path, keep) = match keep {
            Some(dir) => (dir, true),
            None => (
                target_dir().join(format!("vm/truth-{}", std::process::id())),
                false,
            ),
        };
        std::fs::create_dir_all(&path).with_context(|| format!("mkdir {}", path.display()))?;
        // The guests see the host's paths: an absolute one works from any working directory.
        let path = path.canonicalize()?;
        Ok(Self {
            path,
            keep,
            ok: false,
        })
    }

    fn succeeded(mut self) {
        self.ok = true;
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.ok && !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        } else if !self.ok {
            eprintln!("truth --vm: files kept in {}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::truth_retransmit::Retransmissions;
    use serde_json::json;

    #[test]
    fn only_a_first_silent_stop_boots_again() {
        assert_eq!(after_boot(Some(0), 1), AfterBoot::Done);
        assert_eq!(after_boot(Some(0), 2), AfterBoot::Done);
        assert_eq!(
            after_boot(Some(GUEST_STOPPED_EXIT), 1),
            AfterBoot::BootAgain
        );
        assert_eq!(after_boot(Some(GUEST_STOPPED_EXIT), 2), AfterBoot::Fail);
        // A script's own failure, vm run's error (a timeout) and a signal are not retried.
        assert_eq!(after_boot(Some(1), 1), AfterBoot::Fail);
        assert_eq!(after_boot(None, 1), AfterBoot::Fail);
    }

    #[test]
    fn emptying_a_boot_directory_removes_an_earlier_run() {
        let dir = std::env::temp_dir().join(format!("truth-vm-empty-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("rounds"), "netem-delay off 1 2\n").unwrap();
        empty_dir(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
        // A missing directory is created.
        empty_dir(&dir).unwrap();
        assert!(dir.is_dir());
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn only_the_irq_cause_boots_guests_with_more_vcpus() {
        let groups = boot_groups(&[Cause::NetemDelay, Cause::IrqBusyCpu, Cause::NetemLoss]);
        assert_eq!(
            groups,
            [
                (1, vec![Cause::NetemDelay, Cause::NetemLoss]),
                (IRQ_GUEST_CPUS, vec![Cause::IrqBusyCpu])
            ]
        );
        // Threaded IRQs are a boot of their own, even with as many vCPUs.
        let groups = boot_groups(&[
            Cause::IrqBusyCpu,
            Cause::IrqRtBusyCpu,
            Cause::IrqSoftirqLoad,
        ]);
        assert_eq!(
            groups,
            [
                (
                    IRQ_GUEST_CPUS,
                    vec![Cause::IrqBusyCpu, Cause::IrqSoftirqLoad]
                ),
                (IRQ_GUEST_CPUS, vec![Cause::IrqRtBusyCpu])
            ]
        );
        assert_eq!(
            boot_shape(&[Cause::IrqRtBusyCpu]),
            "3 vCPU(s), threadirqs: irq-rt-busy-cpu"
        );
        assert_eq!(
            boot_shape(&[Cause::NetemDelay, Cause::WireDelay]),
            "1 vCPU(s): netem-delay wire-delay"
        );
    }

    #[test]
    fn rounds_are_read_back_and_bad_lines_named() {
        let round = parse_round("netem-loss on 100 250").expect("valid");
        assert_eq!(
            round,
            GuestRound {
                cause: Cause::NetemLoss,
                on: true,
                start_ns: 100,
                end_ns: 250
            }
        );
        let slow = parse_round("slow-handler on 1 2").expect_err("host cause");
        assert!(format!("{slow}").contains("unknown guest cause"), "{slow}");
        let maybe = parse_round("irq-busy-cpu maybe 1 2").expect_err("condition");
        assert!(format!("{maybe}").contains("neither on nor off"), "{maybe}");
        let backwards = parse_round("netem-delay off 5 4").expect_err("backwards");
        assert!(
            format!("{backwards}").contains("ends before"),
            "{backwards}"
        );
    }

    fn request(
        start: i64,
        complete: bool,
        notes: &[&str],
        segments: serde_json::Value,
    ) -> serde_json::Value {
        json!({"type": "request", "start_ns": start, "complete": complete, "e2e_ns": 1000,
               "trace_id": format!("t@{start}"), "notes": notes, "segments": segments})
    }

    #[test]
    fn retransmitted_requests_are_counted_and_their_time_split() {
        let seg = |node: Option<&str>, name: &str, dur: u64| json!({"node": node, "name": name, "unit": "x", "kind": "queue", "dur_ns": dur});
        let lost = json!([
            seg(Some("A"), "tx_qdisc", 600),
            seg(None, "network_round_trip", 300),
            seg(Some("B"), "server_app", 100)
        ]);
        let requests = [
            request(
                10,
                true,
                &["retransmitted: request on A; stage times use the first transmission"],
                lost,
            ),
            request(20, false, &["retransmitted: response on B; ..."], json!([])),
            request(30, true, &["rx context: ..."], json!([])),
            request(40, true, &[], json!([])),
        ];
        let counts = retransmissions(requests.iter(), |r| {
            truth_stats::target_ns(r, Cause::NetemLoss)
        });
        assert_eq!(
            counts,
            Retransmissions {
                requests: 4,
                noted: 2,
                noted_complete: 1,
                e2e_ns: 1000,
                target_ns: 900
            }
        );
        let round = GuestRound {
            cause: Cause::NetemLoss,
            on: true,
            start_ns: 15,
            end_ns: 30,
        };
        let starts: Vec<i64> = inside(&requests, &round)
            .map(|r| r["start_ns"].as_i64().unwrap())
            .collect();
        assert_eq!(starts, [20, 30]);
    }

    #[test]
    fn relay_epochs_alternate_between_the_cause_and_the_base() {
        let realized = BTreeMap::from([(0, 40), (1, 5_100), (2, 45), (3, 5_200), (4, 50)]);
        assert_eq!(
            split_epochs(&realized),
            (vec![5_100, 5_200], vec![40, 45, 50])
        );
    }

    #[test]
    fn the_irq_cause_counts_only_the_servers_irq_and_softirq_segments() {
        let seg = |node: &str, name: &str, unit: &str, dur: u64| json!({"node": node, "name": name, "unit": unit, "kind": "compute", "dur_ns": dur});
        let segments = json!([
            seg("B", "rx_irq_handler", "irq", 7),
            seg("B", "rx_softirq_delay", "softirq", 30),
            seg("B", "rx_napi_poll", "driver", 500),
            seg("A", "rx_softirq_delay", "softirq", 4000),
            seg("A", "tx_qdisc", "qdisc", 60000),
        ]);
        let r = request(1, true, &[], segments);
        assert_eq!(truth_stats::target_ns(&r, Cause::IrqBusyCpu), 37);
        assert_eq!(truth_stats::target_ns(&r, Cause::NetemDelay), 60000);
    }

    #[test]
    fn the_irq_must_have_fired_where_each_run_put_it() {
        let log = "busy 25:  10  20  30  PCI-MSI 81921-edge  virtio1-input.0\n\
                   stop 25:  10  2021  30  PCI-MSI 81921-edge  virtio1-input.0\n\
                   idle 25:  10  2021  31  PCI-MSI 81921-edge  virtio1-input.0\n\
                   stop 25:  11  2021  1531  PCI-MSI 81921-edge  virtio1-input.0\n";
        let switches: Vec<IrqSwitch> = log.lines().map(|l| parse_irq_switch(l).unwrap()).collect();
        assert_eq!(switches[1].counts, [10, 2021, 30]);
        let per_state = irqs_per_state(&switches);
        // The switch into stop and the next run's switch are not a run.
        assert_eq!(per_state.len(), 2);
        assert_eq!(per_state["busy"], [0, 2001, 0]);
        assert_eq!(per_state["idle"], [1, 0, 1500]);
        check_pinned(&per_state["busy"], 1).expect("all on the hog's CPU");
        check_pinned(&per_state["idle"], 2).expect("one stray IRQ of 1501 is in flight");
        let unpinned = check_pinned(&[900, 1100, 0], 1).expect_err("unpinned");
        assert!(
            format!("{unpinned}").contains("not pinned to CPU 1"),
            "{unpinned}"
        );
        assert!(
            check_pinned(&[0, 0, 0], 1).is_err(),
            "no IRQ at all is not pinned"
        );
        let short = parse_irq_switch("busy 25: 1 2 PCI-MSI").expect_err("two CPUs");
        assert!(format!("{short}").contains("2 CPU counts"), "{short}");
    }
}
