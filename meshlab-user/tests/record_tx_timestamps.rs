//! Privileged: socket TX timestamps (`record --tx-timestamps`, sock_ops + the kfunc
//! bpf_sock_ops_enable_tx_tstamp) on a real recording. redis-benchmark against redis-server in
//! two network namespaces joined by a veth pair, both "machines" recorded with timestamps on,
//! merged in kernel-only mode: the timestamp stages must be there for nearly every request, on
//! both nodes, inside the TX stages they split, and the segments must still sum to end-to-end.
//! B also records with `--hw-timestamps`: the RX hardware-stamp read loads and runs, and veth
//! (no NIC clock) gives no stamp, TX or RX.

mod support;

use std::path::Path;
use std::process::Command;

use meshlab_user::lab::netns::Lab;
use meshlab_user::schema::{AttachStatus, Hook, MergedRequest, Record};
use support::redis::{PORT, in_netns, start_redis};
use support::{Recorder, Recording, merge_records};

/// Per redis-benchmark test; `-t ping` runs two (PING_INLINE and PING_MBULK).
const REQUESTS: usize = 1000;
/// The TX stages of one node's message with timestamps on, in path order.
const TX_WITH_TIMESTAMPS: [&str; 5] = [
    "tx_tcp_ip",
    "tx_dev_egress",
    "tx_qdisc",
    "tx_driver",
    "tx_driver_handoff",
];

fn merge(dir: &Path) -> Vec<MergedRequest> {
    let inputs = [dir.join("a.capture"), dir.join("b.capture")];
    merge_records(&inputs, &[], &dir.join("merged.ndjson"))
        .into_iter()
        .filter_map(|record| match record {
            Record::Request(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// The recording has timestamps on (attach plan) and one sched, software and ACK stamp per
/// sampled send, none lost.
fn check_recording(name: &str, rec: &Recording) {
    assert!(
        rec.startup
            .attach_plan
            .iter()
            .any(|e| e.hook == "tx_timestamps" && e.status == AttachStatus::Attached),
        "{name}: attach plan does not say TX timestamps are on"
    );
    assert_eq!(rec.summary.dropped, 0, "{name}: kernel drops");
    let count = |hook| rec.events.iter().filter(|e| e.hook == hook).count();
    let sends = count(Hook::TcpSendmsg);
    for hook in [Hook::TxTstampSched, Hook::TxTstampSw, Hook::TxTstampAck] {
        assert!(
            count(hook) * 100 >= sends * 99,
            "{name}: {} {hook:?} events for {sends} tcp_sendmsg",
            count(hook)
        );
    }
    // veth has no NIC clock: no hardware stamp may appear, TX or RX (B records with
    // --hw-timestamps, so its netif_receive_skb program reads the RX stamp).
    assert_eq!(
        count(Hook::TxTstampHw),
        0,
        "{name}: hardware stamps on veth"
    );
    let rx_stamped = rec
        .events
        .iter()
        .filter(|e| e.hook == Hook::NetifReceiveSkb && e.aux.is_some())
        .count();
    assert_eq!(rx_stamped, 0, "{name}: RX hardware stamps on veth");
}

/// `node`'s TX stages in the request's segment list: the five timestamp-split stages,
/// consecutive, in path order, each starting where the one before ended.
fn tx_split_in_order(r: &MergedRequest, node: &str) -> bool {
    let segs: Vec<_> = r
        .segments
        .iter()
        .filter(|s| s.node.as_deref() == Some(node))
        .collect();
    segs.windows(TX_WITH_TIMESTAMPS.len()).any(|w| {
        w.iter()
            .zip(TX_WITH_TIMESTAMPS)
            .all(|(s, name)| s.name == name)
            && w.windows(2).all(|p| {
                let (a, b) = (p[0], p[1]);
                a.start_ns
                    .zip(b.start_ns)
                    .is_some_and(|(sa, sb)| sa + a.dur_ns == sb)
            })
    })
}

#[test]
fn tx_timestamps_split_the_tx_stages_of_nearly_every_request() {
    let test = "tx_timestamps_split_the_tx_stages_of_nearly_every_request";
    if !support::redis::can_run(test) {
        return;
    }
    // doctor's verdict must be the one this recording proves right.
    let doctor = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let doctor: serde_json::Value = serde_json::from_slice(&doctor.stdout).expect("doctor --json");
    let tx = &doctor["tx_timestamps"];
    assert!(
        tx["usable"] == true && tx["kfunc_btf_id"].as_u64().is_some(),
        "doctor: {tx}"
    );
    let lab = Lab::create().expect("lab");
    let _server = start_redis(&lab);
    let dir = tempfile::tempdir().unwrap();
    let (a_ns, b_ns) = (
        lab.a.path().to_str().unwrap(),
        lab.b.path().to_str().unwrap(),
    );
    let common = ["--port", PORT, "--tx-timestamps"];
    let rec_a = Recorder::start(
        dir.path(),
        "a",
        &[&["--node", "A", "--netns", a_ns][..], &common].concat(),
    );
    let rec_b = Recorder::start(
        dir.path(),
        "b",
        &[
            &["--node", "B", "--netns", b_ns, "--hw-timestamps"][..],
            &common,
        ]
        .concat(),
    );
    let bench = in_netns(&lab.a, "redis-benchmark")
        .args(["-h", &lab.addrs.b.to_string(), "-p", PORT, "-c", "1"])
        .args(["-n", &REQUESTS.to_string(), "-t", "ping", "--csv"])
        .output()
        .expect("run redis-benchmark");
    assert!(bench.status.success(), "redis-benchmark: {}", bench.status);
    let (a, b) = (rec_a.stop(), rec_b.stop());
    check_recording("A", &a);
    check_recording("B", &b);

    let requests = merge(dir.path());
    let complete: Vec<_> = requests.iter().filter(|r| r.complete).collect();
    assert!(
        requests.len() * 100 >= 2 * REQUESTS * 99 && complete.len() * 100 >= requests.len() * 99,
        "{} of {} requests complete (client sent {})",
        complete.len(),
        requests.len(),
        2 * REQUESTS
    );
    let split = complete
        .iter()
        .filter(|r| tx_split_in_order(r, "A") && tx_split_in_order(r, "B"))
        .count();
    eprintln!(
        "tx timestamps: {split} of {} complete requests have the split TX stages on both nodes",
        complete.len()
    );
    assert!(
        split * 100 >= complete.len() * 99,
        "{split} of {} complete requests have tx_dev_egress and tx_driver_handoff in order on both nodes; first without: {:?}",
        complete.len(),
        complete
            .iter()
            .find(|r| !(tx_split_in_order(r, "A") && tx_split_in_order(r, "B")))
    );
    for r in &complete {
        let sum: u64 = r.segments.iter().map(|s| s.dur_ns).sum();
        assert_eq!(sum, r.e2e_ns, "segments sum to end-to-end: {r:?}");
    }
    for node in ["A", "B"] {
        let medians: Vec<String> = TX_WITH_TIMESTAMPS
            .iter()
            .map(|name| format!("{name} {} ns", median_ns(&complete, node, name)))
            .collect();
        eprintln!("tx timestamps, node {node} medians: {}", medians.join(", "));
    }
}

/// Median duration of segment `name` on `node` over `requests` (0 when none has it).
fn median_ns(requests: &[&MergedRequest], node: &str, name: &str) -> u64 {
    let mut durs: Vec<u64> = requests
        .iter()
        .flat_map(|r| r.segments.iter())
        .filter(|s| s.name == name && s.node.as_deref() == Some(node))
        .map(|s| s.dur_ns)
        .collect();
    durs.sort_unstable();
    durs.get(durs.len() / 2).copied().unwrap_or(0)
}
