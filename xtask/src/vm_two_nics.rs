//! Two NICs of one machine sharing one CPU, on real (virtio) NICs: both guests have one vCPU
//! and a second NIC (`vm run --nics 2`: eth1 on a datagram link of its own), and A runs two
//! clients at once, one to each of B's addresses. Both NICs' IRQs fire on B's one CPU, so a
//! softirq run that one NIC's IRQ started polls the other NIC's frames too, and those frames
//! carry that IRQ in their CPU's receive context: the merge must not give it to them
//! (merge/nic.rs `irq_not_of_frame`, docs/coverage-audit.md "Two NICs sharing a CPU").
//!
//! Run by vm_scenarios.rs (`two_nic_scenario`), which checks: B's startup record names both
//! NICs with their RX vectors; B's frames came in on both, all on one CPU, and some in a
//! softirq run the other NIC's IRQ started ([`check_nics_share_a_cpu`]); `report --nic`
//! counts each vector's IRQs as /proc/interrupts did within 1 % (vm_irq_counts.rs) and every
//! request B received on an RX queue (vm_two_queues.rs); each such request is placed on the
//! NIC its address belongs to and never on the other NIC's IRQ ([`check_requests_on_their_nic`]);
//! the requests join across the two guests' clocks (vm_two_machines.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::read_ndjson;
use crate::vm_two_machines::Traffic;

/// B's addresses on eth0 and eth1 (vm/spec.rs `LINK_ADDRS`, `LINK2_ADDRS`).
const FIRST_ADDR: &str = "10.213.0.2";
const SECOND_ADDR: &str = "10.214.0.2";
/// Per client: 4 connections at 200 requests/s, the two-queue scenario's 400 in all (what B's
/// recorder kept up with on its one vCPU there).
pub const TRAFFIC: Traffic = Traffic {
    queues: 1,
    connections: 4,
    qps: 200,
    seconds: 8,
    second_addr: Some(SECOND_ADDR),
};
const NICS: [&str; 2] = ["eth0", "eth1"];
/// Each client sends half the requests: a NIC with a tenth of the frames was not in the run.
const MIN_NIC_SHARE: f64 = 0.10;
/// Each NIC's frames that the merge must have as received requests: the cross-machine check
/// wants 99 % complete, but counts over both NICs.
const MIN_MERGED: f64 = 0.95;

/// RX-capable NIC vectors of a recording's startup record, per device.
pub fn rx_vectors(records: &[Value]) -> Result<BTreeMap<String, BTreeSet<u64>>> {
    let startup = records.first().filter(|r| r["type"] == "startup");
    let startup = startup.context("B's recording: no startup record")?;
    let mut vectors: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for v in startup["nic_irqs"].as_array().into_iter().flatten() {
        let dev = v["dev"].as_str().context("nic_irqs[].dev")?;
        let irq = v["irq"].as_u64().context("nic_irqs[].irq")?;
        vectors.entry(dev.to_owned()).or_default().insert(irq);
    }
    for nic in NICS {
        ensure!(
            vectors.contains_key(nic),
            "B's startup record: no RX vector of {nic} in nic_irqs {vectors:?}"
        );
    }
    Ok(vectors)
}

/// B's RX frames (`netif_receive_skb`) per NIC; per CPU; and how many carried the other NIC's
/// vector in their CPU context.
#[derive(Debug)]
struct Frames {
    per_nic: BTreeMap<&'static str, usize>,
    per_cpu: BTreeMap<u64, usize>,
    in_the_others_run: usize,
}

fn frames(records: &[Value], vectors: &BTreeMap<String, BTreeSet<u64>>) -> Result<Frames> {
    let mut f = Frames {
        per_nic: BTreeMap::new(),
        per_cpu: BTreeMap::new(),
        in_the_others_run: 0,
    };
    let rx = records
        .iter()
        .filter(|r| r["type"] == "kernel" && r["hook"] == "netif_receive_skb");
    for frame in rx {
        let Some(nic) = NICS.into_iter().find(|n| frame["dev"] == *n) else {
            continue;
        };
        *f.per_nic.entry(nic).or_default() += 1;
        let cpu = (frame["cpu"].as_u64()).with_context(|| format!("no cpu: {frame}"))?;
        *f.per_cpu.entry(cpu).or_default() += 1;
        let other = NICS.into_iter().find(|n| *n != nic).unwrap_or_default();
        if (frame["irq"].as_u64()).is_some_and(|irq| vectors[other].contains(&irq)) {
            f.in_the_others_run += 1;
        }
    }
    Ok(f)
}

/// What B's recording says of the run: its NICs' RX vectors and its frames on them.
#[derive(Debug)]
pub struct NicRun {
    vectors: BTreeMap<String, BTreeSet<u64>>,
    frames: Frames,
}

/// B's frames on both NICs, all on one CPU, and at least one of them with the other NIC's
/// vector in its CPU context (else the run did not exercise what it is for).
pub fn check_nics_share_a_cpu(records: &[Value]) -> Result<NicRun> {
    let vectors = rx_vectors(records)?;
    let f = frames(records, &vectors)?;
    let total: usize = f.per_nic.values().sum();
    eprintln!(
        "vm two nics: B's RX frames per NIC {:?}, per CPU {:?}; {} with the other NIC's IRQ in \
         their CPU context",
        f.per_nic, f.per_cpu, f.in_the_others_run
    );
    for nic in NICS {
        let n = f.per_nic.get(nic).copied().unwrap_or(0);
        ensure!(
            n as f64 >= MIN_NIC_SHARE * total as f64 && n > 0,
            "{nic}: {n} of {total} frames (less than {:.0} %)",
            MIN_NIC_SHARE * 100.0
        );
    }
    ensure!(
        f.per_cpu.len() == 1,
        "frames on CPUs {:?}, not on one",
        f.per_cpu
    );
    ensure!(
        f.in_the_others_run > 0,
        "no frame was polled in a softirq run the other NIC's IRQ started: nothing was tested"
    );
    Ok(NicRun { vectors, frames: f })
}

/// Every merged request B received (its `rx_ip_tcp` on B) has B's RX stages on the NIC of the
/// address it was sent to, and none on a vector of the other NIC; and the merge has at least
/// [`MIN_MERGED`] of each NIC's frames as such requests (one small message, one frame).
pub fn check_requests_on_their_nic(dir: &Path, run: &NicRun) -> Result<()> {
    let merged = read_ndjson(&dir.join(crate::vm_irq_counts::NIC_MERGED))?;
    let received = requests_on_their_nic(&merged, &run.vectors)?;
    eprintln!(
        "vm two nics: requests B received per NIC, each placed on it: {received:?}, of frames {:?}",
        run.frames.per_nic
    );
    enough_merged(&received, &run.frames.per_nic)
}

fn enough_merged(received: &BTreeMap<&str, usize>, frames: &BTreeMap<&str, usize>) -> Result<()> {
    for nic in NICS {
        let (got, sent) = (received.get(nic).copied(), frames.get(nic).copied());
        let (got, sent) = (got.unwrap_or(0), sent.unwrap_or(0));
        ensure!(
            sent > 0 && got as f64 >= MIN_MERGED * sent as f64,
            "{nic}: {got} merged requests B received, of {sent} frames (less than {:.0} %)",
            MIN_MERGED * 100.0
        );
    }
    Ok(())
}

/// The requests B received per NIC, each checked to be on it.
fn requests_on_their_nic(
    merged: &[Value],
    vectors: &BTreeMap<String, BTreeSet<u64>>,
) -> Result<BTreeMap<&'static str, usize>> {
    let mut received = BTreeMap::new();
    for request in merged.iter().filter(|r| r["type"] == "request") {
        let trace = request["trace_id"].as_str().unwrap_or_default();
        let nic = nic_of(trace)?;
        let on_b = |s: &&Value| {
            s["node"] == "B" && s["name"].as_str().is_some_and(|n| n.starts_with("rx_"))
        };
        let rx: Vec<&Value> = (request["segments"].as_array().into_iter().flatten())
            .filter(on_b)
            .collect();
        let Some(ip_tcp) = rx.iter().find(|s| s["name"] == "rx_ip_tcp") else {
            continue;
        };
        *received.entry(nic).or_default() += 1;
        ensure!(
            ip_tcp["place"]["dev"].is_string(),
            "{trace}: B's rx_ip_tcp has no device: {ip_tcp}"
        );
        for s in rx.iter().filter(|s| s["place"]["dev"].is_string()) {
            let place = &s["place"];
            ensure!(
                place["dev"] == nic,
                "{trace}: B's {} placed on {}, not on {nic}",
                s["name"],
                place["dev"]
            );
            if let Some(irq) = place["irq"].as_u64() {
                ensure!(
                    vectors[nic].contains(&irq),
                    "{trace}: B's {} placed on IRQ {irq}, not one of {nic}'s {:?}",
                    s["name"],
                    vectors[nic]
                );
            }
        }
    }
    Ok(received)
}

/// The NIC of B a kernel-only trace (`CLIENT>SERVER:PORT@OFFSET`) was sent to, by its
/// server address.
fn nic_of(trace: &str) -> Result<&'static str> {
    let server = trace.split_once('>').map(|(_, s)| s).unwrap_or_default();
    let addr = server.rsplit_once(':').map(|(a, _)| a).unwrap_or_default();
    match addr {
        FIRST_ADDR => Ok(NICS[0]),
        SECOND_ADDR => Ok(NICS[1]),
        _ => anyhow::bail!("{trace}: not a trace to {FIRST_ADDR} or {SECOND_ADDR}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use std::path::Path;

    use std::collections::BTreeMap;

    use super::{
        TRAFFIC, check_nics_share_a_cpu, enough_merged, nic_of, requests_on_their_nic, rx_vectors,
    };
    use crate::vm_two_machines::guest_scripts;

    #[test]
    fn b_listens_on_both_nics_and_a_sends_to_both_at_once() {
        let s = guest_scripts(
            Path::new("/m"),
            Path::new("/d"),
            ("10.213.0.2", &TRAFFIC),
            false,
            None,
        );
        assert!(
            s.b.contains("/m lab server --listen 0.0.0.0:9000 &"),
            "{}",
            s.b
        );
        let client = |addr: &str| {
            format!(
                "/m lab client --connect {addr}:9000 --warmup 0s --duration 8s --concurrency 4 --qps 200"
            )
        };
        let both = format!(
            "{{ {} > /d/a.json & C1=$!; {} > /d/a2.json; C2=$?; wait $C1 && [ $C2 = 0 ]; }} && ok=1",
            client("10.213.0.2"),
            client("10.214.0.2")
        );
        assert!(s.a.contains(&both), "{}", s.a);
    }

    fn startup() -> Value {
        json!({"type": "startup", "nic_irqs": [
            {"irq": 25, "dev": "eth0", "queue": 0}, {"irq": 29, "dev": "eth1", "queue": 0}]})
    }

    fn frame(dev: &str, irq: u64, cpu: u64) -> Value {
        json!({"type": "kernel", "hook": "netif_receive_skb", "dev": dev, "irq": irq, "cpu": cpu})
    }

    #[test]
    fn both_nics_on_one_cpu_with_a_frame_in_the_others_run() {
        let mut records = vec![startup()];
        records.extend((0..5).map(|_| frame("eth0", 25, 0)));
        records.extend((0..4).map(|_| frame("eth1", 29, 0)));
        let err = check_nics_share_a_cpu(&records).unwrap_err();
        assert!(err.to_string().contains("nothing was tested"), "{err}");
        records.push(frame("eth1", 25, 0));
        check_nics_share_a_cpu(&records).unwrap();
        records.push(frame("eth0", 25, 1));
        let err = check_nics_share_a_cpu(&records).unwrap_err();
        assert!(err.to_string().contains("not on one"), "{err}");
    }

    fn request(server: &str, rx: &[(&str, Value)]) -> Value {
        let segments: Vec<Value> = (rx.iter())
            .map(|(name, place)| json!({"name": name, "node": "B", "place": place}))
            .chain([json!({"name": "rx_ip_tcp", "node": "A", "place": {"cpu": 0}})])
            .collect();
        json!({"type": "request", "trace_id": format!("10.0.0.1:5>{server}:9000@0"),
               "segments": segments})
    }

    #[test]
    fn each_request_is_on_the_nic_of_its_address_and_never_on_the_others_irq() {
        let vectors = rx_vectors(&[startup()]).unwrap();
        let on =
            |dev: &str, irq: Option<u64>| json!({"cpu": 0, "dev": dev, "queue": 0, "irq": irq});
        let eth0 = request(
            "10.213.0.2",
            &[
                ("rx_napi_poll", on("eth0", Some(25))),
                ("rx_ip_tcp", on("eth0", Some(25))),
            ],
        );
        let eth1 = request("10.214.0.2", &[("rx_ip_tcp", on("eth1", None))]);
        let received = requests_on_their_nic(&[eth0.clone(), eth1.clone()], &vectors).unwrap();
        assert_eq!(received, BTreeMap::from([("eth0", 1), ("eth1", 1)]));
        let wrong_irq = request("10.214.0.2", &[("rx_ip_tcp", on("eth1", Some(25)))]);
        let err = requests_on_their_nic(&[eth0.clone(), wrong_irq], &vectors).unwrap_err();
        assert!(err.to_string().contains("placed on IRQ 25"), "{err}");
        let wrong_dev = request("10.214.0.2", &[("rx_ip_tcp", on("eth0", Some(25)))]);
        let err = requests_on_their_nic(&[eth0.clone(), wrong_dev], &vectors).unwrap_err();
        assert!(err.to_string().contains("not on eth1"), "{err}");
        let no_dev = request("10.214.0.2", &[("rx_ip_tcp", json!({"cpu": 0}))]);
        let err = requests_on_their_nic(&[eth0, eth1, no_dev], &vectors).unwrap_err();
        assert!(err.to_string().contains("has no device"), "{err}");
    }

    #[test]
    fn a_trace_is_on_the_nic_of_its_server_address_or_fails() {
        assert_eq!(nic_of("10.213.0.1:4>10.213.0.2:9000@0").unwrap(), "eth0");
        assert_eq!(nic_of("10.214.0.1:4>10.214.0.2:9000@100").unwrap(), "eth1");
        assert!(nic_of("t000123").is_err());
        assert!(nic_of("10.214.0.1:4>10.214.0.22:9000@0").is_err());
    }

    #[test]
    fn each_nic_needs_most_of_its_frames_merged() {
        let frames = BTreeMap::from([("eth0", 100), ("eth1", 100)]);
        enough_merged(&BTreeMap::from([("eth0", 95), ("eth1", 100)]), &frames).unwrap();
        let err = enough_merged(&BTreeMap::from([("eth0", 100)]), &frames).unwrap_err();
        assert!(err.to_string().contains("eth1: 0 merged requests"), "{err}");
        let none = BTreeMap::new();
        assert!(enough_merged(&none, &none).is_err());
    }

    #[test]
    fn a_nic_without_frames_or_vectors_fails() {
        let mut records = vec![startup()];
        records.extend((0..20).map(|_| frame("eth0", 25, 0)));
        records.push(frame("eth1", 25, 0));
        let err = check_nics_share_a_cpu(&records).unwrap_err();
        assert!(err.to_string().contains("eth1: 1 of 21 frames"), "{err}");
        let one_nic = [json!({"type": "startup", "nic_irqs": [{"irq": 25, "dev": "eth0"}]})];
        assert!(rx_vectors(&one_nic).is_err());
    }
}
