//! Per-queue and per-CPU counts of the two-guest run checked against the kernel's own
//! counters, as `meshlab report --nic` prints them: the two guests' recordings are merged, and
//! the report (JSON, its raw stream restricted with `--raw-window` to the span between the two
//! snapshots B takes around the traffic, their CLOCK_MONOTONIC times in `b.snapshots`) must
//! give, for every NIC RX vector of B's startup record, per CPU, the /proc/interrupts delta of
//! that vector, and per CPU the NET_RX delta of /proc/softirqs.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::workspace_root;

/// Largest relative difference between a recorded count and the kernel's counter.
const TOLERANCE: f64 = 0.01;

/// Reads `NODE.interrupts.0/.1`, `NODE.softirqs.0/.1` and `NODE.snapshots` in `dir`, merges
/// `a.capture` and `b.capture` there, and compares with what `report --nic` counted.
pub fn check(meshlab: &Path, dir: &Path, node: &str) -> Result<()> {
    let read = |name: String| -> Result<String> {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let span = snapshot_span(&read(format!("{node}.snapshots"))?)?;
    let rows = |name: String| per_cpu_rows(&read(name)?);
    let irq_delta = delta(
        &rows(format!("{node}.interrupts.0"))?,
        &rows(format!("{node}.interrupts.1"))?,
    );
    let soft_delta = delta(
        &rows(format!("{node}.softirqs.0"))?,
        &rows(format!("{node}.softirqs.1"))?,
    );
    let nic_irqs = startup_nic_irqs(&dir.join(format!("{node}.ndjson")))?;
    ensure!(!nic_irqs.is_empty(), "{node}: no NIC IRQs in startup");
    let report = nic_report(meshlab, dir, span)?;
    let counts = ReportCounts::read(&report, &node.to_uppercase())?;
    for irq in nic_irqs.keys() {
        let requests = counts.requests.get(irq).copied().unwrap_or(0);
        ensure!(
            requests > 0,
            "report --nic: no request has a stage on the queue of IRQ {irq}: RX stages lost their queue"
        );
    }
    for (irq, queue) in &nic_irqs {
        let kernel = irq_delta
            .get(&irq.to_string())
            .with_context(|| format!("IRQ {irq} not in /proc/interrupts"))?;
        let recorded = counts.irq_entries.get(irq).cloned().unwrap_or_default();
        compare(&format!("IRQ {irq} (queue {queue})"), &recorded, kernel)?;
    }
    let kernel = soft_delta
        .get("NET_RX")
        .context("no NET_RX in /proc/softirqs")?;
    compare("NET_RX softirq", &counts.net_rx_entries, kernel)
}

/// The merge [`check`] writes into a scenario's directory (both guests' captures), which the
/// scenario's other checks read instead of merging again.
pub const NIC_MERGED: &str = "nic.merged.ndjson";

/// `meshlab merge a.capture b.capture` and `meshlab report --nic --json --raw-window` of it
/// (the runbook's commands, docs/runbook-nic.md step 6).
fn nic_report(meshlab: &Path, dir: &Path, (start, end): (u64, u64)) -> Result<serde_json::Value> {
    let merged = dir.join(NIC_MERGED);
    crate::run_cmd(
        Command::new(meshlab)
            .arg("merge")
            .args([dir.join("a.capture"), dir.join("b.capture")])
            .arg("-o")
            .arg(&merged),
    )?;
    let out = Command::new(meshlab)
        .arg("report")
        .arg(&merged)
        .args(["--nic", "--json", "--raw-window", &format!("{start},{end}")])
        .current_dir(workspace_root())
        .output()
        .context("running meshlab report --nic")?;
    ensure!(
        out.status.success(),
        "meshlab report --nic failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("nic.report.json");
    std::fs::write(&path, &out.stdout)?;
    serde_json::from_slice(&out.stdout).with_context(|| format!("{}: not JSON", path.display()))
}

/// Per CPU: recorded vs the kernel's delta, within TOLERANCE of the delta (and enough of them
/// for a percentage to mean something).
fn compare(what: &str, recorded: &BTreeMap<u32, u64>, kernel: &[u64]) -> Result<()> {
    let total: u64 = kernel.iter().sum();
    ensure!(total >= 50, "{what}: only {total} in the kernel's counter");
    for (cpu, &expected) in kernel.iter().enumerate() {
        let got = recorded.get(&(cpu as u32)).copied().unwrap_or(0);
        let diff = got.abs_diff(expected) as f64;
        ensure!(
            diff <= TOLERANCE * expected.max(1) as f64,
            "{what} on CPU {cpu}: recorded {got}, the kernel counted {expected}"
        );
    }
    let got: u64 = recorded.values().sum();
    eprintln!("vm irq counts: {what}: recorded {got}, kernel counted {total}");
    Ok(())
}

/// `T0 T1` per snapshot: CLOCK_MONOTONIC just before and just after it was read. The span is
/// from the middle of the first to the middle of the second (no traffic flows then: B takes
/// them before its server starts and after it stopped).
fn snapshot_span(text: &str) -> Result<(u64, u64)> {
    let times: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("snapshot times: expected integers (ns)")?;
    ensure!(
        times.len() == 4,
        "snapshot times: expected 2 lines of 2, got {times:?}"
    );
    Ok((times[0].midpoint(times[1]), times[2].midpoint(times[3])))
}

/// `/proc/interrupts` or `/proc/softirqs`: row name (`25`, `NET_RX`) -> count per CPU; the
/// header line names the CPUs, rows have that many counts after `NAME:`.
pub fn per_cpu_rows(text: &str) -> Result<BTreeMap<String, Vec<u64>>> {
    let mut lines = text.lines();
    let cpus = lines
        .next()
        .context("empty snapshot")?
        .split_whitespace()
        .count();
    let mut rows = BTreeMap::new();
    for line in lines {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let counts: Vec<u64> = rest
            .split_whitespace()
            .take(cpus)
            .map_while(|word| word.parse().ok())
            .collect();
        if counts.len() == cpus {
            rows.insert(name.trim().to_owned(), counts);
        }
    }
    Ok(rows)
}

fn delta(
    before: &BTreeMap<String, Vec<u64>>,
    after: &BTreeMap<String, Vec<u64>>,
) -> BTreeMap<String, Vec<u64>> {
    (after.iter())
        .filter_map(|(name, counts)| {
            let old = before.get(name)?;
            let diff = counts.iter().zip(old).map(|(a, b)| a.saturating_sub(*b));
            Some((name.clone(), diff.collect()))
        })
        .collect()
}

/// The RX-capable NIC vectors of a recording's startup record: irq -> queue.
fn startup_nic_irqs(path: &Path) -> Result<BTreeMap<u64, String>> {
    let first =
        BufReader::new(File::open(path).with_context(|| format!("opening {}", path.display()))?)
            .lines()
            .next()
            .transpose()
            .with_context(|| format!("reading {}", path.display()))?;
    let startup: Option<serde_json::Value> = (first.as_deref())
        .map(serde_json::from_str)
        .transpose()
        .with_context(|| format!("{}:1: not JSON", path.display()))?;
    let startup = startup.filter(|r| r["type"] == "startup");
    let startup = startup.with_context(|| format!("{}: no startup record", path.display()))?;
    let mut irqs = BTreeMap::new();
    for vector in startup["nic_irqs"].as_array().into_iter().flatten() {
        let irq = vector["irq"].as_u64().context("nic_irqs[].irq")?;
        irqs.insert(irq, vector["queue"].to_string());
    }
    Ok(irqs)
}

/// One queue row of the report, for the log: its requests and stage and raw-stream medians.
fn print_queue(node: &str, q: &serde_json::Value) {
    let p50 = |v: &serde_json::Value| {
        v["p50_ns"]
            .as_u64()
            .map_or("-".into(), |ns| format!("{:.1}", ns as f64 / 1000.0))
    };
    let stages: Vec<String> = (q["stages"].as_array().into_iter().flatten())
        .map(|s| format!("{} {} us", s["stage"].as_str().unwrap_or("?"), p50(s)))
        .collect();
    let raw = &q["raw"];
    eprintln!(
        "vm irq counts: report --nic {node} {} {} queue {} irq {}: {} requests; p50: {}; raw: hard irq {} us, irq->softirq {} us, packets/poll {}, budget exhausted {}",
        q["dev"].as_str().unwrap_or("?"),
        q["dir"].as_str().unwrap_or("?"),
        q["queue"],
        q["irq"],
        q["requests"],
        stages.join(", "),
        p50(&raw["hard_irq_ns"]),
        p50(&raw["irq_to_softirq_ns"]),
        raw["packets_per_poll"]["p50"],
        raw["budget_exhausted"],
    );
}

/// What `report --nic` counted on one node inside the window.
struct ReportCounts {
    /// irq -> cpu -> hard IRQs (the RX queue rows' raw `hard_irqs_per_cpu`).
    irq_entries: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// cpu -> NET_RX softirq runs (the CPU rows' `net_rx_softirqs`).
    net_rx_entries: BTreeMap<u32, u64>,
    /// irq -> requests with a stage on the queue that vector serves.
    requests: BTreeMap<u64, u64>,
}

impl ReportCounts {
    fn read(report: &serde_json::Value, node: &str) -> Result<Self> {
        let nodes = report["nodes"].as_array().context("report: nodes")?;
        let n = (nodes.iter().find(|n| n["node"] == node))
            .with_context(|| format!("report: no node {node}"))?;
        let mut counts = ReportCounts {
            irq_entries: BTreeMap::new(),
            net_rx_entries: BTreeMap::new(),
            requests: BTreeMap::new(),
        };
        for queue in n["queues"].as_array().into_iter().flatten() {
            print_queue(node, queue);
            if let (Some(irq), Some(requests)) = (queue["irq"].as_u64(), queue["requests"].as_u64())
            {
                *counts.requests.entry(irq).or_default() += requests;
            }
            let raw = &queue["raw"];
            let (Some(irq), Some(per_cpu)) =
                (raw["irq"].as_u64(), raw["hard_irqs_per_cpu"].as_object())
            else {
                continue;
            };
            let entry = counts.irq_entries.entry(irq).or_default();
            for (cpu, count) in per_cpu {
                let cpu: u32 = cpu.parse().context("report: hard_irqs_per_cpu key")?;
                *entry.entry(cpu).or_default() += count.as_u64().context("report: count")?;
            }
        }
        for cpu in n["cpus"].as_array().into_iter().flatten() {
            let id = cpu["cpu"].as_u64().context("report: cpus[].cpu")? as u32;
            let runs = cpu["net_rx_softirqs"].as_u64().unwrap_or(0);
            counts.net_rx_entries.insert(id, runs);
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_rows_read_interrupts_and_softirqs() {
        let interrupts = "           CPU0       CPU1\n\
              25:         43          7   PCI-MSI 81921-edge      virtio3-input.0\n\
             LOC:       6019       6000   Local timer interrupts\n\
             ERR:          0\n";
        let rows = per_cpu_rows(interrupts).expect("parsed");
        assert_eq!(rows["25"], [43, 7]);
        assert_eq!(rows["LOC"], [6019, 6000]);
        // ERR has one count for the whole machine, not one per CPU.
        assert!(!rows.contains_key("ERR"));
        let softirqs = "                    CPU0       CPU1\n          HI:          1          0\n      NET_RX:         98        12\n";
        let before = per_cpu_rows(softirqs).expect("parsed");
        let after = per_cpu_rows(&softirqs.replace("98", "369")).expect("parsed");
        assert_eq!(delta(&before, &after)["NET_RX"], [271, 0]);
    }

    #[test]
    fn the_span_runs_between_the_middles_of_the_snapshots() {
        assert_eq!(snapshot_span("10 20\n100 110\n").expect("span"), (15, 105));
        let error = snapshot_span("10 20\n").expect_err("one snapshot");
        assert!(
            error.to_string().contains("expected 2 lines of 2"),
            "{error}"
        );
    }

    #[test]
    fn the_report_counts_are_read_per_vector_and_cpu() {
        let report = serde_json::json!({"nodes": [{"node": "B",
            "queues": [
                {"dir": "rx", "queue": 0, "irq": 25, "requests": 3,
                 "raw": {"irq": 25, "hard_irqs_per_cpu": {"1": 2}}},
                {"dir": "tx", "queue": 0}
            ],
            "cpus": [{"cpu": 0, "net_rx_softirqs": 1}, {"cpu": 1}]}]});
        let counts = ReportCounts::read(&report, "B").expect("read");
        assert_eq!(counts.irq_entries[&25], BTreeMap::from([(1, 2)]));
        assert_eq!(counts.net_rx_entries, BTreeMap::from([(0, 1), (1, 0)]));
        assert_eq!(counts.requests, BTreeMap::from([(25, 3)]));
        assert!(ReportCounts::read(&report, "A").is_err(), "no node A");
    }

    #[test]
    fn counts_must_agree_within_one_percent_per_cpu() {
        let recorded = BTreeMap::from([(0, 199), (1, 0)]);
        compare("IRQ 25", &recorded, &[200, 0]).expect("0.5 % off");
        let error = compare("IRQ 25", &recorded, &[210, 0]).expect_err("5 % off");
        assert!(
            error
                .to_string()
                .contains("recorded 199, the kernel counted 210"),
            "{error}"
        );
    }
}
