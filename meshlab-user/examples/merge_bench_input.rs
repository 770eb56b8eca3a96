//! Input for `cargo xtask bench merge`: about N events of synthetic two-node traffic
//! (`meshlab_testkit::synth`) written as NDJSON, and its kernel recordings also as the
//! binary captures a recorder would have written, so both input formats of the merge are
//! timed on the same events. Not part of the `meshlab` binary.
//!
//!     cargo run --release -p meshlab-user --example merge_bench_input -- N OUTDIR [SHAPE]
//!
//! SHAPE (default: the benchmark's plain traffic) is one of `meshlab_testkit::synth::SHAPES`
//! (pipelined, kernel-only, ...), for checking merge changes on more than one kind of input.
//! Prints one JSON line: {"events": total, "ndjson": [files], "capture": [files]}.

#[path = "../tests/capture_common/mod.rs"]
mod capture_common;

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (n, dir, shape) = match args.as_slice() {
        [n, dir] => (n, dir, None),
        [n, dir, shape] => (n, dir, Some(shape)),
        _ => anyhow::bail!("usage: merge_bench_input N OUTDIR [SHAPE]"),
    };
    let n: u64 = n.parse()?;
    let files = match shape {
        None => meshlab_testkit::synth::bench_generate(n, dir.as_ref())?,
        Some(shape) => {
            meshlab_testkit::synth::shape_generate(n, shape, dir.as_ref())?.ok_or_else(|| {
                let known = meshlab_testkit::synth::SHAPES.join(", ");
                anyhow::anyhow!("unknown SHAPE {shape}: expected one of {known}")
            })?
        }
    };
    let mut events = 0u64;
    let mut captures: Vec<PathBuf> = Vec::new();
    for f in &files {
        events += count_events(f)?;
        if f.to_string_lossy().contains(".kernel.") {
            let out = f.with_extension("capture");
            capture_common::ndjson_to_capture(f, &out)?;
            captures.push(out);
        } else {
            captures.push(f.clone());
        }
    }
    let line = serde_json::json!({ "events": events, "ndjson": files, "capture": captures });
    println!("{line}");
    Ok(())
}

/// Kernel and probe lines (not startup, clock or summary lines).
fn count_events(path: &std::path::Path) -> anyhow::Result<u64> {
    use std::io::BufRead;
    let f = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut n = 0;
    for line in f.lines() {
        let line = line?;
        if line.starts_with("{\"type\":\"kernel\"") || line.starts_with("{\"type\":\"probe\"") {
            n += 1;
        }
    }
    Ok(n)
}
