//! meshlab's own cost during a recording: its BPF programs' run time (the kernel's BPF
//! run-time statistics, read with BPF_OBJ_GET_INFO_BY_FD on the recorder's own program fds)
//! and the recorder process's CPU time (getrusage), sampled at the start and end of the
//! recording (docs/schema.md, "self_cost").
//!
//! The programs are loaded by this recording with statistics already on (the switch is
//! checked before the first load), so their counters start at zero at load, like the HITS
//! counters: the end sample alone is the recording's figure, and no run between loading and
//! a start sample is lost.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use aya::Ebpf;
use aya::programs::ProgramFd;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

use meshlab_common::Hook;

use super::plan::{Family, HOOKS, HookSpec, TierSpec};
use crate::schema::{BpfStatsState, ProgramRuns, SelfCost};

/// The global switch; read only: `--bpf-stats` turns statistics on through BPF_ENABLE_STATS,
/// which leaves this file as it is.
const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

#[derive(Debug, thiserror::Error)]
pub enum SelfCostError {
    #[error("{program}: duplicating its program fd: {source}")]
    Fd {
        program: &'static str,
        source: std::io::Error,
    },
    #[error("{program}: bpf(BPF_OBJ_GET_INFO_BY_FD): {source}")]
    Info {
        program: &'static str,
        source: std::io::Error,
    },
    #[error("--bpf-stats: bpf(BPF_ENABLE_STATS) failed (needs CAP_SYS_ADMIN): {0}")]
    EnableStats(std::io::Error),
}

/// Whether the kernel counts BPF run time, and the fd keeping it on when `--bpf-stats` asked.
///
/// BPF_ENABLE_STATS counts statistics while its fd is open and stops when the fd is closed,
/// by the kernel, on any exit (error, signal, even SIGKILL): the sysctl is never written, so
/// there is nothing to restore and nothing that a crashed recorder could leave switched on.
pub struct StatsSwitch {
    enabled: Option<OwnedFd>,
    sysctl_at_start: bool,
}

impl StatsSwitch {
    pub fn new(turn_on: bool) -> Result<Self, SelfCostError> {
        let enabled = if turn_on {
            let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| SelfCostError::EnableStats(e.io_error))?;
            Some(fd)
        } else {
            None
        };
        let switch = Self {
            enabled,
            sysctl_at_start: sysctl_on(),
        };
        if !switch.counting() {
            log::warn!(
                "kernel.bpf_stats_enabled is 0: meshlab's own BPF run time is not measured in \
                 this recording (self_cost.bpf_stats = not_measured); `record --bpf-stats` \
                 turns statistics on for the recording only"
            );
        }
        Ok(switch)
    }

    fn counting(&self) -> bool {
        self.enabled.is_some() || self.sysctl_at_start
    }

    /// Measured when statistics were on all along: ours, or the sysctl at start and at end.
    fn state_at_end(&self) -> BpfStatsState {
        if self.enabled.is_some() || (self.sysctl_at_start && sysctl_on()) {
            BpfStatsState::Measured
        } else {
            BpfStatsState::NotMeasured
        }
    }
}

fn sysctl_on() -> bool {
    std::fs::read_to_string(STATS_SYSCTL).is_ok_and(|v| v.trim() != "0")
}

/// Cumulative (run_cnt, run_time_ns, recursion_misses) of one program.
#[derive(Clone, Copy, Debug)]
struct Counters {
    run_cnt: u64,
    run_time_ns: u64,
    recursion_misses: u64,
}

/// The recorder's attached programs, each with a duplicate of its fd: unloading at the end
/// closes aya's fd, ours keeps the program (and its final counters) readable until the
/// summary is written, with no capability (capabilities are dropped once everything is
/// attached; reading the info of an fd one holds needs none).
pub struct OwnPrograms {
    programs: Vec<(&'static TierSpec, ProgramFd)>,
    cpu_start: CpuTime,
    switch: StatsSwitch,
}

impl OwnPrograms {
    /// Starts the CPU window and keeps the programs' fds; call once every program is
    /// attached, before capabilities are dropped.
    pub fn start(
        ebpf: &Ebpf,
        attached: &[&'static TierSpec],
        switch: StatsSwitch,
    ) -> Result<Self, SelfCostError> {
        let mut programs = Vec::with_capacity(attached.len());
        for spec in attached {
            let Some(program) = ebpf.program(spec.program) else {
                continue;
            };
            let fd_err = |source| SelfCostError::Fd {
                program: spec.program,
                source,
            };
            let fd = program
                .fd()
                .map_err(|e| fd_err(std::io::Error::other(e)))?
                .try_clone()
                .map_err(fd_err)?;
            programs.push((*spec, fd));
        }
        Ok(Self {
            programs,
            cpu_start: CpuTime::now(),
            switch,
        })
    }

    /// The cost since [`Self::start`]; call after the programs are detached, so the counters
    /// are final.
    /// `hits` are the per-hook event counters (HITS), `events` the events written.
    pub fn finish(&self, events: u64, hits: &[u64]) -> Result<SelfCost, SelfCostError> {
        let cpu = CpuTime::now();
        let bpf_stats = self.switch.state_at_end();
        let mut programs = BTreeMap::new();
        let end = sample(&self.programs)?;
        let missed_runs = (self.programs.iter().zip(&end))
            .filter(|(_, c)| c.recursion_misses > 0)
            .map(|((spec, _), c)| (spec.program.to_owned(), c.recursion_misses))
            .collect();
        if bpf_stats == BpfStatsState::Measured {
            for ((spec, _), c) in self.programs.iter().zip(&end) {
                let hook = hook_of(spec);
                programs.insert(
                    spec.program.to_owned(),
                    ProgramRuns {
                        hook: hook.name.to_owned(),
                        run_cnt: c.run_cnt,
                        run_time_ns: c.run_time_ns,
                        events: events_of(hook, hits),
                    },
                );
            }
        }
        Ok(SelfCost {
            bpf_stats,
            programs,
            user_cpu_ns: cpu.user_ns.saturating_sub(self.cpu_start.user_ns),
            sys_cpu_ns: cpu.sys_ns.saturating_sub(self.cpu_start.sys_ns),
            events,
            missed_runs,
        })
    }
}

/// The attach-plan hook a tier belongs to (by program name: each names one tier; HOOKS is a
/// const, so its addresses are not stable enough to compare).
fn hook_of(spec: &TierSpec) -> &'static HookSpec {
    HOOKS
        .iter()
        .find(|h| h.tiers.iter().any(|t| t.program == spec.program))
        .expect("every attached tier is one of HOOKS")
}

/// Events a hook's program emitted: the hits of the event hook of the same name, or for
/// sock_ops its two events.
fn events_of(hook: &HookSpec, hits: &[u64]) -> u64 {
    Hook::ALL
        .iter()
        .filter(|h| match hook.family {
            Family::SockOps => matches!(h, Hook::SockEstablished | Hook::SockClosed),
            _ => h.name() == hook.name,
        })
        .map(|h| hits.get(*h as usize).copied().unwrap_or(0))
        .sum()
}

fn sample(programs: &[(&'static TierSpec, ProgramFd)]) -> Result<Vec<Counters>, SelfCostError> {
    programs
        .iter()
        .map(|(spec, fd)| {
            prog_counters(fd).map_err(|source| SelfCostError::Info {
                program: spec.program,
                source,
            })
        })
        .collect()
}

/// BPF_OBJ_GET_INFO_BY_FD on a program fd: the kernel's cumulative run count and time (0
/// without statistics) and its recursion misses (always counted).
fn prog_counters(fd: &ProgramFd) -> std::io::Result<Counters> {
    // SAFETY: a plain C struct for which all-zero is a valid value.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above (a union of plain C structs; zero also means "no flags" to the kernel).
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = fd.as_fd().as_raw_fd() as u32;
    attr.info.info_len = std::mem::size_of::<bpf_prog_info>() as u32;
    attr.info.info = std::ptr::from_mut(&mut info) as u64;
    // SAFETY: attr names a live fd and a writable buffer of info_len bytes; the kernel writes
    // at most that many.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            std::ptr::from_mut(&mut attr),
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Counters {
        run_cnt: info.run_cnt,
        run_time_ns: info.run_time_ns,
        recursion_misses: info.recursion_misses,
    })
}

/// The process's CPU time so far, all threads (getrusage RUSAGE_SELF).
#[derive(Clone, Copy, Debug, Default)]
struct CpuTime {
    user_ns: u64,
    sys_ns: u64,
}

impl CpuTime {
    fn now() -> Self {
        // SAFETY: an all-zero rusage is valid; getrusage only writes the struct we pass.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            usage
        };
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
        Self {
            user_ns: ns(usage.ru_utime),
            sys_ns: ns(usage.ru_stime),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_a_hook_are_its_event_hooks_hits() {
        let mut hits = vec![0u64; Hook::ALL.len()];
        hits[Hook::SockEstablished as usize] = 2;
        hits[Hook::SockClosed as usize] = 1;
        hits[Hook::TcpProbe as usize] = 7;
        let by_name = |name: &str| HOOKS.iter().find(|h| h.name == name).unwrap();
        assert_eq!(events_of(by_name("sock_ops"), &hits), 3);
        assert_eq!(events_of(by_name("tcp_probe"), &hits), 7);
        assert_eq!(events_of(by_name("sched_switch"), &hits), 0);
    }

    #[test]
    fn cpu_time_moves_forward_with_work() {
        let before = CpuTime::now();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
        let after = CpuTime::now();
        assert!(after.user_ns + after.sys_ns > before.user_ns + before.sys_ns);
    }

    #[test]
    fn every_tier_has_its_hook() {
        let mut programs: Vec<_> = HOOKS
            .iter()
            .flat_map(|h| h.tiers)
            .map(|t| t.program)
            .collect();
        let all = programs.len();
        programs.sort_unstable();
        programs.dedup();
        assert_eq!(programs.len(), all, "a program name serves two tiers");
        for hook in HOOKS {
            for tier in hook.tiers {
                assert_eq!(hook_of(tier).name, hook.name, "{}", tier.program);
            }
        }
    }
}
