//! Fixtures with one node's kernel recording edited: the server thread's scheduler events to
//! insert, and a fixture's files with one recording's lines rewritten.

use std::path::{Path, PathBuf};

use super::fixture_files;

/// A sched_switch of B's server thread (pid and tid 2000, cookie 2000) on CPU 1: `value` 1 is
/// the switch-in, 0 the switch-out with `prev_state`.
pub fn switch(ts: u64, value: i64, prev_state: Option<u64>) -> String {
    let aux = prev_state.map_or(String::new(), |s| format!(",\"aux\":{s}"));
    format!(
        "{{\"type\":\"kernel\",\"node\":\"B\",\"hook\":\"sched_switch\",\"ts_ns\":{ts},\"cpu\":1,\"pid\":2000,\"tid\":2000,\"cookie\":2000,\"value\":{value}{aux}}}"
    )
}

/// The server thread switched out in state `prev_state` (0: preempted, runnable).
pub fn off(ts: u64, prev_state: u64) -> String {
    switch(ts, 0, Some(prev_state))
}

/// The server thread switched in.
pub fn on_cpu(ts: u64) -> String {
    switch(ts, 1, None)
}

/// A wake-up of the server thread by something else (another connection's cookie).
pub fn woken_by_other(ts: u64) -> String {
    format!(
        "{{\"type\":\"kernel\",\"node\":\"B\",\"hook\":\"sched_wakeup\",\"ts_ns\":{ts},\"cpu\":0,\"pid\":2000,\"tid\":2000,\"cookie\":9999,\"aux\":7}}"
    )
}

/// `fixture`'s files with `NODE.kernel.ndjson` replaced by a copy in `dir` whose lines went
/// through `edit`.
pub fn with_kernel_lines(
    dir: &Path,
    fixture: &str,
    node: &str,
    edit: impl FnOnce(&mut Vec<String>),
) -> Vec<PathBuf> {
    let name = format!("{node}.kernel.ndjson");
    let mut files = fixture_files(fixture);
    let at = files.iter().position(|f| f.ends_with(&name)).unwrap();
    let text = std::fs::read_to_string(&files[at]).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    edit(&mut lines);
    let path = dir.join(&name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    files[at] = path;
    files
}
