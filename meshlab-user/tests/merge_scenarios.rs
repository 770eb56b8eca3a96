//! Hand-computed scenarios. Each fixture under tests/fixtures/merge/NAME was written by the
//! synthetic generator with the fixed stage times of `synth::FIXED` (regenerate with
//! `cargo test -p meshlab-user --test merge_scenarios -- --ignored write_fixtures`); the
//! expected segments below were worked out by hand from those stage times:
//!
//! client: encode 1000, pre-write 500, syscall->tcp 300, tcp/ip 2000, qdisc 700, driver 400;
//! one-way network 10000 each way; RX on either node: irq handler 300, softirq delay 600,
//! napi poll 800, ip/tcp 1500, tcp deliver 900, wakeup 100, sched delay 4000, poll return 700,
//! recv entry 600, copy 1100, read return 200; server: decode 3000, dispatch 400,
//! handler 25000, encode 2000, pre-write 300, then the same TX stages; client decode 1500.
//! Server inner span = RX 10600 + process 30900 + TX 3400 = 44900; client outer span =
//! 10000 + 44900 + 10000 = 64900; network round trip = 64900 - 44900 = 20000;
//! e2e = 4900 + 64900 + 10600 + 200 + 1500 = 82100.

mod merge_common;

use merge_common::{fixture_dir, fixture_files, merge, scenarios};
use meshlab_user::schema::{JoinMethod, MergedRequest};

type Seg = (&'static str, Option<&'static str>, u64);

const RX_STAGES: [(&str, u64); 7] = [
    ("rx_irq_handler", 300),
    ("rx_softirq_delay", 600),
    ("rx_napi_poll", 800),
    ("rx_ip_tcp", 1500),
    ("rx_tcp_deliver", 900),
    ("rx_wakeup", 100),
    ("rx_sched_delay", 4000),
];
const TX_STAGES: [(&str, u64); 3] = [("tx_tcp_ip", 2000), ("tx_qdisc", 700), ("tx_driver", 400)];

fn on(node: &'static str, stages: &[(&'static str, u64)]) -> Vec<Seg> {
    stages.iter().map(|(n, d)| (*n, Some(node), *d)).collect()
}

/// The plain request, segment by segment.
fn plain() -> Vec<Seg> {
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

fn segs(r: &MergedRequest) -> Vec<(String, Option<String>, u64)> {
    r.segments
        .iter()
        .map(|s| (s.name.clone(), s.node.clone(), s.dur_ns))
        .collect()
}

fn owned(v: &[Seg]) -> Vec<(String, Option<String>, u64)> {
    v.iter()
        .map(|(n, node, d)| (n.to_string(), node.map(str::to_owned), *d))
        .collect()
}

fn assert_request(r: &MergedRequest, expected: &[Seg], e2e: u64) {
    assert_eq!(segs(r), owned(expected), "segments of {}", r.trace_id);
    assert_eq!(r.e2e_ns, e2e, "e2e of {}", r.trace_id);
    assert_eq!(r.segments.iter().map(|s| s.dur_ns).sum::<u64>(), r.e2e_ns);
}

fn only(name: &str) -> MergedRequest {
    let out = merge(&fixture_files(name), &[]);
    assert_eq!(out.requests.len(), 1, "{name}: {:?}", out.summary);
    out.requests.into_iter().next().unwrap()
}

#[test]
fn plain_request_response() {
    let r = only("plain");
    assert_request(&r, &plain(), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    assert_eq!(
        (r.join, r.server_node.as_deref()),
        (JoinMethod::Offset, Some("B"))
    );
    let net = r
        .segments
        .iter()
        .find(|s| s.name == "network_round_trip")
        .unwrap();
    let d = net.derived.as_ref().unwrap();
    assert_eq!(
        (
            d.method.as_str(),
            d.outer_node.as_str(),
            d.inner_node.as_str()
        ),
        ("difference", "A", "B")
    );
    assert_eq!(d.outer, ["net_dev_xmit", "irq_entry"]);
    assert_eq!(d.inner, ["irq_entry", "net_dev_xmit"]);
    // Probe (realtime, converted) to kernel boundaries carry the clock sample's bracket / 2.
    let entry = &r.segments[2];
    assert_eq!(
        (entry.name.as_str(), entry.error_ns),
        ("tx_syscall_entry", Some(50))
    );
    assert_eq!(r.segments[0].error_ns, None);
}

#[test]
fn gro_coalesced_rx_uses_the_skb_carrying_the_last_byte() {
    assert_request(&only("gro_rx"), &plain(), 82_100);
    // Without GRO the response arrives as two skbs 1000 ns apart; the stages are the second's.
    assert_request(&only("rx_without_gro"), &plain(), 82_100);
}

#[test]
fn tso_tx_and_split_tx() {
    assert_request(&only("tso_tx"), &plain(), 82_100);
    // 5000 bytes in 4 MSS skbs queued 1000 ns apart: the last byte's skb is queued 3000 ns later.
    let mut split = plain();
    split[3] = ("tx_tcp_ip", Some("A"), 5_000);
    assert_request(&only("gso_split_tx"), &split, 85_100);
}

#[test]
fn retransmission_uses_the_first_transmission_and_the_network_carries_the_loss() {
    let r = only("retransmission");
    // The lost request is retransmitted at xmit + RTO 200000 (+ qdisc 700 + driver 400): the
    // server sees it 201100 ns later, which the round trip absorbs.
    let mut expected = plain();
    expected[6] = ("network_round_trip", None, 221_100);
    assert_request(&r, &expected, 283_200);
    assert_eq!(
        r.notes,
        ["retransmitted: request on A; stage times use the first transmission"]
    );
    assert!(r.complete);
}

#[test]
fn veth_without_irq_is_not_missing() {
    let r = only("veth_no_irq");
    let expected: Vec<Seg> = plain()
        .into_iter()
        .filter(|(n, _, _)| *n != "rx_irq_handler" && *n != "rx_softirq_delay")
        .collect();
    assert_request(&r, &expected, 80_300);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    let d = r.segments[6].derived.as_ref().unwrap();
    assert_eq!(d.outer, ["net_dev_xmit", "softirq_entry"]);
}

#[test]
fn a_dropped_event_is_missing_and_never_invented() {
    let out = merge(&fixture_files("dropped_event"), &[]);
    let r = &out.requests[0];
    let mut expected = plain();
    let at = expected
        .iter()
        .position(|s| s.0 == "rx_ip_tcp" && s.1 == Some("B"))
        .unwrap();
    expected.splice(at..at + 2, [("rx_ip_tcp+rx_tcp_deliver", Some("B"), 2_400)]);
    assert_request(r, &expected, 82_100);
    assert!(!r.complete);
    assert_eq!(r.missing, ["B:tcp_probe"]);
    assert_eq!(out.summary.dropped_per_node["B"], 1);
    assert_eq!((out.summary.complete, out.summary.incomplete), (0, 1));
}

#[test]
fn out_of_order_lines_within_the_window_change_nothing() {
    let files = fixture_files("out_of_order");
    // The fixture really is out of order.
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let ts: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split("\"ts_ns\":").nth(1))
        .map(|t| t.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert!(ts.windows(2).any(|w| w[0] > w[1]), "fixture is sorted");
    let shuffled = merge(&files, &[]);
    let sorted = merge(&fixture_files("in_order"), &[]);
    assert_eq!(shuffled.requests, sorted.requests);
    assert_eq!(shuffled.requests.len(), 3);
    for r in &shuffled.requests {
        assert_request(r, &plain(), 82_100);
    }
}

#[test]
fn two_connections_interleaved() {
    let out = merge(&fixture_files("interleaved"), &[]);
    let mut ids: Vec<_> = out.requests.iter().map(|r| r.trace_id.clone()).collect();
    ids.sort();
    assert_eq!(ids, ["t000000", "t000001", "t000002", "t000003"]);
    for r in &out.requests {
        assert_request(r, &plain(), 82_100);
        assert!(r.complete);
    }
    // Connection 1's first request starts while connection 0's is in flight.
    let start = |id: &str| {
        out.requests
            .iter()
            .find(|r| r.trace_id == id)
            .unwrap()
            .start_ns
    };
    assert!(start("t000001") < start("t000000") + 82_100);
}

#[test]
fn pipelined_requests_join_by_offset() {
    let out = merge(&fixture_files("pipelined"), &[]);
    assert_eq!(out.requests.len(), 2);
    let mut rs = out.requests.clone();
    rs.sort_by_key(|r| r.start_ns);
    assert_eq!(rs[1].start_ns - rs[0].start_ns, 5_000);
    for r in &rs {
        assert_request(r, &plain(), 82_100);
        assert_eq!(r.join, JoinMethod::Offset);
    }
}

#[test]
fn kernel_only_mode_turns_and_replies() {
    let out = merge(&fixture_files("kernel_only"), &[]);
    let mut expected = on("A", &TX_STAGES);
    expected.push(("network_round_trip", None, 20_000));
    expected.extend(on("B", &RX_STAGES));
    // No probes: switch-in -> copy covers poll return + recv entry (700 + 600); the server
    // process runs from recv return to its tcp_sendmsg: 200+3000+400+25000+2000+300+300.
    expected.extend(on(
        "B",
        &[
            ("rx_wakeup_to_copy", 1300),
            ("rx_copy", 1100),
            ("server_app", 31_200),
        ],
    ));
    expected.extend(on("B", &TX_STAGES));
    expected.extend(on("A", &RX_STAGES));
    expected.extend(on("A", &[("rx_wakeup_to_copy", 1300), ("rx_copy", 1100)]));
    let mut rs = out.requests.clone();
    rs.sort_by_key(|r| r.start_ns);
    assert_eq!(rs.len(), 2, "{:?}", out.summary);
    for r in &rs {
        assert_request(r, &expected, 78_600);
        assert_eq!(r.join, JoinMethod::KernelOnly);
        assert!(r.complete, "{r:?}");
    }
    assert_eq!(rs[0].trace_id, "10.200.0.1:40000>10.200.0.2:9000@0");
    assert_eq!(rs[1].trace_id, "10.200.0.1:40000>10.200.0.2:9000@100");
}

/// Rewrites the committed fixtures from the generator (run on purpose, not in CI).
#[test]
#[ignore]
fn write_fixtures() {
    for (name, cfg) in scenarios() {
        let dir = fixture_dir(name);
        let _ = std::fs::remove_dir_all(&dir);
        meshlab_user::merge::synth::generate(&cfg, &dir).unwrap();
    }
}

#[test]
fn probes_naming_the_connection_by_four_tuple() {
    let r = only("probes_by_tuple");
    assert_request(&r, &plain(), 82_100);
    assert_eq!(r.join, JoinMethod::Offset);
    assert!(r.complete);
}

#[test]
fn probes_without_connection_fall_back_to_thread_and_time_order() {
    let out = merge(&fixture_files("probes_without_conn"), &[]);
    assert_eq!(out.requests.len(), 2);
    for r in &out.requests {
        assert_request(r, &plain(), 82_100);
        assert_eq!(r.join, JoinMethod::PidTidTime, "the fallback is labelled");
        assert!(r.complete);
    }
}

#[test]
fn client_probes_with_a_kernel_only_server_link_by_reversed_four_tuple() {
    let r = only("server_kernel_only");
    let mut expected = on(
        "A",
        &[
            ("client_encode", 1000),
            ("client_pre_write", 500),
            ("tx_syscall_entry", 300),
        ],
    );
    expected.extend(on("A", &TX_STAGES));
    expected.push(("network_round_trip", None, 20_000));
    expected.extend(on("B", &RX_STAGES));
    expected.extend(on(
        "B",
        &[
            ("rx_wakeup_to_copy", 1300),
            ("rx_copy", 1100),
            ("server_app", 31_200),
        ],
    ));
    expected.extend(on("B", &TX_STAGES));
    expected.extend(on("A", &RX_STAGES));
    expected.extend(on(
        "A",
        &[
            ("client_poll_return", 700),
            ("rx_recv_entry", 600),
            ("rx_copy", 1100),
            ("client_read_return", 200),
            ("client_decode", 1500),
        ],
    ));
    assert_request(&r, &expected, 82_100);
    assert_eq!(
        (r.trace_id.as_str(), r.join),
        ("t000000", JoinMethod::KernelOnly)
    );
    assert!(r.complete, "{r:?}");
}

/// The plain fixture with some of B's kernel lines rewritten by `edit(line_no, line) -> line`.
fn plain_with_b_edited(
    dir: &std::path::Path,
    edit: impl Fn(usize, &str) -> String,
) -> Vec<std::path::PathBuf> {
    let mut files = fixture_files("plain");
    let b = files
        .iter()
        .position(|f| f.ends_with("B.kernel.ndjson"))
        .unwrap();
    let text = std::fs::read_to_string(&files[b]).unwrap();
    let edited: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| edit(i + 1, l))
        .collect();
    let path = dir.join("B.kernel.ndjson");
    std::fs::write(&path, edited.join("\n") + "\n").unwrap();
    files[b] = path;
    files
}

#[test]
fn a_would_be_negative_segment_is_refused_and_reported_with_its_events() {
    let dir = tempfile::tempdir().unwrap();
    // tcp_probe (line 4) moved 100 ns before netif_receive_skb (line 3, at 7000001016600).
    let files = plain_with_b_edited(dir.path(), |n, l| {
        if n == 4 {
            l.replace("7000001018100", "7000001016500")
        } else {
            l.to_owned()
        }
    });
    let out = merge(&files, &[]);
    let r = &out.requests[0];
    let mut expected = plain();
    let at = expected
        .iter()
        .position(|s| s.0 == "rx_ip_tcp" && s.1 == Some("B"))
        .unwrap();
    expected.splice(at..at + 2, [("rx_ip_tcp+rx_tcp_deliver", Some("B"), 2_400)]);
    assert_request(r, &expected, 82_100);
    assert!(!r.complete);
    assert_eq!(r.missing, ["B:tcp_probe (out of order)"]);
    let err = &out.summary.errors[0];
    assert!(err.contains("negative segment refused"), "{err}");
    assert!(
        err.contains("B:netif_receive_skb at 7000001016600 ns (")
            && err.contains("B.kernel.ndjson:3)"),
        "{err}"
    );
    assert!(
        err.contains("B:tcp_probe at 7000001016500 ns (") && err.contains("B.kernel.ndjson:4)"),
        "{err}"
    );
}

#[test]
fn a_negative_network_difference_is_refused_and_the_wait_stays_whole() {
    let dir = tempfile::tempdir().unwrap();
    // B's response leaves 100000 ns later than the client saw it arrive allows.
    let files = plain_with_b_edited(dir.path(), |n, l| match n {
        12 => l.replace("7000001059400", "7000001159400"),
        13 => l.replace("7000001059800", "7000001159800"),
        _ => l.to_owned(),
    });
    let out = merge(&files, &[]);
    let r = &out.requests[0];
    assert!(!r.complete);
    let wait = r
        .segments
        .iter()
        .find(|s| s.name == "peer_wait")
        .expect("peer_wait");
    assert_eq!(wait.dur_ns, 64_900);
    assert!(r.segments.iter().all(|s| s.node.as_deref() != Some("B")));
    assert_eq!(r.segments.iter().map(|s| s.dur_ns).sum::<u64>(), 82_100);
    let err = &out.summary.errors[0];
    assert!(
        err.contains("network round trip would be negative"),
        "{err}"
    );
    assert!(
        err.contains("outer span 64900 ns < inner span 144900 ns"),
        "{err}"
    );
}

#[test]
fn a_later_interrupt_on_the_cpu_is_not_taken_for_the_skbs() {
    let dir = tempfile::tempdir().unwrap();
    // B's netif_receive_skb (line 3) carries an IRQ entry after its softirq raise and entry: a
    // later interrupt overwrote the CPU's context. It must not be used (nor made negative).
    let files = plain_with_b_edited(dir.path(), |n, l| {
        if n == 3 {
            l.replace(
                "\"irq_entry_ns\":7000001014900",
                "\"irq_entry_ns\":7000001015850",
            )
        } else {
            l.to_owned()
        }
    });
    let out = merge(&files, &[]);
    let r = &out.requests[0];
    let mut expected = plain();
    // The server's inner span now starts at the softirq raise: 300 ns shorter, so the
    // round trip is 300 ns longer, and B has no rx_irq_handler segment.
    expected[6] = ("network_round_trip", None, 20_300);
    let at = expected
        .iter()
        .position(|s| s.0 == "rx_irq_handler" && s.1 == Some("B"))
        .unwrap();
    expected.remove(at);
    assert_request(r, &expected, 82_100);
    assert_eq!(r.missing, ["B:irq_entry"], "a NIC IRQ was expected");
    assert!(!r.complete);
    assert!(
        r.notes[0].starts_with("rx context: request on B"),
        "{:?}",
        r.notes
    );
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
}

#[test]
fn a_blocking_readers_read_ready_does_not_split_the_receive_path() {
    let r = only("server_blocking_read");
    // server.read_ready was taken 5000 ns before the request arrived: B's switch-in -> copy is
    // one segment (poll return 700 + recv entry 600), with no error.
    let mut expected = plain();
    let at = expected
        .iter()
        .position(|s| s.0 == "server_poll_return")
        .unwrap();
    expected.splice(at..at + 2, [("rx_wakeup_to_copy", Some("B"), 1_300)]);
    assert_request(&r, &expected, 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
}

#[test]
fn probes_without_kernel_recordings_attribute_userland_only() {
    let files: Vec<_> = fixture_files("plain")
        .into_iter()
        .filter(|f| f.to_string_lossy().ends_with("probe.ndjson"))
        .collect();
    let out = merge(&files, &[]);
    let r = &out.requests[0];
    // Each node's time is its probes' realtime clock. Client write_begin (t0+1500) to
    // read_ready (t0+78700) = 77200; server read_ready -> write_begin = 32600; the unsplit
    // receive stages read_ready -> read_end are 600+1100+200 on both sides.
    let expected: Vec<Seg> = vec![
        ("client_encode", Some("A"), 1000),
        ("client_pre_write", Some("A"), 500),
        ("network_round_trip", None, 44_600),
        ("rx_recv_entry+rx_copy+server_read_return", Some("B"), 1900),
        ("server_decode", Some("B"), 3000),
        ("server_dispatch", Some("B"), 400),
        ("server_handler", Some("B"), 25_000),
        ("server_encode", Some("B"), 2000),
        ("server_pre_write", Some("B"), 300),
        ("rx_recv_entry+rx_copy+client_read_return", Some("A"), 1900),
        ("client_decode", Some("A"), 1500),
    ];
    assert_request(r, &expected, 82_100);
    assert_eq!(
        r.missing,
        ["A:kernel (no recording)", "B:kernel (no recording)"]
    );
    assert!(!r.complete);
    let d = r.segments[2].derived.as_ref().unwrap();
    assert_eq!(d.outer, ["client.write_begin", "client.read_ready"]);
    assert_eq!(d.inner, ["server.read_ready", "server.write_begin"]);
}

#[test]
fn on_veth_the_senders_softirq_raise_is_not_a_receive_stage() {
    // In the two-namespace lab the receiver's NET_RX raise happens inside the sender's
    // veth_xmit, before the sender's net_dev_xmit. Add one 2000 ns before the softirq entry to
    // B's netif_receive_skb: the result must not change.
    let dir = tempfile::tempdir().unwrap();
    let mut files = fixture_files("veth_no_irq");
    let b = files
        .iter()
        .position(|f| f.ends_with("B.kernel.ndjson"))
        .unwrap();
    let text = std::fs::read_to_string(&files[b]).unwrap();
    let edited = text.replacen(
        "\"softirq_entry_ns\":7000001014900",
        "\"softirq_raise_ns\":7000001012900,\"softirq_entry_ns\":7000001014900",
        1,
    );
    assert_ne!(edited, text);
    files[b] = dir.path().join("B.kernel.ndjson");
    std::fs::write(&files[b], edited).unwrap();
    let with_raise = merge(&files, &[]);
    let without = merge(&fixture_files("veth_no_irq"), &[]);
    assert_eq!(with_raise.requests, without.requests);
    assert!(with_raise.requests[0].complete);
}

#[test]
fn a_lost_event_does_not_open_the_wakeup_search_to_earlier_messages() {
    // Found on a real recording with ring buffer drops: request 1 lost its sk_data_ready on B;
    // its wake-up must still be its own (after its tcp_probe), not request 0's.
    let dir = tempfile::tempdir().unwrap();
    let cfg = meshlab_user::merge::synth::GenConfig {
        requests: 2,
        drop: Some(("B", "sk_data_ready", 1)),
        ..Default::default()
    };
    let out = merge(&merge_common::generate_into(&cfg, dir.path()), &[]);
    let mut rs = out.requests.clone();
    rs.sort_by_key(|r| r.start_ns);
    assert_request(&rs[0], &plain(), 82_100);
    let mut expected = plain();
    let at = expected
        .iter()
        .position(|s| s.0 == "rx_tcp_deliver" && s.1 == Some("B"))
        .unwrap();
    expected.splice(at..at + 2, [("rx_tcp_deliver+rx_wakeup", Some("B"), 1_000)]);
    assert_request(&rs[1], &expected, 82_100);
    assert_eq!(rs[1].missing, ["B:sk_data_ready"]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
}
