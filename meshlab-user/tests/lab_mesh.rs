//! Privileged: the demo's topologies recorded, merged and attributed per hop. Direct, one-hop
//! and two-hop lab runs (`meshlab demo` with its kernel recorders) must merge almost every
//! sampled request as complete, with each unix leg's kernel stages and each proxy's time as
//! their own segments on the right node, segments summing exactly to end-to-end, and injected
//! skew changing no duration of the real recording.

use std::path::Path;
use std::process::Command;

use meshlab_testkit::privileged::{can_run_with, privileged_or_skip};
use meshlab_user::schema::{Layer, MergeSummary, MergedRequest, Record};

/// `meshlab demo --topology TOPOLOGY` with the lab's default protocol (Framed: client and
/// server halves pair through the TCP leg the relay rule finds) plus `extra` arguments.
///
/// At 1000 requests/s: unlimited c=1 ping-pong on a loaded 2-CPU machine starves the
/// recorders, whose ring buffers then drop events (counted in `dropped_per_node`). A Framed
/// request whose client unix write event was dropped cannot be paired with its server half at
/// all (the pairing goes through that write, the relay and the TCP leg; TTHeader's trace id
/// does not need it), so drops showed up as lost Framed requests. This test is about the hop
/// structure; recorder overload has its own test (record_overload).
fn run_demo(topology: &str, dir: &Path, extra: &[&str]) -> (Vec<MergedRequest>, MergeSummary) {
    let output = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["demo", "--topology", topology, "--trace-sample", "1/4"])
        .args(["--qps", "1000"])
        .args(extra)
        .args(["--duration", "1s", "--warmup", "200ms", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "demo --topology {topology} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let merged = std::fs::read_to_string(dir.join("merged.ndjson")).unwrap();
    let (mut requests, mut summary) = (Vec::new(), None);
    for line in merged.lines() {
        match serde_json::from_str::<Record>(line).unwrap() {
            Record::Request(r) => requests.push(r),
            Record::MergeSummary(s) => summary = Some(s),
            _ => {}
        }
    }
    (requests, summary.expect("merge_summary"))
}

/// Whether `r` has a segment `name` on `node` with unit `unit` (any unit when `None`).
fn has(r: &MergedRequest, name: &str, node: &str, unit: Option<&str>) -> bool {
    r.segments.iter().any(|s| {
        s.name == name && s.node.as_deref() == Some(node) && unit.is_none_or(|u| s.unit == u)
    })
}

fn assert_complete_and_exact(topology: &str, requests: &[MergedRequest], summary: &MergeSummary) {
    assert!(
        requests.len() >= 20,
        "{topology}: {} requests",
        requests.len()
    );
    let complete = requests.iter().filter(|r| r.complete).count();
    assert!(
        complete * 100 >= requests.len() * 99,
        "{topology}: {complete} of {} complete; kernel drops {:?}; first incomplete: {:?}; \
         errors: {:?}",
        requests.len(),
        summary.dropped_per_node,
        requests.iter().find(|r| !r.complete).map(|r| &r.missing),
        summary.errors.iter().take(3).collect::<Vec<_>>()
    );
    for r in requests {
        let sum: u64 = r.segments.iter().map(|s| s.dur_ns).sum();
        assert_eq!(sum, r.e2e_ns, "{topology}: segments sum to end-to-end");
    }
    eprintln!(
        "{topology}: {complete} of {} requests complete, kernel drops {:?}",
        requests.len(),
        summary.dropped_per_node
    );
}

/// Client side of both sidecar topologies: client --UDS--> sidecar-out --TCP--> ...
fn assert_client_node_hops(r: &MergedRequest) {
    assert!(has(r, "uds_send", "A", Some("syscall")), "{r:?}");
    assert!(has(r, "uds_receive", "A", Some("socket")), "{r:?}");
    assert!(
        has(r, "proxy_uds_to_tcp", "A", Some("sidecar-out")),
        "{r:?}"
    );
    assert!(
        has(r, "proxy_tcp_to_uds", "A", Some("sidecar-out")),
        "{r:?}"
    );
    assert!(
        has(r, "tx_tcp_ip", "A", None),
        "the proxy's TCP send: {r:?}"
    );
    assert!(has(r, "client_read_return", "A", Some("client")), "{r:?}");
    let rtt = r
        .segments
        .iter()
        .filter(|s| s.layer == Layer::Network && s.name == "network_round_trip")
        .count();
    assert_eq!(rtt, 1, "one cross-node wait, split once: {r:?}");
}

#[test]
fn direct_one_hop_and_two_hop_requests_are_complete_and_attributed_per_hop() {
    let test = "direct_one_hop_and_two_hop_requests_are_complete_and_attributed_per_hop";
    if !privileged_or_skip(test) || !can_run_with(test, "haproxy") {
        return;
    }
    let out = tempfile::tempdir().unwrap();

    let direct = out.path().join("direct");
    let (requests, summary) = run_demo("direct", &direct, &[]);
    assert_complete_and_exact("direct", &requests, &summary);
    assert_skew_changes_no_duration(&direct, &requests);

    let one_hop = out.path().join("one-hop");
    let (requests, summary) = run_demo("one-hop", &one_hop, &[]);
    assert_complete_and_exact("one-hop", &requests, &summary);
    assert_skew_changes_no_duration(&one_hop, &requests);
    for r in requests.iter().filter(|r| r.complete) {
        assert_client_node_hops(r);
        // The server reads TCP itself: no proxy on B.
        assert!(has(r, "server_handler", "B", Some("server")), "{r:?}");
        assert!(!r.segments.iter().any(|s| s.unit.starts_with("sidecar-in")));
    }

    let two_hop = out.path().join("two-hop");
    let (requests, summary) = run_demo("two-hop", &two_hop, &[]);
    assert_complete_and_exact("two-hop", &requests, &summary);
    for r in requests.iter().filter(|r| r.complete) {
        assert_two_hop_structure(r);
    }
    assert_skew_changes_no_duration(&two_hop, &requests);
    assert_report_shows_hops(&two_hop);
}

/// The demo's text and HTML reports show each sidecar's time and each unix leg as a hop.
fn assert_report_shows_hops(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("report.txt")).unwrap();
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    for hop in [
        "sidecar-out on A",
        "client@A -> sidecar-out@A",
        "sidecar-in on B",
        "sidecar-in@B -> server@B",
        "server@B -> sidecar-in@B",
    ] {
        assert!(text.contains(hop), "{hop} in report.txt:\n{text}");
        assert!(
            html.contains(&hop.replace('>', "&gt;")),
            "{hop} in report.html"
        );
    }
    let unix_legs = text
        .lines()
        .filter(|l| l.contains("unix leg") && l.contains("uds_"))
        .count();
    assert_eq!(unix_legs, 4, "two unix legs per direction:\n{text}");
}

/// (e2e, complete, missing, every segment's name, node, unit, duration and error bound).
type Durations = (
    u64,
    bool,
    Vec<String>,
    Vec<(String, Option<String>, String, u64, Option<u64>)>,
);

fn durations(r: &MergedRequest) -> Durations {
    let segments = r.segments.iter();
    (
        r.e2e_ns,
        r.complete,
        r.missing.clone(),
        segments
            .map(|s| {
                (
                    s.name.to_string(),
                    s.node.as_deref().map(str::to_owned),
                    s.unit.to_string(),
                    s.dur_ns,
                    s.error_ns,
                )
            })
            .collect(),
    )
}

/// The nested waits (client on sidecar-out on A, sidecar-out on sidecar-in across the TCP leg,
/// sidecar-in on the server on B) are each split on their own node: merging the same recordings
/// again with each node's clocks shifted differently changes no duration, bit for bit.
fn assert_skew_changes_no_duration(dir: &Path, requests: &[MergedRequest]) {
    let skewed_file = dir.join("merged-skewed.ndjson");
    let inputs = [
        "kernel-A.capture",
        "kernel-B.capture",
        "probes-client.ndjson",
        "probes-server.ndjson",
    ];
    let output = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .args(inputs.iter().map(|f| dir.join(f)))
        .args(["--inject-skew", "A=-16.34s,B=250123457ns", "-o"])
        .arg(&skewed_file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let skewed: std::collections::HashMap<String, MergedRequest> =
        std::fs::read_to_string(&skewed_file)
            .unwrap()
            .lines()
            .filter_map(|l| match serde_json::from_str::<Record>(l).unwrap() {
                Record::Request(r) => Some((r.trace_id.clone(), r)),
                _ => None,
            })
            .collect();
    assert_eq!(skewed.len(), requests.len(), "the same requests with skew");
    for r in requests {
        let s = &skewed[&r.trace_id];
        assert_eq!(durations(r), durations(s), "{}", r.trace_id);
        assert_ne!(r.start_ns, s.start_ns, "the skew moved absolute times");
    }
    eprintln!(
        "{}: skew A=-16.34s,B=250123457ns: all {} requests' durations identical",
        dir.display(),
        requests.len()
    );
}

/// Both sidecar hops: client node A as in one-hop, then sidecar-in and the server on B.
fn assert_two_hop_structure(r: &MergedRequest) {
    assert_client_node_hops(r);
    assert!(has(r, "proxy_tcp_to_uds", "B", Some("sidecar-in")), "{r:?}");
    assert!(has(r, "proxy_uds_to_tcp", "B", Some("sidecar-in")), "{r:?}");
    assert!(
        has(r, "uds_send", "B", None),
        "the server's unix write: {r:?}"
    );
    assert!(has(r, "server_read_return", "B", Some("server")), "{r:?}");
}

/// TTHeader carries a trace id through the sidecars: the same hop structure must come out
/// when the halves can also pair by it.
#[test]
fn ttheader_two_hop_requests_are_attributed_per_hop() {
    let test = "ttheader_two_hop_requests_are_attributed_per_hop";
    if !privileged_or_skip(test) || !can_run_with(test, "haproxy") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let (requests, summary) = run_demo("two-hop", out.path(), &["--proto", "ttheader"]);
    assert_complete_and_exact("two-hop (ttheader)", &requests, &summary);
    for r in requests.iter().filter(|r| r.complete) {
        assert_two_hop_structure(r);
    }
}

/// The seed's control experiment: the two-hop path with both sidecars on node A. Same hop
/// structure as two-hop, every segment on A, and still one cross-process wait split by the
/// difference method (on one node it is the TCP leg over A's own address).
#[test]
fn control_two_hop_same_node_is_attributed_per_hop_on_one_node() {
    let test = "control_two_hop_same_node_is_attributed_per_hop_on_one_node";
    if !privileged_or_skip(test) || !can_run_with(test, "haproxy") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let (requests, summary) = run_demo("two-hop-same-node", out.path(), &[]);
    assert_complete_and_exact("two-hop-same-node", &requests, &summary);
    for r in requests.iter().filter(|r| r.complete) {
        assert_eq!(r.server_node.as_deref(), Some("A"), "{r:?}");
        assert_client_node_hops(r);
        assert!(has(r, "proxy_tcp_to_uds", "A", Some("sidecar-in")), "{r:?}");
        assert!(has(r, "proxy_uds_to_tcp", "A", Some("sidecar-in")), "{r:?}");
        assert!(has(r, "server_read_return", "A", Some("server")), "{r:?}");
        assert!(
            r.segments
                .iter()
                .all(|s| s.node.as_deref().is_none_or(|n| n == "A")),
            "nothing on B: {r:?}"
        );
    }
}
