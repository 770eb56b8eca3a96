//! Facts about the running system that the loader and `doctor` need: kernel release, mounts
//! (cgroup2, tracefs, bpffs), lockdown, and which IRQs belong to network devices.

use std::fs;
use std::path::{Path, PathBuf};

use crate::schema::NicIrqInfo;

/// `uname -r`.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The lockdown mode in brackets in /sys/kernel/security/lockdown (`none`, `integrity`, ...).
pub fn lockdown_mode() -> Option<String> {
    let text = fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let start = text.find('[')? + 1;
    let end = text[start..].find(']')? + start;
    Some(text[start..end].to_owned())
}

/// One mount from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
}

/// Parses /proc/self/mountinfo text: field 5 is the mount point, the field after " - " the type.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let fs_type = right.split(' ').next()?;
            Some(Mount {
                mount_point: PathBuf::from(unescape_mount_path(mount_point)),
                fs_type: fs_type.to_owned(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn mounts() -> Vec<Mount> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The first mount of `fs_type` (e.g. `cgroup2`, `tracefs`, `bpf`).
pub fn find_mount(mounts: &[Mount], fs_type: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .find(|m| m.fs_type == fs_type)
        .map(|m| m.mount_point.clone())
}

/// Mounts tracefs at /sys/kernel/tracing if no tracefs is mounted (needed for classic
/// tracepoints and kprobes, which aya resolves through tracefs). Returns where it is.
pub fn ensure_tracefs() -> Result<PathBuf, String> {
    if let Some(p) = find_mount(&mounts(), "tracefs") {
        return Ok(p);
    }
    let target = Path::new("/sys/kernel/tracing");
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    // SAFETY: valid NUL-terminated strings; mount(2) has no memory-safety preconditions.
    let rc = unsafe {
        libc::mount(
            c("nodev").as_ptr(),
            c("/sys/kernel/tracing").as_ptr(),
            c("tracefs").as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(target.to_owned())
    } else {
        Err(format!(
            "mount -t tracefs nodev /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// IRQs that belong to network devices. Found two ways, because drivers differ:
/// - MSI IRQs listed under the device's sysfs node (`/sys/class/net/DEV/device/msi_irqs`) or,
///   for virtio, under its PCI parent (`device/../msi_irqs`);
/// - /proc/interrupts actions named after the interface or its bus device (`eth0-TxRx-0`,
///   `virtio0-input.0`).
///
/// Config vectors and transmit-only vectors are left out: only IRQs that can start an RX path
/// count, so an RX event never carries a TX completion's IRQ.
pub fn nic_irqs() -> Vec<NicIrqInfo> {
    let interrupts = fs::read_to_string("/proc/interrupts").unwrap_or_default();
    let names = parse_interrupt_names(&interrupts);
    let mut out = Vec::new();
    let Ok(devs) = fs::read_dir("/sys/class/net") else {
        return out;
    };
    for dev in devs.flatten() {
        let dev_name = dev.file_name().to_string_lossy().into_owned();
        let ifindex = fs::read_to_string(dev.path().join("ifindex"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        let device = dev.path().join("device");
        // The bus device's own name (e.g. `virtio0`), which virtio uses in IRQ names.
        let bus_name = fs::canonicalize(&device)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let mut irqs: Vec<u32> = [device.join("msi_irqs"), device.join("../msi_irqs")]
            .iter()
            .filter_map(|dir| fs::read_dir(dir).ok())
            .flat_map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            })
            .collect();
        let prefixes: Vec<&str> = std::iter::once(dev_name.as_str())
            .chain(bus_name.as_deref())
            .collect();
        irqs.extend(
            names
                .iter()
                .filter(|(_, n)| names_device(n, &prefixes))
                .map(|(irq, _)| *irq),
        );
        irqs.sort_unstable();
        irqs.dedup();
        for irq in irqs {
            let name = names
                .iter()
                .find(|(i, _)| *i == irq)
                .map(|(_, n)| n.as_str())
                .unwrap_or("");
            // MSI vectors of a shared PCI parent may belong to another function: keep only
            // vectors whose name points at this device, when the name says anything at all.
            if !name.is_empty() && !names_device(name, &prefixes) {
                continue;
            }
            if !can_start_rx(name) {
                continue;
            }
            out.push(NicIrqInfo {
                irq,
                dev: dev_name.clone(),
                ifindex,
                queue: queue_from_irq_name(name),
            });
        }
    }
    out
}

/// Whether an IRQ action name belongs to one of the device names (`eth0`, `eth0-rx-1`,
/// `virtio0-input.0`).
fn names_device(action: &str, prefixes: &[&str]) -> bool {
    action.split(',').map(str::trim).any(|a| {
        prefixes.iter().any(|p| {
            a == *p
                || a.strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with(['-', '.', '_', '@']))
        })
    })
}

/// Config vectors (virtio `-config`) and transmit-only vectors carry no received packets.
fn can_start_rx(action: &str) -> bool {
    let lower = action.to_ascii_lowercase();
    !(lower.ends_with("-config")
        || lower.contains("-output")
        || lower.contains("-tx-")
        || lower.ends_with("-tx"))
}

/// (irq number, action names) from /proc/interrupts text.
pub fn parse_interrupt_names(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|line| {
            let (irq, rest) = line.trim_start().split_once(':')?;
            let irq: u32 = irq.trim().parse().ok()?;
            // After the per-CPU counts come the chip, the hw irq and the action names; the
            // action is the last whitespace-separated field(s). Keep the last token.
            let name = rest.split_whitespace().last()?.to_owned();
            Some((irq, name))
        })
        .collect()
}

/// `virtio0-input.3` -> 3, `eth0-TxRx-1` -> 1; None without a separated trailing number.
pub fn queue_from_irq_name(name: &str) -> Option<u32> {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &name[stem.len()..];
    // Require a separator so a device name's own number (`eth0`) is not taken for a queue.
    if digits.is_empty() || !stem.ends_with(['.', '-', '_']) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_finds_cgroup2_under_unified() {
        let text = "\
24 29 0:22 / /sys rw,nosuid - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
40 24 0:35 / /sys/kernel/my\\040dir rw - tracefs nodev rw";
        let mounts = parse_mountinfo(text);
        assert_eq!(
            find_mount(&mounts, "cgroup2").unwrap(),
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            find_mount(&mounts, "tracefs").unwrap(),
            PathBuf::from("/sys/kernel/my dir")
        );
        assert_eq!(find_mount(&mounts, "bpf"), None);
    }

    #[test]
    fn nic_irq_names_match_interface_or_bus_device_and_rx_vectors_only() {
        let prefixes = ["eth0", "virtio0"];
        assert!(names_device("virtio0-input.0", &prefixes));
        assert!(names_device("eth0-TxRx-3", &prefixes));
        assert!(names_device("eth0", &prefixes));
        assert!(!names_device("virtio1-input.0", &prefixes));
        assert!(!names_device("eth01", &prefixes));
        assert!(
            can_start_rx("virtio0-input.0")
                && can_start_rx("eth0-TxRx-3")
                && can_start_rx("eth0-rx-1")
        );
        assert!(
            !can_start_rx("virtio0-config")
                && !can_start_rx("virtio0-output.0")
                && !can_start_rx("eth0-tx-1")
        );
    }

    #[test]
    fn interrupt_names_and_queues() {
        let text = "           CPU0       CPU1\n 24:     100     0  PCI-MSIX-0000:00:03.0   1-edge      virtio0-input.0\n 25:   5   6  PCI-MSIX-0000:00:03.0   2-edge      virtio0-output.0\nNMI:   0   0   Non-maskable interrupts\n";
        let names = parse_interrupt_names(text);
        assert_eq!(
            names,
            vec![
                (24, "virtio0-input.0".to_owned()),
                (25, "virtio0-output.0".to_owned())
            ]
        );
        assert_eq!(queue_from_irq_name("virtio0-input.0"), Some(0));
        assert_eq!(queue_from_irq_name("eth0-TxRx-12"), Some(12));
        assert_eq!(queue_from_irq_name("eth0"), None);
        assert_eq!(queue_from_irq_name("timer"), None);
    }
}
