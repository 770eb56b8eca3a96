//! The merged output format (golden file) and the command line: bad input names file, line and
//! field, exits non-zero and never leaves a half-written output.

mod merge_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use merge_common::{merge_files, parse};

const GOLDEN: &str = "tests/fixtures/merge/golden/plain.timeline.expected.ndjson";
const BUSY_GOLDEN: &str = "tests/fixtures/merge/golden/busy.expected.ndjson";

fn plain_inputs() -> Vec<PathBuf> {
    // Relative paths keep merge_info identical on every machine (tests run in the crate dir).
    [
        "A.kernel.ndjson",
        "A.probe.ndjson",
        "B.kernel.ndjson",
        "B.probe.ndjson",
    ]
    .iter()
    .map(|f| Path::new("tests/fixtures/merge/plain").join(f))
    .collect()
}

#[test]
fn golden_output_with_timeline() {
    let (bytes, _) = merge_files(&plain_inputs(), &[], true).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    if std::env::var_os("MESHLAB_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(Path::new(GOLDEN).parent().unwrap()).unwrap();
        std::fs::write(GOLDEN, &text).unwrap();
    }
    let golden =
        std::fs::read_to_string(GOLDEN).expect("golden file (MESHLAB_UPDATE_GOLDEN=1 writes it)");
    assert_eq!(text, golden, "merged output drifted from {GOLDEN}");
    let out = parse(text.as_bytes());
    assert_eq!(out.info.inputs.len(), 4);
    assert_eq!(out.requests.len(), 1);
    // One timeline line per observed point: 7+10+... of the client and server chains.
    assert!(out.timeline.len() > 30, "{}", out.timeline.len());
    assert_eq!(out.summary.requests, 1);
}

/// Locks the merged bytes of busier traffic than `plain`: several connections, jittered
/// stages, retransmissions and lines out of order within the window, so the reorder buffer,
/// the kernel index and the wake-up lookups all hold many entries (performance work on them
/// must not change a byte). The merge_info line names temporary paths and is left out.
#[test]
fn golden_output_of_busy_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = meshlab_testkit::synth::GenConfig {
        requests: 24,
        connections: 4,
        jitter_seed: Some(7),
        retransmit_every: Some(5),
        disorder: true,
        ..Default::default()
    };
    let files = merge_common::generate_into(&cfg, dir.path());
    let (bytes, summary) = merge_files(&files, &[], false).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let (info, body) = text.split_once('\n').unwrap();
    assert!(info.starts_with("{\"type\":\"merge_info\""), "{info}");
    if std::env::var_os("MESHLAB_UPDATE_GOLDEN").is_some() {
        std::fs::write(BUSY_GOLDEN, body).unwrap();
    }
    let golden = std::fs::read_to_string(BUSY_GOLDEN)
        .expect("golden file (MESHLAB_UPDATE_GOLDEN=1 writes it)");
    assert_eq!(body, golden, "merged output drifted from {BUSY_GOLDEN}");
    assert_eq!(summary.requests, 24);
    assert_eq!(summary.complete, 24, "{:?}", summary.errors);
}

fn meshlab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .args(args)
        .output()
        .expect("run meshlab")
}

fn write(dir: &Path, name: &str, lines: &[&str]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p.to_string_lossy().into_owned()
}

fn first_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned()
}

fn fails_with(args: &[&str], expected: &[&str]) {
    let out = meshlab(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {stderr}");
    for e in expected {
        assert!(stderr.contains(e), "stderr lacks {e:?}: {stderr}");
    }
}

#[test]
fn bad_input_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let startup = first_line("tests/fixtures/merge/plain/A.kernel.ndjson");
    let probe_ok = r#"{"type":"probe","node":"A","process":"client","pid":1,"tid":1,"ts_ns":1700001000001000000,"clock":"realtime","trace_id":"t","point":"client.encode_begin"}"#;
    let probe_bad = r#"{"type":"probe","node":"A","process":"client","pid":1,"tid":1,"ts_ns":"soon","clock":"realtime","trace_id":"t","point":"client.encode_begin"}"#;
    let k0 = write(dir.path(), "k0.ndjson", &[&startup]);
    let f = write(dir.path(), "p.ndjson", &[probe_ok, probe_bad]);
    fails_with(
        &[&k0, &f],
        &[&format!("{f}:2: in a `probe` record"), "expected u64"],
    );

    let est = r#"{"type":"kernel","node":"A","hook":"sock_established","ts_ns":5,"cpu":0,"pid":1,"tid":1,"cookie":7,"saddr":"10.0.0.1","daddr":"10.0.0.2","dport":9000,"active":true}"#;
    let k = write(dir.path(), "k.ndjson", &[&startup, est]);
    fails_with(
        &[&k],
        &[&format!(
            "{k}:2: in a `kernel` record: field `sport`: required for sock_established"
        )],
    );

    let other_node =
        r#"{"type":"kernel","node":"Z","hook":"tcp_probe","ts_ns":5,"cpu":0,"pid":1,"tid":1}"#;
    let k2 = write(dir.path(), "k2.ndjson", &[&startup, other_node]);
    fails_with(
        &[&k2],
        &[&format!("{k2}:2: in a `kernel` record: field `node`")],
    );

    let nameless = r#"{"type":"probe","process":"client","pid":1,"tid":1,"ts_ns":1,"clock":"realtime","trace_id":"t","point":"client.encode_begin"}"#;
    let p2 = write(dir.path(), "p2.ndjson", &[nameless]);
    fails_with(
        &[&p2],
        &[&format!(
            "{p2}:1: in a `probe` record: field `node` is missing"
        )],
    );

    let clock_first = r#"{"type":"clock","realtime_ns":1,"monotonic_ns":2,"tai_ns":3,"boottime_ns":4,"bracket_ns":5}"#;
    let c = write(dir.path(), "c.ndjson", &[clock_first]);
    fails_with(&[&c], &[&format!("{c}:1: expected a `startup` record")]);

    let bad_point = r#"{"type":"probe","node":"A","process":"client","pid":1,"tid":1,"ts_ns":1700001000001000000,"clock":"realtime","trace_id":"t","point":"encode_begin"}"#;
    let p3 = write(dir.path(), "p3.ndjson", &[bad_point]);
    let k3 = write(dir.path(), "k3.ndjson", &[&startup]);
    fails_with(
        &[&k3, &p3],
        &[
            &format!("{p3}:1: in a `probe` record: field `point`"),
            "expected ROLE.NAME",
        ],
    );

    // Without a kernel recording a node's probes keep their clock: two clocks cannot be related.
    let mono = probe_ok.replace("\"realtime\"", "\"monotonic\"");
    let p4 = write(dir.path(), "p4.ndjson", &[probe_ok, &mono]);
    fails_with(
        &[&p4],
        &["node A has no kernel recording", "declare different clocks"],
    );

    // Neither format: the first bytes are shown, not a JSON error about line 1.
    let binary = dir.path().join("random.capture");
    std::fs::write(&binary, b"\x7fELF\x02\x01\x01\0rest").unwrap();
    let binary = binary.to_str().unwrap();
    fails_with(
        &[binary],
        &[
            &format!(
                "{binary}: neither a meshlab capture (it would start with \"MESHCAP\\x00\") nor NDJSON"
            ),
            "it starts with \"\\x7fELF\\x02\\x01\\x01\\x00\"",
        ],
    );
    // A missing file names its cause once.
    let missing = dir.path().join("missing.capture");
    let missing = missing.to_str().unwrap();
    let out = meshlab(&[missing]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );

    fails_with(
        &[&k3, "--inject-skew", "Q=1s"],
        &["--inject-skew names node \"Q\""],
    );
    fails_with(&[&k3, "--window", "2 parsecs"], &["--window"]);
    // A bare number is refused, not read as nanoseconds (record and the lab use the same rule).
    fails_with(
        &[&k3, "--window", "5"],
        &["--window", "ns, us, ms, s, m or h"],
    );
}

#[test]
fn a_failed_merge_leaves_the_output_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.ndjson");
    std::fs::write(&out, "previous result\n").unwrap();
    let mut lines: Vec<String> =
        std::fs::read_to_string("tests/fixtures/merge/in_order/B.kernel.ndjson")
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
    let n = lines.len();
    lines[n - 5] = "{\"type\":\"kernel\",\"node\":\"B\"}".into();
    let bad = dir.path().join("B.kernel.ndjson");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let good = |f: &str| format!("tests/fixtures/merge/in_order/{f}");
    let result = meshlab(&[
        &good("A.kernel.ndjson"),
        &good("A.probe.ndjson"),
        bad.to_str().unwrap(),
        &good("B.probe.ndjson"),
        "-o",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success());
    assert!(
        stderr.contains(&format!(
            "B.kernel.ndjson:{}: in a `kernel` record: missing field",
            n - 4
        )),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous result\n");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers.len(),
        2,
        "temporary file left behind: {leftovers:?}"
    );
}

#[test]
fn node_flag_names_probe_files_and_output_goes_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    // Strip the node field from A's probe file: --node A=FILE must supply it.
    let text = std::fs::read_to_string("tests/fixtures/merge/plain/A.probe.ndjson").unwrap();
    let stripped = text.replace("\"node\":\"A\",", "");
    assert_ne!(stripped, text);
    let probe = dir.path().join("client.ndjson");
    std::fs::write(&probe, stripped).unwrap();
    let out = dir.path().join("merged.ndjson");
    let node_arg = format!("A={}", probe.display());
    let result = meshlab(&[
        "tests/fixtures/merge/plain/A.kernel.ndjson",
        "tests/fixtures/merge/plain/B.kernel.ndjson",
        "tests/fixtures/merge/plain/B.probe.ndjson",
        "--node",
        &node_arg,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let merged = parse(&std::fs::read(&out).unwrap());
    assert_eq!(merged.requests.len(), 1);
    assert!(merged.requests[0].complete);
    assert_eq!(merged.requests[0].e2e_ns, 82_100);
}

/// request_json writes a borrowed segment name or unit (these tables' names and fixed units)
/// without scanning it for bytes to escape: none of them may have one.
#[test]
fn catalog_names_and_fixed_units_need_no_escaping() {
    use meshlab_user::merge::segments::{READER_SEGMENTS, SEGMENTS, Unit};
    let fixed = |u: Unit| match u {
        Unit::Fixed(u) => Some(u),
        Unit::Process => None,
    };
    let names = SEGMENTS.iter().flat_map(|d| [Some(d.name), fixed(d.unit)]);
    let reader = READER_SEGMENTS
        .iter()
        .flat_map(|d| [Some(d.name), fixed(d.unit)]);
    for s in names.chain(reader).flatten() {
        assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""), "{s}");
    }
}
