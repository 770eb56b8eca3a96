//! meshlab on stock Debian kernels under qemu: what this host kernel cannot show.
//!
//! - every privileged record test binary runs inside each guest kernel, where fentry and
//!   kprobe attach (so tcp_sendmsg must be recorded at the fentry tier);
//! - two guests joined by a virtio-net link: the receiver's RX events must carry the real NIC
//!   IRQ that preceded them (irq number, entry time before the NET_RX softirq); its raw IRQ and
//!   NET_RX softirq counts must match /proc/interrupts and /proc/softirqs (vm_irq_counts.rs);
//!   on 6.12 both guests record and the host merges them across machines (vm_two_machines.rs),
//!   and run again with two queues on their one CPU (vm_two_queues.rs), and with two NICs on
//!   their one CPU (vm_two_nics.rs).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::{
    read_ndjson, run_cmd, target_dir, vm_irq_counts, vm_two_machines, vm_two_nics, vm_two_queues,
    vm_wire_rounds,
};

const KERNELS: [&str; 2] = ["6.1", "6.12"];
/// The kernel whose two-guest run is also merged and checked across machines, and whose
/// guests also run with two queues on one CPU (vm_two_queues.rs).
const TWO_MACHINE_KERNEL: &str = "6.12";
/// Guest B, the lab server's machine, on the link.
const SERVER_ADDR: &str = "10.213.0.2";

/// `nic_only`: just the two-guest scenarios: one queue, two queues, two NICs (developer
/// shortcut).
pub fn run(ci: bool, nic_only: bool) -> Result<()> {
    let xtask = crate::self_exe()?;
    if nic_only {
        KERNELS
            .iter()
            .try_for_each(|kernel| nic_irq_scenario(&xtask, kernel))?;
        two_queue_scenario(&xtask, TWO_MACHINE_KERNEL, ci)?;
        return two_nic_scenario(&xtask, TWO_MACHINE_KERNEL);
    }
    let mut check = Command::new(&xtask);
    check.args(["vm", "check"]);
    if ci {
        check.env("MESHLAB_REQUIRE_VM", "1");
    }
    run_cmd(&mut check)?;
    for kernel in KERNELS {
        let mut tests = Command::new(&xtask);
        tests
            .args(["vm", "test", "--kernel", kernel, "--", "-p", "meshlab-user"])
            .args([
                "--test",
                "record_tiers",
                "--test",
                "record_loopback",
                "--test",
                "record_overload",
                // `record -v`: the kernel log calls load and print on these kernels too.
                "--test",
                "record_diag",
                // send_return on every socket (fexit __sock_sendmsg on 6.1: sock_sendmsg
                // attached there but never fired) and prefilter slot hand-overs.
                "--test",
                "record_slot_collisions",
                // `--sample-messages`: the turn atomics load and count exactly on these
                // verifiers (without sampling the verifier never walks that code).
                "--test",
                "record_sampled_count",
                // unix sockets; on 6.1 without the sk_data_ready tracepoint.
                "--test",
                "record_unix",
            ])
            .env("MESHLAB_EXPECT_TCP_SENDMSG_TIER", "fentry")
            .env("MESHLAB_REQUIRE_PRIVILEGED", "1");
        run_cmd(&mut tests)?;
        nic_irq_scenario(&xtask, kernel)?;
    }
    two_queue_scenario(&xtask, TWO_MACHINE_KERNEL, ci)?;
    two_nic_scenario(&xtask, TWO_MACHINE_KERNEL)
}

/// Both guests record; B serves, A sends RPCs over the virtio link once B answers, in rounds
/// with and without a netem delay (vm_two_machines.rs); the host merges both recordings.
fn nic_irq_scenario(xtask: &Path, kernel: &str) -> Result<()> {
    let dir = target_dir().join(format!("vm/scenario-{kernel}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let meshlab = target_dir().join("debug/meshlab");
    let rounds = kernel == TWO_MACHINE_KERNEL;
    // The wire relay's rounds run after the netem ones (docs/vm.md, vm_wire_rounds.rs).
    let wire = rounds.then_some(vm_wire_rounds::rounds_script as vm_two_machines::WireRounds);
    let traffic = (SERVER_ADDR, &vm_two_machines::Traffic::SINGLE);
    let scripts = vm_two_machines::guest_scripts(&meshlab, &dir, traffic, rounds, wire);
    let wire_args = if rounds {
        vm_wire_rounds::run_args(&dir)
    } else {
        Vec::new()
    };
    let mut result = run_cmd(
        Command::new(xtask)
            .args(["vm", "run", "--kernel", kernel, "--timeout", "300", "--rw"])
            .arg(&dir)
            .args(wire_args)
            .args(["--a", &scripts.a, "--b", &scripts.b]),
    )
    .and_then(|()| check_nic_irq_recording(&read_ndjson(&dir.join("b.ndjson"))?))
    .and_then(|()| vm_irq_counts::check(&meshlab, &dir, "b"));
    // 6.1 has no sk_data_ready tier: its merged requests are never complete, and one kernel
    // is enough to check the merge across machines.
    if kernel == TWO_MACHINE_KERNEL {
        result = result
            .and_then(|()| vm_two_machines::check(&meshlab, &dir))
            .and_then(|requests| vm_wire_rounds::check(&requests, &dir));
    }
    finish(
        &dir,
        result,
        &format!("kernel {kernel}: two-guest scenario"),
    )
}

/// Both guests with a two-queue NIC on their one vCPU (vm_two_queues.rs): the first client
/// run only, no rounds. The tap link needs root on the host: without it this skips with a
/// line on stderr, or fails under `--ci`.
fn two_queue_scenario(xtask: &Path, kernel: &str, ci: bool) -> Result<()> {
    let what = format!("kernel {kernel}: two queues on one CPU");
    if !crate::setup::is_root() {
        ensure!(
            !ci,
            "{what}: needs root on the host (the tap link), and --ci allows no skip"
        );
        eprintln!("SKIP {what}: needs root on the host (the tap link)");
        return Ok(());
    }
    let dir = target_dir().join(format!(
        "vm/scenario-{kernel}-queues-{}",
        std::process::id()
    ));
    let meshlab = target_dir().join("debug/meshlab");
    let result = run_two_queues(xtask, kernel, &dir, &meshlab).and_then(|()| {
        let b = dir.join("b.ndjson");
        let records = read_ndjson(&b)?;
        check_nic_irq_recording(&records)
            .and_then(|()| vm_two_queues::check_queues_share_a_cpu(&records))
            .and_then(|()| vm_irq_counts::check(&meshlab, &dir, "b"))
            .and_then(|()| vm_two_queues::check_every_request_on_an_rx_queue(&dir))
            .and_then(|()| {
                vm_two_machines::check_merged(&dir.join(vm_irq_counts::NIC_MERGED)).map(drop)
            })
    });
    finish(&dir, result, &what)
}

/// Both guests with a second NIC (vm_two_nics.rs), one vCPU each: A's first run goes to both
/// of B's addresses at once, no rounds. Both links are qemu's datagram sockets: no root needed.
fn two_nic_scenario(xtask: &Path, kernel: &str) -> Result<()> {
    let dir = target_dir().join(format!("vm/scenario-{kernel}-nics-{}", std::process::id()));
    let meshlab = target_dir().join("debug/meshlab");
    let result = run_two_nics(xtask, kernel, &dir, &meshlab).and_then(|()| {
        let records = read_ndjson(&dir.join("b.ndjson"))?;
        check_nic_irq_recording(&records)?;
        let run = vm_two_nics::check_nics_share_a_cpu(&records)?;
        vm_irq_counts::check(&meshlab, &dir, "b")
            .and_then(|()| vm_two_queues::check_every_request_on_an_rx_queue(&dir))
            .and_then(|()| vm_two_nics::check_requests_on_their_nic(&dir, &run))
            .and_then(|()| {
                vm_two_machines::check_merged(&dir.join(vm_irq_counts::NIC_MERGED)).map(drop)
            })
    });
    finish(
        &dir,
        result,
        &format!("kernel {kernel}: two NICs on one CPU"),
    )
}

fn run_two_nics(xtask: &Path, kernel: &str, dir: &Path, meshlab: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let traffic = (SERVER_ADDR, &vm_two_nics::TRAFFIC);
    let scripts = vm_two_machines::guest_scripts(meshlab, dir, traffic, false, None);
    run_cmd(
        Command::new(xtask)
            .args(["vm", "run", "--kernel", kernel, "--timeout", "300"])
            // One vCPU each: both NICs' vectors on the same CPU.
            .args(["--cpus", "1", "--nics", "2", "--rw"])
            .arg(dir)
            .args(["--a", &scripts.a, "--b", &scripts.b]),
    )
}

fn run_two_queues(xtask: &Path, kernel: &str, dir: &Path, meshlab: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let traffic = &vm_two_queues::TRAFFIC;
    let scripts = vm_two_machines::guest_scripts(meshlab, dir, (SERVER_ADDR, traffic), false, None);
    let queues = traffic.queues.to_string();
    run_cmd(
        Command::new(xtask)
            .args(["vm", "run", "--kernel", kernel, "--timeout", "300"])
            // One vCPU each: both queues' vectors on the same CPU.
            .args(["--cpus", "1", "--queues", &queues, "--rw"])
            .arg(dir)
            .args(["--a", &scripts.a, "--b", &scripts.b]),
    )
}

/// Removes a scenario's directory after `result`, unless it failed or MESHLAB_VM_KEEP is set:
/// the recordings, the merge and the rounds say what went wrong, and can be merged again by a
/// later build.
fn finish(dir: &Path, result: Result<()>, what: &str) -> Result<()> {
    if result.is_ok() && std::env::var_os("MESHLAB_VM_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
    result.with_context(|| format!("{what}, files in {}", dir.display()))
}

fn check_nic_irq_recording(records: &[serde_json::Value]) -> Result<()> {
    let startup = records.first().context("empty recording")?;
    let nic_irqs = check_startup(startup)?;
    let rx = check_rx_irqs(records, nic_irqs)?;
    let (completions, starts) = check_tx_completions(records)?;
    eprintln!(
        "vm scenario: {} RX events on eth0, {} with their NIC IRQ ({} taken during the softirq run, \
         {} with their own IRQ after the run's entry); {completions} of {starts} transmits \
         completed",
        rx.events, rx.with_irq, rx.irq_inside_run, rx.own_irq_in_run,
    );
    Ok(())
}

/// The startup record names eth0's NIC IRQs and device context and has tcp_sendmsg at the
/// fentry tier; returns the NIC IRQs.
fn check_startup(startup: &serde_json::Value) -> Result<&Vec<serde_json::Value>> {
    ensure!(startup["type"] == "startup", "first record is not startup");
    let nic_irqs = startup["nic_irqs"].as_array().context("nic_irqs")?;
    ensure!(
        nic_irqs.iter().any(|i| i["dev"] == "eth0"),
        "no NIC IRQ of eth0 found: {nic_irqs:?}"
    );
    check_device_context(startup)?;
    let plan = startup["attach_plan"].as_array().context("attach_plan")?;
    ensure!(
        plan.iter().any(|e| e["hook"] == "tcp_sendmsg"
            && e["tier"] == "fentry"
            && e["status"] == "attached"),
        "tcp_sendmsg not at the fentry tier"
    );
    Ok(nic_irqs)
}

/// Counts of [`check_rx_irqs`], for the scenario's summary line.
struct RxIrqCounts {
    events: usize,
    with_irq: usize,
    irq_inside_run: usize,
    own_irq_in_run: usize,
}

/// Most RX events on eth0 carry a NIC IRQ and its softirq run, both preceding the packet.
fn check_rx_irqs(
    records: &[serde_json::Value],
    nic_irqs: &[serde_json::Value],
) -> Result<RxIrqCounts> {
    let rx: Vec<_> = records
        .iter()
        .filter(|r| r["type"] == "kernel" && r["hook"] == "netif_receive_skb" && r["dev"] == "eth0")
        .collect();
    ensure!(rx.len() >= 10, "only {} RX events on eth0", rx.len());
    check_rx_queues(&rx, nic_irqs)?;
    let with_irq: Vec<_> = rx
        .iter()
        .filter(|r| r["irq"].is_u64() && r["irq_entry_ns"].is_u64())
        .collect();
    // Under load NAPI may poll several packets per IRQ, but an idle ping-pong takes one IRQ
    // per request: most RX events must carry one.
    ensure!(
        with_irq.len() * 2 >= rx.len(),
        "{} of {} RX events carry an IRQ",
        with_irq.len(),
        rx.len()
    );
    // The IRQ and the softirq run both precede the packet; usually the IRQ also precedes the
    // softirq run, but an IRQ taken while NAPI is already polling can be newer (counted). A
    // frame whose own IRQ came after the running softirq's entry carries that IRQ and no
    // entry (meshlab-ebpf rx.rs `netif_context`; counted). An IRQ taken while the program ran,
    // after its clock read, stays pending for the next frame (CI-65 saw one promoted before
    // the recorder checked that).
    let mut irq_inside_run = 0;
    let mut own_irq_in_run = 0;
    for r in &with_irq {
        let (irq_ns, ts) = (
            r["irq_entry_ns"].as_u64().unwrap(),
            r["ts_ns"].as_u64().unwrap(),
        );
        ensure!(irq_ns <= ts, "IRQ {irq_ns} must precede RX {ts}: {r}");
        match r["softirq_entry_ns"].as_u64() {
            Some(softirq) if softirq > ts => {
                bail!("softirq {softirq} must precede RX {ts}: {r}")
            }
            Some(softirq) => irq_inside_run += usize::from(irq_ns > softirq),
            None => own_irq_in_run += 1,
        }
        let irq = r["irq"].as_u64().unwrap();
        ensure!(
            nic_irqs.iter().any(|i| i["irq"] == irq),
            "IRQ {irq} is not a NIC IRQ"
        );
    }
    Ok(RxIrqCounts {
        events: rx.len(),
        with_irq: with_irq.len(),
        irq_inside_run,
        own_irq_in_run,
    })
}

/// Every RX frame on eth0 carries the RX queue virtio_net recorded for it
/// (`skb_record_rx_queue`; meshlab-ebpf rx.rs `rx_queue`), one that a vector of eth0 serves.
fn check_rx_queues(rx: &[&serde_json::Value], nic_irqs: &[serde_json::Value]) -> Result<()> {
    let served: Vec<u64> = nic_irqs
        .iter()
        .filter(|i| i["dev"] == "eth0")
        .filter_map(|i| i["queue"].as_u64())
        .collect();
    ensure!(
        !served.is_empty(),
        "no eth0 vector names its queue: {nic_irqs:?}"
    );
    for r in rx {
        let queue = r["queue"].as_u64();
        ensure!(
            queue.is_some_and(|q| served.contains(&q)),
            "RX event on eth0 without a queue of eth0's vectors {served:?}: {r}"
        );
    }
    Ok(())
}

/// TX completion: the driver frees each response skb after sending it; the event must follow
/// the start_xmit of the same skb and carry its byte range. Returns (completions, transmits).
fn check_tx_completions(records: &[serde_json::Value]) -> Result<(usize, usize)> {
    let kernel = |hook: &str| -> Vec<&serde_json::Value> {
        records
            .iter()
            .filter(|r| r["type"] == "kernel" && r["hook"] == hook)
            .collect()
    };
    let starts = kernel("net_dev_start_xmit");
    let completions = kernel("tx_complete");
    ensure!(
        completions.len() * 2 >= starts.len(),
        "{} TX completions for {} transmits",
        completions.len(),
        starts.len()
    );
    for done in &completions {
        let start = starts
            .iter()
            .rev()
            .find(|s| s["skb"] == done["skb"] && s["ts_ns"].as_u64() <= done["ts_ns"].as_u64())
            .with_context(|| format!("TX completion without a transmit of its skb: {done}"))?;
        ensure!(
            start["offset"] == done["offset"] && start["len"] == done["len"],
            "{start} vs {done}"
        );
    }
    Ok((completions.len(), starts.len()))
}

/// The guest's virtio NIC in the startup record's `devices`: driver, the ethtool netlink parts
/// virtio_net supports, and its vectors with roles (docs/schema.md, device context).
fn check_device_context(startup: &serde_json::Value) -> Result<()> {
    let devices = startup["devices"]
        .as_array()
        .context("startup has no devices")?;
    let eth0 = devices
        .iter()
        .find(|d| d["dev"] == "eth0")
        .with_context(|| format!("no device context of eth0: {devices:?}"))?;
    ensure!(eth0["driver"] == "virtio_net", "eth0 driver: {eth0}");
    ensure!(eth0["rings"]["rx"].as_u64() > Some(0), "eth0 rings: {eth0}");
    ensure!(
        eth0["channels"]["combined"].as_u64() >= Some(1),
        "eth0 channels: {eth0}"
    );
    ensure!(eth0["offloads"].is_object(), "eth0 offloads: {eth0}");
    let irqs = eth0["irqs"].as_array().context("eth0 irqs")?;
    for role in ["rx", "tx"] {
        ensure!(
            irqs.iter().any(|i| i["role"] == role && i["queue"] == 0),
            "no {role} vector of queue 0 on eth0: {irqs:?}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::check_rx_irqs;

    fn frame(ts: u64, irq_entry: u64) -> Value {
        json!({"type": "kernel", "hook": "netif_receive_skb", "dev": "eth0", "queue": 0,
               "irq": 25, "irq_entry_ns": irq_entry, "softirq_entry_ns": irq_entry + 1, "ts_ns": ts})
    }

    #[test]
    fn an_irq_after_its_frame_fails_the_check() {
        let nic_irqs = [json!({"irq": 25, "dev": "eth0", "queue": 0})];
        let mut records: Vec<Value> = (0..200).map(|i| frame(1000 * i + 500, 1000 * i)).collect();
        let counts = check_rx_irqs(&records, &nic_irqs).unwrap();
        assert_eq!(counts.with_irq, 200);
        records[7] = frame(7500, 7600);
        let err = check_rx_irqs(&records, &nic_irqs).err().unwrap();
        assert!(
            err.to_string().contains("IRQ 7600 must precede RX 7500"),
            "{err}"
        );
    }
}
