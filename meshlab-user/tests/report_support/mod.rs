//! Shared by the report_* integration tests: fixture paths, running the binary, and an
//! independent re-computation of the figures straight from the fixture JSON (so the tests do
//! not check the report's arithmetic with the report's own code).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/report")
        .join(name)
}

pub fn meshlab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_meshlab"));
    c.env("RUST_LOG", "warn");
    c
}

pub fn run(args: &[&str]) -> Output {
    meshlab().args(args).output().expect("run meshlab")
}

/// Runs and asserts success; returns stdout.
pub fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "meshlab {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// The `request` records of a merged file, as plain JSON.
pub fn requests(name: &str) -> Vec<serde_json::Value> {
    requests_in(&fixture(name))
}

pub fn requests_in(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "request")
        .collect()
}

/// Nearest rank: the value at 1-based rank ceil(q * n) of the sorted values.
pub fn nearest_rank(values: &[u64], q: f64) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64) - 1e-9).ceil().max(1.0) as usize;
    v[rank - 1]
}

pub fn e2e(reqs: &[serde_json::Value]) -> Vec<u64> {
    reqs.iter().map(|r| r["e2e_ns"].as_u64().unwrap()).collect()
}

/// Per segment "name@node" (node `derived` when absent): its duration in each request that has
/// it (summed if it repeats within a request).
pub fn segment_samples(reqs: &[serde_json::Value]) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in reqs {
        let mut this: BTreeMap<String, u64> = BTreeMap::new();
        for s in r["segments"].as_array().unwrap() {
            let key = format!(
                "{}@{}",
                s["name"].as_str().unwrap(),
                s["node"].as_str().unwrap_or("derived")
            );
            *this.entry(key).or_default() += s["dur_ns"].as_u64().unwrap();
        }
        for (k, d) in this {
            out.entry(k).or_default().push(d);
        }
    }
    out
}

/// Index of the first request whose end-to-end is the nearest-rank quantile `q`.
pub fn representative(reqs: &[serde_json::Value], q: f64) -> usize {
    let all = e2e(reqs);
    let target = nearest_rank(&all, q);
    all.iter().position(|&v| v == target).unwrap()
}

/// Microseconds with two decimals, as the report prints them.
pub fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0 + 1e-9)
}
