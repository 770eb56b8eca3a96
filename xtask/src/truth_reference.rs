//! The independent reference of `cargo xtask truth`: Debian's bpftrace running
//! `xtask/truth/reference.bt` on the client veth and socket during a run, timing the same
//! intervals of the same data-carrying packets meshlab records, for a side-by-side median.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::truth_lab::{Proc, median};
use crate::workspace_root;

/// The stages the script times, as it names its maps (and as meshlab names the segments).
pub const STAGES: [&str; 5] = [
    "tx_qdisc",
    "tx_driver",
    "rx_ip_tcp",
    "rx_tcp_deliver",
    "rx_sched_delay",
];

/// The script counts each interval in a map keyed by its length in steps of this many ns.
const STEP_NS: f64 = 10.0;

/// Stage -> median interval (ns) measured by bpftrace in one run.
pub type StageMedians = BTreeMap<&'static str, f64>;

/// One watched run: bpftrace's medians and meshlab's ("NODE segment" -> median ns).
pub type ReferenceRun = (StageMedians, BTreeMap<String, f64>);

pub struct Reference {
    proc: Proc,
    output: PathBuf,
}

impl Reference {
    /// Starts bpftrace on `device` and waits until its probes are attached.
    pub fn start(device: &str, dir: &Path) -> Result<Self> {
        let output = dir.join("reference.txt");
        let script = workspace_root().join("xtask/truth/reference.bt");
        let mut cmd = Command::new("bpftrace");
        // At most one map key per packet (a distinct 10 ns length), so 65536 holds a minute at
        // 1000 req/s; the default 4096 would drop lengths in a long run. A much larger limit
        // made bpftrace take over a minute to exit here.
        cmd.env("BPFTRACE_MAP_KEYS_MAX", "65536")
            .arg(&script)
            .arg(device)
            .stdout(std::fs::File::create(&output)?)
            .stderr(std::fs::File::create(dir.join("reference.log"))?);
        let proc = Proc::spawn("bpftrace (reference)", &mut cmd)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        // bpftrace prints "Attaching N probes..." once they are in place.
        while !std::fs::read_to_string(&output)?.contains("Attaching") {
            if Instant::now() > deadline {
                bail!(
                    "bpftrace did not attach within 60 s (see {})",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { proc, output })
    }

    /// Stops bpftrace; per stage the median of its intervals, in nanoseconds.
    pub fn finish(mut self) -> Result<StageMedians> {
        // Detaching and draining its buffers takes bpftrace seconds on a busy machine.
        self.proc.stop_within(Duration::from_secs(60))?;
        let text = std::fs::read_to_string(&self.output)?;
        let mut samples: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        for line in text.lines() {
            if let Some((stage, ns, count)) = parse_map_line(line) {
                // The bucket's middle: the script truncated the length to a STEP_NS multiple.
                let v = samples.entry(stage).or_default();
                v.extend(std::iter::repeat_n(ns + STEP_NS / 2.0, count));
            }
        }
        if samples.len() < STAGES.len() {
            bail!(
                "{}: bpftrace timed only {:?} of {STAGES:?}",
                self.output.display(),
                samples.keys().collect::<Vec<_>>()
            );
        }
        Ok(samples
            .into_iter()
            .map(|(stage, v)| (stage, median(v)))
            .collect())
    }
}

/// `@STAGE[STEPS]: COUNT`, as bpftrace prints a count map at exit: stage, ns, count.
fn parse_map_line(line: &str) -> Option<(&'static str, f64, usize)> {
    let (name, rest) = line.strip_prefix('@')?.split_once('[')?;
    let (steps, count) = rest.split_once("]: ")?;
    let stage = STAGES.iter().find(|s| **s == name)?;
    let steps: f64 = steps.parse().ok()?;
    Some((stage, steps * STEP_NS, count.trim().parse().ok()?))
}

/// The reference table: per stage, meshlab's and bpftrace's medians over the reference runs.
pub fn print_comparison(runs: &[ReferenceRun]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\nindependent reference (bpftrace, xtask/truth/reference.bt) on the same {} run(s), \
         client veth and socket, data packets, medians (us; meshlab: over the requests that \
         have the segment)",
        runs.len()
    );
    println!(
        "{:<15} {:>9} {:>9} {:>8}",
        "stage", "meshlab", "bpftrace", "diff"
    );
    for stage in STAGES {
        let meshlab = median(
            runs.iter()
                .filter_map(|(_, m)| m.get(&format!("A {stage}")).copied())
                .collect(),
        );
        let reference = median(
            runs.iter()
                .filter_map(|(r, _)| r.get(stage).copied())
                .collect(),
        );
        println!(
            "{stage:<15} {:>9.2} {:>9.2} {:>7.1}%",
            meshlab / 1e3,
            reference / 1e3,
            (meshlab / reference - 1.0) * 100.0
        );
    }
}
