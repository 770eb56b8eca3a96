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

use merge_common::edit::with_kernel_lines;
use merge_common::expect::{RX_STAGES, Seg, TX_STAGES, assert_request, on, only, plain};
use merge_common::{fixture_dir, fixture_files, merge, scenarios};
use meshlab_user::schema::{JoinMethod, MergedRequest, Segment};

#[test]
fn plain_request_response() {
    let r = only("plain");
    assert_request(&r, &plain(), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    assert_eq!(
        (r.join, r.server_node.as_deref()),
        (JoinMethod::Offset, Some("B"))
    );
    let (net, ends) = network(&r);
    let d = net.derived.as_ref().unwrap();
    assert_eq!(
        (
            d.method.as_str(),
            d.outer_node.as_str(),
            d.inner_node.as_str()
        ),
        ("difference", "A", "B")
    );
    assert_eq!(
        ends,
        ["net_dev_xmit", "irq_entry", "irq_entry", "net_dev_xmit"]
    );
    // Probe (realtime, converted) to kernel boundaries carry the clock sample's bracket / 2.
    let entry = &r.segments[2];
    assert_eq!(
        (&*entry.name, entry.error_ns),
        ("tx_syscall_entry", Some(50))
    );
    assert_eq!(r.segments[0].error_ns, None);
}

/// The NIC driver frees each TX skb 1500 ns after net_dev_xmit: both TX completions become
/// segments, on the client before its wait and on the server at the end of its span, so the
/// round trip shrinks by both: 20000 - 2 x 1500 = 17000; e2e is unchanged.
#[test]
fn tx_completion_is_a_segment_on_both_sides() {
    let r = only("tx_completion");
    let mut expected = plain();
    let client_tx_end = expected.iter().position(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(client_tx_end, ("tx_completion", Some("A"), 1_500));
    let net = expected
        .iter()
        .position(|s| s.0 == "network_round_trip")
        .unwrap();
    expected[net].2 = 17_000;
    let server_tx_end = expected.iter().rposition(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(server_tx_end, ("tx_completion", Some("B"), 1_500));
    assert_request(&r, &expected, 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    let d = r.segments[net].derived.as_ref().expect("derived");
    assert_eq!(d.outer, ["tx_complete", "irq_entry"]);
    assert_eq!(d.inner, ["irq_entry", "tx_complete"]);
}

/// Completions 100 us after the transmit come after the response reached the client: the
/// driver reclaimed the skbs lazily, so neither is used and the request is the plain one.
#[test]
fn late_tx_completion_is_not_used() {
    let r = only("tx_completion_late");
    assert_request(&r, &plain(), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
}

/// Completions 30 us after the transmit. The request's comes after the server already had the
/// request (10 us one way) but before the response came back (64.9 us): only the difference
/// method shows it (the wait from it would be 20000 - 30000 < 0), as it shows the response's
/// (after the client had it). Neither is used and the request is the plain one, without error.
#[test]
fn tx_completion_after_the_peer_had_the_message_is_not_used() {
    let out = merge(&fixture_files("tx_completion_after_peer_rx"), &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    let [r] = &out.requests[..] else {
        panic!("one request expected: {:?}", out.summary)
    };
    assert_request(r, &plain(), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
}

/// A threaded IRQ handler that waited 5 us for its CPU: B's IRQ entry 5 us earlier than in
/// the fixture (the frame arrived 5 us sooner, its raise, softirq and netif_receive_skb as
/// before), and the request's completion 17 us after its driver returned. From the completion
/// the round trip is negative with the IRQ kept (-1600 ns with the response's completion and
/// driver return cut off), +1800 ns once the chain starts at the raise. But the IRQ's wait for
/// its raise (5300 ns) is longer than the rest of the context (1400 ns to netif_receive_skb):
/// a handler that ran late, after the frame came, so the request's completion goes instead
/// and the IRQ stays (13500 ns of round trip from the client's driver return).
#[test]
fn a_late_request_completion_goes_before_the_servers_irq() {
    let r = late_completion_with_server_context(&[("7000001014900", "7000001009900")]);
    let mut expected = plain();
    let server_irq = expected
        .iter()
        .position(|s| s.0 == "rx_irq_handler")
        .unwrap();
    expected[server_irq].2 = 5_300;
    let net = expected
        .iter()
        .position(|s| s.0 == "network_round_trip")
        .unwrap();
    expected[net].2 = 13_500;
    let server_tx_end = expected.iter().rposition(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(server_tx_end, ("tx_completion", Some("B"), 1_500));
    assert_request(&r, &expected, 82_100);
    let d = r.segments[net].derived.as_ref().expect("derived");
    assert_eq!(d.outer, ["net_dev_xmit", "irq_entry"]);
    assert_eq!(d.inner, ["irq_entry", "tx_complete"]);
}

/// The `tx_completion` fixture's request with its completion 17 us after its driver returned
/// (15.5 us later than recorded) and B's receive context times replaced by `moves` (old, new),
/// merged without errors.
fn late_completion_with_server_context(moves: &[(&str, &str)]) -> MergedRequest {
    let dir = tempfile::tempdir().unwrap();
    let mut files = with_kernel_lines(dir.path(), "tx_completion", "A", |lines| {
        let completion = lines.iter().position(|l| l.contains("\"tx_complete\""));
        let line = &mut lines[completion.unwrap()];
        assert!(line.contains("1000001006400"), "{line}");
        *line = line.replace("1000001006400", "1000001021900");
    });
    let b_dir = tempfile::tempdir().unwrap();
    let b_files = with_kernel_lines(b_dir.path(), "tx_completion", "B", |lines| {
        assert!(lines[2].contains("netif_receive_skb"), "{}", lines[2]);
        for (old, new) in moves {
            assert!(lines[2].contains(old), "{}", lines[2]);
            lines[2] = lines[2].replace(old, new);
        }
    });
    let b = b_files.iter().find(|f| f.ends_with("B.kernel.ndjson"));
    let at = files.iter().position(|f| f.ends_with("B.kernel.ndjson"));
    files[at.unwrap()] = b.unwrap().clone();
    let out = merge(&files, &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    let [r] = &out.requests[..] else {
        panic!("one request expected: {:?}", out.summary)
    };
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    r.clone()
}

/// A receive context left from an earlier frame (one poll of the same queue): B's IRQ, raise
/// and softirq entry 5 us older than in the fixture, the frame as before, and the request's
/// completion 17 us after its driver returned. From the completion the round trip is negative
/// with any of the context kept and the response's completion and driver return cut off
/// (-1600 ns from the IRQ, -1300 from the raise, -700 from the softirq entry), +3200 ns from
/// netif_receive_skb with both completions kept. Dropping the completion instead would keep
/// the whole old context (13500 ns from the driver return), but its long gap comes after the
/// raise (300 ns IRQ to raise, 6400 raise to netif_receive_skb): no handler ran late, so the
/// context goes, as before the threaded-IRQ rule.
#[test]
fn an_earlier_frames_irq_still_goes_before_the_request_completion() {
    let r = late_completion_with_server_context(&[
        ("7000001014900", "7000001009900"),
        ("7000001015200", "7000001010200"),
        ("7000001015800", "7000001010800"),
    ]);
    let dropped = ["rx_irq_handler", "rx_softirq_delay", "rx_napi_poll"];
    let mut expected: Vec<Seg> = plain();
    let server_rx = expected
        .iter()
        .position(|s| s.0 == "rx_irq_handler")
        .unwrap();
    expected.drain(server_rx..server_rx + dropped.len());
    let server_tx_end = expected.iter().rposition(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(server_tx_end, ("tx_completion", Some("B"), 1_500));
    let client_tx_end = expected.iter().position(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(client_tx_end, ("tx_completion", Some("A"), 17_000));
    let net = expected
        .iter()
        .position(|s| s.0 == "network_round_trip")
        .unwrap();
    expected[net].2 = 3_200;
    assert_request(&r, &expected, 82_100);
    let d = r.segments[net].derived.as_ref().expect("derived");
    assert_eq!(d.outer, ["tx_complete", "irq_entry"]);
    assert_eq!(d.inner, ["netif_receive_skb", "tx_complete"]);
}

/// Both drivers return after the peer already had the frame (a virtio kick that stalls the
/// sender's vCPU, seen in the 6.12 guests): each net_dev_xmit 25.1 us after its doorbell,
/// 15.1 us after the peer's IRQ for the frame. With either return as the departure the round
/// trip would be negative, so the departure is net_dev_start_xmit on both sides: no
/// `tx_driver` segment, its 400 ns on each side are network time, and the request stays
/// complete without an error.
#[test]
fn a_driver_return_after_the_peer_had_the_frame_is_not_the_departure() {
    let r = departs_at_start_xmit("driver_return_after_peer_rx");
    let net = r
        .segments
        .iter()
        .position(|s| s.name == "network_round_trip")
        .unwrap();
    let d = r.segments[net].derived.as_ref().unwrap();
    assert_eq!(d.outer, ["net_dev_start_xmit", "irq_entry"]);
    assert_eq!(d.inner, ["irq_entry", "net_dev_start_xmit"]);
}

/// The drivers return 70 us after their doorbells: A's net_dev_xmit of the request comes after
/// the response's IRQ on A itself. It is not used (nor is B's, by the difference method): the
/// same request as above, not an out-of-order chain with the response's IRQ dropped.
#[test]
fn a_driver_return_after_the_reply_arrived_is_not_used() {
    departs_at_start_xmit("driver_return_after_reply");
}

/// The one request of `fixture`, checked to be the plain request with each side's departure
/// at net_dev_start_xmit: no `tx_driver`, its 400 ns on each side in the network time.
fn departs_at_start_xmit(fixture: &str) -> MergedRequest {
    let out = merge(&fixture_files(fixture), &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    let [r] = &out.requests[..] else {
        panic!("one request expected: {:?}", out.summary)
    };
    let mut expected: Vec<_> = plain().into_iter().filter(|s| s.0 != "tx_driver").collect();
    let net = expected
        .iter()
        .position(|s| s.0 == "network_round_trip")
        .unwrap();
    expected[net].2 = 20_800;
    assert_request(r, &expected, 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    r.clone()
}

/// Constructed hardware path (no NIC here stamps): the driver reports each skb's hardware TX
/// timestamp 1000 ns after net_dev_xmit and frees it 500 ns later, so `tx_completion` (1500)
/// splits into `tx_nic_send` 1000 + `tx_reclaim` 500 on both sides; the round trip is the
/// one of `tx_completion_is_a_segment_on_both_sides`.
#[test]
fn hardware_tx_timestamp_splits_tx_completion() {
    let r = only("tx_hw_timestamp");
    let mut expected = plain();
    let client_tx_end = expected.iter().position(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(client_tx_end, ("tx_nic_send", Some("A"), 1_000));
    expected.insert(client_tx_end + 1, ("tx_reclaim", Some("A"), 500));
    let net = expected
        .iter()
        .position(|s| s.0 == "network_round_trip")
        .unwrap();
    expected[net].2 = 17_000;
    let server_tx_end = expected.iter().rposition(|s| s.0 == "tx_driver").unwrap() + 1;
    expected.insert(server_tx_end, ("tx_nic_send", Some("B"), 1_000));
    expected.insert(server_tx_end + 1, ("tx_reclaim", Some("B"), 500));
    assert_request(&r, &expected, 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
}

/// A hardware stamp reported (with the completion) after the response reached the client was
/// read at a lazy reclaim: like the late completion, neither is used.
#[test]
fn late_hardware_tx_timestamp_is_not_used() {
    let r = only("tx_hw_timestamp_late");
    assert_request(&r, &plain(), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
}

/// Index of segment `name` on `node` (`None`: a derived segment) in `expected`.
fn seg_at(expected: &[Seg], name: &str, node: Option<&str>) -> usize {
    expected
        .iter()
        .position(|s| s.0 == name && s.1 == node)
        .unwrap_or_else(|| panic!("no {name} on {node:?}"))
}

/// `plain()` with `tx_nic_send` of `tx_ns` after each side's driver and `rx_nic_receive` of
/// `rx_ns` before each side's RX, where set; the network round trip loses both.
fn with_nic_stages(tx_ns: Option<u64>, rx_ns: Option<u64>) -> Vec<Seg> {
    let mut expected = plain();
    for node in ["A", "B"] {
        if let Some(tx) = tx_ns {
            let driver = seg_at(&expected, "tx_driver", Some(node));
            expected.insert(driver + 1, ("tx_nic_send", Some(node), tx));
        }
        if let Some(rx) = rx_ns {
            let irq = seg_at(&expected, "rx_irq_handler", Some(node));
            expected.insert(irq, ("rx_nic_receive", Some(node), rx));
        }
    }
    let net = seg_at(&expected, "network_round_trip", None);
    expected[net].2 = 20_000 - 2 * (tx_ns.unwrap_or(0) + rx_ns.unwrap_or(0));
    expected
}

/// The derived network segment of `r` and the points its spans end at (outer, inner).
fn network(r: &MergedRequest) -> (&Segment, [&str; 4]) {
    let net = r
        .segments
        .iter()
        .find(|s| s.name == "network_round_trip")
        .unwrap();
    let d = net.derived.as_ref().unwrap();
    let ends = [&d.outer[0], &d.outer[1], &d.inner[0], &d.inner[1]].map(String::as_str);
    (net, ends)
}

/// `record --hw-timestamps` with the NIC's clock sampled: each hardware stamp is placed at its
/// NIC-clock time (1000 ns after the doorbell), not where the driver reported it (99 us later,
/// at a lazy reclaim, where the late TX completion is also left out). The NIC's send is a
/// stage of its own and leaves the network time, and the placement's bound (half the
/// readings' 40 ns window) travels with it.
#[test]
fn hardware_tx_timestamp_on_the_nic_clock_is_the_wire_time() {
    let r = only("tx_hw_timestamp_nic_clock");
    assert_request(&r, &with_nic_stages(Some(1_000), None), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    let bound = |name: &str| r.segments.iter().find(|s| s.name == name).unwrap().error_ns;
    assert_eq!(bound("tx_nic_send"), Some(20));
    let (net, ends) = network(&r);
    assert_eq!(net.error_ns, Some(40));
    assert_eq!(
        ends,
        ["tx_tstamp_hw", "irq_entry", "irq_entry", "tx_tstamp_hw"]
    );
}

/// The frame left (NIC clock: doorbell + 1000 ns) before the driver returned (doorbell +
/// 3000 ns): the driver's return is no stage boundary, so the driver's time and the NIC's send
/// are one stage up to the wire time, not an out-of-order chain.
#[test]
fn a_wire_time_before_the_driver_returned_leaves_the_return_out() {
    let r = only("tx_hw_timestamp_nic_clock_before_driver_return");
    let mut expected = plain();
    for node in ["A", "B"] {
        let driver = seg_at(&expected, "tx_driver", Some(node));
        expected[driver] = ("tx_driver+tx_driver_handoff+tx_nic_send", Some(node), 1_400);
    }
    let net = seg_at(&expected, "network_round_trip", None);
    expected[net].2 = 18_000;
    assert_request(&r, &expected, 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
}

/// The NIC stamped each received frame 700 ns before its IRQ: the frame's arrival starts the
/// receive path (`rx_nic_receive`: coalescing and DMA), and the network time ends there.
#[test]
fn hardware_rx_timestamp_on_the_nic_clock_starts_the_receive_path() {
    let r = only("rx_hw_timestamp_nic_clock");
    assert_request(&r, &with_nic_stages(None, Some(700)), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    let (_, ends) = network(&r);
    assert_eq!(
        ends,
        [
            "net_dev_xmit",
            "rx_tstamp_hw",
            "rx_tstamp_hw",
            "net_dev_xmit"
        ]
    );
}

/// Both NICs stamp both ways: the network round trip is the wire alone (10000 ns each way
/// minus 1000 ns of sending and 700 ns of receiving NIC), the NICs' parts are stages.
#[test]
fn hardware_stamps_both_ways_leave_only_the_wire_in_the_network() {
    let r = only("hw_timestamps_nic_clock_both_ways");
    assert_request(&r, &with_nic_stages(Some(1_000), Some(700)), 82_100);
    assert!(r.complete && r.missing.is_empty(), "{r:?}");
    let (net, ends) = network(&r);
    assert_eq!(net.dur_ns, 16_600);
    assert_eq!(
        ends,
        [
            "tx_tstamp_hw",
            "rx_tstamp_hw",
            "rx_tstamp_hw",
            "tx_tstamp_hw"
        ]
    );
    // All four ends placed through NIC clocks, each span's two ends through the same reading
    // of its node's NIC clock: the offsets cancel within each span, no conversion bound.
    assert_eq!(net.error_ns, None);
    let nic_send = r.segments.iter().find(|s| s.name == "tx_nic_send").unwrap();
    assert_eq!(
        nic_send.error_ns,
        Some(20),
        "a kernel point and a NIC-clock point"
    );
}

/// Injected skew moves the node's clock samples, NIC-clock samples included: nothing changes.
#[test]
fn nic_clock_placement_ignores_injected_skew() {
    let files = fixture_files("hw_timestamps_nic_clock_both_ways");
    let plain_run = merge(&files, &[]);
    let skewed = merge(&files, &[("B", 3_000_000_007), ("A", -500_000_003)]);
    let durations = |o: &merge_common::Output| -> Vec<(String, u64)> {
        o.requests[0]
            .segments
            .iter()
            .map(|s| (s.name.to_string(), s.dur_ns))
            .collect()
    };
    assert_ne!(plain_run.requests[0].start_ns, skewed.requests[0].start_ns);
    assert_eq!(durations(&plain_run), durations(&skewed));
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
    // 5000 bytes in 4 MSS skbs queued 1000 ns apart: the last byte's skb is queued 3000 ns later,
    // 1700 ns after the send call returned (3300 ns after tcp_sendmsg): that wait is the send
    // queue's (docs/segments.md, "Send queue").
    let mut split = plain();
    split[3] = ("tx_tcp_ip", Some("A"), 3_300);
    split.insert(4, ("tx_socket_queue", Some("A"), 1_700));
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

/// A kernel-only request of the plain stage times: no probes, so the processes' own stages
/// are cut at the kernel's events.
fn kernel_only_segments() -> Vec<Seg> {
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
    expected
}

#[test]
fn kernel_only_mode_turns_and_replies() {
    let out = merge(&fixture_files("kernel_only"), &[]);
    let expected = kernel_only_segments();
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

/// At the end of a recording much shorter than the 2 s window, every turn but each
/// connection's last is closed and not yet due; they are finished there 1024 at a time
/// (`FINAL_TURNS_STEP`): 2500 requests per node take three steps, and every request comes out
/// once, whole, across the steps' boundaries.
#[test]
fn kernel_only_turns_finished_in_steps_at_the_end_are_all_requests() {
    let cfg = meshlab_testkit::synth::GenConfig {
        requests: 2500,
        connections: 3,
        probes: false,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let out = merge(&merge_common::generate_into(&cfg, dir.path()), &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    assert_eq!(out.requests.len(), 2500, "{:?}", out.summary);
    let expected = kernel_only_segments();
    for r in &out.requests {
        assert_request(r, &expected, 78_600);
        assert!(r.complete, "{r:?}");
    }
    let ids: std::collections::BTreeSet<&str> =
        out.requests.iter().map(|r| r.trace_id.as_str()).collect();
    assert_eq!(ids.len(), 2500, "a request came out twice");
}

/// Rewrites the committed fixtures from the generator (run on purpose, not in CI).
#[test]
#[ignore]
fn write_fixtures() {
    for (name, cfg) in scenarios() {
        let dir = fixture_dir(name);
        let _ = std::fs::remove_dir_all(&dir);
        meshlab_testkit::synth::generate(&cfg, &dir).unwrap();
    }
}
