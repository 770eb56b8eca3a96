//! The independent reference of `cargo xtask truth`: Debian's bpftrace running
//! `xtask/truth/reference.bt` on the client veth and socket during a run, timing the same
//! intervals of the same data-carrying packets meshlab records, for a side-by-side median.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::bpfstats::ProgramCost;
use crate::truth_lab::{Proc, median};
use crate::workspace_root;

/// A stage the script times: its map's (and meshlab's segment's) name and the tracepoints at
/// its ends, whose meshlab programs run inside the interval.
pub struct Stage {
    pub name: &'static str,
    from: &'static str,
    to: &'static str,
}

const fn stage(name: &'static str, from: &'static str, to: &'static str) -> Stage {
    Stage { name, from, to }
}

pub const STAGES: [Stage; 5] = [
    stage("tx_qdisc", "net_dev_queue", "net_dev_start_xmit"),
    stage("tx_driver", "net_dev_start_xmit", "net_dev_xmit"),
    stage("rx_ip_tcp", "netif_receive_skb", "tcp_probe"),
    stage("rx_tcp_deliver", "tcp_probe", "sk_data_ready"),
    stage("rx_sched_delay", "sched_waking", "sched_switch"),
];

/// The script counts each interval in a map keyed by its length in steps of this many ns.
const STEP_NS: f64 = 10.0;

/// Stage -> median interval (ns) measured by bpftrace in one run.
pub type StageMedians = BTreeMap<&'static str, f64>;

/// One watched run.
pub struct ReferenceRun {
    pub bpftrace: StageMedians,
    /// "NODE segment" -> median ns over the requests that have it.
    pub meshlab: BTreeMap<String, f64>,
    /// The client's recorder's programs during the run (kernel BPF statistics).
    pub meshlab_programs: Vec<ProgramCost>,
    /// Names of all BPF programs loaded on the machine during the run: other tracers'
    /// programs on a stage's tracepoints run between the two tools' clock reads too.
    pub loaded_programs: Vec<String>,
}

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
                "{}: bpftrace timed only {:?} of the {} stages",
                self.output.display(),
                samples.keys().collect::<Vec<_>>(),
                STAGES.len()
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
    let stage = STAGES.iter().find(|s| s.name == name)?;
    let steps: f64 = steps.parse().ok()?;
    Some((stage.name, steps * STEP_NS, count.trim().parse().ok()?))
}

/// Mean run time of the client recorder's program on `tracepoint` (kernel names are cut to
/// 15 characters; the program is `TRACEPOINT_btf` or `TRACEPOINT_raw`, whichever attached).
fn program_ns_per_run(programs: &[ProgramCost], tracepoint: &str) -> f64 {
    let prefix = program_prefix(tracepoint);
    programs
        .iter()
        .filter(|p| p.runs > 0 && p.name.starts_with(prefix))
        .map(|p| p.ns_per_run)
        .sum()
}

fn program_prefix(tracepoint: &str) -> &str {
    &tracepoint[..tracepoint.len().min(15)]
}

/// The reference table: per stage, meshlab's and bpftrace's medians over the reference runs,
/// and meshlab's own program run time at the stage's two ends (an upper bound of the tracer's
/// time inside the interval: the tail of the first program and the head of the second).
pub fn print_comparison(runs: &[ReferenceRun]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\nindependent reference (bpftrace, xtask/truth/reference.bt) on the same {} run(s), \
         client veth and socket, data packets, medians (us; meshlab: over the requests that \
         have the segment; own BPF: mean run time of meshlab's programs at both ends; progs: \
         BPF programs of any tool loaded for the stage's end tracepoint, machine-wide)",
        runs.len()
    );
    println!(
        "{:<15} {:>9} {:>9} {:>8} {:>9} {:>6}",
        "stage", "meshlab", "bpftrace", "diff", "own BPF", "progs"
    );
    for stage in &STAGES {
        let over_runs =
            |f: &dyn Fn(&ReferenceRun) -> Option<f64>| median(runs.iter().filter_map(f).collect());
        let meshlab = over_runs(&|r| r.meshlab.get(&format!("A {}", stage.name)).copied());
        let reference = over_runs(&|r| r.bpftrace.get(stage.name).copied());
        let own = over_runs(&|r| {
            Some(
                program_ns_per_run(&r.meshlab_programs, stage.from)
                    + program_ns_per_run(&r.meshlab_programs, stage.to),
            )
        });
        let programs = over_runs(&|r| {
            let prefix = program_prefix(stage.to);
            Some(
                r.loaded_programs
                    .iter()
                    .filter(|n| n.starts_with(prefix))
                    .count() as f64,
            )
        });
        println!(
            "{:<15} {:>9.2} {:>9.2} {:>7.1}% {:>9.2} {:>6.0}",
            stage.name,
            meshlab / 1e3,
            reference / 1e3,
            (meshlab / reference - 1.0) * 100.0,
            own / 1e3,
            programs
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_lines_are_read_as_stage_length_and_count() {
        assert_eq!(
            parse_map_line("@tx_driver[264]: 7"),
            Some(("tx_driver", 2640.0, 7))
        );
        assert_eq!(
            parse_map_line("@rx_sched_delay[3106]: 1"),
            Some(("rx_sched_delay", 31060.0, 1))
        );
        // Internal maps, bpftrace's banner and unknown stages are not samples.
        assert_eq!(parse_map_line("@q[18446612686941882592]: 1"), None);
        assert_eq!(parse_map_line("Attaching 10 probes..."), None);
        assert_eq!(parse_map_line("@tx_driver[x]: 7"), None);
    }

    #[test]
    fn a_stage_costs_the_programs_at_both_its_ends() {
        let cost = |name: &str, ns_per_run: f64| ProgramCost {
            name: name.to_owned(),
            runs: 10,
            ns_per_run,
            bytes_xlated: 0,
            bytes_jited: 0,
        };
        // Kernel program names are cut to 15 characters.
        let programs = [
            cost("net_dev_start_x", 300.0),
            cost("net_dev_xmit_bt", 200.0),
            cost("net_dev_queue_b", 100.0),
        ];
        assert_eq!(program_ns_per_run(&programs, "net_dev_start_xmit"), 300.0);
        assert_eq!(program_ns_per_run(&programs, "net_dev_xmit"), 200.0);
        assert_eq!(program_ns_per_run(&programs, "sched_switch"), 0.0);
    }
}
