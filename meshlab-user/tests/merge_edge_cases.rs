//! Edge cases met on real recordings and in the joins' corners: other ways to name a
//! connection, fallbacks, refused negative spans, per-CPU context, blocking readers, lost
//! events, probe-only inputs. Stage times as in tests/merge_scenarios.rs.

mod merge_common;

use merge_common::edit::with_kernel_lines;
use merge_common::expect::{RX_STAGES, Seg, TX_STAGES, assert_request, on, only, plain};
use merge_common::{fixture_files, merge};
use meshlab_user::schema::{Hook, JoinMethod, MergedRequest};

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
    with_kernel_lines(dir, "plain", "B", |lines| {
        for (i, l) in lines.iter_mut().enumerate() {
            *l = edit(i + 1, l);
        }
    })
}

/// A connection's last turn has no next turn to close it: it closes when idle for a window.
/// A quiet node (here: A's only other events come 3 s later, 5000 scheduler events of another
/// thread) must still finish it while its events are indexed. It was finished only at the
/// 4096-event sweep, after that sweep had evicted its events: the last request of every
/// connection of the two-guest scenario was lost ("cannot measure end to end").
#[test]
fn the_last_turn_of_a_quiet_connection_is_finished_before_its_events_are_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let last_event = 1_000_001_182_500u64;
    let later = (0..5000u64).map(|i| {
        format!(
            "{{\"type\":\"kernel\",\"node\":\"A\",\"hook\":\"sched_switch\",\"ts_ns\":{},\"cpu\":0,\"pid\":7,\"tid\":7,\"value\":{}}}",
            last_event + 3_000_000_000 + 100 * i,
            i % 2
        )
    });
    let files = with_kernel_lines(dir.path(), "kernel_only", "A", |lines| {
        let at = lines.len() - 2; // before the final clock and summary records
        lines.splice(at..at, later);
    });
    let out = merge(&files, &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    assert_eq!(out.requests.len(), 2);
    assert!(
        out.requests.iter().all(|r| r.complete),
        "{:?}",
        out.requests
    );
}

/// A NIC frame found by a poll no NIC IRQ started (NAPI's re-poll, a TX NAPI's softirq run:
/// seen in the 6.12 guests): its CPU context has a NET_RX raise and softirq entry but no IRQ.
/// Those two are not the frame's (here 3 ms before it, which made the network difference
/// negative): the chain starts at netif_receive_skb, the 1.7 us before it are the network's,
/// and nothing is missing.
#[test]
fn a_nic_frame_polled_without_an_irq_starts_at_netif_receive_skb() {
    let dir = tempfile::tempdir().unwrap();
    let files = plain_with_b_edited(dir.path(), |n, l| match n {
        3 => l
            .replace(r#""irq":40,"irq_entry_ns":7000001014900,"#, "")
            .replace("7000001015200", "6999998015200")
            .replace("7000001015800", "6999998015800"),
        _ => l.to_owned(),
    });
    assert_starts_at_netif_receive_skb(&files);
}

/// The plain request with B's frame merged as polled without an IRQ of its own: B's first RX
/// stages (IRQ handler, softirq delay, NAPI poll) are gone, their 1.7 us the network's, and
/// nothing is missing.
fn assert_starts_at_netif_receive_skb(files: &[std::path::PathBuf]) {
    let out = merge(files, &[]);
    let r = &out.requests[0];
    let mut expected = plain();
    let net = expected
        .iter()
        .position(|s| s.0 == "network_round_trip")
        .unwrap();
    expected[net].2 = 20_000 + 300 + 600 + 800;
    expected.drain(net + 1..net + 4);
    assert_request(r, &expected, 82_100);
    assert!(r.complete, "{r:?}");
    assert!(r.missing.is_empty(), "{:?}", r.missing);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
}

/// B's startup with a second NIC, eth1 (ifindex 3), whose vector is 41.
const ETH0_IRQS: &str = r#""nic_irqs":[{"irq":40,"dev":"eth0","ifindex":2,"queue":0}]"#;
const ETH0_ETH1_IRQS: &str = r#""nic_irqs":[{"irq":40,"dev":"eth0","ifindex":2,"queue":0},{"irq":41,"dev":"eth1","ifindex":3,"queue":0}]"#;

/// The plain fixture with B's frame (line 3) carrying eth1's vector 41 as its context IRQ,
/// its device edited by `frame_dev`, and B's startup naming eth1 or not.
fn frame_with_irq_41(
    dir: &std::path::Path,
    eth1_named: bool,
    frame_dev: &'static str,
) -> Vec<std::path::PathBuf> {
    plain_with_b_edited(dir, move |n, l| match n {
        1 if eth1_named => l.replace(ETH0_IRQS, ETH0_ETH1_IRQS),
        3 => l
            .replace(r#""irq":40,"#, r#""irq":41,"#)
            .replace(r#""dev":"eth0""#, frame_dev),
        _ => l.to_owned(),
    })
}

/// A frame of one NIC whose CPU context holds another NIC's IRQ (two NICs sharing a CPU: the
/// context is the CPU's last IRQ before the softirq run that polled both). The frame came from
/// its own NIC's hardware, so that IRQ and its raise are not the frame's: it is merged as one
/// polled without an IRQ of its own (above), its chain starting at netif_receive_skb, and no
/// segment is placed on the other NIC's vector.
#[test]
fn a_nic_frame_carrying_another_nics_irq_starts_at_netif_receive_skb() {
    let dir = tempfile::tempdir().unwrap();
    let files = frame_with_irq_41(dir.path(), true, r#""dev":"eth0""#);
    assert_starts_at_netif_receive_skb(&files);
    let out = merge(&files, &[]);
    let places = out.requests[0]
        .segments
        .iter()
        .filter_map(|s| s.place.as_ref());
    assert!(
        places.clone().all(|p| p.irq != Some(41)),
        "{:?}",
        places.collect::<Vec<_>>()
    );
    // Placed on its own device, through the stage that starts at the frame.
    let ip_tcp = (out.requests[0].segments.iter())
        .find(|s| s.name == "rx_ip_tcp" && s.node.as_deref() == Some("B"))
        .and_then(|s| s.place.as_ref());
    assert_eq!(
        ip_tcp.and_then(|p| p.dev.as_deref()),
        Some("eth0"),
        "{ip_tcp:?}"
    );
}

/// Only `rx_ip_tcp` takes the device of the frame that starts it: with B's `tcp_probe` lost,
/// the span joined over it (netif_receive_skb -> sk_data_ready) keeps only its CPU, so socket
/// time never lands in the queue's rows of `report --nic`.
#[test]
fn a_span_joined_over_a_lost_tcp_probe_is_on_no_device() {
    let dir = tempfile::tempdir().unwrap();
    let files = with_kernel_lines(dir.path(), "plain", "B", |lines| {
        let probe = lines
            .iter()
            .position(|l| l.contains(r#""hook":"tcp_probe""#));
        lines.remove(probe.unwrap());
    });
    let out = merge(&files, &[]);
    let from_frame: Vec<_> = (out.requests[0].segments.iter())
        .filter(|s| s.node.as_deref() == Some("B") && s.name.starts_with("rx_ip_tcp"))
        .map(|s| (s.name.to_string(), s.place.clone()))
        .collect();
    let [(name, Some(place))] = from_frame.as_slice() else {
        panic!("{from_frame:?}");
    };
    assert_eq!(name, "rx_ip_tcp+rx_tcp_deliver");
    assert_eq!((place.cpu, &place.dev, place.queue), (1, &None, None));
}

/// B's startup with eth0 on two queues: vector 40 serves queue 0, vector 41 queue 1.
const ETH0_TWO_QUEUES: &str = r#""nic_irqs":[{"irq":40,"dev":"eth0","ifindex":2,"queue":0},{"irq":41,"dev":"eth0","ifindex":2,"queue":1}]"#;

/// Two queues of one NIC whose softirq runs share a CPU: the frame's RX queue (the driver's
/// `skb_record_rx_queue`, the event's `queue`) says whose the context IRQ is. A frame of queue
/// 0 carrying queue 1's vector is merged as one polled without an IRQ of its own (its chain
/// starts at netif_receive_skb, so no kernel segment ends at the frame), and no segment is
/// placed on queue 1 or its vector; a frame of queue 1 keeps them. The stage after the frame
/// (`rx_ip_tcp`, ending at tcp_probe, an event of no device) ran in the frame's context: it
/// is placed on the frame's queue 0, without an IRQ, so `report --nic` counts the request on
/// the queue it came from.
#[test]
fn a_frame_carrying_another_queues_irq_starts_at_netif_receive_skb() {
    let frame_on_queue = |dir: &std::path::Path, queue: &'static str| {
        plain_with_b_edited(dir, move |n, l| match n {
            1 => l.replace(ETH0_IRQS, ETH0_TWO_QUEUES),
            3 => l.replace(r#""irq":40,"#, &format!(r#""irq":41,"queue":{queue},"#)),
            _ => l.to_owned(),
        })
    };
    let (other, own) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = frame_on_queue(other.path(), "0");
    assert_starts_at_netif_receive_skb(&files);
    let out = merge(&files, &[]);
    let rx_places: Vec<_> = out.requests[0]
        .segments
        .iter()
        .filter(|s| s.name.starts_with("rx_") && s.node.as_deref() == Some("B"))
        .filter_map(|s| s.place.as_ref().map(|p| (s.name.clone(), p.queue, p.irq)))
        .collect();
    assert!(
        rx_places
            .iter()
            .all(|(_, queue, irq)| *irq != Some(41) && *queue != Some(1)),
        "{rx_places:?}"
    );
    assert!(
        rx_places.contains(&("rx_ip_tcp".into(), Some(0), None)),
        "{rx_places:?}"
    );
    let kept = merge(&frame_on_queue(own.path(), "1"), &[]);
    let r = &kept.requests[0];
    assert!(r.complete, "{r:?}");
    let on_41 = r.segments.iter().filter(|s| {
        s.node.as_deref() == Some("B")
            && s.place
                .as_ref()
                .is_some_and(|p| p.irq == Some(41) && p.queue == Some(1))
    });
    assert!(on_41.count() > 0, "{r:?}");
}

/// A frame of a device without IRQs (veth) carrying a NIC's IRQ was routed there from that NIC
/// in the same softirq run: it keeps the IRQ, its segments and durations as when the vector is
/// unknown (only the queue the named vector serves is added to their place).
#[test]
fn a_frame_of_a_device_without_irqs_keeps_a_nics_irq() {
    let (named, unknown) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let veth = r#""dev":"veth0","ifindex":7"#;
    let keeps = merge(&frame_with_irq_41(named.path(), true, veth), &[]);
    let as_unknown = merge(&frame_with_irq_41(unknown.path(), false, veth), &[]);
    let shape = |r: &MergedRequest| {
        let segments = r.segments.iter();
        let named = segments.map(|s| (s.name.clone(), s.node.clone(), s.dur_ns));
        (r.complete, r.e2e_ns, named.collect::<Vec<_>>())
    };
    assert_eq!(shape(&keeps.requests[0]), shape(&as_unknown.requests[0]));
    let on_41 = keeps.requests[0].segments.iter().filter(|s| {
        s.node.as_deref() == Some("B") && s.place.as_ref().is_some_and(|p| p.irq == Some(41))
    });
    assert!(on_41.count() > 0, "{:?}", keeps.requests[0]);
}

/// A NIC frame whose IRQ came while a NET_RX softirq run was already going on its CPU, on a
/// kernel whose running net_rx_action polls the device itself (`in_net_rx_action`, 6.12+):
/// the kernel program gives it that IRQ and raise and no softirq entry of its own (meshlab-ebpf
/// rx.rs `netif_context`). The time from the raise to netif_receive_skb is one segment; the
/// chain starts at the frame's own IRQ and nothing is missing. Without the raise (6.12 raises
/// none while the action runs) the IRQ entry alone starts it.
#[test]
fn a_nic_frame_whose_irq_came_during_a_running_softirq_starts_at_that_irq() {
    for (raise, merged) in [
        (
            true,
            vec![
                ("rx_irq_handler", 300),
                ("rx_softirq_delay+rx_napi_poll", 1400),
            ],
        ),
        (
            false,
            vec![("rx_irq_handler+rx_softirq_delay+rx_napi_poll", 1700)],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let files = plain_with_b_edited(dir.path(), |n, l| match n {
            3 => {
                let l = l.replace(r#","softirq_entry_ns":7000001015800"#, "");
                if raise {
                    l
                } else {
                    l.replace(r#","softirq_raise_ns":7000001015200"#, "")
                }
            }
            _ => l.to_owned(),
        });
        let out = merge(&files, &[]);
        let r = &out.requests[0];
        let mut expected = plain();
        let at = expected
            .iter()
            .position(|s| s.0 == "rx_irq_handler" && s.1 == Some("B"))
            .unwrap();
        let segments = merged.into_iter().map(|(name, d)| (name, Some("B"), d));
        expected.splice(at..at + 3, segments);
        assert_request(r, &expected, 82_100);
        assert!(r.complete, "{r:?}");
        assert!(r.missing.is_empty(), "{:?}", r.missing);
        assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    }
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
    // The driver's return (net_dev_xmit) is dropped as the departure when it makes the
    // difference negative; with start_xmit (400 ns earlier) it is still negative: refused.
    assert!(
        err.contains("outer span 64900 ns < inner span 144500 ns")
            && err.contains("B:net_dev_start_xmit at 7000001159400 ns"),
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
    let cfg = meshlab_testkit::synth::GenConfig {
        requests: 2,
        drop: Some(("B", Hook::SkDataReady, 1)),
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

#[test]
fn kernel_only_calls_on_a_connection_opened_before_the_recording_are_counted() {
    // B's connection has no sock_established (it was open before the recording started):
    // its calls cannot be turned into requests, and the merge says how many it skipped.
    let dir = tempfile::tempdir().unwrap();
    let mut files = fixture_files("kernel_only");
    let b = files
        .iter()
        .position(|f| f.ends_with("B.kernel.ndjson"))
        .unwrap();
    let text = std::fs::read_to_string(&files[b]).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("\"sock_established\""))
        .collect();
    let path = dir.path().join("B.kernel.ndjson");
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
    files[b] = path;
    let out = merge(&files, &[]);
    let line = out
        .summary
        .errors
        .iter()
        .find(|e| e.starts_with("node B: kernel-only:"))
        .unwrap_or_else(|| panic!("{:?}", out.summary.errors));
    assert!(
        line.contains("on connections opened before the recording"),
        "{line}"
    );
    assert!(!line.contains(": 0 calls"), "{line}");
}
