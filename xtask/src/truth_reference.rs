//! The independent reference of `cargo xtask truth`: Debian's bpftrace running
//! `xtask/truth/reference.bt` on the client veth and socket during a run, timing the same
//! intervals of the same data-carrying packets meshlab records, for a side-by-side median.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::truth_lab::{Proc, median};
use crate::workspace_root;

/// A stage the script times: its map's (and meshlab's segment's) name and the tracepoints at
/// its ends (the points of the clock-read offsets and of the `progs` column; the `own BPF`
/// column is the report's, [`client_stage_own_ns`]).
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

/// The points whose clock reads the script keeps (`@at[ID, cpu, ns]`, ID = index + 1): its
/// tracepoint and meshlab's hook for it (meshlab's sched_switch: the switch-in, `value` 1).
const POINTS: [(&str, &str); 8] = [
    ("net_dev_queue", "net_dev_queue"),
    ("net_dev_start_xmit", "net_dev_start_xmit"),
    ("net_dev_xmit", "net_dev_xmit"),
    ("netif_receive_skb", "netif_receive_skb"),
    ("tcp_probe", "tcp_probe"),
    ("sk_data_ready", "sk_data_ready"),
    ("sched_waking", "sched_wakeup"),
    ("sched_switch", "sched_switch"),
];

/// Two clock reads of one event by the two tools are this close at most (the programs between
/// them take well under a microsecond; events of one point on one CPU are tens apart).
const MATCH_NS: u64 = 5_000;

/// One tool's clock read of one event: the point (index into [`POINTS`]), CPU and time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockRead {
    point: usize,
    cpu: u32,
    ns: u64,
}

/// What bpftrace measured in one run.
pub struct BpftraceRun {
    pub medians: StageMedians,
    pub reads: Vec<ClockRead>,
}

/// Point -> (median of bpftrace's clock read minus meshlab's for the same event, events
/// paired, bpftrace's reads of the point).
pub type ClockOffsets = BTreeMap<&'static str, (f64, usize, usize)>;

/// One watched run.
pub struct ReferenceRun {
    /// Run with the script's clock reads kept (`Reference::start`'s `stamps`).
    pub stamps: bool,
    pub bpftrace: StageMedians,
    /// How far apart the two tools read the clock at each point ([`clock_offsets`]).
    pub offsets: ClockOffsets,
    /// "NODE segment" -> median ns over the requests that have it.
    pub meshlab: BTreeMap<String, f64>,
    /// Stage -> meshlab's own BPF time in it on the client, as `meshlab report` estimates it
    /// ([`client_stage_own_ns`]).
    pub meshlab_stage_own_ns: BTreeMap<String, f64>,
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
    /// `stamps`: keep every clock read for [`clock_offsets`] (work inside the intervals: the
    /// comparison uses runs without).
    pub fn start(device: &str, stamps: bool, dir: &Path) -> Result<Self> {
        let output = dir.join("reference.txt");
        let script = workspace_root().join("xtask/truth/reference.bt");
        let mut cmd = Command::new("bpftrace");
        // At most one map key per packet (a distinct 10 ns length), so 65536 holds a minute at
        // 1000 req/s; the default 4096 would drop lengths in a long run. A much larger limit
        // made bpftrace take over a minute to exit here.
        cmd.env("BPFTRACE_MAP_KEYS_MAX", "65536")
            .arg(&script)
            .arg(device)
            .arg(if stamps { "1" } else { "0" })
            .stdout(std::fs::File::create(&output)?)
            .stderr(std::fs::File::create(dir.join("reference.log"))?);
        let proc = Proc::spawn("bpftrace (reference)", &mut cmd)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        // The script's first and last probe print once they fire (reference.bt): then every
        // probe is attached. ("Attaching N probes..." comes before the attaching: waiting for
        // it, bpftrace missed the first second of every run.)
        let attached =
            |text: &str| text.contains("attached: first") && text.contains("attached: last");
        while !attached(&std::fs::read_to_string(&output)?) {
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

    /// Stops bpftrace; per stage the median of its intervals, in nanoseconds, and its clock
    /// reads.
    pub fn finish(mut self) -> Result<BpftraceRun> {
        // Detaching and draining its buffers takes bpftrace seconds on a busy machine.
        self.proc.stop_within(Duration::from_secs(60))?;
        let text = std::fs::read_to_string(&self.output)?;
        let mut samples: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        let mut reads = Vec::new();
        for line in text.lines() {
            if let Some((stage, ns, count)) = parse_map_line(line) {
                // The bucket's middle: the script truncated the length to a STEP_NS multiple.
                let v = samples.entry(stage).or_default();
                v.extend(std::iter::repeat_n(ns + STEP_NS / 2.0, count));
            } else if let Some(read) = parse_read_line(line) {
                reads.push(read);
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
        Ok(BpftraceRun {
            medians: samples
                .into_iter()
                .map(|(stage, v)| (stage, median(v)))
                .collect(),
            reads,
        })
    }
}

/// `@at[POINT, CPU, NS]: COUNT`: one of the script's clock reads.
fn parse_read_line(line: &str) -> Option<ClockRead> {
    let rest = line.strip_prefix("@at[")?;
    let (key, _) = rest.split_once("]: ")?;
    let mut parts = key.split(", ").map(|p| p.trim().parse::<u64>().ok());
    let (point, cpu, ns) = (parts.next()??, parts.next()??, parts.next()??);
    let point = usize::try_from(point).ok()?.checked_sub(1)?;
    (point < POINTS.len()).then_some(ClockRead {
        point,
        cpu: u32::try_from(cpu).ok()?,
        ns,
    })
}

/// meshlab's clock reads of the same points, from the client recording exported as NDJSON
/// (`meshlab export`): every event of those hooks (sched_switch: the switch-ins).
pub fn meshlab_reads(export: &Path) -> Result<Vec<ClockRead>> {
    let text =
        std::fs::read_to_string(export).with_context(|| format!("reading {}", export.display()))?;
    let mut reads = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: not JSON: {line}", export.display()))?;
        let Some(hook) = v["hook"].as_str() else {
            continue;
        };
        let Some(point) = POINTS.iter().position(|(_, h)| *h == hook) else {
            continue;
        };
        if hook == "sched_switch" && v["value"].as_u64() != Some(1) {
            continue;
        }
        if let (Some(cpu), Some(ns)) = (v["cpu"].as_u64(), v["ts_ns"].as_u64()) {
            reads.push(ClockRead {
                point,
                cpu: cpu as u32,
                ns,
            });
        }
    }
    Ok(reads)
}

/// Pairs each bpftrace clock read with meshlab's nearest read of the same point on the same
/// CPU (within [`MATCH_NS`]): the same event seen by both tools. Per point, the median of
/// bpftrace's time minus meshlab's: where in the tracepoint's run of programs each tool read
/// the clock. A stage's two tools differ by its end point's offset minus its start point's.
pub fn clock_offsets(bpftrace: &[ClockRead], meshlab: &[ClockRead]) -> ClockOffsets {
    let mut by_point: BTreeMap<(usize, u32), Vec<u64>> = BTreeMap::new();
    for r in meshlab {
        by_point.entry((r.point, r.cpu)).or_default().push(r.ns);
    }
    by_point.values_mut().for_each(|v| v.sort_unstable());
    let mut deltas: BTreeMap<usize, (Vec<f64>, usize)> = BTreeMap::new();
    for r in bpftrace {
        let entry = deltas.entry(r.point).or_default();
        entry.1 += 1;
        let Some(times) = by_point.get(&(r.point, r.cpu)) else {
            continue;
        };
        let i = times.partition_point(|&t| t < r.ns);
        let nearest = [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|j| times.get(j))
            .min_by_key(|&&t| t.abs_diff(r.ns));
        if let Some(&t) = nearest.filter(|&&t| t.abs_diff(r.ns) <= MATCH_NS) {
            entry.0.push(r.ns as f64 - t as f64);
        }
    }
    deltas
        .into_iter()
        .map(|(point, (d, total))| (POINTS[point].0, (median(d.clone()), d.len(), total)))
        .collect()
}

/// `@STAGE[STEPS]: COUNT`, as bpftrace prints a count map at exit: stage, ns, count.
fn parse_map_line(line: &str) -> Option<(&'static str, f64, usize)> {
    let (name, rest) = line.strip_prefix('@')?.split_once('[')?;
    let (steps, count) = rest.split_once("]: ")?;
    let stage = STAGES.iter().find(|s| s.name == name)?;
    let steps: f64 = steps.parse().ok()?;
    Some((stage.name, steps * STEP_NS, count.trim().parse().ok()?))
}

/// The report's `own_cost.stages[].own_ns_est` of the client's node (A), by stage: the sum of
/// the mean run times of meshlab's programs at the stage's two ends (report/own_cost.rs
/// `STAGE_PROGRAMS`), over the whole recording; one definition for the report and this table.
pub fn client_stage_own_ns(report: &serde_json::Value) -> BTreeMap<String, f64> {
    let stages = report["own_cost"]["stages"]
        .as_array()
        .into_iter()
        .flatten();
    stages
        .filter(|s| s["node"] == "A")
        .filter_map(|s| Some((s["stage"].as_str()?.to_owned(), s["own_ns_est"].as_f64()?)))
        .collect()
}

/// A program name's prefix the kernel keeps (names are cut to 15 characters).
fn program_prefix(tracepoint: &str) -> &str {
    &tracepoint[..tracepoint.len().min(15)]
}

/// The reference table: per stage, meshlab's and bpftrace's medians over the reference runs,
/// and meshlab's own program run time at the stage's two ends: the report's estimate (mean
/// runs, which under-states an emitting run) of what can fall between the two tools' clock
/// reads, the tail of the first program and the head of the second.
pub fn print_comparison(all: &[ReferenceRun]) {
    let (stamped, runs): (Vec<&ReferenceRun>, Vec<&ReferenceRun>) =
        all.iter().partition(|r| r.stamps);
    if runs.is_empty() {
        return;
    }
    println!(
        "\nindependent reference (bpftrace, xtask/truth/reference.bt) on {} run(s) of its own, \
         client veth and socket, data packets, medians (us; meshlab: over the requests that \
         have the segment; own BPF: `meshlab report`'s own ns est of the stage on the client, \
         the mean run time of meshlab's programs at its two ends over the recording; progs: \
         BPF programs of any tool loaded for the stage's end tracepoint, machine-wide). Clock \
         reads, from {} more run(s) in which the script kept them: off from/to = bpftrace's \
         read minus meshlab's for the same event at the stage's start and end point (median \
         over the events both saw; paired: the share of bpftrace's reads paired); by offsets: \
         the diff those two alone make, (from - to) / bpftrace; diff there: that run's own diff",
        runs.len(),
        stamped.len()
    );
    println!(
        "{:<15} {:>9} {:>9} {:>8} {:>9} {:>6} {:>9} {:>9} {:>7} {:>11} {:>11}",
        "stage",
        "meshlab",
        "bpftrace",
        "diff",
        "own BPF",
        "progs",
        "off from",
        "off to",
        "paired",
        "by offsets",
        "diff there"
    );
    for stage in &STAGES {
        let over = |runs: &[&ReferenceRun], f: &dyn Fn(&ReferenceRun) -> Option<f64>| {
            median(runs.iter().filter_map(|r| f(r)).collect())
        };
        let meshlab = |r: &ReferenceRun| r.meshlab.get(&format!("A {}", stage.name)).copied();
        let reference = |r: &ReferenceRun| r.bpftrace.get(stage.name).copied();
        let diff =
            |runs: &[&ReferenceRun]| (over(runs, &meshlab) / over(runs, &reference) - 1.0) * 100.0;
        let own = over(&runs, &|r| r.meshlab_stage_own_ns.get(stage.name).copied());
        let programs = over(&runs, &|r| {
            let prefix = program_prefix(stage.to);
            Some(
                r.loaded_programs
                    .iter()
                    .filter(|n| n.starts_with(prefix))
                    .count() as f64,
            )
        });
        let offset = |point: &str| over(&stamped, &|r| r.offsets.get(point).map(|o| o.0));
        let paired = over(&stamped, &|r| {
            let share = |p: &str| r.offsets.get(p).map(|o| o.1 as f64 / o.2.max(1) as f64);
            Some(share(stage.from)?.min(share(stage.to)?))
        });
        let (from, to) = (offset(stage.from), offset(stage.to));
        println!(
            "{:<15} {:>9.2} {:>9.2} {:>7.1}% {:>9.2} {:>6.0} {:>9.2} {:>9.2} {:>6.0}% {:>10.1}% {:>10.1}%",
            stage.name,
            over(&runs, &meshlab) / 1e3,
            over(&runs, &reference) / 1e3,
            diff(&runs),
            own / 1e3,
            programs,
            from / 1e3,
            to / 1e3,
            paired * 100.0,
            (from - to) / over(&stamped, &reference) * 100.0,
            diff(&stamped)
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
    fn clock_read_lines_are_point_cpu_and_time() {
        assert_eq!(
            parse_read_line("@at[2, 1, 7000001234]: 1"),
            Some(ClockRead {
                point: 1,
                cpu: 1,
                ns: 7000001234
            })
        );
        // Points are 1-based and there are 8; interval maps are not clock reads.
        assert_eq!(parse_read_line("@at[0, 1, 5]: 1"), None);
        assert_eq!(parse_read_line("@at[9, 1, 5]: 1"), None);
        assert_eq!(parse_read_line("@tx_driver[264]: 7"), None);
    }

    #[test]
    fn offsets_pair_the_nearest_read_of_the_same_point_and_cpu() {
        let read = |point, cpu, ns| ClockRead { point, cpu, ns };
        let meshlab = [
            read(0, 0, 10_000),
            read(0, 0, 50_000),
            read(0, 1, 10_300),
            read(1, 0, 20_000),
        ];
        let bpftrace = [
            // 400 ns after meshlab's read of the same event on CPU 0 (not CPU 1's, 100 away).
            read(0, 0, 10_400),
            read(0, 0, 50_600),
            // Nothing of meshlab's within 5 us: not paired.
            read(0, 0, 90_000),
            read(1, 0, 19_900),
        ];
        let offsets = clock_offsets(&bpftrace, &meshlab);
        assert_eq!(offsets["net_dev_queue"], (600.0, 2, 3));
        assert_eq!(offsets["net_dev_start_xmit"], (-100.0, 1, 1));
    }

    #[test]
    fn the_own_cost_column_is_the_reports_estimate_on_the_client() {
        let report = serde_json::json!({"own_cost": {"stages": [
            {"stage": "tx_qdisc", "node": "A", "own_ns_est": 640.5},
            {"stage": "tx_qdisc", "node": "B", "own_ns_est": 999.0},
            {"stage": "rx_ip_tcp", "node": "A", "own_ns_est": 880.0},
        ]}});
        let own = client_stage_own_ns(&report);
        assert_eq!(own.len(), 2);
        assert_eq!(own["tx_qdisc"], 640.5);
        assert_eq!(own["rx_ip_tcp"], 880.0);
        assert!(client_stage_own_ns(&serde_json::json!({})).is_empty());
    }
}
