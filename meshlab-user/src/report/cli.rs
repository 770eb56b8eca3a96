//! `meshlab report`.

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::output::{Output, Policy, create_output, write_output};
use crate::schema::{InputKind, MergedRequest};

use super::aggregate::Aggregate;
use super::compare::{ladder, write_ladder};
use super::html::{self, Representatives};
use super::nic::NicReport;
use super::nic_compare::{NicCompare, compare, write_nic_compare};
use super::nic_raw;
use super::nic_rounds::{nic_rounds, write_nic_rounds};
use super::nic_text::write_nic;
use super::perfetto::TraceWriter;
use super::rounds::{rounds, write_rounds};
use super::select::for_each_request;
use super::summary::RunReport;
use super::text::write_run;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["merged", "compare"]))]
pub struct ReportArgs {
    /// Merged NDJSON (the output of `meshlab merge`).
    #[arg(value_name = "MERGED", conflicts_with = "compare")]
    pub merged: Option<PathBuf>,
    /// Print JSON instead of the text tables.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (waterfalls, charts, provenance) to FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "compare")]
    pub html: Option<PathBuf>,
    /// Also write a Chrome/Perfetto trace-event JSON of the requests to FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "compare")]
    pub perfetto: Option<PathBuf>,
    /// Requests in the Perfetto trace: the first N of the file, plus the median and p99 ones.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub perfetto_max: usize,
    /// Compare runs (merged NDJSON files): p50 ladder with steps over the first run.
    #[arg(long, value_name = "RUN", num_args = 2..)]
    pub compare: Vec<PathBuf>,
    /// Names of the compared runs, comma-separated, in order (default: file names). Runs with
    /// the same name are interleaved rounds of one configuration (A,B,A,B,...): each row then
    /// gives the median of the rounds' p50s and whether the configurations' rounds separate.
    #[arg(
        long,
        value_name = "A,B,...",
        value_delimiter = ',',
        requires = "compare"
    )]
    pub labels: Vec<String>,
    /// Per device queue and per CPU: the requests' kernel stages and the raw IRQ/NAPI stream of
    /// the recordings; with --compare, queue by queue with the device settings that differ.
    #[arg(long)]
    pub nic: bool,
    /// Recordings whose raw IRQ/NAPI stream --nic reads (default: the kernel recordings the
    /// merge read, as its merge_info names them).
    #[arg(
        long,
        value_name = "FILE",
        requires = "nic",
        conflicts_with = "compare"
    )]
    pub recording: Vec<PathBuf>,
    /// Count the raw IRQ/NAPI stream only between these two times (ns, CLOCK_MONOTONIC of the
    /// recording's node), e.g. two /proc/interrupts snapshots.
    #[arg(
        long,
        value_name = "START_NS,END_NS",
        value_delimiter = ',',
        num_args = 1,
        requires = "nic"
    )]
    pub raw_window: Vec<u64>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let args = &args;
    if !args.compare.is_empty() {
        return run_compare(args);
    }
    let path = args
        .merged
        .as_deref()
        .expect("clap requires MERGED or --compare");
    let window = raw_window(args)?;
    let mut agg = Aggregate::from_file(path, args.nic)?;
    let report = RunReport::new(&mut agg);
    let nic = match args.nic {
        true => Some(nic_report(&mut agg, &args.recording, window)?),
        false => None,
    };
    // Files first: a reader closing stdout early must not cost the HTML or the trace.
    if args.html.is_some() || args.perfetto.is_some() {
        write_files(args, path, &agg, &report, nic.as_ref())?;
    }
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if let Some(nic) = &nic {
        if args.json {
            serde_json::to_writer_pretty(&mut out, nic)?;
            writeln!(out)?;
        } else {
            write_nic(nic, &mut out)?;
        }
    } else if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write_run(&report, &mut out)?;
    }
    out.flush()?;
    Ok(())
}

/// A Perfetto trace being written to a temporary file beside its destination.
type OpenTrace<'a> = (TraceWriter<BufWriter<Output>>, &'a PathBuf);

fn write_files(
    args: &ReportArgs,
    path: &Path,
    agg: &Aggregate,
    report: &RunReport,
    nic: Option<&NicReport>,
) -> anyhow::Result<()> {
    let (median_at, p99_at) = (report.median_request, report.p99_request);
    let mut median: Option<MergedRequest> = None;
    let mut p99: Option<MergedRequest> = None;
    let mut trace = open_trace(args, agg)?;
    let perfetto_max = if trace.is_some() {
        args.perfetto_max
    } else {
        0
    };
    let last = median_at.max(p99_at).max(perfetto_max.saturating_sub(1));
    for_each_request(
        path,
        last,
        |i| i < perfetto_max || i == median_at || i == p99_at,
        |i, req| {
            if let Some((w, _)) = trace.as_mut() {
                let label = match (i == median_at, i == p99_at) {
                    (true, true) => Some("median and p99"),
                    (true, false) => Some("median"),
                    (false, true) => Some("p99"),
                    _ => None,
                };
                w.request(&req, label)?;
            }
            if i == median_at {
                median = Some(req.clone());
            }
            if i == p99_at {
                p99 = Some(req);
            }
            Ok(())
        },
    )?;
    let (Some(median), Some(p99)) = (median, p99) else {
        bail!(
            "{}: the file changed between the two passes (representative requests not found)",
            path.display()
        );
    };
    let representatives = Representatives {
        median: &median,
        p99: &p99,
    };
    if let Some(trace) = trace {
        finish_trace(trace, path, &representatives)?;
    }
    if let Some(file) = &args.html {
        write_html(file, report, agg, &representatives, nic)?;
    }
    Ok(())
}

fn open_trace<'a>(args: &'a ReportArgs, agg: &Aggregate) -> anyhow::Result<Option<OpenTrace<'a>>> {
    let Some(file) = &args.perfetto else {
        return Ok(None);
    };
    let nodes: Vec<String> = agg
        .info
        .iter()
        .flat_map(|i| i.nodes.iter().map(|n| n.node.clone()))
        .collect();
    let out = create_output(file, Policy::Atomic)?;
    Ok(Some((TraceWriter::new(BufWriter::new(out), &nodes)?, file)))
}

fn finish_trace(
    (w, file): OpenTrace,
    path: &Path,
    representatives: &Representatives,
) -> anyhow::Result<()> {
    let other = serde_json::json!({
        "source": path.display().to_string(),
        "generator": format!("meshlab {}", env!("CARGO_PKG_VERSION")),
        "clocks": "each node's events are on that node's CLOCK_MONOTONIC; events with args.display_only are placed for display",
        "median_trace_id": representatives.median.trace_id,
        "p99_trace_id": representatives.p99.trace_id,
    });
    let events = w.events;
    w.finish(other)?
        .into_inner()
        .map_err(|e| e.into_error())?
        .commit()?;
    log::info!("wrote {} ({events} trace events)", file.display());
    Ok(())
}

fn write_html(
    file: &Path,
    report: &RunReport,
    agg: &Aggregate,
    representatives: &Representatives,
    nic: Option<&NicReport>,
) -> anyhow::Result<()> {
    let page = html::render(report, agg, representatives, nic);
    write_output(file, page.as_bytes())?;
    log::info!("wrote {}", file.display());
    Ok(())
}

fn run_compare(args: &ReportArgs) -> anyhow::Result<()> {
    let labels = compare_labels(args)?;
    let mut runs = args
        .compare
        .iter()
        .map(|p| Aggregate::from_file(p, args.nic))
        .collect::<Result<Vec<_>, _>>()?;
    let ladder = ladder(&runs, &labels);
    // Rounds only from labels given: two files of one name (x/merged, y/merged) are two runs,
    // and are not checked for interleaving either.
    let rounds = match args.labels.is_empty() {
        true => None,
        false => rounds(&ladder),
    };
    let nic = match args.nic {
        true => {
            let names = match rounds {
                Some(_) => round_names(&labels),
                None => labels.clone(),
            };
            Some(nic_compare(&mut runs, &names, raw_window(args)?)?)
        }
        false => None,
    };
    let nic_rounds = match (&nic, &rounds) {
        (Some(nic), Some(_)) => Some(nic_rounds(nic, &labels)),
        _ => None,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if args.json {
        let value = match (&nic, &rounds) {
            (None, None) => serde_json::to_value(&ladder)?,
            _ => serde_json::json!({
                "ladder": ladder, "rounds": rounds, "nic": nic, "nic_rounds": nic_rounds
            }),
        };
        serde_json::to_writer_pretty(&mut out, &value)?;
        writeln!(out)?;
    } else {
        match &rounds {
            // Rounds of a few configurations: the per-run ladder and its run-to-run steps in
            // words would be A, B, A, B, ... over the first round.
            Some(rounds) => write_rounds(rounds, &mut out)?,
            None => {
                write_ladder(&ladder, &mut out)?;
                super::steps::write_steps(&runs, &labels, &mut out)?;
            }
        }
        if let Some(nic) = &nic {
            write_nic_compare(nic, &mut out)?;
        }
        if let Some(r) = &nic_rounds {
            write_nic_rounds(r, &mut out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The compared runs' names: `--labels`, one per run, else the files' stems.
fn compare_labels(args: &ReportArgs) -> anyhow::Result<Vec<String>> {
    if args.labels.is_empty() {
        let stem = |p: &PathBuf| {
            p.file_stem().map_or_else(
                || p.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            )
        };
        return Ok(args.compare.iter().map(stem).collect());
    }
    if args.labels.len() != args.compare.len() {
        bail!(
            "--labels has {} names for {} runs; give one per run",
            args.labels.len(),
            args.compare.len()
        );
    }
    Ok(args.labels.clone())
}

/// Each run's label with its round number (`A#1`, `B#1`, `A#2`, ...), for tables that list runs.
fn round_names(labels: &[String]) -> Vec<String> {
    (0..labels.len())
        .map(|i| {
            let round = labels[..=i].iter().filter(|l| **l == labels[i]).count();
            format!("{}#{round}", labels[i])
        })
        .collect()
}

/// `--raw-window START_NS,END_NS`, checked.
fn raw_window(args: &ReportArgs) -> anyhow::Result<Option<[u64; 2]>> {
    match args.raw_window[..] {
        [] => Ok(None),
        [a, b] if a <= b => Ok(Some([a, b])),
        _ => bail!(
            "--raw-window: expected START_NS,END_NS with START_NS <= END_NS, got {:?}",
            args.raw_window
        ),
    }
}

/// The recordings `--nic` reads: the given ones, else the kernel inputs of the merge.
fn recordings(agg: &Aggregate, given: &[PathBuf]) -> Vec<PathBuf> {
    if !given.is_empty() {
        return given.to_vec();
    }
    let inputs = agg.info.iter().flat_map(|i| i.inputs.iter());
    (inputs.filter(|i| i.kind == InputKind::Kernel))
        .map(|i| PathBuf::from(&i.file))
        .collect()
}

fn nic_report(
    agg: &mut Aggregate,
    given: &[PathBuf],
    window: Option<[u64; 2]>,
) -> anyhow::Result<NicReport> {
    let mut raw = BTreeMap::new();
    for path in recordings(agg, given) {
        // A recording the merge read but that is not here any more: said in the report.
        if given.is_empty() && !path.exists() {
            log::warn!(
                "{}: not found: no raw IRQ/NAPI stream for it",
                path.display()
            );
            continue;
        }
        let (node, stream) = nic_raw::read(&path, window)?;
        raw.insert(node, stream);
    }
    let file = agg.file.display().to_string();
    if agg.nic.is_empty() {
        log::warn!(
            "{file}: no kernel segment says where it ran (`place`): merged by an older meshlab? run `meshlab merge` again"
        );
    }
    let mut report = NicReport::new(file, &mut agg.nic, raw, window);
    if let Some(info) = &agg.info {
        report.add_timestamps(&info.nodes);
    }
    Ok(report)
}

fn nic_compare(
    runs: &mut [Aggregate],
    labels: &[String],
    window: Option<[u64; 2]>,
) -> anyhow::Result<NicCompare> {
    let mut reports = Vec::new();
    let mut startups = Vec::new();
    for agg in runs.iter_mut() {
        reports.push(nic_report(agg, &[], window)?);
        startups.push(agg.info.as_ref().map_or_else(Vec::new, |i| i.nodes.clone()));
    }
    Ok(compare(labels, &reports, &startups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_names_number_each_labels_rounds() {
        let labels: Vec<String> = ["A", "B", "A", "B", "A"].map(String::from).to_vec();
        assert_eq!(round_names(&labels), ["A#1", "B#1", "A#2", "B#2", "A#3"]);
    }
}
