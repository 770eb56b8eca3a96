//! What a /proc/interrupts action name says about a network device's vector: whose it is, which
//! queue, and whether it serves RX, TX or both. Drivers name vectors differently:
//!
//! | driver      | queue vectors                          | other vectors                 |
//! |-------------|----------------------------------------|-------------------------------|
//! | virtio_net  | `virtio0-input.3`, `virtio0-output.3`  | `virtio0-config`, `virtio0-virtqueues` (shared) |
//! | mlx5_core   | `mlx5_comp3@pci:0000:3b:00.0`          | `mlx5_async0@pci:0000:3b:00.0` |
//! | ice, i40e   | `ice-eth0-TxRx-3`, `i40e-eth0-TxRx-3`  | `ice-0000:3b:00.0:misc`       |
//! | ixgbe, bnxt | `eth0-TxRx-3`, `eth0-rx-3`, `eth0-tx-3` | `eth0` (link)                |
//!
//! A vector is matched by the names the device goes by ([`DeviceNames`]); mlx5 names only the
//! PCI function, never the netdev, so the PCI address is one of those names.

pub use crate::schema::IrqRole;

/// What one action name says: role and, when the name has one, the queue (channel) number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IrqName {
    pub role: IrqRole,
    pub queue: Option<u32>,
}

/// The names a network device goes by in IRQ action names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceNames {
    /// Interface name (`eth0`).
    pub netdev: String,
    /// Bus device names, innermost first: `virtio0` then its PCI function `0000:00:03.0`.
    pub bus: Vec<String>,
    /// Kernel driver name (`ice`), which some drivers put in front of the netdev name.
    pub driver: Option<String>,
}

/// Classifies `action` (one /proc/interrupts action name) for the device; None when the name
/// belongs to something else.
pub(crate) fn classify(action: &str, names: &DeviceNames) -> Option<IrqName> {
    if let Some((vector, pci)) = action.split_once("@pci:") {
        return names
            .bus
            .iter()
            .any(|b| b == pci)
            .then(|| mlx5_vector(vector));
    }
    let rest = names
        .driver
        .as_deref()
        .and_then(|d| action.strip_prefix(d)?.strip_prefix('-'))
        .unwrap_or(action);
    let owners = std::iter::once(names.netdev.as_str()).chain(names.bus.iter().map(String::as_str));
    for owner in owners {
        let Some(tail) = rest.strip_prefix(owner) else {
            continue;
        };
        if tail.is_empty() {
            return Some(IrqName {
                role: IrqRole::Other,
                queue: None,
            });
        }
        if let Some(suffix) = tail.strip_prefix(['-', '.', '_', ':']) {
            return Some(queue_vector(suffix));
        }
    }
    None
}

/// `comp3` (completion EQ of channel 3, RX and TX) or `async0`, `pages_eq`, `cmd_eq`.
fn mlx5_vector(vector: &str) -> IrqName {
    let kind = vector.strip_prefix("mlx5_").unwrap_or(vector);
    match kind.strip_prefix("comp").and_then(|n| n.parse().ok()) {
        Some(queue) => IrqName {
            role: IrqRole::RxTx,
            queue: Some(queue),
        },
        None => IrqName {
            role: IrqRole::Other,
            queue: None,
        },
    }
}

/// The part after the owner: `input.3`, `TxRx-3`, `rx-3`, `tx-3`, `config`, `misc`, `3`.
fn queue_vector(suffix: &str) -> IrqName {
    let lower = suffix.to_ascii_lowercase();
    let (kind, queue) = match lower.rsplit_once(['-', '.', '_']) {
        Some((kind, number)) => match number.parse::<u32>() {
            Ok(q) => (kind, Some(q)),
            Err(_) => (lower.as_str(), None),
        },
        None => match lower.parse::<u32>() {
            Ok(q) => ("", Some(q)),
            Err(_) => (lower.as_str(), None),
        },
    };
    let role = match kind {
        "input" | "rx" => IrqRole::Rx,
        "output" | "tx" => IrqRole::Tx,
        // A bare number (`eth0-3`, older sfc) is a combined channel vector.
        "txrx" | "" => IrqRole::RxTx,
        // virtio with too few MSI-X vectors: one vector for every virtqueue.
        "virtqueues" => IrqRole::RxTx,
        _ => IrqRole::Other,
    };
    IrqName {
        role,
        queue: queue.filter(|_| role != IrqRole::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(netdev: &str, bus: &[&str], driver: Option<&str>) -> DeviceNames {
        DeviceNames {
            netdev: netdev.into(),
            bus: bus.iter().map(|s| (*s).to_owned()).collect(),
            driver: driver.map(Into::into),
        }
    }

    fn named(role: IrqRole, queue: Option<u32>) -> Option<IrqName> {
        Some(IrqName { role, queue })
    }

    #[test]
    fn virtio_vectors_by_bus_device_name() {
        let dev = names("eth0", &["virtio0", "0000:00:03.0"], Some("virtio_net"));
        assert_eq!(
            classify("virtio0-input.3", &dev),
            named(IrqRole::Rx, Some(3))
        );
        assert_eq!(
            classify("virtio0-output.0", &dev),
            named(IrqRole::Tx, Some(0))
        );
        assert_eq!(
            classify("virtio0-config", &dev),
            named(IrqRole::Other, None)
        );
        assert_eq!(
            classify("virtio0-virtqueues", &dev),
            named(IrqRole::RxTx, None)
        );
        assert_eq!(classify("virtio1-input.0", &dev), None);
        assert_eq!(classify("virtio01-input.0", &dev), None);
    }

    #[test]
    fn mlx5_vectors_by_pci_address_only() {
        let dev = names("ens1f0np0", &["0000:3b:00.0"], Some("mlx5_core"));
        assert_eq!(
            classify("mlx5_comp3@pci:0000:3b:00.0", &dev),
            named(IrqRole::RxTx, Some(3))
        );
        assert_eq!(
            classify("mlx5_async0@pci:0000:3b:00.0", &dev),
            named(IrqRole::Other, None)
        );
        // The second port's function is another device.
        assert_eq!(classify("mlx5_comp3@pci:0000:3b:00.1", &dev), None);
    }

    #[test]
    fn intel_and_broadcom_vectors() {
        let ice = names("eth0", &["0000:3b:00.0"], Some("ice"));
        assert_eq!(
            classify("ice-eth0-TxRx-12", &ice),
            named(IrqRole::RxTx, Some(12))
        );
        assert_eq!(
            classify("ice-0000:3b:00.0:misc", &ice),
            named(IrqRole::Other, None)
        );
        let i40e = names("eth2", &["0000:5e:00.1"], Some("i40e"));
        assert_eq!(
            classify("i40e-eth2-TxRx-0", &i40e),
            named(IrqRole::RxTx, Some(0))
        );
        assert_eq!(classify("i40e-eth20-TxRx-0", &i40e), None);
        let ixgbe = names("eth1", &["0000:04:00.0"], Some("ixgbe"));
        assert_eq!(
            classify("eth1-TxRx-7", &ixgbe),
            named(IrqRole::RxTx, Some(7))
        );
        assert_eq!(classify("eth1-rx-2", &ixgbe), named(IrqRole::Rx, Some(2)));
        assert_eq!(classify("eth1-tx-2", &ixgbe), named(IrqRole::Tx, Some(2)));
        assert_eq!(classify("eth1", &ixgbe), named(IrqRole::Other, None));
        let bnxt = names("enp94s0f0np0", &["0000:5e:00.0"], Some("bnxt_en"));
        assert_eq!(
            classify("enp94s0f0np0-TxRx-3", &bnxt),
            named(IrqRole::RxTx, Some(3))
        );
    }

    #[test]
    fn only_rx_capable_roles_start_rx() {
        assert!(IrqRole::Rx.can_start_rx() && IrqRole::RxTx.can_start_rx());
        assert!(!IrqRole::Tx.can_start_rx() && !IrqRole::Other.can_start_rx());
    }
}
