//! What every fuzz target checks: the input is parsed by the real code path (merge for
//! recordings and probe files, report for merged files) and either accepted or rejected with
//! an error that names an input file (the fuzzed one, or another it conflicts with). A panic,
//! a hang or an error naming no file is a find.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use meshlab_user::capture::{RecordKind, file_header, json_record_bytes};
use meshlab_user::merge::cli::merge_to;
use meshlab_user::merge::pipeline::Options;
use meshlab_user::report::aggregate::Aggregate;
use meshlab_user::report::summary::RunReport;
use meshlab_user::report::text::write_run;

/// The two-node fixture the merge tests use; a target replaces one of its files.
const FIXTURE: [(&str, &str); 4] = [
    (
        "A.kernel.ndjson",
        include_str!("../../tests/fixtures/merge/plain/A.kernel.ndjson"),
    ),
    (
        "A.probe.ndjson",
        include_str!("../../tests/fixtures/merge/plain/A.probe.ndjson"),
    ),
    (
        "B.kernel.ndjson",
        include_str!("../../tests/fixtures/merge/plain/B.kernel.ndjson"),
    ),
    (
        "B.probe.ndjson",
        include_str!("../../tests/fixtures/merge/plain/B.probe.ndjson"),
    ),
];

/// A private directory for this fuzzing process (libFuzzer runs inputs one at a time).
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("meshlab-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        for (name, text) in FIXTURE {
            std::fs::write(dir.join(name), text).expect("fixture");
        }
        dir
    })
}

/// Merges the fixture with `FIXTURE[replaced]` replaced by `data`.
pub fn merge_with(replaced: usize, data: &[u8]) {
    let dir = scratch();
    let (name, original) = FIXTURE[replaced];
    let fuzzed = dir.join(name);
    std::fs::write(&fuzzed, data).expect("write input");
    let files: Vec<PathBuf> = FIXTURE.iter().map(|(n, _)| dir.join(n)).collect();
    let opts = Options {
        window_ns: 1_000_000_000,
        timeline: true,
    };
    let result = merge_to(
        std::io::sink(),
        &files,
        &[],
        &BTreeMap::new(),
        &opts,
        Vec::new(),
    );
    std::fs::write(&fuzzed, original).expect("restore fixture");
    if let Err(e) = result {
        assert_names_a_file(&format!("{e:#}"));
    }
}

/// Merges the fixture with node A's kernel recording replaced by a binary capture: the real
/// file header, a meta record and the fixture's startup record (so the fuzzer starts past the
/// magic and the framing it would otherwise have to guess), then `records` as record bytes.
pub fn merge_capture(records: &[u8]) {
    let startup = FIXTURE[0]
        .1
        .lines()
        .next()
        .expect("the fixture starts with its startup");
    let mut bytes = file_header().to_vec();
    bytes.extend(capture_record(
        RecordKind::Meta,
        br#"{"node":"A","dev_names":{}}"#,
    ));
    bytes.extend(capture_record(RecordKind::Startup, startup.as_bytes()));
    bytes.extend_from_slice(records);
    merge_with(0, &bytes);
}

/// One capture record: kind (u8) and payload length (u32 little-endian), then the payload.
fn capture_record(kind: RecordKind, payload: &[u8]) -> Vec<u8> {
    json_record_bytes(kind, payload).expect("small payload")
}

/// Reads `data` as a merged file the way `meshlab report` does.
pub fn report_on(data: &[u8]) {
    let path = scratch().join("merged.ndjson");
    std::fs::write(&path, data).expect("write input");
    match Aggregate::from_file(&path, true) {
        Ok(mut agg) => {
            let report = RunReport::new(&mut agg);
            write_run(&report, &mut std::io::sink()).expect("writing to a sink");
        }
        Err(e) => assert_names_a_file(&e.to_string()),
    }
}

fn assert_names_a_file(message: &str) {
    let dir = scratch().display().to_string();
    assert!(
        message.contains(&dir),
        "a rejection must name the input file it is about: {message}"
    );
}
