//! `meshlab doctor`: what this kernel allows, found by really loading and attaching every tier
//! of every hook, and the attach plan `record` would use.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use aya::programs::SockOps;
use meshlab_common::Config;
use object::{Object, ObjectSection};
use serde::Serialize;

use super::kfunc::{KfuncIds, TX_TSTAMP_KFUNCS};
use super::plan::{
    Family, HOOKS, SOCK_OPS_PROGRAM, TRACEPOINT_PROBE, TX_TIMESTAMPS_HOOK, TX_TSTAMP_KFUNC, Tier,
};
use super::{btf_offsets, loader, nic, setup, sysinfo};
use crate::schema::{AttachEntry, AttachStatus};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct DoctorReport {
    pub kernel: String,
    pub btf: bool,
    pub lockdown: Option<String>,
    pub tracefs: Result<String, String>,
    pub bpffs: Option<String>,
    pub cgroup2: Option<String>,
    /// Programs, maps and BTF found in the embedded eBPF object.
    pub object: ObjectFacts,
    /// Every tier of every hook, as tried.
    pub tiers: Vec<AttachEntry>,
    /// Per family and tier: did it load and attach for every hook of the family that has it?
    pub families: BTreeMap<String, BTreeMap<String, String>>,
    /// What `record` would use: hook -> tier.
    pub plan: BTreeMap<String, Tier>,
    pub usable: bool,
    /// Why attach-tier probing could not run, if it could not.
    pub probe_error: Option<String>,
    /// Whether `record --tx-timestamps` works here, and why not.
    pub tx_timestamps: TxTimestamps,
    /// Per device with a bus device: what it can stamp (ethtool TSINFO_GET), in words.
    pub nic_timestamps: BTreeMap<String, String>,
    /// Per device: what `record --hw-timestamps` would do to its hardware stamping.
    pub hw_timestamps: BTreeMap<String, String>,
    /// How the online CPUs map onto the kernel programs' event rings, in words.
    pub event_rings: String,
}

/// Socket TX timestamps (sock_ops, `record --tx-timestamps`): the kfunc in vmlinux BTF, and
/// the sock_ops program with its kfunc calls really loaded.
#[derive(Debug, Serialize)]
pub(crate) struct TxTimestamps {
    /// BTF id of [`TX_TSTAMP_KFUNC`] in vmlinux BTF; `None`: this kernel cannot.
    pub kfunc_btf_id: Option<u32>,
    pub usable: bool,
    /// What was found, in words (the reason when not usable).
    pub verdict: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct ObjectFacts {
    pub bytes: usize,
    pub programs: usize,
    pub has_btf: bool,
    pub missing_programs: Vec<String>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let report = diagnose();
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_table(&mut out, &report)?;
    }
    out.flush()?;
    if !report.usable {
        anyhow::bail!("nothing usable: record cannot trace on this machine (see above)");
    }
    Ok(())
}

pub(crate) fn diagnose() -> DoctorReport {
    let mounts = sysinfo::mounts();
    let mut report = DoctorReport {
        kernel: sysinfo::kernel_release(),
        btf: Path::new(btf_offsets::VMLINUX_BTF).exists(),
        lockdown: sysinfo::lockdown_mode(),
        tracefs: sysinfo::ensure_tracefs().map(|p| p.display().to_string()),
        bpffs: sysinfo::find_mount(&mounts, "bpf").map(|p| p.display().to_string()),
        cgroup2: sysinfo::find_mount(&mounts, "cgroup2").map(|p| p.display().to_string()),
        object: inspect_object(loader::EBPF_OBJECT),
        tiers: Vec::new(),
        families: BTreeMap::new(),
        plan: BTreeMap::new(),
        usable: false,
        probe_error: None,
        tx_timestamps: probe_tx_timestamps(),
        nic_timestamps: BTreeMap::new(),
        hw_timestamps: BTreeMap::new(),
        event_rings: event_rings_verdict(aya::util::online_cpus().ok().as_deref()),
    };
    (report.nic_timestamps, report.hw_timestamps) = nic_timestamps();
    if let Err(e) = probe_tiers(&mut report) {
        report.probe_error = Some(format!("{e:#}"));
    }
    summarize(&mut report);
    report
}

/// Per device with a bus device: what it can stamp, and what `--hw-timestamps` would do.
fn nic_timestamps() -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let contexts = nic::device_contexts(&nic::sysfs::SysRoot::live(), None);
    let each = |say: fn(&crate::schema::DeviceContext) -> String| {
        (contexts.iter())
            .map(|ctx| (ctx.dev.clone(), say(ctx)))
            .collect()
    };
    (
        each(nic::stamping::verdict),
        each(nic::hwstamp::doctor_line),
    )
}

/// Checks the embedded ELF with `object`: every program the hook table names must be there.
pub(crate) fn inspect_object(bytes: &[u8]) -> ObjectFacts {
    let Ok(file) = object::File::parse(bytes) else {
        return ObjectFacts {
            bytes: bytes.len(),
            programs: 0,
            has_btf: false,
            missing_programs: vec!["<unparsable ELF>".into()],
        };
    };
    let symbols: std::collections::HashSet<String> = {
        use object::ObjectSymbol;
        file.symbols()
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect()
    };
    let wanted = HOOKS
        .iter()
        .flat_map(|h| h.tiers.iter())
        .chain(std::iter::once(&TRACEPOINT_PROBE));
    let missing_programs = wanted
        .filter(|t| !symbols.contains(t.program))
        .map(|t| t.program.to_owned())
        .collect();
    let programs = file
        .sections()
        .filter(|s| {
            s.name().is_ok_and(|n| {
                [
                    "tp_btf/",
                    "raw_tp/",
                    "kprobe/",
                    "fentry/",
                    "fexit/",
                    "tracepoint/",
                    "sockops",
                ]
                .iter()
                .any(|p| n.starts_with(p))
            })
        })
        .count();
    ObjectFacts {
        bytes: bytes.len(),
        programs,
        has_btf: file.section_by_name(".BTF").is_some(),
        missing_programs,
    }
}

fn probe_tiers(report: &mut DoctorReport) -> anyhow::Result<()> {
    setup::require_root("probing attach tiers")?;
    setup::raise_memlock();
    // With the kernel log calls on (`record -v`), so the verifier checks them too: without
    // them it only checks a subset (it removes the calls).
    let (mut ebpf, _) = setup::load(
        &Config::default(),
        meshlab_common::DEFAULT_RING_BYTES,
        super::diag::level(true),
        &[],
    )?;
    let btf = loader::kernel_btf()?;
    let cgroup_path = setup::cgroup_dir(None)?;
    let cgroup = loader::open_cgroup(&cgroup_path)
        .with_context(|| format!("opening {}", cgroup_path.display()))?;
    for hook in HOOKS {
        report
            .tiers
            .extend(loader::attach_hook(&mut ebpf, &btf, hook, Some(&cgroup), true).entries);
    }
    let probe = super::plan::HookSpec {
        name: "net_dev_queue",
        family: Family::Tx,
        tiers: std::slice::from_ref(&TRACEPOINT_PROBE),
        raw_stream_only: false,
    };
    report
        .tiers
        .extend(loader::attach_hook(&mut ebpf, &btf, &probe, None, true).entries);
    Ok(())
}

/// Looks the kfunc up, then (as root) loads the sock_ops program with TX timestamps on: the
/// verifier resolves the kfunc calls the loader wrote, so a load is the real check.
fn probe_tx_timestamps() -> TxTimestamps {
    let not = |kfunc_btf_id, verdict: String| TxTimestamps {
        kfunc_btf_id,
        usable: false,
        verdict,
    };
    let btf = match btf_offsets::read_btf(Path::new(btf_offsets::VMLINUX_BTF)) {
        Ok(btf) => btf,
        Err(e) => return not(None, format!("unknown: {e}")),
    };
    let kfuncs = KfuncIds::resolve(&btf);
    let id = kfuncs
        .0
        .iter()
        .find(|(name, _)| *name == TX_TSTAMP_KFUNC)
        .and_then(|(_, id)| *id);
    if !kfuncs.all_present(&TX_TSTAMP_KFUNCS) {
        return not(
            id,
            format!(
                "NO: {} has no kfunc {} (socket TX timestamps through sock_ops need Linux 6.15+)",
                btf_offsets::VMLINUX_BTF,
                kfuncs.missing(&TX_TSTAMP_KFUNCS).join(", ")
            ),
        );
    }
    let config = Config {
        tx_timestamps: 1,
        ..Config::default()
    };
    let loaded = setup::require_root("loading sock_ops with TX timestamps").and_then(|()| {
        let (mut ebpf, _) = setup::load(
            &config,
            meshlab_common::DEFAULT_RING_BYTES,
            super::diag::level(true),
            &[],
        )?;
        let program: &mut SockOps = ebpf
            .program_mut(SOCK_OPS_PROGRAM)
            .context("no sock_ops program in the object")?
            .try_into()?;
        program.load()?;
        Ok(())
    });
    match loaded {
        Ok(()) => TxTimestamps {
            kfunc_btf_id: id,
            usable: true,
            verdict: format!(
                "yes: kfunc {TX_TSTAMP_KFUNC} (BTF id {}), sock_ops with TX timestamps loads (record --tx-timestamps); hardware stamps need a NIC that stamps",
                id.unwrap_or_default()
            ),
        },
        Err(e) => not(
            id,
            format!("NO: the kfunc exists but sock_ops with TX timestamps did not load: {e:#}"),
        ),
    }
}

fn summarize(report: &mut DoctorReport) {
    for hook in HOOKS {
        let family = hook.family.name().to_owned();
        for entry in report.tiers.iter().filter(|e| e.hook == hook.name) {
            let cell = report
                .families
                .entry(family.clone())
                .or_default()
                .entry(entry.tier.as_str().to_owned())
                .or_insert_with(|| "usable".into());
            if entry.status != AttachStatus::Attached {
                *cell = format!("unusable: {}", entry.error.clone().unwrap_or_default());
            }
        }
        if let Some(first) = report
            .tiers
            .iter()
            .find(|e| e.hook == hook.name && e.status == AttachStatus::Attached)
        {
            report.plan.insert(hook.name.to_owned(), first.tier);
        }
    }
    if let Some(tp) = report.tiers.iter().find(|e| e.tier == Tier::Tracepoint) {
        let cell = if tp.status == AttachStatus::Attached {
            "usable (capability probe; record uses raw_tp/tp_btf)".to_owned()
        } else {
            format!("unusable: {}", tp.error.clone().unwrap_or_default())
        };
        report
            .families
            .entry("tx".into())
            .or_default()
            .insert(Tier::Tracepoint.as_str().into(), cell);
    }
    let has = |family: Family| {
        HOOKS
            .iter()
            .any(|h| h.family == family && report.plan.contains_key(h.name))
    };
    report.usable = report.plan.contains_key("sock_ops") && has(Family::Tx) && has(Family::Rx);
}

fn print_table(out: &mut impl Write, r: &DoctorReport) -> std::io::Result<()> {
    print_environment(out, r)?;
    if let Some(e) = &r.probe_error {
        writeln!(out, "\nattach tiers: not probed: {e}")?;
    }
    writeln!(out, "\n{:<8} {:<11} result", "family", "tier")?;
    for (family, tiers) in &r.families {
        for (tier, result) in tiers {
            writeln!(out, "{family:<8} {tier:<11} {result}")?;
        }
    }
    writeln!(out, "\nattach plan (record):")?;
    for hook in HOOKS {
        let tier = r.plan.get(hook.name).map_or("NONE", |t| t.as_str());
        writeln!(out, "  {:<20} {tier}", hook.name)?;
    }
    writeln!(
        out,
        "  {TX_TIMESTAMPS_HOOK:<20} {}",
        r.tx_timestamps.verdict
    )?;
    writeln!(out, "\nNIC timestamps (ethtool -T):")?;
    if r.nic_timestamps.is_empty() {
        writeln!(out, "  no device with a bus device (NIC)")?;
    }
    for (dev, verdict) in &r.nic_timestamps {
        writeln!(out, "  {dev:<20} {verdict}")?;
        if let Some(hw) = r.hw_timestamps.get(dev) {
            writeln!(out, "  {:<20} record --hw-timestamps: {hw}", "")?;
        }
    }
    writeln!(out, "\nusable: {}", if r.usable { "yes" } else { "NO" })
}

/// Whether every online CPU has an event ring of its own (CPU c writes ring c % EVENT_RINGS,
/// `meshlab_common::event_ring_of_cpu`): CPUs sharing a ring pay for its shared lock and
/// positions on every record they write at once.
fn event_rings_verdict(online_cpus: Option<&[u32]>) -> String {
    let rings = meshlab_common::EVENT_RINGS;
    let Some(cpus) = online_cpus else {
        return format!("{rings} (the online CPUs are unknown)");
    };
    let mut sharing = [0usize; meshlab_common::EVENT_RINGS as usize];
    for &cpu in cpus {
        sharing[meshlab_common::event_ring_of_cpu(cpu) as usize] += 1;
    }
    let most = sharing.iter().copied().max().unwrap_or(0);
    if most <= 1 {
        return format!("{} in use, one per online CPU", cpus.len());
    }
    format!(
        "{rings} for {} online CPUs: CPU c writes ring c % {rings}, so up to {most} CPUs share a \
         ring and pay more per event while they trace at once; keep the traced work on CPUs that \
         differ modulo {rings} (docs/runbook-nic.md, step 1)",
        cpus.len()
    )
}

/// Kernel, BTF, lockdown, the file systems record needs, and the embedded object.
fn print_environment(out: &mut impl Write, r: &DoctorReport) -> std::io::Result<()> {
    writeln!(out, "kernel      {}", r.kernel)?;
    writeln!(
        out,
        "btf         {}",
        if r.btf {
            btf_offsets::VMLINUX_BTF
        } else {
            "MISSING (record needs CONFIG_DEBUG_INFO_BTF)"
        }
    )?;
    writeln!(
        out,
        "lockdown    {}",
        r.lockdown.as_deref().unwrap_or("not available")
    )?;
    match &r.tracefs {
        Ok(p) => writeln!(out, "tracefs     {p}")?,
        Err(e) => writeln!(out, "tracefs     MISSING: {e}")?,
    }
    writeln!(
        out,
        "bpffs       {}",
        r.bpffs
            .as_deref()
            .unwrap_or("not mounted (not needed: meshlab pins nothing)")
    )?;
    writeln!(
        out,
        "cgroup2     {}",
        r.cgroup2
            .as_deref()
            .unwrap_or("MISSING (sock_ops needs cgroup v2)")
    )?;
    writeln!(
        out,
        "object      {} bytes, {} programs, BTF {}{}",
        r.object.bytes,
        r.object.programs,
        if r.object.has_btf {
            "present"
        } else {
            "MISSING"
        },
        if r.object.missing_programs.is_empty() {
            String::new()
        } else {
            format!(", MISSING programs: {:?}", r.object.missing_programs)
        }
    )?;
    writeln!(out, "event rings {}", r.event_rings)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_object_has_every_program_of_the_hook_table_and_btf() {
        let facts = inspect_object(loader::EBPF_OBJECT);
        assert!(
            facts.missing_programs.is_empty(),
            "{:?}",
            facts.missing_programs
        );
        assert!(
            facts.has_btf,
            "the object must carry BTF (tp_btf/fentry and map definitions)"
        );
        let tier_count: usize = HOOKS.iter().map(|h| h.tiers.len()).sum::<usize>() + 1;
        assert_eq!(facts.programs, tier_count);
    }

    #[test]
    fn event_rings_are_shared_only_by_online_cpus_of_one_remainder() {
        assert_eq!(
            event_rings_verdict(Some(&[0, 1])),
            "2 in use, one per online CPU"
        );
        let eight: Vec<u32> = (0..8).collect();
        assert_eq!(
            event_rings_verdict(Some(&eight)),
            "8 in use, one per online CPU"
        );
        // Online CPUs of a machine with more possible ones: no two of one remainder modulo 8.
        assert_eq!(
            event_rings_verdict(Some(&[0, 3, 9])),
            "3 in use, one per online CPU"
        );
        // 3, 11 and 19 share ring 3; 0 and 16 ring 0.
        let shared = event_rings_verdict(Some(&[0, 3, 11, 16, 19]));
        assert!(
            shared
                .starts_with("8 for 5 online CPUs: CPU c writes ring c % 8, so up to 3 CPUs share"),
            "{shared}"
        );
        let seventeen: Vec<u32> = (0..17).collect();
        assert!(event_rings_verdict(Some(&seventeen)).contains("up to 3 CPUs share"));
        assert!(event_rings_verdict(None).contains("unknown"));
    }
}
