//! The `meshlab` command line. Data goes to stdout (or `-o`), logs to stderr; a closed
//! downstream pipe ends output successfully.

use clap::{Parser, Subcommand};
use meshlab_user::{capture, kernel, lab, merge, ndjson, report};

#[derive(Debug, Parser)]
#[command(
    name = "meshlab",
    version,
    about = "eBPF tracer for the below-syscall part of RPC latency"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check what this kernel allows and print the attach plan `record` would use.
    Doctor(kernel::doctor::DoctorArgs),
    /// Load the kernel programs and record kernel events into a binary capture (needs root).
    Record(kernel::record::RecordArgs),
    /// Turn a binary capture into NDJSON (the documented interchange format).
    Export(capture::export::ExportArgs),
    /// Join kernel and userland NDJSON of all nodes and attribute every microsecond.
    Merge(merge::cli::MergeArgs),
    /// Show where the time went: tables, HTML, Perfetto; compare runs.
    Report(report::cli::ReportArgs),
    /// The lab: two network namespaces and an RPC workload with userland probes.
    Lab(lab::cli::LabArgs),
    /// Run the lab end to end: record, workload, merge, report.
    Demo(lab::cli::DemoArgs),
}

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_micros()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Doctor(args) => kernel::doctor::run(args),
        Command::Record(args) => kernel::record::run(args),
        Command::Export(args) => capture::export::run(args),
        Command::Merge(args) => merge::cli::run(args),
        Command::Report(args) => report::cli::run(args),
        Command::Lab(args) => lab::cli::run_lab(args),
        Command::Demo(args) => lab::cli::run_demo(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if ndjson::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meshlab: error: {}", error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message already
/// carries: library errors name their source in their own text ("FILE: cannot open: CAUSE")
/// and also return it as `source()`, so anyhow's `{:#}` would print the cause twice.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let open = meshlab_user::capture::CaptureError::Open {
            file: "/x.capture".into(),
            source: io,
        };
        let e = anyhow::Error::new(open).context("merging");
        assert_eq!(
            error_text(&e),
            "merging: /x.capture: cannot open: entity not found"
        );
    }

    #[test]
    fn causes_not_in_the_message_are_kept_in_order() {
        let e = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(error_text(&e), "outer: middle: inner");
    }
}

/// mimalloc instead of glibc's malloc: the merge allocates and frees a window of events per
/// node (the reading threads allocate what the merging thread frees), where glibc's malloc
/// and free took a fifth of the merge's CPU (callgrind: 1.46 G -> 1.17 G instructions on a
/// 1e5-event merge). Built without transparent huge pages (`no_thp`): with them the faults
/// fall 300x but zeroing fresh 2 MiB pages tripled the system time on the VM measured
/// (docs/benchmarks-merge-ab.md, rounds 19 and 33).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
