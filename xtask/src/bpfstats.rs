//! The kernel's BPF run-time statistics of one recorder's programs (`kernel.bpf_stats_enabled`,
//! read through `bpftool prog show --json`).
//!
//! The switch is global: it is turned on for the measurement and set back to what it was,
//! also when the bench fails. Programs are picked by the ids the recorder's process holds
//! (`prog_id` in /proc/PID/fdinfo; Debian's bpftool does not list pids), so other recorders
//! on the machine do not mix in.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cleanup::{Registered, register};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Turns BPF run-time statistics on and restores the previous setting on drop (or when xtask
/// is killed).
pub struct StatsEnabled {
    previous: String,
    _cleanup: Registered,
}

impl StatsEnabled {
    pub fn on() -> Result<StatsEnabled> {
        let previous = std::fs::read_to_string(STATS_SYSCTL)
            .with_context(|| format!("reading {STATS_SYSCTL}"))?;
        let previous = previous.trim().to_owned();
        // Registered before the write: a signal in between restores a value that was not
        // changed, which is harmless; one after it must not leave the switch on.
        let cleanup = {
            let previous = previous.clone();
            register(format!("kernel.bpf_stats_enabled={previous}"), move |_| {
                let _ = std::fs::write(STATS_SYSCTL, &previous);
            })
        };
        std::fs::write(STATS_SYSCTL, "1")
            .with_context(|| format!("writing 1 to {STATS_SYSCTL}"))?;
        Ok(StatsEnabled {
            previous,
            _cleanup: cleanup,
        })
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        let _ = std::fs::write(STATS_SYSCTL, &self.previous);
    }
}

/// Cumulative counters of one program.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgramCounters {
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub bytes_xlated: u64,
    pub bytes_jited: u64,
}

/// Program name -> counters, for the programs process `pid` holds.
pub type Snapshot = BTreeMap<String, ProgramCounters>;

/// Every BPF program loaded on the machine, as `bpftool prog show --json` lists them.
fn loaded_programs() -> Result<serde_json::Value> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .context("running bpftool (cargo xtask setup installs it)")?;
    if !out.status.success() {
        bail!("bpftool prog show failed: {}", out.status);
    }
    serde_json::from_slice(&out.stdout).context("bpftool prog show --json output")
}

/// The names of every BPF program loaded on the machine (by any process).
pub fn loaded_program_names() -> Result<Vec<String>> {
    let programs = loaded_programs()?;
    Ok(programs
        .as_array()
        .context("bpftool: expected a JSON array")?
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect())
}

pub fn snapshot(pid: u32) -> Result<Snapshot> {
    let programs = loaded_programs()?;
    let held = program_ids_held_by(pid)?;
    let mut snap = Snapshot::new();
    for prog in programs
        .as_array()
        .context("bpftool: expected a JSON array")?
    {
        let held_by_pid = prog["id"].as_u64().is_some_and(|id| held.contains(&id));
        let Some(name) = prog["name"].as_str().filter(|_| held_by_pid) else {
            continue;
        };
        let field = |k: &str| prog[k].as_u64().unwrap_or(0);
        snap.insert(
            name.to_owned(),
            ProgramCounters {
                run_time_ns: field("run_time_ns"),
                run_cnt: field("run_cnt"),
                bytes_xlated: field("bytes_xlated"),
                bytes_jited: field("bytes_jited"),
            },
        );
    }
    Ok(snap)
}

/// Id and name of every BPF program process `pid` holds.
pub fn programs_held_by(pid: u32) -> Result<Vec<(u64, String)>> {
    let held = program_ids_held_by(pid)?;
    Ok(loaded_programs()?
        .as_array()
        .context("bpftool: expected a JSON array")?
        .iter()
        .filter_map(|p| {
            let id = p["id"].as_u64().filter(|id| held.contains(id))?;
            Some((id, p["name"].as_str()?.to_owned()))
        })
        .collect())
}

/// BPF program ids of the file descriptors process `pid` holds.
fn program_ids_held_by(pid: u32) -> Result<Vec<u64>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        // An fd closed meanwhile is simply not counted.
        let Ok(info) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        ids.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse::<u64>().ok()),
        );
    }
    Ok(ids)
}

/// Per program: runs and nanoseconds per run between two snapshots, with its code size.
#[derive(Clone, Debug)]
pub struct ProgramCost {
    pub name: String,
    pub runs: u64,
    pub ns_per_run: f64,
    pub bytes_xlated: u64,
    pub bytes_jited: u64,
}

pub fn delta(before: &Snapshot, after: &Snapshot) -> Vec<ProgramCost> {
    after
        .iter()
        .map(|(name, a)| {
            let b = before.get(name).copied().unwrap_or_default();
            let runs = a.run_cnt.saturating_sub(b.run_cnt);
            let ns = a.run_time_ns.saturating_sub(b.run_time_ns);
            ProgramCost {
                name: name.clone(),
                runs,
                ns_per_run: if runs == 0 {
                    0.0
                } else {
                    ns as f64 / runs as f64
                },
                bytes_xlated: a.bytes_xlated,
                bytes_jited: a.bytes_jited,
            }
        })
        .collect()
}

/// Per-program costs of the recorder `pid` over `workload`, with those of the programs this
/// process holds (the empty floor program of crate::bpffloor, read through our own pid).
pub fn costs_over<T>(pid: u32, workload: impl FnOnce() -> Result<T>) -> Result<Vec<ProgramCost>> {
    let me = std::process::id();
    let (before, floor_before) = (snapshot(pid)?, snapshot(me)?);
    workload()?;
    let mut costs = delta(&before, &snapshot(pid)?);
    costs.extend(delta(&floor_before, &snapshot(me)?));
    Ok(costs)
}
