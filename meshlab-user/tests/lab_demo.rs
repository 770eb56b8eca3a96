//! `meshlab demo --no-record`: lab, workload with probes, the files and the summary table,
//! and no namespace left behind. The merge and the report must succeed (a demo whose merge
//! failed is a failed demo) and every merged request's segments must sum to its end-to-end.

use std::process::{Command, Stdio};

use meshlab_testkit::privileged::privileged_or_skip;
use meshlab_user::lab::netns::NETNS_DIR;
use meshlab_user::schema::{MergedRequest, Record};

#[test]
fn demo_without_recorders_writes_probes_and_prints_the_table() {
    if !privileged_or_skip("demo_without_recorders_writes_probes_and_prints_the_table") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let child = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["demo", "--no-record", "--topology", "direct"])
        .args(["--duration", "300ms", "--warmup", "100ms", "--out"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        stdout.contains("| direct | "),
        "table on stdout: {stdout}\n{stderr}"
    );
    for file in [
        "probes-client.ndjson",
        "probes-server.ndjson",
        "client-summary.json",
    ] {
        let path = dir.join(file);
        assert!(
            path.exists() && std::fs::metadata(&path).unwrap().len() > 0,
            "{file}"
        );
        assert!(
            stdout.contains(&path.display().to_string()),
            "{file} listed: {stdout}"
        );
    }
    assert!(dir.join("summary.md").exists());
    // Every step must succeed: a demo whose merge or report failed is a failed demo.
    assert!(
        output.status.success(),
        "the demo failed ({}): {stderr}",
        output.status
    );
    let merged = std::fs::read_to_string(dir.join("merged.ndjson")).expect("merged.ndjson");
    let requests: Vec<MergedRequest> = merged
        .lines()
        .filter_map(|l| match serde_json::from_str::<Record>(l) {
            Ok(Record::Request(r)) => Some(r),
            _ => None,
        })
        .collect();
    assert!(!requests.is_empty(), "the merge produced requests");
    for r in &requests {
        let sum: u64 = r.segments.iter().map(|s| s.dur_ns).sum();
        assert_eq!(sum, r.e2e_ns, "segments sum to end-to-end: {r:?}");
    }
    assert!(dir.join("report.txt").exists(), "the report was written");
    let prefix = format!("mlab-{pid}-");
    let leftovers: Vec<_> = std::fs::read_dir(NETNS_DIR)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(leftovers.is_empty(), "namespaces left: {leftovers:?}");
}
