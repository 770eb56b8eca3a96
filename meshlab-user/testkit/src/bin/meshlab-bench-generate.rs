//! `meshlab-bench-generate N OUTDIR`: writes synthetic two-node traffic of about N events
//! (kernel recordings and probe files) to OUTDIR and prints their paths, for merge benchmarks.
//! Lives here, not in `meshlab`, so the product binary carries no generator.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [events, dir] = args.as_slice() else {
        eprintln!("usage: meshlab-bench-generate N OUTDIR");
        return ExitCode::from(2);
    };
    let Ok(events) = events.parse::<u64>() else {
        eprintln!("meshlab-bench-generate: N `{events}`: expected a number of events");
        return ExitCode::from(2);
    };
    match meshlab_testkit::synth::bench_generate(events, &PathBuf::from(dir)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("meshlab-bench-generate: writing {dir}: {e}");
            ExitCode::FAILURE
        }
    }
}
