//! Network devices as sysfs and procfs show them: identity, queues with their RPS/XPS CPUs,
//! MSI vectors, /proc/interrupts lines and IRQ affinity. Every path is taken under a
//! [`SysRoot`], so tests read recorded snapshots (meshlab-user/tests/fixtures/nic/).

use std::fs;
use std::path::{Path, PathBuf};

use super::irq_names::DeviceNames;
use crate::schema::QueueCpus;

/// Where `sys/` and `proc/` are: `/` on a live system, a snapshot directory in tests.
#[derive(Clone, Debug)]
pub struct SysRoot(PathBuf);

impl SysRoot {
    pub fn live() -> Self {
        SysRoot(PathBuf::from("/"))
    }

    pub fn at(dir: impl Into<PathBuf>) -> Self {
        SysRoot(dir.into())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    fn read_trimmed(&self, rel: impl AsRef<Path>) -> Option<String> {
        fs::read_to_string(self.0.join(rel))
            .ok()
            .map(|s| s.trim().to_owned())
    }
}

/// One interface under `sys/class/net`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDevice {
    pub ifindex: u32,
    pub names: DeviceNames,
    /// Whether the interface has a bus device (a NIC or virtio), unlike lo, veth or bridges.
    pub has_bus_device: bool,
    /// MSI vectors of the device and, for virtio, of its PCI parent.
    pub msi_irqs: Vec<u32>,
    pub mtu: Option<u32>,
}

/// Every interface under `sys/class/net`, sorted by name.
pub fn net_devices(root: &SysRoot) -> Vec<NetDevice> {
    let Ok(entries) = fs::read_dir(root.path("sys/class/net")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.iter().map(|n| net_device(root, n)).collect()
}

fn net_device(root: &SysRoot, netdev: &str) -> NetDevice {
    let class = format!("sys/class/net/{netdev}");
    let device = root.path(&class).join("device");
    let canonical = fs::canonicalize(&device).ok();
    // A PCI NIC lists its MSI vectors itself. A virtio device (`virtio0`) has none: its PCI
    // transport parent (`0000:00:03.0`) holds them. A PCI NIC's parent is a bridge whose own
    // vectors (pcieport) are never the NIC's, so the parent counts only for the former.
    let own_msi = device.join("msi_irqs").is_dir();
    let bus: Vec<String> = canonical
        .iter()
        .flat_map(|p| [Some(p.as_path()), p.parent().filter(|_| !own_msi)])
        .flatten()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let driver = fs::canonicalize(device.join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let msi_dir = device.join(if own_msi { "msi_irqs" } else { "../msi_irqs" });
    let mut msi_irqs: Vec<u32> = fs::read_dir(msi_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    msi_irqs.sort_unstable();
    NetDevice {
        ifindex: parse_or(root.read_trimmed(format!("{class}/ifindex")), 0),
        names: DeviceNames {
            netdev: netdev.to_owned(),
            bus,
            driver,
        },
        has_bus_device: canonical.is_some(),
        msi_irqs,
        mtu: root
            .read_trimmed(format!("{class}/mtu"))
            .and_then(|s| s.parse().ok()),
    }
}

fn parse_or(text: Option<String>, default: u32) -> u32 {
    text.and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// `queues/rx-N` with RPS CPUs and `queues/tx-N` with XPS CPUs, by queue number.
pub(crate) fn queues(root: &SysRoot, netdev: &str) -> (Vec<QueueCpus>, Vec<QueueCpus>) {
    let dir = format!("sys/class/net/{netdev}/queues");
    let mut rx = Vec::new();
    let mut tx = Vec::new();
    for entry in fs::read_dir(root.path(&dir))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let (list, mask_file, number) = match name.split_once('-') {
            Some(("rx", n)) => (&mut rx, "rps_cpus", n),
            Some(("tx", n)) => (&mut tx, "xps_cpus", n),
            _ => continue,
        };
        let Ok(queue) = number.parse() else { continue };
        // xps_cpus cannot be read on single-queue devices; RPS may be compiled out: no CPUs.
        let cpus = root
            .read_trimmed(format!("{dir}/{name}/{mask_file}"))
            .map(|m| parse_cpu_mask(&m))
            .unwrap_or_default();
        list.push(QueueCpus { queue, cpus });
    }
    rx.sort_by_key(|q| q.queue);
    tx.sort_by_key(|q| q.queue);
    (rx, tx)
}

/// A sysfs CPU mask (`00000000,0000000a`: 32-bit hex words, most significant first) -> CPUs.
pub(crate) fn parse_cpu_mask(mask: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for (word_index, word) in mask.trim().rsplit(',').enumerate() {
        let Ok(bits) = u32::from_str_radix(word, 16) else {
            return Vec::new();
        };
        let base = 32 * word_index as u32;
        cpus.extend((0..32).filter(|b| bits & (1 << b) != 0).map(|b| base + b));
    }
    cpus.sort_unstable();
    cpus
}

/// A CPU list (`0-3,8,10-11`) -> CPUs.
pub fn parse_cpu_list(list: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let range = match part.split_once('-') {
            Some((a, b)) => a.parse::<u32>().ok().zip(b.parse().ok()),
            None => part.parse().ok().map(|c| (c, c)),
        };
        if let Some((first, last)) = range {
            cpus.extend(first..=last);
        }
    }
    cpus
}

/// The CPUs an IRQ may run on and, when the kernel says, the ones it is delivered to now.
pub(crate) fn irq_affinity(root: &SysRoot, irq: u32) -> (Vec<u32>, Option<Vec<u32>>) {
    let affinity = root
        .read_trimmed(format!("proc/irq/{irq}/smp_affinity_list"))
        .map(|l| parse_cpu_list(&l))
        .unwrap_or_default();
    let effective = root
        .read_trimmed(format!("proc/irq/{irq}/effective_affinity_list"))
        .map(|l| parse_cpu_list(&l));
    (affinity, effective)
}

/// One numbered line of /proc/interrupts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterruptLine {
    pub irq: u32,
    /// Interrupt count per CPU, CPU0 first.
    pub per_cpu: Vec<u64>,
    /// Action names (several when the line is shared: `uhci_hcd:usb1, eth0`).
    pub actions: Vec<String>,
}

pub fn read_interrupts(root: &SysRoot) -> Vec<InterruptLine> {
    root.read_trimmed("proc/interrupts")
        .map(|t| parse_interrupts(&t))
        .unwrap_or_default()
}

/// Parses /proc/interrupts: a header of CPU names, then `IRQ: count... chip hwirq actions`.
/// Lines that are not numbered (NMI, LOC, ...) are left out.
pub(crate) fn parse_interrupts(text: &str) -> Vec<InterruptLine> {
    let mut lines = text.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|line| {
            let (irq, rest) = line.trim_start().split_once(':')?;
            let irq = irq.trim().parse().ok()?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let per_cpu: Vec<u64> = fields
                .iter()
                .take(cpus)
                .map_while(|f| f.parse().ok())
                .collect();
            Some(InterruptLine {
                irq,
                actions: action_names(&fields[per_cpu.len()..]),
                per_cpu,
            })
        })
        .collect()
}

/// After the counts come the chip and the hw IRQ (`PCI-MSIX-0000:00:03.0 1-edge`), on some
/// architectures a trigger word (`Edge`, `Level`), then the action names joined by `, `. A vector
/// that no driver requested has no action.
fn action_names(fields: &[&str]) -> Vec<String> {
    let mut rest = fields.get(2..).unwrap_or_default();
    if let Some((first, tail)) = rest.split_first()
        && matches!(*first, "Edge" | "Level")
    {
        rest = tail;
    }
    rest.join(" ")
        .split(", ")
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_masks_and_lists() {
        assert_eq!(parse_cpu_mask("00000000,0000000a"), vec![1, 3]);
        assert_eq!(parse_cpu_mask("00000001,00000000"), vec![32]);
        assert_eq!(parse_cpu_mask("0"), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("0-2,5,7-8"), vec![0, 1, 2, 5, 7, 8]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
    }

    #[test]
    fn interrupts_with_counts_and_shared_actions() {
        let text = "           CPU0       CPU1\n\
  11:          3          4   IO-APIC  11-fasteoi   uhci_hcd:usb1, eth0\n\
  24:        100          0  PCI-MSIX-0000:00:03.0   1-edge      virtio0-input.0\n\
  30:          0          0  PCI-MSIX-0000:00:03.0   7-edge\n\
 NMI:          0          0   Non-maskable interrupts\n";
        let lines = parse_interrupts(text);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].per_cpu, vec![3, 4]);
        assert_eq!(lines[0].actions, vec!["uhci_hcd:usb1", "eth0"]);
        assert_eq!(lines[1].actions, vec!["virtio0-input.0"]);
        assert_eq!(lines[1].per_cpu, vec![100, 0]);
        assert!(lines[2].actions.is_empty());
    }
}
