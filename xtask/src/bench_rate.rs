//! `cargo xtask bench rate-ab --baseline OLD_MESHLAB --candidate NEW_MESHLAB`: the ladder's
//! zero-drop event rate search (crate::ladder, "Event rate without drops") alone, for two
//! recorder builds alternated round by round. The echo server and the lab client are the
//! baseline's in both, pinned as in the ladder (server and client on different CPUs), so only
//! the recorder differs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::bench_merge::machine;
use crate::ladder::{rate_search_with, spawn_echo_server};
use crate::ladder_doc::RateStep;
use crate::ladder_plan::FULL;
use crate::machine_cpu::loadavg;
use crate::procs::tempdir;

#[derive(clap::Args)]
pub struct RateAbArgs {
    /// The reference `meshlab` binary (also runs the echo workload).
    #[arg(long)]
    baseline: PathBuf,
    /// The recorder build compared with it.
    #[arg(long)]
    candidate: PathBuf,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub fn run(args: RateAbArgs) -> Result<()> {
    let dir = tempdir()?;
    let _echo = spawn_echo_server(&args.baseline, &dir)?;
    let load_before = loadavg();
    let builds = [&args.baseline, &args.candidate];
    // build -> rounds -> steps
    let mut results: Vec<Vec<Vec<RateStep>>> = vec![Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        // Alternate which build goes first, so neither always follows the other.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for b in order {
            let steps = rate_search_with(builds[b], &args.baseline, &dir, FULL)?;
            eprintln!("bench rate-ab: round {round} build {b} done");
            results[b].push(steps);
        }
    }
    let load = format!("{load_before} before, {} after", loadavg());
    print!("{}", report(&args, &results, &load));
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Per build and requested rate: medians over rounds, and every round's drops; then each
/// build's highest events/s without a drop, per round.
fn report(args: &RateAbArgs, results: &[Vec<Vec<RateStep>>], load: &str) -> String {
    let labels = [args.baseline.display(), args.candidate.display()];
    let mut text = format!(
        "Echo RPC c=32 over loopback (server and client pinned to different CPUs) at fixed \
         request rates (0 = unlimited), {} s each, the recorder tracing all of it into a binary \
         capture; {} rounds, builds alternated. On {}, load average {load}.\n\n\
         | build | requested req/s | achieved req/s median | events/s median | dropped per round | recorder CPU ns/event median |\n\
         |---|---|---|---|---|---|\n",
        FULL.echo_seconds,
        args.rounds,
        machine(),
    );
    for (b, rounds) in results.iter().enumerate() {
        let mut by_rate: BTreeMap<u64, Vec<&RateStep>> = BTreeMap::new();
        for step in rounds.iter().flatten() {
            by_rate.entry(step.requested_qps).or_default().push(step);
        }
        for &qps in FULL.rate_steps {
            let steps = by_rate.get(&qps).map(Vec::as_slice).unwrap_or_default();
            let drops: Vec<String> = steps.iter().map(|s| s.dropped.to_string()).collect();
            text.push_str(&format!(
                "| {} | {qps} | {:.0} | {:.0} | {} | {:.1} |\n",
                labels[b],
                median(steps.iter().map(|s| s.achieved_qps).collect()),
                median(steps.iter().map(|s| s.events_per_s).collect()),
                drops.join(" / "),
                median(steps.iter().map(|s| s.recorder_ns_per_event).collect()),
            ));
        }
    }
    text.push_str("\nHighest events/s without a drop, per round:\n\n");
    for (b, rounds) in results.iter().enumerate() {
        let best: Vec<String> = rounds
            .iter()
            .map(|steps| {
                steps
                    .iter()
                    .filter(|s| s.dropped == 0)
                    .map(|s| s.events_per_s)
                    .reduce(f64::max)
                    .map_or("none".to_owned(), |e| format!("{e:.0}"))
            })
            .collect();
        text.push_str(&format!("- {}: {}\n", labels[b], best.join(", ")));
    }
    text
}
