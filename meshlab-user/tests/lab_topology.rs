//! Each topology passes traffic where it should: through HAProxy (asserted on the proxy's own
//! counters: one connection, and exactly the client's bytes) and over the unix socket legs
//! (asserted on the probe records' connection names).

use std::path::Path;

use meshlab_testkit::privileged::{can_run_with, privileged_or_skip};
use meshlab_user::lab::codec::Proto;
use meshlab_user::lab::netns::Lab;
use meshlab_user::lab::topology::{Topology, TopologyRun};
use meshlab_user::lab::workload::latency::LatencySummary;
use meshlab_user::ndjson::RecordReader;
use meshlab_user::schema::{ConnRef, ProbeEvent, Record};

const EXE: &str = env!("CARGO_BIN_EXE_meshlab");

fn probes(path: &Path) -> Vec<ProbeEvent> {
    RecordReader::open(path)
        .unwrap()
        .map(|r| match r.unwrap() {
            Record::Probe(p) => p,
            other => panic!("not a probe: {other:?}"),
        })
        .collect()
}

fn conn_of(events: &[ProbeEvent], point: &str) -> ConnRef {
    events
        .iter()
        .find(|e| e.point == point)
        .unwrap()
        .conn
        .clone()
        .unwrap()
}

/// Total bytes in direction of `point` (end of the last message).
fn stream_bytes(events: &[ProbeEvent], point: &str) -> u64 {
    events
        .iter()
        .filter(|e| e.point == point)
        .map(|e| e.offset.unwrap() + e.len.unwrap())
        .max()
        .unwrap()
}

fn run_topology(topology: Topology) {
    let test = format!("topology_{}", topology.name());
    if !privileged_or_skip(&test)
        || (topology != Topology::Direct && !can_run_with(&test, "haproxy"))
    {
        return;
    }
    let lab = Lab::create().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (client_trace, server_trace) = (
        out.path().join("client.ndjson"),
        out.path().join("server.ndjson"),
    );
    let server_extra = [
        "--trace".into(),
        server_trace.clone().into_os_string(),
        "--node".into(),
        // The node the server really runs on (A in the same-node control).
        topology.server_node().into(),
    ];
    let mut run = TopologyRun::start(
        &lab,
        topology,
        Path::new(EXE),
        Proto::Ttheader,
        &server_extra,
    )
    .unwrap();
    let output = run
        .client_command(&lab, Path::new(EXE), Proto::Ttheader)
        .args([
            "--warmup",
            "100ms",
            "--duration",
            "400ms",
            "--json",
            "--node",
            "A",
            "--trace",
        ])
        .arg(&client_trace)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: LatencySummary = serde_json::from_slice(&output.stdout).unwrap();
    assert!(summary.requests > 10, "{summary:?}");

    let client = probes(&client_trace);
    let (sent, received) = (
        stream_bytes(&client, "client.write_begin"),
        stream_bytes(&client, "client.read_end"),
    );
    for proxy in &run.proxies {
        let stats = proxy.stats().unwrap();
        let frontend = stats.iter().find(|s| s.service == "FRONTEND").unwrap();
        let upstream = stats.iter().find(|s| s.service == "upstream").unwrap();
        assert_eq!(
            frontend.total_sessions, 1,
            "{}: the client's one connection",
            proxy.name
        );
        assert_eq!(
            upstream.total_sessions, 1,
            "{}: one upstream connection",
            proxy.name
        );
        assert_eq!(
            frontend.bytes_in, sent,
            "{}: every request byte went through",
            proxy.name
        );
        assert_eq!(
            frontend.bytes_out, received,
            "{}: every response byte came back",
            proxy.name
        );
    }
    assert_eq!(run.stop_server().unwrap().code(), Some(0));
    let server = probes(&server_trace);
    let (client_conn, server_conn) = (
        conn_of(&client, "client.write_begin"),
        conn_of(&server, "server.read_end"),
    );
    let a = lab.addrs.a.to_string();
    let uds = |c: &ConnRef, name: &str| c.unix_path.as_deref().is_some_and(|p| p.ends_with(name));
    match topology {
        Topology::Direct => {
            assert!(run.proxies.is_empty());
            assert_eq!(client_conn.laddr.as_deref(), Some(a.as_str()));
            assert_eq!(
                server_conn.raddr.as_deref(),
                Some(a.as_str()),
                "server sees the client itself"
            );
            assert_eq!(server_conn.rport, client_conn.lport);
        }
        Topology::OneHop => {
            assert_eq!(run.proxies.len(), 1);
            assert!(
                uds(&client_conn, "client.sock"),
                "client -> sidecar over UDS: {client_conn:?}"
            );
            assert_eq!(
                server_conn.raddr.as_deref(),
                Some(a.as_str()),
                "server sees sidecar A"
            );
        }
        Topology::TwoHop | Topology::TwoHopSameNode => {
            assert_eq!(run.proxies.len(), 2);
            assert!(uds(&client_conn, "client.sock"), "{client_conn:?}");
            assert!(
                uds(&server_conn, "server.sock"),
                "sidecar B -> server over UDS: {server_conn:?}"
            );
        }
    }
    let runtime_dir = run.runtime_dir.path().to_owned();
    drop(run);
    assert!(!runtime_dir.exists(), "sockets and configs removed");
}

#[test]
fn topology_direct() {
    run_topology(Topology::Direct);
}

#[test]
fn topology_one_hop() {
    run_topology(Topology::OneHop);
}

#[test]
fn topology_two_hop() {
    run_topology(Topology::TwoHop);
}

#[test]
fn topology_two_hop_same_node() {
    run_topology(Topology::TwoHopSameNode);
}
