//! Network devices: which IRQs belong to which device and queue (for the kernel programs'
//! NIC IRQ map) and each device's settings at start-up (the startup record's `devices`).

pub mod ethtool;
pub mod hwstamp;
pub mod hwstamp_ioctl;
pub mod irq_names;
pub mod phc;
pub mod phc_ioctl;
pub mod stamping;
pub mod sysfs;

use std::collections::BTreeMap;

use ethtool::{EthtoolError, EthtoolSocket};
use sysfs::{InterruptLine, NetDevice, SysRoot};

use crate::schema::{DeviceContext, DeviceIrq, IrqRole, NicIrqInfo};

/// Every vector of `dev`: its MSI vectors and the /proc/interrupts lines whose action names
/// name it. A vector in `msi_irqs` whose name belongs to another device (another function of
/// a shared PCI parent) is left out; one with no action yet is kept with role `other`.
pub(crate) fn device_irqs(
    root: &SysRoot,
    dev: &NetDevice,
    interrupts: &[InterruptLine],
) -> Vec<DeviceIrq> {
    let by_irq: BTreeMap<u32, &InterruptLine> = interrupts.iter().map(|l| (l.irq, l)).collect();
    let mut irqs: Vec<u32> = dev.msi_irqs.clone();
    irqs.extend(
        interrupts
            .iter()
            .filter(|l| {
                l.actions
                    .iter()
                    .any(|a| irq_names::classify(a, &dev.names).is_some())
            })
            .map(|l| l.irq),
    );
    irqs.sort_unstable();
    irqs.dedup();
    irqs.into_iter()
        .filter_map(|irq| {
            let actions = by_irq
                .get(&irq)
                .map(|l| l.actions.as_slice())
                .unwrap_or_default();
            let (name, classified) = match actions
                .iter()
                .find_map(|a| Some((a, irq_names::classify(a, &dev.names)?)))
            {
                Some((name, c)) => (name.clone(), c),
                None if actions.is_empty() => (String::new(), unnamed()),
                None => return None,
            };
            let (affinity, effective_affinity) = sysfs::irq_affinity(root, irq);
            Some(DeviceIrq {
                irq,
                name,
                role: classified.role,
                queue: classified.queue,
                affinity,
                effective_affinity,
            })
        })
        .collect()
}

fn unnamed() -> irq_names::IrqName {
    irq_names::IrqName {
        role: IrqRole::Other,
        queue: None,
    }
}

/// The IRQs that can start a receive path on any device, for the kernel programs' NIC IRQ map
/// (an RX event must never carry a TX completion's IRQ).
pub fn nic_irqs(root: &SysRoot) -> Vec<NicIrqInfo> {
    let interrupts = sysfs::read_interrupts(root);
    sysfs::net_devices(root)
        .iter()
        .flat_map(|dev| {
            device_irqs(root, dev, &interrupts)
                .into_iter()
                .filter(|irq| irq.role.can_start_rx())
                .map(|irq| NicIrqInfo {
                    irq: irq.irq,
                    dev: dev.names.netdev.clone(),
                    ifindex: dev.ifindex,
                    queue: irq.queue,
                })
        })
        .collect()
}

/// Settings of the devices a recording traces: `only` when the recording is restricted to one
/// device, else every interface with a bus device (NICs and virtio; not lo, veth, bridges).
pub fn device_contexts(root: &SysRoot, only: Option<&str>) -> Vec<DeviceContext> {
    let interrupts = sysfs::read_interrupts(root);
    let mut socket = EthtoolSocket::open();
    sysfs::net_devices(root)
        .iter()
        .filter(|d| match only {
            Some(name) => d.names.netdev == name,
            None => d.has_bus_device,
        })
        .map(|dev| {
            let mut ctx = sysfs_context(root, dev, &interrupts);
            match &mut socket {
                Ok(sock) => add_ethtool(&mut ctx, sock),
                Err(e) => ctx.unavailable.push(format!("ethtool netlink: {e}")),
            }
            ctx
        })
        .collect()
}

/// The part of a device's context that sysfs and procfs give.
pub fn sysfs_context(
    root: &SysRoot,
    dev: &NetDevice,
    interrupts: &[InterruptLine],
) -> DeviceContext {
    let (rx_queues, tx_queues) = sysfs::queues(root, &dev.names.netdev);
    DeviceContext {
        dev: dev.names.netdev.clone(),
        ifindex: dev.ifindex,
        driver: dev.names.driver.clone(),
        mtu: dev.mtu,
        rx_queues,
        tx_queues,
        irqs: device_irqs(root, dev, interrupts),
        ..DeviceContext::default()
    }
}

/// Adds what ethtool reports; a request the driver does not support is named in `unavailable`.
fn add_ethtool(ctx: &mut DeviceContext, sock: &mut EthtoolSocket) {
    let dev = ctx.dev.clone();
    let mut note = |part: &str, e: EthtoolError| ctx_note(&mut ctx.unavailable, part, e);
    match ethtool::driver_info(&dev) {
        Ok(info) => {
            let some = |s: String| (!s.is_empty()).then_some(s);
            ctx.driver = some(info.driver).or(ctx.driver.take());
            ctx.driver_version = some(info.version);
            ctx.firmware = some(info.firmware);
            ctx.bus_info = some(info.bus_info);
        }
        Err(e) => note("driver info", e),
    }
    ctx.channels = sock.channels(&dev).map_err(|e| note("channels", e)).ok();
    ctx.rings = sock.rings(&dev).map_err(|e| note("rings", e)).ok();
    ctx.coalesce = sock.coalesce(&dev).map_err(|e| note("coalesce", e)).ok();
    ctx.offloads = sock.offloads(&dev).map_err(|e| note("offloads", e)).ok();
    ctx.timestamping = sock
        .timestamping(&dev)
        .map_err(|e| note("timestamping", e))
        .ok();
}

fn ctx_note(unavailable: &mut Vec<String>, part: &str, e: EthtoolError) {
    unavailable.push(format!("{part}: {e}"));
}
