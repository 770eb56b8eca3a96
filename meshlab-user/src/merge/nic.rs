//! Where a node's kernel events ran ([`Place`]): the event's CPU, and the queue and IRQ it
//! belongs to, completed from the node's device context (startup `devices`, `nic_irqs`).
//!
//! RX events carry the IRQ of their CPU's receive context and, where the driver recorded it,
//! the frame's RX queue: the queue is the frame's own, else the one the IRQ serves. TX events
//! carry the skb's queue_mapping: the IRQ is the vector that serves that TX queue (a `tx` or
//! `rx_tx` vector of the device).
//!
//! The receive context is per CPU, not per queue: on a machine whose NICs or queues share a
//! CPU, a frame of one can carry the IRQ of another (the last IRQ before the softirq run that
//! polled both): [`NodeNic::irq_not_of_frame`]. What the merge makes of it is decided where the
//! context is reduced (reduce.rs `rx_context`); such an IRQ is no part of the frame's place.

use super::HashMap;

use crate::incoming::KernelLine;
use crate::schema::{DeviceContext, Hook, IrqRole, NicIrqInfo, Startup};

use super::event::Place;

/// One node's queue <-> IRQ maps.
#[derive(Clone, Debug, Default)]
pub struct NodeNic {
    /// RX-capable vector -> the queue it serves.
    rx_queue: HashMap<u32, u32>,
    /// (ifindex, TX queue) -> the vector that serves it.
    tx_irq: HashMap<(u32, u32), u32>,
    /// Device name -> ifindex, for events that name their device only.
    ifindex: HashMap<String, u32>,
    /// Every known vector -> the ifindex of the device it belongs to.
    irq_device: HashMap<u32, u32>,
    /// The devices with RX-capable vectors (a few NICs): their frames expect an IRQ.
    rx_devices: Vec<u32>,
}

impl NodeNic {
    pub fn new(startup: &Startup) -> NodeNic {
        NodeNic::from_context(&startup.nic_irqs, &startup.devices)
    }

    fn from_context(nic_irqs: &[NicIrqInfo], devices: &[DeviceContext]) -> NodeNic {
        let mut nic = NodeNic::default();
        for v in nic_irqs {
            nic.ifindex.insert(v.dev.clone(), v.ifindex);
            nic.irq_device.insert(v.irq, v.ifindex);
            nic.rx_devices.push(v.ifindex);
            if let Some(q) = v.queue {
                nic.rx_queue.insert(v.irq, q);
            }
        }
        for dev in devices {
            nic.ifindex.insert(dev.dev.clone(), dev.ifindex);
            for v in &dev.irqs {
                nic.irq_device.entry(v.irq).or_insert(dev.ifindex);
                let Some(q) = v.queue else { continue };
                if v.role.can_start_rx() {
                    nic.rx_queue.entry(v.irq).or_insert(q);
                    nic.rx_devices.push(dev.ifindex);
                }
                if matches!(v.role, IrqRole::Tx | IrqRole::RxTx) {
                    nic.tx_irq.entry((dev.ifindex, q)).or_insert(v.irq);
                }
            }
        }
        nic.rx_devices.sort_unstable();
        nic.rx_devices.dedup();
        nic
    }

    /// The event's device: its ifindex, else the one its device name has.
    fn ifindex_of(&self, k: &KernelLine<'_>) -> Option<u32> {
        (k.ifindex.filter(|&i| i != 0)).or_else(|| self.ifindex.get(k.dev?).copied())
    }

    /// Whether an RX event's frame came from a device with RX vectors (a NIC): its chain
    /// should start at an IRQ of its own. A frame of a device without (veth, a bridge) routed
    /// there from a NIC in the same softirq run did start at that NIC's IRQ.
    pub fn expects_irq(&self, k: &KernelLine<'_>) -> bool {
        self.ifindex_of(k)
            .is_some_and(|d| self.rx_devices.contains(&d))
    }

    /// Whether a NIC frame's context IRQ is not its own ([`Self::irq_not_of_frame`]): that IRQ
    /// and its raise are no part of the frame's chain or place (reduce.rs `rx_context`).
    pub fn foreign_context_irq(&self, k: &KernelLine<'_>) -> bool {
        self.expects_irq(k) && self.irq_not_of_frame(k)
    }

    /// Whether an RX event's context IRQ is known not to be the frame's: a vector of another
    /// device, or of the same device's other RX queue when the frame's queue is known
    /// (module doc).
    fn irq_not_of_frame(&self, k: &KernelLine<'_>) -> bool {
        let (Some(irq), Some(frame_dev)) = (k.irq, self.ifindex_of(k)) else {
            return false;
        };
        let Some(&irq_dev) = self.irq_device.get(&irq) else {
            return false;
        };
        let other_queue = || {
            k.queue
                .zip(self.rx_queue.get(&irq))
                .is_some_and(|(frame, &served)| frame != served)
        };
        irq_dev != frame_dev || other_queue()
    }

    /// The place of one event: CPU always; queue and IRQ on the device stages.
    pub fn place(&self, k: &KernelLine<'_>) -> Place {
        let ifindex = self.ifindex_of(k);
        let (queue, irq) = match k.hook {
            Hook::NetifReceiveSkb => {
                let foreign = self.foreign_context_irq(k);
                let irq = k.irq.filter(|_| k.irq_entry_ns.is_some() && !foreign);
                let served = irq.and_then(|irq| self.rx_queue.get(&irq).copied());
                // A NIC driver records the RX queue; on veth `queue_mapping` still holds the
                // sender's TX queue (the kernel's skb_get_rx_queue reads it all the same).
                let own_queue = k.queue.filter(|_| self.expects_irq(k));
                return Place::new(Some(k.cpu), ifindex, own_queue, irq).or_queue_of_irq(served);
            }
            Hook::NetDevQueue | Hook::NetDevStartXmit | Hook::NetDevXmit | Hook::TxComplete => {
                let irq = ifindex
                    .zip(k.queue)
                    .and_then(|key| self.tx_irq.get(&key).copied());
                (k.queue, irq)
            }
            _ => (None, None),
        };
        Place::new(Some(k.cpu), ifindex, queue, irq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{DeviceIrq, KernelEvent};

    fn irq(irq: u32, role: IrqRole, queue: u32) -> DeviceIrq {
        DeviceIrq {
            irq,
            name: format!("virtio0-{irq}"),
            role,
            queue: Some(queue),
            affinity: vec![0],
            effective_affinity: None,
        }
    }

    fn nic() -> NodeNic {
        let nic_irqs = [NicIrqInfo {
            irq: 30,
            dev: "eth0".into(),
            ifindex: 2,
            queue: Some(1),
        }];
        let devices = [DeviceContext {
            dev: "eth0".into(),
            ifindex: 2,
            irqs: vec![irq(30, IrqRole::Rx, 1), irq(31, IrqRole::Tx, 1)],
            ..DeviceContext::default()
        }];
        NodeNic::from_context(&nic_irqs, &devices)
    }

    #[test]
    fn rx_queue_comes_from_the_context_irq_and_tx_irq_from_the_queue() {
        let nic = nic();
        let mut rx = KernelEvent::new("B".into(), Hook::NetifReceiveSkb, 1);
        rx.cpu = 3;
        rx.ifindex = Some(2);
        rx.irq = Some(30);
        rx.irq_entry_ns = Some(1);
        let p = nic.place(&KernelLine::of(&rx));
        assert_eq!((p.cpu(), p.queue(), p.irq()), (Some(3), Some(1), Some(30)));
        // An event naming its device only (synthetic recordings) still gets its ifindex.
        rx.ifindex = None;
        rx.dev = Some("eth0".into());
        assert_eq!(nic.place(&KernelLine::of(&rx)).ifindex(), Some(2));
        // A context without an IRQ (veth, loopback): no queue either.
        rx.irq_entry_ns = None;
        assert_eq!(nic.place(&KernelLine::of(&rx)).queue(), None);
        let mut tx = KernelEvent::new("B".into(), Hook::NetDevXmit, 1);
        tx.ifindex = Some(2);
        tx.queue = Some(1);
        let p = nic.place(&KernelLine::of(&tx));
        assert_eq!((p.queue(), p.irq()), (Some(1), Some(31)));
        tx.queue = Some(5);
        assert_eq!(
            nic.place(&KernelLine::of(&tx)).irq(),
            None,
            "no vector serves queue 5"
        );
        let sched = KernelEvent::new("B".into(), Hook::SchedSwitch, 1);
        assert_eq!(nic.place(&KernelLine::of(&sched)).queue(), None);
    }

    #[test]
    fn an_rx_frame_is_placed_on_its_own_queue_without_another_queues_irq() {
        // eth0's queue 0 is served by vector 30, queue 1 by 32; both may run on one CPU.
        let devices = [DeviceContext {
            dev: "eth0".into(),
            ifindex: 2,
            irqs: vec![irq(30, IrqRole::RxTx, 0), irq(32, IrqRole::RxTx, 1)],
            ..DeviceContext::default()
        }];
        let nic = NodeNic::from_context(&[], &devices);
        let mut rx = KernelEvent::new("B".into(), Hook::NetifReceiveSkb, 1);
        rx.ifindex = Some(2);
        rx.irq_entry_ns = Some(1);
        // (frame's queue, context IRQ, its place's queue and IRQ)
        for (queue, ctx_irq, placed) in [
            (Some(1), 32, (Some(1), Some(32))), // its own queue's IRQ
            (Some(1), 30, (Some(1), None)),     // queue 0's IRQ: not the frame's
            (Some(0), 30, (Some(0), Some(30))),
            (None, 32, (Some(1), Some(32))), // no recorded queue: the IRQ's
        ] {
            rx.queue = queue;
            rx.irq = Some(ctx_irq);
            let k = KernelLine::of(&rx);
            let p = nic.place(&k);
            assert_eq!(
                (p.queue(), p.irq()),
                placed,
                "queue {queue:?}, IRQ {ctx_irq}"
            );
            assert_eq!(nic.irq_not_of_frame(&k), placed.1.is_none());
            // Without the IRQ (a stale context, index.rs) a queue of the frame's own stays.
            assert_eq!(p.without_irq().queue(), queue);
        }
        // A veth frame routed from eth0's queue 1 keeps that IRQ and queue (reduce.rs too);
        // its own `queue` is the veth sender's TX queue, no RX queue.
        rx.ifindex = Some(7);
        rx.queue = Some(3);
        let p = nic.place(&KernelLine::of(&rx));
        assert_eq!((p.queue(), p.irq()), (Some(1), Some(32)));
    }

    #[test]
    fn a_context_irq_is_known_to_be_another_devices_by_its_vector() {
        let nic_irqs = [(30, "eth0", 2), (50, "eth1", 3)].map(|(irq, dev, ifindex)| NicIrqInfo {
            irq,
            dev: dev.into(),
            ifindex,
            queue: Some(0),
        });
        let nic = NodeNic::from_context(&nic_irqs, &[]);
        let mut rx = KernelEvent::new("B".into(), Hook::NetifReceiveSkb, 1);
        rx.irq_entry_ns = Some(1);
        // (frame's device, context IRQ, the IRQ known to be another device's)
        for (ifindex, irq, other) in [
            (2, 30, false), // eth0's frame, eth0's IRQ
            (2, 50, true),  // eth0's frame, eth1's IRQ
            (3, 30, true),  // eth1's frame, eth0's IRQ
            (7, 30, true),  // a veth frame routed from eth0 (reduce.rs keeps its IRQ)
            (2, 99, false), // a vector the startup record does not name
        ] {
            rx.ifindex = Some(ifindex);
            rx.irq = Some(irq);
            let k = KernelLine::of(&rx);
            assert_eq!(
                nic.irq_not_of_frame(&k),
                other,
                "frame {ifindex}, IRQ {irq}"
            );
        }
    }
}
