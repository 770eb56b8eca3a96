//! The independent reference of `cargo xtask truth`: Debian's bpftrace running
//! `xtask/truth/reference.bt` on the client veth during a run, timing tx_qdisc and tx_driver
//! of the same data-carrying packets meshlab records, for a side-by-side median.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::truth_lab::{Proc, median};
use crate::workspace_root;

/// The stages the script times, as it prints them (and as meshlab names them).
pub const STAGES: [&str; 2] = ["tx_qdisc", "tx_driver"];

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
        cmd.arg(&script)
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
            let Some((stage, ns)) = line.split_once(' ') else {
                continue;
            };
            if let (Some(stage), Ok(ns)) = (STAGES.iter().find(|s| **s == stage), ns.parse()) {
                samples.entry(stage).or_default().push(ns);
            }
        }
        if samples.len() < STAGES.len() {
            bail!("{}: bpftrace timed no data packet", self.output.display());
        }
        Ok(samples
            .into_iter()
            .map(|(stage, v)| (stage, median(v)))
            .collect())
    }
}

/// The reference table: per stage, meshlab's and bpftrace's medians over the reference runs.
pub fn print_comparison(runs: &[ReferenceRun]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\nindependent reference (bpftrace, xtask/truth/reference.bt) on the same {} run(s), \
         client veth, data packets, medians (us)",
        runs.len()
    );
    println!(
        "{:<10} {:>9} {:>9} {:>8}",
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
            "{stage:<10} {:>9.2} {:>9.2} {:>7.1}%",
            meshlab / 1e3,
            reference / 1e3,
            (meshlab / reference - 1.0) * 100.0
        );
    }
}
