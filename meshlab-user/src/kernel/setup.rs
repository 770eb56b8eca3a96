//! What `record` and `doctor` share before anything is attached: privilege checks, the
//! network namespace facts (cookie, device names), and the loaded object with its maps filled.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use aya::Ebpf;
use aya::maps::HashMap as BpfHashMap;
use meshlab_common::{Config, KernelOffsets, NicIrq, names};

use super::kfunc::{KfuncIds, TX_TSTAMP_KFUNCS, set_cast_ids};
use super::{btf_offsets, sysinfo};
use crate::schema::NicIrqInfo;

/// `SO_NETNS_COOKIE` (include/uapi/asm-generic/socket.h), not yet in the libc crate.
const SO_NETNS_COOKIE: libc::c_int = 71;

pub fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} needs root to load eBPF programs: run it with sudo");
    }
    Ok(())
}

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF memory to it (< 5.11); newer
/// kernels use memcg accounting, so a refusal (no CAP_SYS_RESOURCE) is only a warning.
pub fn raise_memlock() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to an initialised rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        log::debug!(
            "setrlimit(RLIMIT_MEMLOCK) refused ({}); fine on 5.11+",
            std::io::Error::last_os_error()
        );
    }
}

/// Facts about the network namespace being traced, read from inside it.
#[derive(Debug, Default, Clone)]
pub struct NetnsFacts {
    /// `bpf_get_netns_cookie` value of the namespace.
    pub cookie: u64,
    /// ifindex -> device name, as seen inside the namespace.
    pub dev_names: HashMap<u32, String>,
}

/// Reads [`NetnsFacts`] of the namespace at `netns` (a /run/netns/NAME or /proc/PID/ns/net
/// path), or of the current one. setns(2) applies to the calling thread only, so it runs on a
/// short-lived thread and the recorder itself never changes namespace.
pub fn netns_facts(netns: Option<&Path>) -> anyhow::Result<NetnsFacts> {
    let ns_file = match netns {
        Some(p) => Some(
            File::open(p).with_context(|| format!("opening network namespace {}", p.display()))?,
        ),
        None => None,
    };
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<NetnsFacts> {
            if let Some(f) = &ns_file {
                // SAFETY: valid fd; CLONE_NEWNET checks that it is a network namespace.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!(
                        "setns into {:?} failed: {}",
                        netns,
                        std::io::Error::last_os_error()
                    );
                }
            }
            Ok(NetnsFacts {
                cookie: current_netns_cookie()?,
                dev_names: interface_names(),
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("netns probe thread panicked"))?
    })
}

fn current_netns_cookie() -> anyhow::Result<u64> {
    // SAFETY: plain socket creation; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        bail!(
            "socket() for SO_NETNS_COOKIE failed: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid fd and out-pointers of the advertised size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        bail!("getsockopt(SO_NETNS_COOKIE) failed: {err} (needs Linux 5.14+)");
    }
    Ok(cookie)
}

fn interface_names() -> HashMap<u32, String> {
    let mut names = HashMap::new();
    // SAFETY: if_nameindex returns a NULL-terminated array we free with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return names;
        }
        let mut cur = list;
        while (*cur).if_index != 0 && !(*cur).if_name.is_null() {
            names.insert(
                (*cur).if_index,
                CStr::from_ptr((*cur).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            cur = cur.add(1);
        }
        libc::if_freenameindex(list);
    }
    names
}

/// The cgroup2 directory sock_ops attaches to: `--cgroup`, else the cgroup2 mount root.
pub fn cgroup_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    sysinfo::find_mount(&sysinfo::mounts(), "cgroup2")
        .context("no cgroup2 mount in /proc/self/mountinfo (sock_ops needs cgroup v2; mount it or pass --cgroup)")
}

/// Resolves kernel offsets and kfuncs, loads the object and fills the NIC IRQ map. TX
/// timestamps asked for on a kernel without their kfuncs are an error, never a silent gap.
/// `kernel_log_level`: see [`super::loader::load_object`].
pub fn load(
    config: &Config,
    ring_bytes: u32,
    kernel_log_level: u8,
    nic_irqs: &[NicIrqInfo],
) -> anyhow::Result<(Ebpf, KernelOffsets)> {
    let btf = btf_offsets::read_btf(Path::new(btf_offsets::VMLINUX_BTF))?;
    let mut offsets = btf_offsets::resolve_offsets_from(&btf)?;
    let kfuncs = KfuncIds::resolve(&btf);
    if config.tx_timestamps != 0 && !kfuncs.all_present(&TX_TSTAMP_KFUNCS) {
        bail!(
            "--tx-timestamps: {} has no kfunc {} (sock_ops TX timestamping needs Linux 6.15+)",
            btf_offsets::VMLINUX_BTF,
            kfuncs.missing(&TX_TSTAMP_KFUNCS).join(", ")
        );
    }
    set_cast_ids(&mut offsets, &btf, &kfuncs);
    let mut ebpf =
        super::loader::load_object(config, &offsets, ring_bytes, kernel_log_level, &kfuncs)?;
    let mut irq_map: BpfHashMap<_, u32, NicIrq> =
        BpfHashMap::try_from(map_mut(&mut ebpf, names::MAP_NIC_IRQS)?)?;
    for irq in nic_irqs {
        let value = NicIrq {
            ifindex: irq.ifindex,
            queue: irq.queue.unwrap_or(u32::MAX),
        };
        irq_map
            .insert(irq.irq, value, 0)
            .with_context(|| format!("registering NIC IRQ {}", irq.irq))?;
    }
    // Devices with NIC IRQs: only their TX skb frees are TX completions (a veth or loopback
    // "transmit" hands the skb to the receiver, which frees it much later).
    let mut nic_devs: BpfHashMap<_, u32, u8> =
        BpfHashMap::try_from(map_mut(&mut ebpf, names::MAP_NIC_IFINDEXES)?)?;
    for irq in nic_irqs {
        nic_devs
            .insert(irq.ifindex, 1, 0)
            .with_context(|| format!("registering NIC {}", irq.dev))?;
    }
    Ok((ebpf, offsets))
}

/// A map of the loaded object by its name (meshlab_common::names).
pub fn map_mut<'e>(ebpf: &'e mut Ebpf, name: &str) -> anyhow::Result<&'e mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("the eBPF object has no map {name}"))
}
