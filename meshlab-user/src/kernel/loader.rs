//! Loading the embedded eBPF object and attaching its programs tier by tier.

use std::fs::File;
use std::path::Path;

use aya::programs::fentry::FEntryLinkId;
use aya::programs::fexit::FExitLinkId;
use aya::programs::kprobe::KProbeLinkId;
use aya::programs::raw_trace_point::RawTracePointLinkId;
use aya::programs::sock_ops::SockOpsLinkId;
use aya::programs::tp_btf::BtfTracePointLinkId;
use aya::programs::trace_point::TracePointLinkId;
use aya::programs::{
    BtfTracePoint, CgroupAttachMode, FEntry, FExit, KProbe, Program, ProgramError, RawTracePoint,
    SockOps, TracePoint,
};
use aya::{Btf, Ebpf, EbpfLoader};
use meshlab_common::{Config, EVENT_RINGS, KernelOffsets, names};

use super::kfunc::{KfuncIds, patch_object};
use super::plan::{HookSpec, Tier, TierSpec};
use crate::schema::{AttachEntry, AttachStatus};

/// The kernel programs, built from meshlab-ebpf by build.rs and embedded in the binary.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/meshlab-ebpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("reading kernel BTF for the loader failed: {0}")]
    Btf(#[from] aya::BtfError),
    #[error(transparent)]
    Kfunc(#[from] super::kfunc::KfuncError),
}

/// Loads the object, its kfunc calls resolved for this kernel, with its read-only globals and
/// ring buffer size; no program is loaded into the kernel yet (that happens per tier in
/// [`attach_hook`]). `kernel_log_level` is [`super::diag::level`]: with 0 the programs' log
/// calls are removed by the verifier and their ring, which nothing reads then, is shrunk to one
/// page.
pub fn load_object(
    config: &Config,
    offsets: &KernelOffsets,
    ring_bytes: u32,
    kernel_log_level: u8,
    kfuncs: &KfuncIds,
) -> Result<Ebpf, LoadError> {
    let object = patch_object(EBPF_OBJECT, kfuncs)?;
    let mut loader = EbpfLoader::new();
    loader
        .override_global(names::GLOBAL_CONFIG, config, true)
        .override_global(names::GLOBAL_OFFSETS, offsets, true)
        .override_global(names::GLOBAL_KERNEL_LOG_LEVEL, &kernel_log_level, true);
    let used = event_rings_used();
    for (ring, name) in names::MAP_EVENTS.iter().enumerate() {
        // A ring no CPU writes still has to exist (the programs name it): one page.
        let bytes = if used.contains(&ring) {
            ring_bytes
        } else {
            page_size()
        };
        loader.map_max_entries(name, bytes);
    }
    if kernel_log_level == 0 {
        loader.map_max_entries(names::MAP_KERNEL_LOG, page_size());
    }
    Ok(loader.load(object.bytes())?)
}

/// The event rings some possible CPU writes, in ring order: each gets `--ring-bytes` and is
/// drained by the reader. CPU ids run 0..nr_cpus (aya's count of
/// /sys/devices/system/cpu/possible, as for per-CPU maps), and CPU `c < EVENT_RINGS` writes
/// ring `c` (`event_ring_of_cpu`), so the rings used are the first min(CPUs, EVENT_RINGS);
/// without a count, all rings.
pub fn event_rings_used() -> Vec<usize> {
    let cpus = aya::util::nr_cpus().map_or(EVENT_RINGS as usize, |n| n.max(1));
    (0..cpus.min(EVENT_RINGS as usize)).collect()
}

/// The smallest ring buffer the kernel accepts.
fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}

/// The kernel's BTF as aya needs it for fentry and tp_btf (its own parser: aya's program
/// loading API takes this type; btf_offsets.rs uses btf-rs for field offsets, which aya's
/// public API does not expose).
pub fn kernel_btf() -> Result<Btf, LoadError> {
    Ok(Btf::from_sys_fs()?)
}

/// What [`attach_hook`] did: the attach-plan entries of every tier, and the tier that stays
/// attached with its link (none with `try_all`, or when no tier attached).
pub struct HookAttach {
    pub entries: Vec<AttachEntry>,
    pub chosen: Option<(&'static TierSpec, TierLink)>,
}

/// Attaches `hook`: tiers are tried fastest first. With `try_all` (doctor) every tier is
/// tried and detached again; otherwise the first that attaches stays and the rest are skipped.
pub fn attach_hook(
    ebpf: &mut Ebpf,
    btf: &Btf,
    hook: &HookSpec,
    cgroup: Option<&File>,
    try_all: bool,
) -> HookAttach {
    let mut entries = Vec::with_capacity(hook.tiers.len());
    let mut chosen = None;
    let mut attached = false;
    for spec in hook.tiers {
        if attached && !try_all {
            entries.push(entry(hook.name, spec.tier, AttachStatus::Skipped, None));
            continue;
        }
        match attach_tier(ebpf, btf, spec, cgroup) {
            Ok(link) => {
                attached = true;
                entries.push(entry(hook.name, spec.tier, AttachStatus::Attached, None));
                if try_all {
                    let _ = detach_tier(ebpf, spec);
                } else {
                    chosen = Some((spec, link));
                }
            }
            Err(e) => {
                let _ = detach_tier(ebpf, spec);
                entries.push(entry(hook.name, spec.tier, AttachStatus::Failed, Some(e)));
            }
        }
    }
    HookAttach { entries, chosen }
}

fn entry(hook: &str, tier: Tier, status: AttachStatus, error: Option<String>) -> AttachEntry {
    AttachEntry {
        hook: hook.to_owned(),
        tier,
        status,
        error,
    }
}

/// One link of a loaded program, by program type: [`detach_link`] removes just it and keeps
/// the program loaded, so `record --attach on-demand` can attach it again without loading
/// (and verifying) it again.
#[derive(Debug)]
pub enum TierLink {
    Fentry(FEntryLinkId),
    Fexit(FExitLinkId),
    Kprobe(KProbeLinkId),
    TpBtf(BtfTracePointLinkId),
    RawTp(RawTracePointLinkId),
    Tracepoint(TracePointLinkId),
    SockOps(SockOpsLinkId),
}

/// Loads and attaches one program. The error is the kernel's reason, with the verifier log's
/// tail when the verifier refused the program.
pub fn attach_tier(
    ebpf: &mut Ebpf,
    btf: &Btf,
    spec: &TierSpec,
    cgroup: Option<&File>,
) -> Result<TierLink, String> {
    require_program(ebpf, spec)?;
    load_tier(ebpf, btf, spec).map_err(describe_program_error)?;
    attach_loaded(ebpf, spec, cgroup)
}

/// A program missing from the embedded object is a build mismatch: said by name here, since
/// aya has no error of its own for it.
fn require_program(ebpf: &Ebpf, spec: &TierSpec) -> Result<(), String> {
    match ebpf.program(spec.program) {
        Some(_) => Ok(()),
        None => Err(format!(
            "program {} missing from the embedded object",
            spec.program
        )),
    }
}

/// The tier's program; callers checked [`require_program`] (or got a loaded one from it).
fn program<'a>(ebpf: &'a mut Ebpf, spec: &TierSpec) -> Result<&'a mut Program, ProgramError> {
    ebpf.program_mut(spec.program)
        .ok_or(ProgramError::UnexpectedProgramType)
}

/// Loads (verifies) one tier's program without attaching it.
fn load_tier(ebpf: &mut Ebpf, btf: &Btf, spec: &TierSpec) -> Result<(), ProgramError> {
    let program = program(ebpf, spec)?;
    match spec.tier {
        Tier::Fentry => <&mut FEntry>::try_from(program)?.load(spec.target, btf),
        Tier::Fexit => <&mut FExit>::try_from(program)?.load(spec.target, btf),
        Tier::Kprobe => <&mut KProbe>::try_from(program)?.load(),
        Tier::TpBtf => <&mut BtfTracePoint>::try_from(program)?.load(spec.target, btf),
        Tier::RawTp => <&mut RawTracePoint>::try_from(program)?.load(),
        Tier::Tracepoint => <&mut TracePoint>::try_from(program)?.load(),
        Tier::SockOps => <&mut SockOps>::try_from(program)?.load(),
    }
}

/// Attaches one loaded tier's program (again).
pub fn attach_loaded(
    ebpf: &mut Ebpf,
    spec: &TierSpec,
    cgroup: Option<&File>,
) -> Result<TierLink, String> {
    require_program(ebpf, spec)?;
    let result: Result<TierLink, ProgramError> = (|| {
        let program = program(ebpf, spec)?;
        Ok(match spec.tier {
            Tier::Fentry => TierLink::Fentry(<&mut FEntry>::try_from(program)?.attach()?),
            Tier::Fexit => TierLink::Fexit(<&mut FExit>::try_from(program)?.attach()?),
            Tier::Kprobe => {
                TierLink::Kprobe(<&mut KProbe>::try_from(program)?.attach(spec.target, 0)?)
            }
            Tier::TpBtf => TierLink::TpBtf(<&mut BtfTracePoint>::try_from(program)?.attach()?),
            Tier::RawTp => {
                TierLink::RawTp(<&mut RawTracePoint>::try_from(program)?.attach(spec.target)?)
            }
            Tier::Tracepoint => {
                let (category, name) = spec.target.split_once(':').unwrap_or(("", spec.target));
                TierLink::Tracepoint(<&mut TracePoint>::try_from(program)?.attach(category, name)?)
            }
            Tier::SockOps => {
                let cgroup = cgroup.ok_or(ProgramError::UnexpectedProgramType)?;
                let p = <&mut SockOps>::try_from(program)?;
                TierLink::SockOps(p.attach(cgroup, CgroupAttachMode::Single)?)
            }
        })
    })();
    result.map_err(describe_program_error)
}

/// Detaches one link of a tier's program; the program stays loaded.
pub fn detach_link(ebpf: &mut Ebpf, spec: &TierSpec, link: TierLink) -> Result<(), ProgramError> {
    let program = program(ebpf, spec)?;
    match link {
        TierLink::Fentry(id) => <&mut FEntry>::try_from(program)?.detach(id),
        TierLink::Fexit(id) => <&mut FExit>::try_from(program)?.detach(id),
        TierLink::Kprobe(id) => <&mut KProbe>::try_from(program)?.detach(id),
        TierLink::TpBtf(id) => <&mut BtfTracePoint>::try_from(program)?.detach(id),
        TierLink::RawTp(id) => <&mut RawTracePoint>::try_from(program)?.detach(id),
        TierLink::Tracepoint(id) => <&mut TracePoint>::try_from(program)?.detach(id),
        TierLink::SockOps(id) => <&mut SockOps>::try_from(program)?.detach(id),
    }
}

/// Detaches and unloads one tier's program (all its links).
pub fn detach_tier(ebpf: &mut Ebpf, spec: &TierSpec) -> Result<(), ProgramError> {
    let Some(program) = ebpf.program_mut(spec.program) else {
        return Ok(());
    };
    match spec.tier {
        Tier::Fentry => <&mut FEntry>::try_from(program)?.unload(),
        Tier::Fexit => <&mut FExit>::try_from(program)?.unload(),
        Tier::Kprobe => <&mut KProbe>::try_from(program)?.unload(),
        Tier::TpBtf => <&mut BtfTracePoint>::try_from(program)?.unload(),
        Tier::RawTp => <&mut RawTracePoint>::try_from(program)?.unload(),
        Tier::Tracepoint => <&mut TracePoint>::try_from(program)?.unload(),
        Tier::SockOps => <&mut SockOps>::try_from(program)?.unload(),
    }
}

/// One line for the plan: the error chain, and for verifier rejections the log's last lines
/// (the full log can be thousands of lines; the tail says why).
fn describe_program_error(err: ProgramError) -> String {
    const VERIFIER_TAIL_LINES: usize = 8;
    if let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = &err
    {
        let log = verifier_log.to_string();
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(VERIFIER_TAIL_LINES)..].join(" | ");
        if tail.is_empty() {
            return format!(
                "load failed: {io_error} (no verifier output: refused before verification)"
            );
        }
        return format!("load failed: {io_error}; verifier: {tail}");
    }
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Opens the cgroup2 directory sock_ops attaches to.
pub fn open_cgroup(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use object::{Object, ObjectSymbol};

    use super::*;

    #[test]
    fn every_map_and_global_name_userspace_uses_is_in_the_object() {
        let file = object::File::parse(EBPF_OBJECT).expect("the embedded object parses");
        let symbols: HashSet<&str> = file.symbols().filter_map(|s| s.name().ok()).collect();
        for name in names::USER_SIDE_NAMES {
            assert!(
                symbols.contains(name),
                "{name} is not a symbol of the eBPF object"
            );
        }
    }
}
