//! The sender's send queue (docs/segments.md, `tx_socket_queue`), and a server or client
//! chain whose receive context began before its message left. Constructed edits of the kernel-only
//! fixture, whose first request is A's tcp_sendmsg at 1000001001800, net_dev_queue at
//! 1000001003800 (`tx_tcp_ip` 2000 ns), send return at 1000001005100 (after the data left:
//! no point); B's request RX context IRQ 7000001014900, raise 7000001015200, softirq
//! 7000001015800, netif_receive_skb 7000001016600; network round trip 20000 ns.

mod merge_common;

use merge_common::edit::with_kernel_lines;
use merge_common::expect::{RX_STAGES, Seg, TX_STAGES, assert_request, on};
use merge_common::merge;
use meshlab_user::schema::{Kind, MergedRequest};

const E2E: u64 = 78_600;

/// The first request of the kernel-only fixture with `edit` applied to `node`'s lines.
fn first_request(node: &str, edit: impl FnOnce(&mut Vec<String>)) -> MergedRequest {
    let dir = tempfile::tempdir().unwrap();
    let files = with_kernel_lines(dir.path(), "kernel_only", node, edit);
    let out = merge(&files, &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    let mut rs = out.requests;
    rs.sort_by_key(|r| r.start_ns);
    rs.remove(0)
}

/// The kernel-only request with A's request TX as `tx`, the round trip `rtt`, B's RX stages
/// from `rx_from` on and A's from `a_rx_from` on (the standard stages without the ones before).
fn expected(tx: &[(&'static str, u64)], rtt: u64, rx_from: usize, a_rx_from: usize) -> Vec<Seg> {
    let mut v = on("A", tx);
    v.push(("network_round_trip", None, rtt));
    v.extend(on("B", &RX_STAGES[rx_from..]));
    v.extend(on(
        "B",
        &[
            ("rx_wakeup_to_copy", 1300),
            ("rx_copy", 1100),
            ("server_app", 31_200),
        ],
    ));
    v.extend(on("B", &TX_STAGES));
    v.extend(on("A", &RX_STAGES[a_rx_from..]));
    v.extend(on("A", &[("rx_wakeup_to_copy", 1300), ("rx_copy", 1100)]));
    v
}

/// Moves A's first send return (line 6, after the request's driver return) to `ts`, placed in
/// time order before line `before`.
fn send_return_at(ts: u64, before: usize) -> impl FnOnce(&mut Vec<String>) {
    move |lines: &mut Vec<String>| {
        let old = lines.remove(6);
        assert!(
            old.contains("send_return") && old.contains("1000001005100"),
            "{old}"
        );
        lines.insert(before, old.replace("1000001005100", &ts.to_string()));
    }
}

#[test]
fn a_send_returning_before_its_last_byte_left_splits_tx_tcp_ip() {
    // The call returned 1200 ns after tcp_sendmsg; the last byte was queued to the device
    // 800 ns later: that wait is the send queue's.
    let r = first_request("A", send_return_at(1_000_001_003_000, 3));
    assert!(r.complete, "{r:?}");
    let mut tx = vec![("tx_tcp_ip", 1200), ("tx_socket_queue", 800)];
    tx.extend(&TX_STAGES[1..]);
    assert_request(&r, &expected(&tx, 20_000, 0, 0), E2E);
    let queue = r.segments.iter().find(|s| s.name == "tx_socket_queue");
    let queue = queue.expect("tx_socket_queue");
    assert_eq!((&*queue.unit, queue.kind), ("socket", Kind::Queue));
}

#[test]
fn a_send_returning_after_its_data_left_is_no_point() {
    // The fixture as recorded: the return comes after the driver's, nothing waited.
    let r = first_request("A", |_| {});
    assert!(r.complete, "{r:?}");
    assert_request(&r, &expected(&TX_STAGES, 20_000, 0, 0), E2E);
}

/// Moves the receive context (IRQ, raise, softirq entry: `(from, to)` times) of the
/// netif_receive_skb event on `line`.
fn context_moved(line: usize, times: [(&str, &str); 3]) -> impl FnOnce(&mut Vec<String>) {
    move |lines: &mut Vec<String>| {
        assert!(lines[line].contains("netif_receive_skb"), "{}", lines[line]);
        for (from, to) in times {
            assert!(lines[line].contains(from), "{from} in {}", lines[line]);
            lines[line] = lines[line].replace(from, to);
        }
    }
}

#[test]
fn a_receive_context_before_the_request_left_does_not_start_the_server_chain() {
    // B's softirq run (and its IRQ) began 25 us earlier, before A's request left at
    // 1000001004900 (the outer span, 64900 ns, would be shorter than the inner): the run
    // began before the frame existed, so B's chain starts at netif_receive_skb.
    let context = [
        ("7000001014900", "7000000989900"),
        ("7000001015200", "7000000990200"),
        ("7000001015800", "7000000990800"),
    ];
    let r = first_request("B", context_moved(2, context));
    assert!(r.complete, "{r:?}");
    // The round trip gains the 1700 ns of IRQ, raise and softirq run the fixture had.
    assert_request(&r, &expected(&TX_STAGES, 21_700, 3, 0), E2E);
}

#[test]
fn a_receive_context_before_the_response_existed_does_not_end_the_clients_wait() {
    // A's softirq run (and its IRQ) began 30 us earlier than recorded: the outer span from the
    // request's departure, 34900 ns, is shorter than B's 44900 whatever B's side drops (its
    // context, its driver return). The run began before the response existed (an earlier
    // frame's IRQ, NAPI polling on), so the wait ends at A's netif_receive_skb.
    let context = [
        ("1000001069800", "1000001039800"),
        ("1000001070100", "1000001040100"),
        ("1000001070700", "1000001040700"),
    ];
    let r = first_request("A", context_moved(7, context));
    assert!(r.complete, "{r:?}");
    // The round trip gains the 1700 ns of A's IRQ, raise and softirq run the fixture had.
    assert_request(&r, &expected(&TX_STAGES, 21_700, 0, 3), E2E);
    // The reader is told why A's request has no IRQ or softirq stage.
    let note = "receive context before the response: irq_entry, softirq_raise, softirq_entry \
                on A dropped; the peer wait ends at netif_receive_skb";
    assert_eq!(r.notes, [note]);
}
