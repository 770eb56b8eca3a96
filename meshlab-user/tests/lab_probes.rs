//! Userland probe NDJSON of the workload: every line validates against the schema, points
//! follow the catalog, stream offsets match the bytes sent, and sampling is 1 in N.

mod lab_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use lab_support::{ServerProcess, run_client};
use meshlab_user::lab::probes::CATALOG;
use meshlab_user::ndjson::RecordReader;
use meshlab_user::schema::{ClockId, Direction, ProbeEvent, Record};

fn read_probes(path: &Path, node: &str, process: &str) -> Vec<ProbeEvent> {
    let mut events = Vec::new();
    for record in RecordReader::open(path).unwrap() {
        match record.unwrap_or_else(|e| panic!("schema violation: {e}")) {
            Record::Probe(p) => {
                assert_eq!(p.node.as_deref(), Some(node));
                assert_eq!(p.process, process);
                assert_eq!(p.clock, ClockId::Realtime);
                assert!(
                    CATALOG.iter().any(|c| c.0 == p.point),
                    "{} not in catalog",
                    p.point
                );
                events.push(p);
            }
            other => panic!("{}: not a probe record: {other:?}", path.display()),
        }
    }
    events
}

fn names(v: &[ProbeEvent]) -> Vec<&str> {
    v.iter().map(|e| e.point.as_str()).collect()
}

fn points_of(role: &str) -> Vec<&'static str> {
    CATALOG
        .iter()
        .map(|c| c.0)
        .filter(|p| p.starts_with(role))
        .collect()
}

/// trace id -> that request's events in file order.
fn by_trace(events: &[ProbeEvent]) -> BTreeMap<String, Vec<ProbeEvent>> {
    let mut m: BTreeMap<String, Vec<ProbeEvent>> = BTreeMap::new();
    for e in events {
        m.entry(e.trace_id.clone()).or_default().push(e.clone());
    }
    m
}

fn message(events: &[ProbeEvent], point: &str) -> (u64, u64, u64, Direction) {
    let e = events.iter().find(|e| e.point == point).unwrap();
    let conn = e
        .conn
        .as_ref()
        .expect("byte-carrying points name the connection");
    assert!(conn.cookie.is_some(), "SO_COOKIE read");
    assert!(conn.laddr.is_some() && conn.rport.is_some(), "TCP 4-tuple");
    (
        conn.cookie.unwrap(),
        e.offset.unwrap(),
        e.len.unwrap(),
        e.dir.unwrap(),
    )
}

/// Offsets of consecutive messages on one connection and direction leave no gap: each starts
/// where the previous ended, from 0.
fn assert_contiguous(mut msgs: Vec<(u64, u64)>, what: &str) {
    msgs.sort_unstable();
    let mut expected = 0;
    for (offset, len) in msgs {
        assert_eq!(offset, expected, "{what}: gap or overlap");
        assert!(len > 0);
        expected = offset + len;
    }
}

struct Run {
    client: Vec<ProbeEvent>,
    server: Vec<ProbeEvent>,
    requests_total: u64,
}

fn traced_run(proto: &str, sample: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (cli, srv) = (
        dir.path().join("client.ndjson"),
        dir.path().join("server.ndjson"),
    );
    let srv_arg = srv.to_str().unwrap();
    let server_flags = ["--trace", srv_arg, "--trace-sample", sample, "--node", "B"];
    let server = ServerProcess::start(dir.path(), proto, &server_flags);
    let summary = run_client(
        &server.addr,
        proto,
        &[
            "--trace",
            cli.to_str().unwrap(),
            "--trace-sample",
            sample,
            "--node",
            "A",
        ]
        .into_iter()
        .chain(["--concurrency", "2", "--qps", "2000"])
        .collect::<Vec<_>>(),
    );
    server.stop();
    Run {
        client: read_probes(&cli, "A", "client"),
        server: read_probes(&srv, "B", "server"),
        requests_total: summary.requests_total,
    }
}

#[test]
fn every_request_has_all_points_and_offsets_match_the_bytes_sent() {
    for proto in ["ttheader", "framed"] {
        let run = traced_run(proto, "1/1");
        let (client, server) = (by_trace(&run.client), by_trace(&run.server));
        assert_eq!(
            client.len() as u64,
            run.requests_total,
            "{proto}: 1/1 traces every request"
        );
        assert_eq!(
            client.keys().collect::<BTreeSet<_>>(),
            server.keys().collect::<BTreeSet<_>>(),
            "{proto}: client and server agree on trace ids"
        );
        let mut tx: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        let mut rx: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        for (id, c) in &client {
            let s = &server[id];
            assert_eq!(names(c), points_of("client."), "{proto} {id}");
            assert_eq!(names(s), points_of("server."), "{proto} {id}");
            for v in [c, s] {
                assert!(
                    v.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns),
                    "time order {id}"
                );
                assert!(v.iter().all(|e| e.tid == v[0].tid && e.pid == v[0].pid));
            }
            let (cookie, req_off, req_len, d) = message(c, "client.write_begin");
            assert_eq!(d, Direction::Tx);
            let (_, resp_off, resp_len, d) = message(c, "client.read_end");
            assert_eq!(d, Direction::Rx);
            // Same TCP stream seen from both ends: same offsets and lengths.
            let (_, s_req_off, s_req_len, _) = message(s, "server.read_end");
            let (_, s_resp_off, s_resp_len, _) = message(s, "server.write_begin");
            assert_eq!(
                (s_req_off, s_req_len),
                (req_off, req_len),
                "{proto} {id} request"
            );
            assert_eq!(
                (s_resp_off, s_resp_len),
                (resp_off, resp_len),
                "{proto} {id} response"
            );
            tx.entry(cookie).or_default().push((req_off, req_len));
            rx.entry(cookie).or_default().push((resp_off, resp_len));
        }
        assert_eq!(tx.len(), 2, "{proto}: two connections, two cookies");
        for (cookie, msgs) in tx {
            assert_contiguous(msgs, &format!("{proto} tx cookie {cookie}"));
        }
        for (cookie, msgs) in rx {
            assert_contiguous(msgs, &format!("{proto} rx cookie {cookie}"));
        }
    }
}

#[test]
fn one_in_n_requests_is_sampled_on_both_sides() {
    for proto in ["ttheader", "framed"] {
        let run = traced_run(proto, "1/8");
        let (client, server) = (by_trace(&run.client), by_trace(&run.server));
        let expected = run.requests_total as f64 / 8.0;
        // Per connection the first request (seq 0) and then every 8th: at most one extra each.
        assert!(
            (client.len() as f64 - expected).abs() <= 2.0,
            "{proto}: {} sampled of {}",
            client.len(),
            run.requests_total
        );
        assert_eq!(
            client.keys().collect::<Vec<_>>(),
            server.keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn no_trace_flag_means_no_probe_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), "ttheader", &[]);
    run_client(&server.addr, "ttheader", &[]);
    server.stop();
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files,
        ["server.ready"],
        "only the ready file; no probes written"
    );
}
