//! What `meshlab demo` prints at the end: every file it wrote and the seed's ladder table
//! ("how much more does the mesh cost": end-to-end p50 and the step over direct).

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::report::steps::STEPS_HEADING;

use super::topology::Topology;
use super::workload::latency::LatencySummary;

/// What one topology produced.
pub(super) struct TopologyOutcome {
    pub topology: Topology,
    pub dir: PathBuf,
    pub summary: Option<LatencySummary>,
    pub files: Vec<PathBuf>,
    pub failures: Vec<String>,
}

pub(super) fn print_outcomes(out: &Path, outcomes: &[TopologyOutcome]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "meshlab demo: output in {}", out.display())?;
    for o in outcomes {
        writeln!(stdout, "\n[{}] {}", o.topology.name(), o.dir.display())?;
        for f in &o.files {
            writeln!(stdout, "  {}", f.display())?;
        }
    }
    let mut table = ladder_table(outcomes);
    table.push_str(&steps_in_words(&out.join("compare.txt")));
    writeln!(stdout, "\n{table}")?;
    crate::output::write_output(&out.join("summary.md"), table.as_bytes())?;
    let failures: Vec<_> = outcomes
        .iter()
        .flat_map(|o| {
            o.failures
                .iter()
                .map(move |f| format!("[{}] {f}", o.topology.name()))
        })
        .collect();
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("meshlab demo: FAILED: {f}");
        }
        bail!(
            "{} step(s) failed; the files listed above are in {}",
            failures.len(),
            out.display()
        );
    }
    Ok(())
}

/// The ladder's steps in words from `meshlab report --compare`'s text (compare.txt, written
/// by the demo with several topologies), so the summary says what made up each step; empty
/// when there is none.
fn steps_in_words(compare_txt: &Path) -> String {
    let text = std::fs::read_to_string(compare_txt).unwrap_or_default();
    match text.find(STEPS_HEADING) {
        Some(at) => format!("\n{}", &text[at..]),
        None => String::new(),
    }
}

/// The seed's "how much more does the mesh cost" table from the client's p50.
pub(super) fn ladder_table(outcomes: &[TopologyOutcome]) -> String {
    let p50 = |t: Topology| {
        outcomes
            .iter()
            .find(|o| o.topology == t)
            .and_then(|o| o.summary.as_ref())
            .map(|s| s.p50_us)
    };
    let direct = p50(Topology::Direct);
    let mut table = String::from(
        "| topology | end-to-end p50 | over direct |\n|----------|---------------:|-------------|\n",
    );
    for o in outcomes {
        let Some(s) = &o.summary else { continue };
        let step = match (o.topology, direct) {
            // Not a rung: the ladder's steps are cross-node (the seed's rule; CPU contention
            // of one node would be credited to "one more hop").
            (Topology::TwoHopSameNode, _) => "control: both sidecars on A".to_owned(),
            (Topology::Direct, _) | (_, None) => "-".to_owned(),
            (_, Some(d)) => format!(
                "{:+.1} us ({:+.1} %)",
                s.p50_us - d,
                (s.p50_us - d) / d * 100.0
            ),
        };
        table.push_str(&format!(
            "| {} | {:.1} us | {} |\n",
            o.topology.name(),
            s.p50_us,
            step
        ));
    }
    let first = outcomes.iter().find_map(|o| o.summary.as_ref());
    if let Some(s) = first {
        table.push_str(&format!(
            "\n({}, c={}, payload {} B, {:.1} s measured per topology; p50 of the client's \
             encode-to-decode time)\n",
            s.proto, s.concurrency, s.payload, s.duration_s
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(topology: Topology, p50_us: f64) -> TopologyOutcome {
        TopologyOutcome {
            topology,
            dir: PathBuf::new(),
            summary: Some(LatencySummary {
                proto: "ttheader".into(),
                endpoint: String::new(),
                payload: 64,
                concurrency: 1,
                requests: 1000,
                requests_total: 1200,
                duration_s: 3.0,
                qps: 333.0,
                p50_us,
                p90_us: p50_us,
                p99_us: p50_us,
                p999_us: p50_us,
                max_us: p50_us,
                mean_us: p50_us,
            }),
            files: Vec::new(),
            failures: Vec::new(),
        }
    }

    #[test]
    fn ladder_shows_the_step_over_direct_absolute_and_relative() {
        let table = ladder_table(&[
            outcome(Topology::Direct, 147.3),
            outcome(Topology::OneHop, 163.2),
            outcome(Topology::TwoHop, 228.2),
        ]);
        assert!(table.contains("| direct | 147.3 us | - |"), "{table}");
        assert!(
            table.contains("| one-hop | 163.2 us | +15.9 us (+10.8 %) |"),
            "{table}"
        );
        assert!(
            table.contains("| two-hop | 228.2 us | +80.9 us (+54.9 %) |"),
            "{table}"
        );
    }

    #[test]
    fn the_control_is_not_a_step_of_the_ladder() {
        let table = ladder_table(&[
            outcome(Topology::Direct, 147.3),
            outcome(Topology::TwoHopSameNode, 200.0),
        ]);
        assert!(
            table.contains("| two-hop-same-node | 200.0 us | control: both sidecars on A |"),
            "{table}"
        );
    }

    #[test]
    fn the_summary_carries_the_steps_in_words_of_the_comparison() {
        let dir = tempfile::tempdir().unwrap();
        let compare = dir.path().join("compare.txt");
        assert_eq!(steps_in_words(&compare), "", "no comparison, no words");
        let words = format!(
            "{STEPS_HEADING} (segment p50s; each run over the one before):\n  \
             one-hop over direct: end-to-end +15.90 us\n"
        );
        std::fs::write(&compare, format!("| segment | ... |\n{words}")).unwrap();
        assert_eq!(steps_in_words(&compare), format!("\n{words}"));
    }

    #[test]
    fn without_direct_there_is_no_step() {
        let table = ladder_table(&[outcome(Topology::TwoHop, 50.0)]);
        assert!(table.contains("| two-hop | 50.0 us | - |"), "{table}");
    }
}
