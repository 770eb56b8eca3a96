//! Per-queue and per-CPU counts of the two-guest run checked against the kernel's own
//! counters: every NIC RX vector's `irq_entry` events in guest B's `--raw-irq` recording,
//! per CPU, against the /proc/interrupts delta of that vector, and NET_RX `softirq_entry`
//! events per CPU against the /proc/softirqs delta, over the same span (the two snapshots B
//! takes around the traffic, with their CLOCK_MONOTONIC times in `b.snapshots`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, ensure};

use crate::read_ndjson;

/// Largest relative difference between a recorded count and the kernel's counter.
const TOLERANCE: f64 = 0.01;
/// NET_RX in /proc/softirqs and in `softirq_entry`'s `value` (the kernel's softirq number).
const NET_RX: i64 = 3;

/// Reads `NODE.interrupts.0/.1`, `NODE.softirqs.0/.1`, `NODE.snapshots` and `NODE.ndjson` in
/// `dir` and compares.
pub fn check(dir: &Path, node: &str) -> Result<()> {
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
    let recording = Recording::read(&dir.join(format!("{node}.ndjson")), span)?;
    ensure!(
        !recording.nic_irqs.is_empty(),
        "{node}: no NIC IRQs in startup"
    );
    for (irq, queue) in &recording.nic_irqs {
        let kernel = irq_delta
            .get(&irq.to_string())
            .with_context(|| format!("IRQ {irq} not in /proc/interrupts"))?;
        let recorded = recording.irq_entries.get(irq).cloned().unwrap_or_default();
        compare(&format!("IRQ {irq} (queue {queue})"), &recorded, kernel)?;
    }
    let kernel = soft_delta
        .get("NET_RX")
        .context("no NET_RX in /proc/softirqs")?;
    compare("NET_RX softirq", &recording.net_rx_entries, kernel)
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

/// What the recording counted inside the span.
struct Recording {
    /// RX-capable NIC vectors of the startup record: irq -> queue.
    nic_irqs: BTreeMap<u64, String>,
    /// irq -> cpu -> `irq_entry` events.
    irq_entries: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// cpu -> NET_RX `softirq_entry` events.
    net_rx_entries: BTreeMap<u32, u64>,
}

impl Recording {
    fn read(path: &Path, (start, end): (u64, u64)) -> Result<Self> {
        let mut recording = Recording {
            nic_irqs: BTreeMap::new(),
            irq_entries: BTreeMap::new(),
            net_rx_entries: BTreeMap::new(),
        };
        for record in read_ndjson(path)? {
            if record["type"] == "startup" {
                for vector in record["nic_irqs"].as_array().into_iter().flatten() {
                    let irq = vector["irq"].as_u64().context("nic_irqs[].irq")?;
                    recording.nic_irqs.insert(irq, vector["queue"].to_string());
                }
            }
            let inside = record["ts_ns"]
                .as_u64()
                .is_some_and(|t| t >= start && t <= end);
            if record["type"] != "kernel" || !inside {
                continue;
            }
            let cpu = record["cpu"].as_u64().context("kernel event without cpu")? as u32;
            if record["hook"] == "irq_entry" {
                let irq = record["irq"].as_u64().context("irq_entry without irq")?;
                *recording
                    .irq_entries
                    .entry(irq)
                    .or_default()
                    .entry(cpu)
                    .or_default() += 1;
            } else if record["hook"] == "softirq_entry" && record["value"] == NET_RX {
                *recording.net_rx_entries.entry(cpu).or_default() += 1;
            }
        }
        Ok(recording)
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
    fn the_recording_counts_nic_irqs_and_net_rx_inside_the_span() {
        let dir = std::env::temp_dir().join(format!("vm-irq-counts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("b.ndjson");
        let lines = [
            r#"{"type":"startup","nic_irqs":[{"irq":25,"queue":0}]}"#,
            r#"{"type":"kernel","hook":"irq_entry","irq":25,"cpu":1,"ts_ns":10}"#,
            r#"{"type":"kernel","hook":"irq_entry","irq":25,"cpu":1,"ts_ns":11}"#,
            r#"{"type":"kernel","hook":"softirq_entry","value":3,"cpu":0,"ts_ns":12}"#,
            r#"{"type":"kernel","hook":"softirq_entry","value":1,"cpu":0,"ts_ns":12}"#,
            r#"{"type":"kernel","hook":"irq_entry","irq":25,"cpu":1,"ts_ns":99}"#,
        ];
        std::fs::write(&path, lines.join("\n")).expect("write");
        let recording = Recording::read(&path, (10, 20)).expect("read");
        std::fs::write(&path, "{}\nnot json\n").expect("write");
        let error = Recording::read(&path, (10, 20)).err().expect("bad line");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(recording.nic_irqs[&25], "0");
        assert_eq!(recording.irq_entries[&25], BTreeMap::from([(1, 2)]));
        assert_eq!(recording.net_rx_entries, BTreeMap::from([(0, 1)]));
        assert!(
            format!("{error:#}").contains("b.ndjson:2: not JSON"),
            "{error:#}"
        );
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
