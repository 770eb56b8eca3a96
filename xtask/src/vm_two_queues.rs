//! Two RX queues of one NIC sharing one CPU, on a real (virtio) NIC: both guests have one
//! vCPU and a two-queue NIC (`vm run --queues 2`, a multi-queue tap link; `ethtool -L eth0
//! combined 2` in each guest), and the lab client opens several connections, which the host's
//! tap spreads over the queues by flow. Every IRQ vector of both queues then fires on the same
//! CPU, so a frame's CPU context alone cannot tell its queue: the merge must place each frame
//! on its own queue (its `skb_record_rx_queue`, docs/coverage-audit.md).
//!
//! Run by vm_scenarios.rs (`two_queue_scenario`), which checks B's recording and the merge of
//! both: every RX frame carries a queue one of its vectors serves and most their IRQ; each
//! queue took a share of the frames, all on one CPU (here); `report --nic` counts, per queue,
//! what /proc/interrupts counted within 1 % and has requests with stages on each queue
//! (vm_irq_counts.rs); the requests join across the two guests' clocks (vm_two_machines.rs).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, ensure};

use crate::read_ndjson;
use crate::vm_two_machines::Traffic;

pub const TRAFFIC: Traffic = Traffic {
    queues: 2,
    // The tap hashes each flow to a queue: with 16 flows, the chance that a queue gets none
    // is 2 in 2^16.
    connections: 16,
    // Unlimited, 16 connections made ~1000 requests/s, and guest B's recorder, sharing its one
    // vCPU with the server and the softirqs, dropped 4.3 % of the events in a CI run (none in
    // the run before it): a drop costs the check its pairs of transmits and completions.
    qps: 400,
    // At least 1000 requests from A, the cross-machine check's least.
    seconds: 4,
};
/// Each queue's least share of B's RX frames on eth0 (one flow of 16 is about 6 %).
const MIN_QUEUE_SHARE: f64 = 0.03;

/// B's RX frames on eth0 came in on every queue of the NIC, each with its share, and all on
/// one CPU.
pub fn check_queues_share_a_cpu(path: &Path) -> Result<()> {
    let records = read_ndjson(path)?;
    let rx = records.iter().filter(|r| {
        r["type"] == "kernel" && r["hook"] == "netif_receive_skb" && r["dev"] == "eth0"
    });
    let mut per_queue: BTreeMap<u64, usize> = BTreeMap::new();
    let mut cpus: BTreeMap<u64, usize> = BTreeMap::new();
    for frame in rx {
        let queue = frame["queue"]
            .as_u64()
            .context("an RX frame without queue")?;
        *per_queue.entry(queue).or_default() += 1;
        *cpus
            .entry(frame["cpu"].as_u64().context("cpu")?)
            .or_default() += 1;
    }
    let total: usize = per_queue.values().sum();
    eprintln!("vm two queues: B's RX frames on eth0 per queue {per_queue:?}, per CPU {cpus:?}");
    ensure!(
        per_queue.len() == usize::from(TRAFFIC.queues),
        "frames on queues {per_queue:?}, not on all {} queues",
        TRAFFIC.queues
    );
    for (queue, frames) in &per_queue {
        ensure!(
            *frames as f64 >= MIN_QUEUE_SHARE * total as f64,
            "queue {queue}: {frames} of {total} frames (less than {:.0} %)",
            MIN_QUEUE_SHARE * 100.0
        );
    }
    ensure!(cpus.len() == 1, "frames on CPUs {cpus:?}, not on one");
    Ok(())
}
