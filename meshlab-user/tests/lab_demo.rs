//! `meshlab demo --no-record`: lab, workload with probes, the files and the summary table,
//! and no namespace left behind. Merge/report are other modules: whether they succeed or not,
//! the demo must list its files, print the table, and name any failed step.

use std::process::{Command, Stdio};

use meshlab_testkit::privileged::privileged_or_skip;
use meshlab_user::lab::netns::NETNS_DIR;

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
    if !output.status.success() {
        assert!(
            stderr.contains("FAILED: [direct] meshlab merge")
                || stderr.contains("FAILED: [direct] meshlab report"),
            "a failing demo names the failed step: {stderr}"
        );
        assert!(
            stderr.contains(&dir.display().to_string()),
            "and where the files are"
        );
    }
    let prefix = format!("mlab-{pid}-");
    let leftovers: Vec<_> = std::fs::read_dir(NETNS_DIR)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(leftovers.is_empty(), "namespaces left: {leftovers:?}");
}
