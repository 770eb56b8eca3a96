//! `cargo xtask vm check`: boots each kernel and proves what the runner promises.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};

use super::guest::{self, RunOutcome};
use super::image;
use super::kernel::KernelLabel;
use super::spec::{LINK_ADDRS, RunSpec};

const CLOCK_SAMPLES: usize = 5;

pub fn run(labels: &[KernelLabel]) -> Result<()> {
    for &label in labels {
        if let Err(why) = super::qemu::which_qemu().and_then(|_| image::prepared(label)) {
            if super::vm_required() {
                return Err(why.context("MESHLAB_REQUIRE_VM=1 and the VM runner is not ready"));
            }
            eprintln!("vm check: SKIP kernel {label} (set MESHLAB_REQUIRE_VM=1 to fail): {why:#}");
            continue;
        }
        check_kernel(label).with_context(|| format!("vm check on kernel {label}"))?;
    }
    Ok(())
}

fn spec(label: KernelLabel, commands: Vec<String>, rw_dirs: Vec<PathBuf>) -> Result<RunSpec> {
    Ok(RunSpec {
        label,
        boot: image::prepared(label)?,
        commands,
        cwd: PathBuf::from("/"),
        timeout: Duration::from_secs(120),
        memory_mib: 512,
        cpus: 1,
        rw_dirs,
        stream: false,
        wire: None,
        kernel_args: Vec::new(),
        queues: 1,
        nics: 1,
    })
}

fn check_kernel(label: KernelLabel) -> Result<()> {
    // One guest: the kernel we asked for, with BTF, and the eBPF filesystems mounted.
    let single = "uname -r; hostname; \
                  test -e /sys/kernel/btf/vmlinux && echo btf=present; \
                  grep -E ' (tracefs|debugfs|bpf|cgroup2) ' /proc/mounts | cut -d' ' -f3 | sort | tr '\\n' ' '";
    let spec_one = spec(label, vec![single.to_owned()], Vec::new())?;
    let one = guest::run_guests(&spec_one)?;
    let out = succeeded(&spec_one, &one)?.remove(0);
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines.first() == Some(&spec_one.boot.release.as_str()),
        "guest says release {:?}, expected {}",
        lines.first(),
        spec_one.boot.release
    );
    ensure!(
        lines.contains(&"btf=present"),
        "/sys/kernel/btf/vmlinux missing in the guest"
    );
    let mounts = lines.last().copied().unwrap_or_default();
    ensure!(
        mounts.trim() == "bpf cgroup2 debugfs tracefs",
        "guest mounts: {mounts:?}"
    );
    println!(
        "kernel {label}: release {} | BTF present | {mounts}| 1 guest boot+run {:.1} s, qemu peak RSS {} MiB",
        spec_one.boot.release,
        one.elapsed.as_secs_f64(),
        one.guests[0].peak_rss_kib >> 10
    );

    // Two guests: distinct hostnames, ping both ways over the private link, REALTIME skew.
    let clock_dir = crate::target_dir().join(format!("vm/check-clock-{}", std::process::id()));
    std::fs::create_dir_all(&clock_dir)?;
    let result = check_pair(label, &clock_dir);
    let _ = std::fs::remove_dir_all(&clock_dir);
    result
}

fn check_pair(label: KernelLabel, clock_dir: &Path) -> Result<()> {
    let command = |me: usize| {
        format!(
            "hostname; irqs() {{ awk '/virtio.*-input/ {{n += $2}} END {{print n + 0}}' /proc/interrupts; }}; \
             before=$(irqs); ping -c 3 -W 2 {peer} | tail -n 2; echo nic_rx_irqs=$(($(irqs) - before)); \
             for i in $(seq {CLOCK_SAMPLES}); do date +%s.%N > {dir}/$(hostname).$i; sleep 0.1; done",
            peer = LINK_ADDRS[1 - me],
            dir = clock_dir.display()
        )
    };
    let spec_two = spec(
        label,
        vec![command(0), command(1)],
        vec![clock_dir.to_path_buf()],
    )?;
    let two = guest::run_guests(&spec_two)?;
    let outputs = succeeded(&spec_two, &two)?;
    let hostnames: Vec<&str> = outputs.iter().filter_map(|o| o.lines().next()).collect();
    ensure!(
        hostnames == ["meshlab-a", "meshlab-b"],
        "hostnames {hostnames:?}"
    );
    for (name, out) in hostnames.iter().zip(&outputs) {
        ensure!(
            out.contains(" 0% packet loss"),
            "{name}: ping over the private link failed:\n{out}"
        );
    }
    let mut irqs = Vec::new();
    for (name, out) in hostnames.iter().zip(&outputs) {
        let count: u64 = (out.lines())
            .find_map(|l| l.strip_prefix("nic_rx_irqs="))
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("{name}: no nic_rx_irqs line in:\n{out}"))?;
        // Each echo reply arrives on the virtio-net RX queue: at least one IRQ per ping.
        ensure!(
            count >= 3,
            "{name}: only {count} virtio-net RX IRQs for 3 pings"
        );
        irqs.push(count);
    }
    let rtt = |out: &str| {
        out.lines()
            .find(|l| l.contains("min/avg/max"))
            .unwrap_or("?")
            .to_owned()
    };
    let offset_a = clock_offset(clock_dir, "meshlab-a")?;
    let offset_b = clock_offset(clock_dir, "meshlab-b")?;
    let peak: Vec<String> = two
        .guests
        .iter()
        .map(|g| format!("{} MiB", g.peak_rss_kib >> 10))
        .collect();
    println!(
        "kernel {label}: 2 guests boot+run {:.1} s, qemu peak RSS {} | ping A->B {} | B->A {} | \
         virtio-net RX IRQs during the pings: A {}, B {}",
        two.elapsed.as_secs_f64(),
        peak.join(" + "),
        rtt(&outputs[0]),
        rtt(&outputs[1]),
        irqs[0],
        irqs[1],
    );
    println!(
        "kernel {label}: CLOCK_REALTIME skew A-B = {:+.1} ms (A-host {:+.1} ms, B-host {:+.1} ms; \
         best of {CLOCK_SAMPLES} samples, each low by its 9p write latency)",
        (offset_a - offset_b) * 1e3,
        offset_a * 1e3,
        offset_b * 1e3
    );
    Ok(())
}

/// Each guest's stdout, or an error with its stderr when a command failed.
fn succeeded(spec: &RunSpec, outcome: &RunOutcome) -> Result<Vec<String>> {
    let code = guest::exit_code(spec, outcome)?;
    if code != 0 {
        let stderr: Vec<String> = (outcome.guests.iter())
            .map(|g| format!("{}: {}", g.name, String::from_utf8_lossy(&g.stderr)))
            .collect();
        bail!("check command exited with {code}:\n{}", stderr.join("\n"));
    }
    Ok(outcome
        .guests
        .iter()
        .map(|g| String::from_utf8_lossy(&g.stdout).into_owned())
        .collect())
}

/// Guest REALTIME minus host REALTIME, in seconds. The guest writes its clock into a file on a
/// host directory; the host kernel stamps the file's mtime when qemu writes it, a little later.
/// So guest - mtime underestimates the offset by that latency: the largest sample is the best.
fn clock_offset(dir: &Path, hostname: &str) -> Result<f64> {
    let mut best: Option<f64> = None;
    for i in 1..=CLOCK_SAMPLES {
        let path = dir.join(format!("{hostname}.{i}"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let guest: f64 = text.trim().parse().with_context(|| {
            format!(
                "{}: expected seconds.nanoseconds, got {text:?}",
                path.display()
            )
        })?;
        let host = std::fs::metadata(&path)?
            .modified()?
            .duration_since(UNIX_EPOCH)?
            .as_secs_f64();
        let offset = guest - host;
        best = Some(best.map_or(offset, |b: f64| b.max(offset)));
    }
    best.context("no clock samples")
}
