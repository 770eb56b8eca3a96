//! The hand-computed expectations of the scenarios (see tests/merge_scenarios.rs for how the
//! stage times were chosen) and assertions on merged requests.

use meshlab_user::schema::MergedRequest;

use super::{fixture_files, merge};

pub type Seg = (&'static str, Option<&'static str>, u64);

pub const RX_STAGES: [(&str, u64); 7] = [
    ("rx_irq_handler", 300),
    ("rx_softirq_delay", 600),
    ("rx_napi_poll", 800),
    ("rx_ip_tcp", 1500),
    ("rx_tcp_deliver", 900),
    ("rx_wakeup", 100),
    ("rx_sched_delay", 4000),
];
pub const TX_STAGES: [(&str, u64); 3] =
    [("tx_tcp_ip", 2000), ("tx_qdisc", 700), ("tx_driver", 400)];

pub fn on(node: &'static str, stages: &[(&'static str, u64)]) -> Vec<Seg> {
    stages.iter().map(|(n, d)| (*n, Some(node), *d)).collect()
}

/// The plain request, segment by segment.
pub fn plain() -> Vec<Seg> {
    let mut v = on(
        "A",
        &[
            ("client_encode", 1000),
            ("client_pre_write", 500),
            ("tx_syscall_entry", 300),
        ],
    );
    v.extend(on("A", &TX_STAGES));
    v.push(("network_round_trip", None, 20_000));
    v.extend(on("B", &RX_STAGES));
    v.extend(on(
        "B",
        &[
            ("server_poll_return", 700),
            ("rx_recv_entry", 600),
            ("rx_copy", 1100),
            ("server_read_return", 200),
        ],
    ));
    v.extend(on(
        "B",
        &[
            ("server_decode", 3000),
            ("server_dispatch", 400),
            ("server_handler", 25_000),
            ("server_encode", 2000),
            ("server_pre_write", 300),
            ("tx_syscall_entry", 300),
        ],
    ));
    v.extend(on("B", &TX_STAGES));
    v.extend(on("A", &RX_STAGES));
    v.extend(on(
        "A",
        &[
            ("client_poll_return", 700),
            ("rx_recv_entry", 600),
            ("rx_copy", 1100),
            ("client_read_return", 200),
            ("client_decode", 1500),
        ],
    ));
    v
}

pub fn segs(r: &MergedRequest) -> Vec<(String, Option<String>, u64)> {
    r.segments
        .iter()
        .map(|s| {
            (
                s.name.to_string(),
                s.node.as_deref().map(str::to_owned),
                s.dur_ns,
            )
        })
        .collect()
}

pub fn owned(v: &[Seg]) -> Vec<(String, Option<String>, u64)> {
    v.iter()
        .map(|(n, node, d)| (n.to_string(), node.map(str::to_owned), *d))
        .collect()
}

pub fn assert_request(r: &MergedRequest, expected: &[Seg], e2e: u64) {
    assert_eq!(segs(r), owned(expected), "segments of {}", r.trace_id);
    assert_eq!(r.e2e_ns, e2e, "e2e of {}", r.trace_id);
    assert_eq!(r.segments.iter().map(|s| s.dur_ns).sum::<u64>(), r.e2e_ns);
}

pub fn only(name: &str) -> MergedRequest {
    let out = merge(&fixture_files(name), &[]);
    assert_eq!(out.requests.len(), 1, "{name}: {:?}", out.summary);
    out.requests.into_iter().next().unwrap()
}
