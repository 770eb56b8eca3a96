//! `meshlab merge`: arguments, output file handling (temp file + rename, so a failure never
//! leaves half a file at `-o`), and the merge_info / merge_summary framing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ndjson::RecordWriter;
use crate::output::{Output, Policy, create_output};
use crate::schema::{InputKind, MergeInfo, MergeInput, MergeSummary, Record, SCHEMA_VERSION};
use crate::units::{parse_duration, parse_offset_ns};

use super::MergeError;
use super::input;
use super::pipeline::{self, Options};

#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// Kernel recordings (first record `startup`) and probe files (`probe` records); the kind
    /// is detected from the records.
    pub files: Vec<PathBuf>,
    /// A probe file whose lines have no `node` field: NAME=FILE.
    #[arg(long = "node", value_name = "NAME=FILE")]
    pub node: Vec<String>,
    /// Shift a node's clocks: NODE=OFFSET[,NODE=OFFSET] (e.g. B=16.34s, A=-250ms, C=12ns;
    /// OFFSET is a signed duration with a unit). Absolute times move; every duration stays
    /// bit-identical.
    #[arg(long, value_name = "NODE=OFFSET", value_delimiter = ',')]
    pub inject_skew: Vec<String>,
    /// Reorder and join window: how far out of order NDJSON lines may be (a binary capture,
    /// which `record` writes in time order, is read 10 ms ahead, or the window if shorter or
    /// if its node has hardware TX stamps) and how long after a message
    /// its kernel events may appear; a number with a unit: ns, us, ms, s, m or h. Memory grows
    /// with event rate x window.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = parse_duration)]
    pub window: Duration,
    /// Output file (default: stdout). Written to a temporary file and renamed on success.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Also write each request's observed points as timeline lines (`probe` records with
    /// clock=monotonic, kernel points named `kernel.HOOK`) before its `request` line.
    #[arg(long)]
    pub timeline: bool,
}

fn parse_pairs(items: &[String], flag: &str) -> Result<Vec<(String, String)>, MergeError> {
    items
        .iter()
        .map(|s| {
            s.split_once('=')
                .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| MergeError::Usage(format!("{flag} \"{s}\": expected NAME=VALUE")))
        })
        .collect()
}

pub fn run(args: MergeArgs) -> anyhow::Result<()> {
    let window_ns = u64::try_from(args.window.as_nanos())
        .map_err(|_| MergeError::Usage("--window: out of range".into()))?;
    let mut skews = BTreeMap::new();
    for (node, off) in parse_pairs(&args.inject_skew, "--inject-skew")? {
        let ns = parse_offset_ns(&off)
            .map_err(|e| MergeError::Usage(format!("--inject-skew {node}={e}")))?;
        skews.insert(node, ns);
    }
    let named: Vec<(String, PathBuf)> = parse_pairs(&args.node, "--node")?
        .into_iter()
        .map(|(n, f)| (n, PathBuf::from(f)))
        .collect();
    if args.files.is_empty() && named.is_empty() {
        return Err(MergeError::Usage("no input files".into()).into());
    }
    let command: Vec<String> = std::env::args().collect();
    let opts = Options {
        window_ns,
        timeline: args.timeline,
    };
    let summary = match &args.output {
        Some(out) => write_atomically(out, |w| {
            merge_to(w, &args.files, &named, &skews, &opts, command)
        })?,
        None => {
            let stdout = std::io::stdout().lock();
            merge_to(stdout, &args.files, &named, &skews, &opts, command)?
        }
    };
    log::info!(
        "merged {} requests: {} complete, {} incomplete, {} errors; kernel drops: {}",
        summary.requests,
        summary.complete,
        summary.incomplete,
        summary.errors.len(),
        pipeline::per_node(&summary.dropped_per_node)
    );
    for e in summary.errors.iter().take(5) {
        log::warn!("{e}");
    }
    Ok(())
}

/// Writes through a temporary file next to `out` (crate::output's rules) and renames it into
/// place only on success.
fn write_atomically<T>(
    out: &Path,
    body: impl FnOnce(&mut Output) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let mut file = create_output(out, Policy::Atomic)?;
    let value = body(&mut file)?;
    file.commit()?;
    Ok(value)
}

/// The whole merge into `out`: merge_info, requests (and timeline lines), merge_summary.
pub fn merge_to<W: Write>(
    out: W,
    files: &[PathBuf],
    named: &[(String, PathBuf)],
    skews: &BTreeMap<String, i64>,
    opts: &Options,
    command: Vec<String>,
) -> anyhow::Result<MergeSummary> {
    let plan = input::plan(files, named, skews)?;
    let mut writer = RecordWriter::new(out);
    let inputs = plan
        .files
        .iter()
        .flat_map(|f| {
            f.nodes.iter().map(|n| MergeInput {
                file: f.display.clone(),
                node: n.clone(),
                kind: f.kind,
            })
        })
        .collect();
    writer.write(&Record::MergeInfo(MergeInfo {
        schema_version: SCHEMA_VERSION,
        version: env!("CARGO_PKG_VERSION").into(),
        command,
        inputs,
        nodes: plan.startups.clone(),
        injected_skew_ns: skews.clone(),
    }))?;
    if plan.files.iter().all(|f| f.kind == InputKind::Probe) {
        log::warn!("no kernel recording among the inputs: only userland stages can be attributed");
    }
    let summary = pipeline::run(&plan, opts, &mut |r| writer.write(&r))?;
    writer.write(&Record::MergeSummary(summary.clone()))?;
    let mut inner = writer.into_inner()?;
    inner.flush()?;
    Ok(summary)
}
