//! `meshlab record`: load the kernel programs, attach them tier by tier, and stream events
//! into a binary capture (or NDJSON) until --duration, Ctrl-C or SIGTERM.

use std::io::{IsTerminal, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use aya::maps::HashMap as BpfHashMap;
use meshlab_common::{Config, DEFAULT_RING_BYTES, FILTER_ADDRS, FILTER_PORTS};

use super::loader::{HookAttach, TierLink};
use super::ondemand::{self, OnDemand};
use super::output::{OutputFormat, RecordingOutput};
use super::plan::{Family, HOOKS, HookSpec, TX_TIMESTAMPS_HOOK, Tier, TierSpec};
use super::{clock, diag, loader, nic, privilege, selfcost, session, setup, sysinfo};
use crate::ndjson::is_broken_pipe;
use crate::output::{Policy, create_output};
use crate::schema::{
    AttachEntry, AttachMode, AttachStatus, Filters, NicIrqInfo, Record, SCHEMA_VERSION, Startup,
};
use crate::units::{parse_duration, parse_sample_rate};

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Output file ("-" for stdout): a binary capture (`meshlab export` makes NDJSON of it),
    /// or NDJSON with --format ndjson.
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// capture: raw events, cheapest to record (docs/capture-format.md); ndjson: decoded
    /// lines (docs/schema.md), about ten times the recorder's CPU per event.
    #[arg(long, value_enum, default_value_t = OutputFormat::Capture)]
    pub format: OutputFormat,
    /// Stop after this long (DURATION: a number with a unit, ns, us, ms, s, m or h, e.g. 500ms,
    /// 10m); default: until Ctrl-C or SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Node name written into every record (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Trace only connections of this network namespace (/run/netns/NAME or /proc/PID/ns/net).
    #[arg(long)]
    pub netns: Option<PathBuf>,
    /// Trace only connections with this local or remote port (repeatable).
    #[arg(long = "port")]
    pub ports: Vec<u16>,
    /// Trace only connections with this local or remote address (repeatable).
    #[arg(long = "addr")]
    pub addrs: Vec<IpAddr>,
    /// cgroup2 directory to attach sock_ops to (default: the cgroup2 root, i.e. everything).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// Only packets through this network device (name inside --netns).
    #[arg(long)]
    pub device: Option<String>,
    /// Trace one connection in N, chosen by a hash of the 4-tuple both ends agree on ("1/N").
    #[arg(long, value_parser = parse_sample_rate, default_value = "1/1")]
    pub sample_conns: u32,
    /// On each traced connection, trace one request in N and the response answering it, chosen
    /// by a hash of the connection and the request's stream offset both ends agree on ("1/N").
    #[arg(long, value_parser = parse_sample_rate, default_value = "1/1")]
    pub sample_messages: u32,
    /// Also record unix stream sockets (sidecar legs): send/recv returns and data-ready, keyed
    /// by socket address. Use with --netns: without it every unix socket of the host is traced.
    #[arg(long)]
    pub unix: bool,
    /// Also stream every NIC IRQ, NET softirq and napi_poll event (NIC evaluation).
    #[arg(long)]
    pub raw_irq: bool,
    /// Also record socket TX timestamps of traced sends (qdisc, driver software, NIC
    /// hardware, ACK) through sock_ops; needs the kfunc bpf_sock_ops_enable_tx_tstamp (6.15+).
    #[arg(long)]
    pub tx_timestamps: bool,
    /// With --tx-timestamps: switch hardware stamping on (SIOCSHWTSTAMP: TX on, RX all where
    /// offered) on each traced device whose ethtool TSINFO says it can, and restore its
    /// previous config when the recorder exits; a device that cannot is reported and left
    /// alone. The NIC clock is not mapped to system time.
    #[arg(long, requires = "tx_timestamps")]
    pub hw_timestamps: bool,
    /// When the hot hooks (every hook but sock_ops) are attached. on-demand: only while a
    /// connection is traced, so a recorder whose filters match nothing costs the traffic
    /// nothing; `hot_hooks` records say when they were attached, and events before that are
    /// missing (not with --unix or --raw-irq, which need the hot hooks to notice anything).
    #[arg(long, value_enum, default_value_t = AttachMode::Always, value_name = "MODE")]
    pub attach: AttachMode,
    /// Created once every program is attached and the startup record is written.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Size in bytes of each event ring (a power of two, at least the page size). There is one
    /// ring per CPU, up to 8 (CPU c writes ring c % 8), so the kernel memory taken is this
    /// times min(CPUs, 8); the startup record says how many (`event_rings`).
    #[arg(long, default_value_t = DEFAULT_RING_BYTES)]
    pub ring_bytes: u32,
    /// Time between periodic clock records (DURATION, as --duration; at least 1s, the
    /// recorder's housekeeping tick).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    pub clock_every: Duration,
    /// Print the kernel programs' rare diagnostics on stderr, named by program: a failed
    /// kernel read on a traced socket, a refused map update, an impossible state. Off by
    /// default, when the verifier removes them and they cost the programs nothing.
    #[arg(short, long)]
    pub verbose: bool,
    /// Turn the kernel's BPF run-time statistics on for this recording only (BPF_ENABLE_STATS:
    /// off again when the recorder exits, however it exits; kernel.bpf_stats_enabled is not
    /// written). Without it, and with the sysctl at 0, meshlab's own program run time is
    /// "not measured" in the summary's self_cost. Costs some ns per program run.
    #[arg(long)]
    pub bpf_stats: bool,
}

/// The kernel programs wake the reader about once per 1/16 of the ring submitted; in between
/// the reader drains every [`super::session::DRAIN_EVERY`].
const WAKEUP_FRACTION: u32 = 16;

/// `Config::wakeup_events`: each CPU forces a wakeup every this many events, so the CPUs that
/// share a ring (one, unless there are more CPUs than rings) together submit about
/// `ring_bytes / WAKEUP_FRACTION` to it between wakeups. Counting events per CPU replaced
/// asking the ring for its pending bytes on every event (a helper call per event, up to ~7 %
/// of a traced program run: docs/benchmarks-kernel.md).
fn wakeup_events(ring_bytes: u32) -> u32 {
    let cpus = aya::util::nr_cpus().map_or(1, |n| n.max(1));
    let cpus_per_ring = cpus.div_ceil(meshlab_common::EVENT_RINGS as usize);
    // Each record takes its size plus the ring's 8-byte header.
    let record = std::mem::size_of::<meshlab_common::Event>() + 8;
    let per_cpu = ring_bytes as usize / WAKEUP_FRACTION as usize / record / cpus_per_ring;
    u32::try_from(per_cpu.max(1)).unwrap_or(u32::MAX)
}

pub fn run(args: RecordArgs) -> anyhow::Result<()> {
    check_args(&args)?;
    // A refused output path fails here, not after the programs are loaded and attached (the
    // file itself is created only then: a failed load leaves an earlier one as it was).
    if args.output.as_os_str() != "-" {
        crate::output::check_output(&args.output)?;
    }
    setup::raise_memlock();
    let node = args.node.clone().unwrap_or_else(sysinfo::hostname);
    let netns = setup::netns_facts(args.netns.as_deref())?;
    let config = kernel_config(&args, &netns)?;
    let nic_irqs = nic::nic_irqs(&nic::sysfs::SysRoot::live());
    let log_level = diag::level(args.verbose);
    let (mut ebpf, _offsets) = setup::load(&config, args.ring_bytes, log_level, &nic_irqs)?;
    install_filters(&mut ebpf, &args)?;

    let cgroup_path = setup::cgroup_dir(args.cgroup.as_deref())?;
    // Before the first program is loaded: their run counters then start with them.
    let stats = selfcost::StatsSwitch::new(args.bpf_stats)?;
    let hooks = attach_all(&mut ebpf, &cgroup_path, args.raw_irq, args.attach)?;
    let (mut attach_plan, attached) = (hooks.plan, hooks.tiers);
    attach_plan.push(tx_timestamps_entry(args.tx_timestamps));
    let kernel_log = match args.verbose {
        true => Some(diag::KernelLog::start(&mut ebpf, &attached)?),
        false => None,
    };
    let own = selfcost::OwnPrograms::start(&ebpf, &attached, stats)?;
    let mut startup = startup_record(&args, &node, &cgroup_path, attach_plan, nic_irqs);
    // Held to the end of run(): dropping it restores the devices' previous configs.
    let hw_switch = switch_hw_timestamps(args.hw_timestamps, &mut startup.devices)?;
    let sink = open_capture_output(&args.output)?;
    let out = RecordingOutput::new(args.format, node.clone(), netns.dev_names, sink)
        .with_context(|| format!("writing {}", args.output.display()))?;
    let start_ns = startup.clock.monotonic_ns;
    let on_demand = match args.attach {
        AttachMode::OnDemand => Some(OnDemand::new(
            &mut ebpf,
            node.clone(),
            hooks.parked,
            start_ns,
        )?),
        AttachMode::Always => None,
    };
    let mut session = session::Session::new(ebpf, attached, own, node, out, kernel_log)?
        .keep_net_admin(hw_switch.as_ref().is_some_and(|s| s.any_switched()))
        .with_nic_clocks(open_nic_clocks(args.hw_timestamps, &startup.devices));
    if let Some(on_demand) = on_demand {
        session = session.with_on_demand(on_demand);
    }
    session.write_record(&Record::Startup(startup))?;
    session.flush()?;
    let run = session.run(
        args.duration,
        args.clock_every.max(Duration::from_secs(1)),
        args.ready_file.as_deref(),
    );
    drop(hw_switch);
    report_end(run, &args.output)
}

/// `--hw-timestamps`: switches the devices of the startup record that can stamp; `None`
/// without the flag.
fn switch_hw_timestamps(
    requested: bool,
    devices: &mut [crate::schema::DeviceContext],
) -> anyhow::Result<Option<nic::hwstamp::HwStampSwitch<nic::hwstamp_ioctl::LiveIoctl>>> {
    if !requested {
        return Ok(None);
    }
    if devices.is_empty() {
        log::warn!("--hw-timestamps: no traced device with a bus device (NIC): nothing switched");
    }
    let io = nic::hwstamp_ioctl::LiveIoctl::open()?;
    Ok(Some(nic::hwstamp::HwStampSwitch::switch_on(io, devices)))
}

/// `--hw-timestamps`: the NIC clocks of the devices switched on, opened before the
/// capability drop; `None` without the flag or a clock.
fn open_nic_clocks(
    requested: bool,
    devices: &[crate::schema::DeviceContext],
) -> Option<nic::phc::PhcSampler> {
    if !requested {
        return None;
    }
    nic::phc::PhcSampler::open(devices, |index| {
        let phc = nic::phc_ioctl::LivePhc::open(index)?;
        Ok(Box::new(phc) as Box<dyn nic::phc::PhcReader>)
    })
}

/// Refuses what cannot work before anything is loaded: missing privileges, a ring size the
/// kernel rejects, binary bytes onto a terminal.
fn check_args(args: &RecordArgs) -> anyhow::Result<()> {
    privilege::require("meshlab record", privilege::RECORD_NEEDS)?;
    if args.netns.is_some() {
        privilege::require("meshlab record --netns", privilege::NETNS_NEEDS)?;
    }
    if args.attach == AttachMode::OnDemand && (args.unix || args.raw_irq) {
        bail!(
            "--attach on-demand cannot be combined with --unix or --raw-irq: their events come \
             from the hot hooks themselves, with no traced TCP connection to attach them for"
        );
    }
    if !args.ring_bytes.is_power_of_two() || args.ring_bytes < 4096 {
        bail!(
            "--ring-bytes {}: must be a power of two and at least 4096",
            args.ring_bytes
        );
    }
    if args.format == OutputFormat::Capture
        && args.output.as_os_str() == "-"
        && std::io::stdout().is_terminal()
    {
        bail!(
            "refusing to write a binary capture to a terminal: use -o FILE, a pipe, or --format ndjson"
        );
    }
    Ok(())
}

/// The kernel programs' [`Config`] for these flags; --device is resolved inside the traced
/// namespace.
fn kernel_config(args: &RecordArgs, netns: &setup::NetnsFacts) -> anyhow::Result<Config> {
    let ifindex = match &args.device {
        Some(dev) => {
            *netns
                .dev_names
                .iter()
                .find(|(_, name)| *name == dev)
                .with_context(|| format!("--device {dev}: no such device in the traced namespace"))?
                .0
        }
        None => 0,
    };
    let port_flag = if args.ports.is_empty() {
        0
    } else {
        FILTER_PORTS
    };
    let addr_flag = if args.addrs.is_empty() {
        0
    } else {
        FILTER_ADDRS
    };
    Ok(Config {
        netns_cookie: if args.netns.is_some() {
            netns.cookie
        } else {
            0
        },
        filter_flags: port_flag | addr_flag,
        sample_every: args.sample_conns,
        ifindex,
        raw_irq_stream: u32::from(args.raw_irq),
        trace_unix: u32::from(args.unix),
        wakeup_events: wakeup_events(args.ring_bytes),
        sample_messages_every: args.sample_messages,
        tx_timestamps: u32::from(args.tx_timestamps),
        wake_on_traced: u32::from(args.attach == AttachMode::OnDemand),
        rx_hw_timestamps: u32::from(args.hw_timestamps),
    })
}

/// What [`attach_all`] attached.
struct AttachedHooks {
    /// The attach plan for the startup record.
    plan: Vec<AttachEntry>,
    /// The tier chosen per hook (programs loaded; attached unless parked).
    tiers: Vec<&'static TierSpec>,
    /// `--attach on-demand`: the hot hooks, detached again with their programs loaded.
    parked: Vec<(&'static HookSpec, &'static TierSpec)>,
}

/// Attaches every hook of the plan, fastest tier first; with `--attach on-demand` the hot
/// hooks are detached again at once ([`park`]). sock_ops is the one hook without which nothing
/// is traced, so its failure is an error; any other missing hook is a warning.
fn attach_all(
    ebpf: &mut aya::Ebpf,
    cgroup_path: &std::path::Path,
    raw_irq: bool,
    mode: AttachMode,
) -> anyhow::Result<AttachedHooks> {
    let cgroup = loader::open_cgroup(cgroup_path)
        .with_context(|| format!("opening cgroup2 directory {}", cgroup_path.display()))?;
    let btf = loader::kernel_btf()?;
    let mut out = AttachedHooks {
        plan: Vec::new(),
        tiers: Vec::new(),
        parked: Vec::new(),
    };
    for hook in HOOKS {
        if hook.raw_stream_only && !raw_irq {
            out.plan.push(not_requested(hook));
            continue;
        }
        let HookAttach {
            mut entries,
            chosen,
        } = loader::attach_hook(ebpf, &btf, hook, Some(&cgroup), false);
        match chosen {
            Some((spec, link)) => {
                out.tiers.push(spec);
                if mode == AttachMode::OnDemand && hook.on_demand() {
                    if ondemand::reattachable(spec.tier) {
                        park(ebpf, spec, link, &mut entries)?;
                        out.parked.push((hook, spec));
                    } else {
                        log::warn!(
                            "{}: attached for the whole recording: its tier {} cannot be attached again once capabilities are dropped",
                            hook.name,
                            spec.tier
                        );
                    }
                }
            }
            None if hook.family == Family::SockOps => {
                bail!(
                    "sock_ops could not attach to {}: {:?}",
                    cgroup_path.display(),
                    entries[0].error
                )
            }
            None => log::warn!(
                "{}: no tier attached; its events will be missing",
                hook.name
            ),
        }
        out.plan.extend(entries);
    }
    Ok(out)
}

/// Detaches a hot hook's link right after it attached (so the plan's tier is one that
/// attaches here), keeps its program loaded, and marks its plan entry `on_demand`.
fn park(
    ebpf: &mut aya::Ebpf,
    spec: &'static TierSpec,
    link: TierLink,
    entries: &mut [AttachEntry],
) -> anyhow::Result<()> {
    loader::detach_link(ebpf, spec, link)
        .with_context(|| format!("detaching {} until a connection is traced", spec.program))?;
    for e in entries.iter_mut().filter(|e| e.tier == spec.tier) {
        e.status = AttachStatus::OnDemand;
    }
    Ok(())
}

/// The first record of every recording: who recorded what, where, and with which filters.
fn startup_record(
    args: &RecordArgs,
    node: &str,
    cgroup_path: &std::path::Path,
    attach_plan: Vec<AttachEntry>,
    nic_irqs: Vec<NicIrqInfo>,
) -> Startup {
    Startup {
        schema_version: SCHEMA_VERSION,
        tool: "meshlab".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        node: node.to_owned(),
        hostname: sysinfo::hostname(),
        kernel: sysinfo::kernel_release(),
        command: std::env::args().collect(),
        pid: std::process::id(),
        clock: clock::sample_clocks(None),
        attach_plan,
        filters: Filters {
            ports: args.ports.clone(),
            addrs: args.addrs.iter().map(ToString::to_string).collect(),
            netns: args.netns.as_ref().map(|p| p.display().to_string()),
            cgroup: cgroup_path.display().to_string(),
            device: args.device.clone(),
            sample_every: args.sample_conns,
            sample_messages_every: args.sample_messages,
            raw_irq_stream: args.raw_irq,
        },
        ring_buffer_bytes: args.ring_bytes,
        event_rings: u32::try_from(super::loader::event_rings_used().len()).unwrap_or(u32::MAX),
        nic_irqs,
        devices: nic::device_contexts(&nic::sysfs::SysRoot::live(), args.device.as_deref()),
        attach_mode: args.attach,
    }
}

/// The session is gone by now, and with it every program, link and map: say what ended it.
fn report_end(run: anyhow::Result<String>, output: &std::path::Path) -> anyhow::Result<()> {
    match run {
        Ok(summary) => eprintln!("{summary}"),
        Err(e) if is_broken_pipe(&e) => {
            log::info!("output closed by its reader: recording stopped, programs detached");
        }
        Err(e) => {
            return Err(e.context(format!(
                "recording to {} stopped; programs detached; the file holds every record up to its last complete line",
                output.display()
            )));
        }
    }
    Ok(())
}

/// Socket TX timestamps ride on the sock_ops program: on when asked for (setup::load refused
/// to start if the kernel lacks their kfuncs), so the plan says which it was.
fn tx_timestamps_entry(requested: bool) -> AttachEntry {
    AttachEntry {
        hook: TX_TIMESTAMPS_HOOK.into(),
        tier: Tier::SockOps,
        status: if requested {
            AttachStatus::Attached
        } else {
            AttachStatus::Skipped
        },
        error: (!requested).then(|| "not requested (--tx-timestamps)".into()),
    }
}

fn not_requested(hook: &HookSpec) -> AttachEntry {
    AttachEntry {
        hook: hook.name.into(),
        tier: hook.tiers[0].tier,
        status: AttachStatus::Skipped,
        error: Some("not requested (--raw-irq)".into()),
    }
}

fn install_filters(ebpf: &mut aya::Ebpf, args: &RecordArgs) -> anyhow::Result<()> {
    let mut ports: BpfHashMap<_, u16, u8> = BpfHashMap::try_from(
        ebpf.map_mut("FILTER_PORT_SET")
            .context("FILTER_PORT_SET map missing")?,
    )?;
    for port in &args.ports {
        ports.insert(port, 1, 0)?;
    }
    let mut addrs: BpfHashMap<_, [u8; 16], u8> = BpfHashMap::try_from(
        ebpf.map_mut("FILTER_ADDR_SET")
            .context("FILTER_ADDR_SET map missing")?,
    )?;
    for addr in &args.addrs {
        let bytes = match addr {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        addrs.insert(bytes, 1, 0)?;
    }
    Ok(())
}

/// The output file or stdout (every file `record` and `export` write is opened here). The file is opened under crate::output's rules (no symlink, no
/// foreign file, handed to the invoking user under sudo so a recording can be merged and
/// deleted without root) and streamed: a killed recorder leaves every complete line.
pub(crate) fn open_capture_output(path: &std::path::Path) -> anyhow::Result<Box<dyn Write + Send>> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(std::io::stdout()));
    }
    let file = create_output(path, Policy::Stream)?.commit()?;
    Ok(Box::new(file))
}
