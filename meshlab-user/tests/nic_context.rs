//! Device context and IRQ-to-queue mapping on sysfs/procfs snapshots
//! (tests/fixtures/nic/README.md says where each comes from), plus the live ethtool netlink
//! client on this machine's interfaces.

use std::path::PathBuf;

use meshlab_user::kernel::nic::{self, sysfs::SysRoot};
use meshlab_user::schema::{DeviceContext, DeviceIrq, IrqRole, NicIrqInfo};

fn snapshot(name: &str) -> SysRoot {
    SysRoot::at(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/nic")
            .join(name),
    )
}

fn context(root: &SysRoot, dev: &str) -> DeviceContext {
    let interrupts = nic::sysfs::read_interrupts(root);
    let device = nic::sysfs::net_devices(root)
        .into_iter()
        .find(|d| d.names.netdev == dev)
        .unwrap_or_else(|| panic!("{dev} not in the snapshot"));
    nic::sysfs_context(root, &device, &interrupts)
}

/// (irq, role, queue) of each vector.
fn vectors(irqs: &[DeviceIrq]) -> Vec<(u32, IrqRole, Option<u32>)> {
    irqs.iter().map(|i| (i.irq, i.role, i.queue)).collect()
}

#[test]
fn virtio_net_vectors_from_the_pci_parent() {
    let root = snapshot("virtio");
    let ctx = context(&root, "eth0");
    assert_eq!(ctx.driver.as_deref(), Some("virtio_net"));
    assert_eq!(ctx.ifindex, 2);
    assert_eq!(
        vectors(&ctx.irqs),
        vec![
            (37, IrqRole::Other, None),
            (38, IrqRole::Rx, Some(0)),
            (39, IrqRole::Tx, Some(0)),
        ]
    );
    assert_eq!(ctx.irqs[1].name, "virtio2-input.0");
    assert_eq!(ctx.irqs[1].affinity, vec![0, 1]);
    assert_eq!(ctx.irqs[1].effective_affinity, Some(vec![1]));
    assert_eq!((ctx.rx_queues.len(), ctx.tx_queues.len()), (1, 1));
    // Other virtio devices on the same machine (balloon virtio0, vsock virtio3 with `-rx`) are
    // not eth0's.
    let irqs: Vec<u32> = nic::nic_irqs(&root).iter().map(|i| i.irq).collect();
    assert_eq!(irqs, vec![38]);
}

#[test]
fn mlx5_completion_vectors_by_pci_function_per_port() {
    let root = snapshot("mlx5");
    let port0 = context(&root, "ens1f0np0");
    assert_eq!(port0.driver.as_deref(), Some("mlx5_core"));
    assert_eq!(
        vectors(&port0.irqs),
        vec![
            (60, IrqRole::Other, None),
            (61, IrqRole::RxTx, Some(0)),
            (62, IrqRole::RxTx, Some(1)),
            (63, IrqRole::RxTx, Some(2)),
            (64, IrqRole::RxTx, Some(3)),
        ]
    );
    assert_eq!(port0.irqs[4].name, "mlx5_comp3@pci:0000:3b:00.0");
    assert_eq!(port0.tx_queues[2].cpus, vec![2], "XPS of tx-2 is CPU 2");
    let port1 = context(&root, "ens1f1np1");
    assert_eq!(
        port1.irqs.iter().map(|i| i.irq).collect::<Vec<_>>(),
        vec![70, 71, 72, 73, 74]
    );
    let rx_map = nic::nic_irqs(&root);
    assert_eq!(rx_map.len(), 8, "4 completion vectors per port: {rx_map:?}");
    assert!(rx_map.contains(&NicIrqInfo {
        irq: 73,
        dev: "ens1f1np1".into(),
        ifindex: 5,
        queue: Some(2),
    }));
}

#[test]
fn ice_i40e_bnxt_ixgbe_side_by_side() {
    let root = snapshot("intel-broadcom");
    let ice = context(&root, "eth0");
    assert_eq!(
        vectors(&ice.irqs),
        vec![
            (90, IrqRole::Other, None),
            (91, IrqRole::RxTx, Some(0)),
            (92, IrqRole::RxTx, Some(1)),
        ]
    );
    assert_eq!(ice.rx_queues[0].cpus, vec![0, 1], "RPS of rx-0");
    assert!(ice.rx_queues[1].cpus.is_empty(), "RPS off on rx-1");
    let i40e = context(&root, "eth2");
    assert_eq!(
        vectors(&i40e.irqs),
        vec![
            (100, IrqRole::Other, None),
            (101, IrqRole::RxTx, Some(0)),
            (102, IrqRole::RxTx, Some(1)),
        ]
    );
    // bnxt: vector 112 is allocated but not requested (no action name yet).
    let bnxt = context(&root, "enp94s0f0np0");
    assert_eq!(bnxt.driver.as_deref(), Some("bnxt_en"));
    assert_eq!(
        vectors(&bnxt.irqs),
        vec![
            (110, IrqRole::RxTx, Some(0)),
            (111, IrqRole::RxTx, Some(1)),
            (112, IrqRole::Other, None),
        ]
    );
    // ixgbe with separate RX and TX vectors; the PCIe bridge's vectors (125, 126) and the
    // shared legacy line naming `eth20` are not eth1's.
    let ixgbe = context(&root, "eth1");
    assert_eq!(
        vectors(&ixgbe.irqs),
        vec![
            (120, IrqRole::Rx, Some(0)),
            (121, IrqRole::Rx, Some(1)),
            (122, IrqRole::Tx, Some(0)),
            (123, IrqRole::Tx, Some(1)),
            (124, IrqRole::Other, None),
        ]
    );
    let rx_map: Vec<(String, u32)> = nic::nic_irqs(&root)
        .into_iter()
        .map(|i| (i.dev, i.irq))
        .collect();
    assert_eq!(rx_map.len(), 8, "{rx_map:?}");
    assert!(
        !rx_map
            .iter()
            .any(|(_, irq)| [122, 124, 125, 126, 130].contains(irq))
    );
}

/// The live ethtool client on this machine: every interface with a bus device gets a context,
/// and each ethtool part is either read or named in `unavailable` with the kernel's reason.
#[test]
fn live_device_contexts_read_or_explain_every_part() {
    let contexts = nic::device_contexts(&SysRoot::live(), None);
    for ctx in &contexts {
        let parts = [
            ("channels", ctx.channels.is_some()),
            ("rings", ctx.rings.is_some()),
            ("coalesce", ctx.coalesce.is_some()),
            ("offloads", ctx.offloads.is_some()),
            ("timestamping", ctx.timestamping.is_some()),
        ];
        for (part, read) in parts {
            let explained = ctx.unavailable.iter().any(|u| u.starts_with(part));
            assert!(
                read != explained,
                "{}: {part} read={read} explained={explained}: {ctx:?}",
                ctx.dev
            );
        }
        if ctx.driver.as_deref() == Some("virtio_net") {
            let rings = ctx.rings.expect("virtio_net reports its rings");
            assert!(rings.rx > 0 && rings.rx <= rings.rx_max, "{rings:?}");
            let channels = ctx.channels.expect("virtio_net reports its channels");
            assert!(channels.combined >= 1, "{channels:?}");
            assert_eq!(ctx.rx_queues.len() as u32, channels.combined);
            // Every driver gets at least the kernel's software RX stamps; virtio has no PHC.
            let ts = ctx.timestamping.as_ref().expect("TSINFO_GET answers");
            assert!(
                ts.software_rx && !ts.hardware_tx && ts.phc_index.is_none(),
                "{ts:?}"
            );
        }
    }
    // `lo` has no bus device but can be asked for by name; loopback has features, no rings.
    let lo = nic::device_contexts(&SysRoot::live(), Some("lo"));
    assert_eq!(lo.len(), 1);
    assert!(lo[0].offloads.is_some(), "{:?}", lo[0]);
    assert!(lo[0].rings.is_none() && lo[0].unavailable.iter().any(|u| u.starts_with("rings")));
}
