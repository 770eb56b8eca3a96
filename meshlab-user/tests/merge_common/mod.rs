//! Helpers shared by the merge tests: scenarios as generator configs, running the merge
//! in-process, and reading its output back.
#![allow(dead_code)]

pub mod edit;
pub mod expect;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use meshlab_testkit::synth::{GenConfig, ProbeConn, generate};
use meshlab_user::merge::cli::merge_to;
use meshlab_user::merge::pipeline::Options;
use meshlab_user::ndjson::RecordReader;
use meshlab_user::schema::{Hook, MergeInfo, MergeSummary, MergedRequest, Record};

pub struct Output {
    pub info: MergeInfo,
    pub requests: Vec<MergedRequest>,
    pub timeline: Vec<Record>,
    pub summary: MergeSummary,
}

pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/merge")
        .join(name)
}

/// The committed scenarios: (fixture name, generator config).
pub fn scenarios() -> Vec<(&'static str, GenConfig)> {
    let d = GenConfig::default;
    vec![
        ("plain", d()),
        (
            "gro_rx",
            GenConfig {
                response_len: 2_896,
                gro: true,
                ..d()
            },
        ),
        (
            "rx_without_gro",
            GenConfig {
                response_len: 2_896,
                gro: false,
                ..d()
            },
        ),
        (
            "tso_tx",
            GenConfig {
                request_len: 5_000,
                tso: true,
                ..d()
            },
        ),
        (
            "gso_split_tx",
            GenConfig {
                request_len: 5_000,
                tso: false,
                ..d()
            },
        ),
        (
            "retransmission",
            GenConfig {
                retransmit_every: Some(1),
                ..d()
            },
        ),
        (
            "veth_no_irq",
            GenConfig {
                nic_irq: false,
                ..d()
            },
        ),
        (
            "dropped_event",
            GenConfig {
                drop: Some(("B", Hook::TcpProbe, 0)),
                ..d()
            },
        ),
        (
            "out_of_order",
            GenConfig {
                requests: 3,
                disorder: true,
                ..d()
            },
        ),
        ("in_order", GenConfig { requests: 3, ..d() }),
        (
            "interleaved",
            GenConfig {
                requests: 4,
                connections: 2,
                ..d()
            },
        ),
        (
            "pipelined",
            GenConfig {
                requests: 2,
                pipeline: 2,
                ..d()
            },
        ),
        (
            "kernel_only",
            GenConfig {
                requests: 2,
                probes: false,
                ..d()
            },
        ),
        (
            "probes_by_tuple",
            GenConfig {
                probe_conn: ProbeConn::FourTuple,
                ..d()
            },
        ),
        (
            "probes_without_conn",
            GenConfig {
                requests: 2,
                probe_conn: ProbeConn::Absent,
                ..d()
            },
        ),
        (
            "server_blocking_read",
            GenConfig {
                server_blocking_read: true,
                ..d()
            },
        ),
        (
            "server_kernel_only",
            GenConfig {
                server_probes: false,
                ..d()
            },
        ),
        (
            "tx_completion",
            GenConfig {
                tx_complete_after_ns: Some(1_500),
                ..d()
            },
        ),
        (
            "tx_completion_late",
            GenConfig {
                tx_complete_after_ns: Some(100_000),
                ..d()
            },
        ),
        (
            "tx_completion_after_peer_rx",
            GenConfig {
                tx_complete_after_ns: Some(30_000),
                ..d()
            },
        ),
        (
            "driver_return_after_peer_rx",
            GenConfig {
                driver_returns_after_ns: 25_100,
                ..d()
            },
        ),
        (
            "driver_return_after_reply",
            GenConfig {
                driver_returns_after_ns: 70_000,
                ..d()
            },
        ),
        (
            "tx_hw_timestamp",
            GenConfig {
                tx_hw_tstamp_after_ns: Some(1_000),
                tx_complete_after_ns: Some(1_500),
                ..d()
            },
        ),
        (
            "tx_hw_timestamp_late",
            GenConfig {
                tx_hw_tstamp_after_ns: Some(99_000),
                tx_complete_after_ns: Some(100_000),
                ..d()
            },
        ),
        (
            "tx_hw_timestamp_nic_clock",
            GenConfig {
                tx_hw_tstamp_after_ns: Some(99_000),
                tx_hw_wire_after_doorbell_ns: Some(1_000),
                tx_complete_after_ns: Some(100_000),
                ..d()
            },
        ),
        (
            "rx_hw_timestamp_nic_clock",
            GenConfig {
                rx_hw_stamp_before_irq_ns: Some(700),
                ..d()
            },
        ),
        (
            "hw_timestamps_nic_clock_both_ways",
            GenConfig {
                tx_hw_tstamp_after_ns: Some(99_000),
                tx_hw_wire_after_doorbell_ns: Some(1_000),
                tx_complete_after_ns: Some(100_000),
                rx_hw_stamp_before_irq_ns: Some(700),
                ..d()
            },
        ),
        (
            "tx_hw_timestamp_nic_clock_before_driver_return",
            GenConfig {
                driver_returns_after_ns: 3_000,
                tx_hw_tstamp_after_ns: Some(2_000),
                tx_hw_wire_after_doorbell_ns: Some(1_000),
                ..d()
            },
        ),
    ]
}

/// Input files of a committed fixture, in a stable order.
pub fn fixture_files(name: &str) -> Vec<PathBuf> {
    let dir = fixture_dir(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.to_string_lossy().ends_with(".ndjson")
                && !p.to_string_lossy().ends_with("expected.ndjson")
        })
        .collect();
    files.sort();
    files
}

pub fn merge_files(
    files: &[PathBuf],
    skews: &[(&str, i64)],
    timeline: bool,
) -> anyhow::Result<(Vec<u8>, MergeSummary)> {
    let skews: BTreeMap<String, i64> = skews.iter().map(|(n, s)| (n.to_string(), *s)).collect();
    let opts = Options {
        window_ns: 2_000_000_000,
        timeline,
    };
    let mut out = Vec::new();
    let summary = merge_to(
        &mut out,
        files,
        &[],
        &skews,
        &opts,
        vec!["meshlab".into(), "merge".into()],
    )?;
    Ok((out, summary))
}

pub fn parse(bytes: &[u8]) -> Output {
    let reader = RecordReader::new("merged".into(), bytes);
    let (mut info, mut requests, mut timeline, mut summary) = (None, Vec::new(), Vec::new(), None);
    for r in reader {
        match r.expect("merge output parses with unknown fields denied") {
            Record::MergeInfo(i) => info = Some(i),
            Record::Request(q) => requests.push(q),
            Record::MergeSummary(s) => summary = Some(s),
            other => timeline.push(other),
        }
    }
    Output {
        info: info.expect("merge_info line"),
        requests,
        timeline,
        summary: summary.expect("merge_summary line"),
    }
}

pub fn merge(files: &[PathBuf], skews: &[(&str, i64)]) -> Output {
    let (bytes, _) = merge_files(files, skews, false).expect("merge succeeds");
    parse(&bytes)
}

pub fn generate_into(cfg: &GenConfig, dir: &Path) -> Vec<PathBuf> {
    let mut files = generate(cfg, dir).expect("generate").all();
    files.sort();
    files
}
