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
//! (vm_irq_counts.rs), and every request B received is on one of B's RX queues, those polled
//! without an IRQ of their own included ([`check_every_request_on_an_rx_queue`]); the requests
//! join across the two guests' clocks (vm_two_machines.rs).

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
    // 3200 requests at best; the cross-machine check wants at least 1000 from A, which leaves
    // room for the TCG guest stalling (whole seconds on a loaded host, docs/vm.md).
    seconds: 8,
    second_addr: None,
};
/// Each queue's least share of B's RX frames on eth0 (one flow of 16 is about 6 %).
const MIN_QUEUE_SHARE: f64 = 0.03;

/// B's recording started with the queues in use (its startup record's device context), and
/// its RX frames on eth0 came in on every one of them, each with its share, all on one CPU.
pub fn check_queues_share_a_cpu(records: &[serde_json::Value]) -> Result<()> {
    let devices = (records.first()).and_then(|startup| startup["devices"].as_array());
    let eth0 = (devices.into_iter().flatten()).find(|d| d["dev"] == "eth0");
    let combined = eth0.and_then(|d| d["channels"]["combined"].as_u64());
    ensure!(
        combined == Some(u64::from(TRAFFIC.queues)),
        "B's startup record: eth0 channels combined {combined:?}, not {}",
        TRAFFIC.queues
    );
    let rx = records.iter().filter(|r| {
        r["type"] == "kernel" && r["hook"] == "netif_receive_skb" && r["dev"] == "eth0"
    });
    let mut per_queue: BTreeMap<u64, usize> = BTreeMap::new();
    let mut cpus: BTreeMap<u64, usize> = BTreeMap::new();
    for frame in rx {
        let queue = (frame["queue"].as_u64()).with_context(|| format!("no queue: {frame}"))?;
        let cpu = (frame["cpu"].as_u64()).with_context(|| format!("no cpu: {frame}"))?;
        *per_queue.entry(queue).or_default() += 1;
        *cpus.entry(cpu).or_default() += 1;
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

/// `report --nic` (vm_irq_counts.rs wrote its merge and report in `dir`) counts each request
/// B received on exactly one of B's RX queues (of any NIC): the rows' request counts add up to
/// the merged requests with B's `rx_ip_tcp` stage (one small message, one frame). A frame polled
/// without an IRQ of its own has no IRQ stage: it counts through the stage it carries on.
pub fn check_every_request_on_an_rx_queue(dir: &Path) -> Result<()> {
    let path = dir.join("nic.report.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let report =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let merged = read_ndjson(&dir.join(crate::vm_irq_counts::NIC_MERGED))?;
    every_request_on_an_rx_queue(&report, &merged)
}

fn every_request_on_an_rx_queue(
    report: &serde_json::Value,
    merged: &[serde_json::Value],
) -> Result<()> {
    let nodes = report["nodes"].as_array().context("report: nodes")?;
    let b = (nodes.iter().find(|n| n["node"] == "B")).context("report: no node B")?;
    let mut on_queues = BTreeMap::new();
    for row in b["queues"].as_array().into_iter().flatten() {
        if row["dir"] == "rx"
            && let (Some(dev), Some(queue)) = (row["dev"].as_str(), row["queue"].as_u64())
        {
            let requests = row["requests"].as_u64().context("report: requests")?;
            on_queues.insert(format!("{dev} queue {queue}"), requests);
        }
    }
    let received_by_b = |r: &&serde_json::Value| {
        let mut segments = r["segments"].as_array().into_iter().flatten();
        segments.any(|s| s["name"] == "rx_ip_tcp" && s["node"] == "B")
    };
    let received = (merged.iter())
        .filter(|r| r["type"] == "request")
        .filter(received_by_b)
        .count() as u64;
    let counted: u64 = on_queues.values().sum();
    eprintln!(
        "vm rx queues: requests B received {received}, on B's RX queues {on_queues:?} ({counted})"
    );
    ensure!(
        received > 0,
        "no merged request B received: nothing was counted"
    );
    ensure!(
        counted == received,
        "report --nic counts {counted} requests on B's RX queues {on_queues:?}, not the \
         {received} B received"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::{TRAFFIC, every_request_on_an_rx_queue};
    use crate::vm_two_machines::{Traffic, guest_scripts};

    fn scripts(traffic: &Traffic) -> (String, String) {
        let s = guest_scripts(
            Path::new("/m"),
            Path::new("/d"),
            ("10.0.0.2", traffic),
            false,
            None,
        );
        (s.a, s.b)
    }

    #[test]
    fn every_request_b_received_must_be_on_one_of_its_rx_queues() {
        let report = |q0: u64, q1: u64| {
            json!({"nodes": [{"node": "B", "queues": [
                {"dev": "eth0", "dir": "tx", "queue": 0, "requests": 9},
                {"dev": "eth0", "dir": "rx", "queue": null, "requests": 0},
                {"dev": "eth0", "dir": "rx", "queue": 0, "requests": q0},
                {"dev": "eth0", "dir": "rx", "queue": 1, "requests": q1}]}]})
        };
        let request = |node: &str| {
            json!({"type": "request", "segments": [
                {"name": "rx_ip_tcp", "node": node}, {"name": "rx_napi_poll", "node": "B"}]})
        };
        let merged = [
            json!({"type": "summary"}),
            request("B"),
            request("B"),
            request("A"),
        ];
        assert!(every_request_on_an_rx_queue(&report(1, 1), &merged).is_ok());
        let err = every_request_on_an_rx_queue(&report(1, 0), &merged).unwrap_err();
        assert!(err.to_string().contains("counts 1 requests"), "{err}");
        assert!(every_request_on_an_rx_queue(&report(2, 1), &merged).is_err());
    }

    #[test]
    fn both_guests_turn_the_queues_on_before_recording() {
        for script in <[String; 2]>::from(scripts(&TRAFFIC)) {
            let ethtool = script.find("ethtool -L eth0 combined 2 || exit 1;");
            let record = script.find("/m record ");
            assert!(ethtool.is_some() && ethtool < record, "{script}");
        }
        let (a, _) = scripts(&TRAFFIC);
        assert!(
            a.contains("--duration 8s --concurrency 16 --qps 400"),
            "{a}"
        );
    }

    #[test]
    fn one_queue_leaves_the_nic_and_the_client_as_they_were() {
        let (a, b) = scripts(&Traffic::SINGLE);
        assert!(!a.contains("ethtool") && !b.contains("ethtool"));
        assert!(a.contains("--duration 1s --concurrency 1 --qps 0"), "{a}");
    }
}
