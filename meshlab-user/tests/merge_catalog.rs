//! Any probe catalog (docs/probes.md): a fixture written to the probe NDJSON contract in the
//! shape of the seed's mesh (Kitex client -> envoy-out on node A, envoy-in -> Kitex server on
//! node B; four processes per request, more than 100 point names, probes only) is merged:
//! every point is placed, pairs without a standard definition are named after their points in
//! their process, the cross-node wait is split between envoy-out's TCP write and read, and the
//! segments sum exactly to end-to-end.

mod merge_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use merge_common::{merge, parse};
use meshlab_user::schema::{ProbeEvent, Record};

fn fixture() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/catalog");
    vec![dir.join("probes-A.ndjson"), dir.join("probes-B.ndjson")]
}

fn probes() -> Vec<ProbeEvent> {
    fixture()
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| match serde_json::from_str::<Record>(l).unwrap() {
                    Record::Probe(p) => p,
                    other => panic!("not a probe record: {other:?}"),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The lab catalog's points that map to standard chain points (docs/probe-catalog.md).
const STANDARD: &[&str] = &[
    "client.encode_begin",
    "client.encode_end",
    "client.write_begin",
    "client.read_ready",
    "client.read_end",
    "client.decode_end",
    "server.read_ready",
    "server.read_end",
    "server.decode_end",
    "server.handler_begin",
    "server.handler_end",
    "server.encode_end",
    "server.write_begin",
];

#[test]
fn the_fixture_is_the_seeds_shape() {
    let probes = probes();
    let names: BTreeSet<&str> = probes.iter().map(|p| p.point.as_str()).collect();
    assert!(names.len() > 100, "{} point names", names.len());
    let mut per_trace: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for p in &probes {
        per_trace.entry(&p.trace_id).or_default().insert(&p.process);
    }
    assert!(
        per_trace.values().all(|procs| procs.len() == 4),
        "{per_trace:?}"
    );
}

#[test]
fn a_four_process_catalog_merges_with_every_point_placed() {
    let probes = probes();
    let custom = probes
        .iter()
        .filter(|p| !STANDARD.contains(&p.point.as_str()))
        .count() as u64;
    let out = merge(&fixture(), &[]);
    assert_eq!(out.requests.len(), 3);
    assert_eq!(
        out.summary.custom_points, custom,
        "every custom point placed"
    );
    assert_eq!(out.summary.unplaced_points, 0);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    for r in &out.requests {
        let sum: u64 = r.segments.iter().map(|s| s.dur_ns).sum();
        assert_eq!(sum, r.e2e_ns, "{}: Σ segments = end-to-end", r.trace_id);
        // Probes only: the kernel's stages are the one thing missing, per node.
        assert_eq!(
            r.missing,
            vec!["A:kernel (no recording)", "B:kernel (no recording)"]
        );
        let units = |node: &str, unit: &str| {
            r.segments
                .iter()
                .filter(|s| s.node.as_deref() == Some(node) && s.unit == unit)
                .count()
        };
        assert!(units("A", "envoy-out") >= 30, "{r:?}");
        assert!(units("B", "envoy-in") >= 30, "{r:?}");
        assert!(units("A", "kitex-client") >= 10, "{r:?}");
        assert!(units("B", "kitex-server") >= 10, "{r:?}");
        let named = |name: &str| r.segments.iter().any(|s| s.name == name);
        assert!(named(
            "envoy-out.router_route_match..envoy-out.router_cluster_pick"
        ));
        assert!(named("server.biz_db_get..server.biz_db_put"));
        // The wait is split between envoy-out's TCP write (`dir: tx`) and read (`dir: rx`):
        // the fixture puts 40 us on the wire plus envoy-out's 900 ns step to its read.
        let rtt: Vec<_> = r
            .segments
            .iter()
            .filter(|s| s.name == "network_round_trip")
            .collect();
        assert_eq!(rtt.len(), 1);
        assert_eq!(rtt[0].dur_ns, 40_900);
        let derived = rtt[0].derived.as_ref().unwrap();
        assert_eq!(
            derived.outer,
            vec![
                "envoy-out.upstream_write_begin",
                "envoy-out.upstream_read_end"
            ]
        );
    }
}

#[test]
fn unplaceable_points_are_counted_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = fixture();
    // A point of another process inside the client's wait that names no TCP connection, and
    // one of a trace no half on its node has.
    let extra = dir.path().join("probes-A-extra.ndjson");
    let line = |trace: &str, ts: u64| {
        format!(
            r#"{{"type":"probe","node":"A","process":"envoy-out","pid":200,"tid":201,"ts_ns":{ts},"clock":"monotonic","trace_id":"{trace}","point":"envoy-out.upstream_idle"}}"#
        )
    };
    let first_wait_ns = 1_000_000_000 + 9 * 700 + 21 * 1_100 + 10_000;
    std::fs::write(
        &extra,
        format!(
            "{}\n{}\n",
            line("t000", first_wait_ns),
            line("nobody", 1_000_000_001)
        ),
    )
    .unwrap();
    files.push(extra);
    let (bytes, summary) = merge_common::merge_files(&files, &[], false).unwrap();
    assert_eq!(summary.unplaced_points, 2);
    assert_eq!(parse(&bytes).summary.unplaced_points, 2);
}
