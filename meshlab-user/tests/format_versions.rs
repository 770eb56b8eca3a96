//! Versioned formats are checked by the commands (issue 12): a recording or a merged file of
//! an unknown schema version is refused with the version read and the ones supported, and
//! nothing is written.

use std::path::Path;
use std::process::Command;

const PLAIN: &str = "tests/fixtures/merge/plain";

fn meshlab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(args)
        .output()
        .expect("run meshlab")
}

/// `text` with its first `"schema_version":1` replaced by `version`.
fn with_version(text: &str, version: u32) -> String {
    assert!(
        text.contains("\"schema_version\":1"),
        "fixture has no version"
    );
    text.replacen(
        "\"schema_version\":1",
        &format!("\"schema_version\":{version}"),
        1,
    )
}

fn assert_version_error(out: &std::process::Output, file: &str, record: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    let expected = format!("in a `{record}` record: field `schema_version` is 999");
    assert!(err.contains(file) && err.contains(&expected), "{err}");
    assert!(err.contains("reads schema version 1"), "{err}");
}

#[test]
fn merge_refuses_a_recording_of_an_unknown_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = std::fs::read_to_string(Path::new(PLAIN).join("A.kernel.ndjson")).unwrap();
    let future = dir.path().join("A.kernel.ndjson");
    std::fs::write(&future, with_version(&kernel, 999)).unwrap();
    let merged = dir.path().join("merged.ndjson");
    let out = meshlab(&[
        "merge",
        future.to_str().unwrap(),
        &format!("{PLAIN}/B.kernel.ndjson"),
        "-o",
        merged.to_str().unwrap(),
    ]);
    assert_version_error(&out, "A.kernel.ndjson:1:", "startup");
    assert!(!merged.exists(), "an output was written");
}

#[test]
fn report_refuses_a_merged_file_of_an_unknown_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    let merged =
        std::fs::read_to_string("tests/fixtures/merge/golden/plain.timeline.expected.ndjson")
            .unwrap();
    let future = dir.path().join("future.ndjson");
    std::fs::write(&future, with_version(&merged, 999)).unwrap();
    let out = meshlab(&["report", future.to_str().unwrap()]);
    assert_version_error(&out, "future.ndjson:1:", "merge_info");
}
