//! The ladder's steps in words (`report --compare`, text output): for each run over the one
//! before it, which segments appeared or disappeared and which grew or shrank beyond the noise,
//! per node and unit, and each process's time (the seed's "inbound 4.1x outbound", "the
//! client's socket work shrinks" are read off these lines).
//!
//! Runs with both an inbound and an outbound sidecar (merge names the proxies `sidecar-in*` and
//! `sidecar-out*`, half.rs) get the inbound/outbound ratio of their process times; with a run
//! whose sidecars share a node (the seed's control experiment) next to one whose sidecars are
//! on different nodes, the two ratios are stated side by side: an asymmetry that stays when
//! both sidecars share a node belongs to the path, one that goes away belonged to the machines.
//!
//! A segment's figure is its p50 in that run; sums of p50s (a process's time) are labelled as
//! such, since a sum of medians is not the median of sums. "Beyond the noise" is the ladder's
//! rule (`compare::Z` standard errors of the two p50s).

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::schema::Layer;

use super::aggregate::{Aggregate, node_label};
use super::compare::Z;
use super::key::SegmentKey;
use super::table::{us, us_signed};

/// At most this many segments are named per category; the rest are counted and summed.
const TOP: usize = 4;

/// One segment's change between two runs: p50 before and after (`None`: absent in that run).
struct Change {
    key: SegmentKey,
    before: Option<u64>,
    after: Option<u64>,
    beyond_noise: bool,
}

impl Change {
    fn delta(&self) -> i128 {
        i128::from(self.after.unwrap_or(0)) - i128::from(self.before.unwrap_or(0))
    }

    fn label(&self) -> String {
        let node = node_label(&self.key);
        let unit = match self.key.layer {
            Layer::Process => format!(", {}", self.key.unit),
            _ => String::new(),
        };
        format!("{} ({node}{unit})", self.key.name)
    }
}

/// A segment in fewer than one in `RARE_BELOW` of a run's requests counts as absent there: its
/// p50 describes those few requests (a stage joined around a missing point, a rare path), not
/// the run, and read as a step of the whole ladder (a joined stage of the one incomplete
/// request of a demo run was listed as "appeared +4629 us").
const RARE_BELOW: usize = 100;

fn p50(run: &Aggregate, key: &SegmentKey) -> Option<(u64, Option<f64>)> {
    let common = |s: &&super::quantile::Samples| s.len() * RARE_BELOW >= run.e2e.len();
    let samples = run
        .segments
        .get(key)
        .filter(|s| !s.is_empty())
        .filter(common)?;
    Some((samples.quantile(500), run.median_se.get(key).copied()))
}

fn changes(a: &Aggregate, b: &Aggregate) -> Vec<Change> {
    let mut keys: Vec<&SegmentKey> = a.segments.keys().chain(b.segments.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let (before, after) = (p50(a, key), p50(b, key));
            before.or(after)?;
            let beyond_noise = match (before, after) {
                (Some((x, Some(sx))), Some((y, Some(sy)))) => {
                    (i128::from(y) - i128::from(x)).unsigned_abs() as f64
                        > Z * (sx * sx + sy * sy).sqrt()
                }
                _ => false,
            };
            Some(Change {
                key: key.clone(),
                before: before.map(|(v, _)| v),
                after: after.map(|(v, _)| v),
                beyond_noise,
            })
        })
        .collect()
}

/// One line: the largest `TOP` of `items` by |delta|, and the count and sum of the rest.
fn category(out: &mut dyn Write, title: &str, mut items: Vec<&Change>) -> io::Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    items.sort_by_key(|c| std::cmp::Reverse(c.delta().unsigned_abs()));
    let total: i128 = items.iter().map(|c| c.delta()).sum();
    let named: Vec<String> = items
        .iter()
        .take(TOP)
        .map(|c| format!("{} {}", c.label(), us_signed(c.delta())))
        .collect();
    let rest = items.len().saturating_sub(TOP);
    let more = if rest > 0 {
        format!(" and {rest} more")
    } else {
        String::new()
    };
    writeln!(
        out,
        "    {title} ({} us in all): {}{more}",
        us_signed(total),
        named.join(", ")
    )
}

/// Sum of the p50s of each process's segments in a run, per (node, process).
fn process_time(run: &Aggregate) -> BTreeMap<(String, String), u64> {
    let mut per = BTreeMap::new();
    for key in run.segments.keys().filter(|k| k.layer == Layer::Process) {
        if let Some((v, _)) = p50(run, key) {
            let slot = (node_label(key).to_owned(), key.unit.clone());
            *per.entry(slot).or_insert(0) += v;
        }
    }
    per
}

/// One run's sidecars: the inbound and the outbound ones' process time (sums of p50s) and the
/// nodes they ran on.
struct Sidecars {
    inbound_ns: u64,
    outbound_ns: u64,
    inbound_nodes: Vec<String>,
    outbound_nodes: Vec<String>,
}

impl Sidecars {
    fn of(run: &Aggregate) -> Option<Sidecars> {
        let mut s = Sidecars {
            inbound_ns: 0,
            outbound_ns: 0,
            inbound_nodes: Vec::new(),
            outbound_nodes: Vec::new(),
        };
        for ((node, unit), ns) in process_time(run) {
            let (total, nodes) = if unit.starts_with("sidecar-in") {
                (&mut s.inbound_ns, &mut s.inbound_nodes)
            } else if unit.starts_with("sidecar-out") {
                (&mut s.outbound_ns, &mut s.outbound_nodes)
            } else {
                continue;
            };
            *total += ns;
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        (s.inbound_ns > 0 && s.outbound_ns > 0).then_some(s)
    }

    fn ratio(&self) -> f64 {
        self.inbound_ns as f64 / self.outbound_ns as f64
    }

    fn same_node(&self) -> bool {
        self.inbound_nodes == self.outbound_nodes && self.inbound_nodes.len() == 1
    }

    fn placement(&self) -> String {
        if self.same_node() {
            format!("both on {}", self.inbound_nodes[0])
        } else {
            format!(
                "inbound on {}, outbound on {}",
                self.inbound_nodes.join("+"),
                self.outbound_nodes.join("+")
            )
        }
    }
}

/// The sidecars' asymmetry per run, and the control (sidecars on one node) against the runs
/// with sidecars on different nodes.
fn write_sidecars(runs: &[Aggregate], labels: &[String], out: &mut dyn Write) -> io::Result<()> {
    let found: Vec<(&String, Sidecars)> = runs
        .iter()
        .zip(labels)
        .filter_map(|(run, label)| Sidecars::of(run).map(|s| (label, s)))
        .collect();
    for (label, s) in &found {
        writeln!(
            out,
            "  sidecars in {label}: inbound {} us / outbound {} us = {:.1}x ({}; sums of p50s)",
            us(s.inbound_ns),
            us(s.outbound_ns),
            s.ratio(),
            s.placement()
        )?;
    }
    let Some((control_label, c)) = found.iter().find(|(_, s)| s.same_node()) else {
        return Ok(());
    };
    for (label, s) in found.iter().filter(|(_, s)| !s.same_node()) {
        writeln!(
            out,
            "  control: inbound/outbound is {:.1}x in {label} ({}) and {:.1}x in \
             {control_label} ({}); an asymmetry that stays with both sidecars on one node \
             belongs to the path, one that goes away belonged to the machines",
            s.ratio(),
            s.placement(),
            c.ratio(),
            c.placement()
        )?;
    }
    Ok(())
}

/// The heading of the steps in words; the demo's summary.md quotes compare.txt from it on
/// (lab/demo_summary.rs).
pub(crate) const STEPS_HEADING: &str = "steps in words";

/// Writes the steps of `runs` (labelled `labels`) in words.
pub fn write_steps(runs: &[Aggregate], labels: &[String], out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\n{STEPS_HEADING} (segment p50s; each run over the one before):"
    )?;
    for i in 1..runs.len() {
        let (a, b) = (&runs[i - 1], &runs[i]);
        let e2e = i128::from(b.e2e.quantile(500)) - i128::from(a.e2e.quantile(500));
        writeln!(
            out,
            "  {} over {}: end-to-end {} us",
            labels[i],
            labels[i - 1],
            us_signed(e2e)
        )?;
        let all = changes(a, b);
        let pick = |f: &dyn Fn(&Change) -> bool| all.iter().filter(|c| f(c)).collect::<Vec<_>>();
        category(out, "appeared", pick(&|c| c.before.is_none()))?;
        category(out, "gone", pick(&|c| c.after.is_none()))?;
        category(out, "grew", pick(&|c| c.beyond_noise && c.delta() > 0))?;
        category(out, "shrank", pick(&|c| c.beyond_noise && c.delta() < 0))?;
    }
    for (run, label) in runs.iter().zip(labels) {
        let parts: Vec<String> = process_time(run)
            .into_iter()
            .map(|((node, unit), ns)| format!("{unit} on {node} {}", us(ns)))
            .collect();
        writeln!(
            out,
            "  process time in {label} (sum of its segments' p50s, us): {}",
            parts.join(", ")
        )?;
    }
    write_sidecars(runs, labels, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{JoinMethod, Kind, MergedRequest, Segment};

    fn proxy(name: &str, node: &str, unit: &str, dur_ns: u64) -> Segment {
        Segment {
            name: name.to_owned().into(),
            node: Some(node.to_owned().into()),
            layer: Layer::Process,
            unit: unit.to_owned().into(),
            kind: Kind::Compute,
            start_ns: Some(0),
            dur_ns,
            error_ns: None,
            derived: None,
            place: None,
        }
    }

    /// A run of identical requests: the outbound sidecar on A, the inbound one on `in_node`.
    fn run(in_node: &str, inbound_ns: u64, outbound_ns: u64) -> Aggregate {
        let request = request(in_node, inbound_ns, outbound_ns);
        let mut agg = Aggregate::default();
        for _ in 0..5 {
            agg.add_request(&request);
        }
        agg.finish();
        agg
    }

    fn request(in_node: &str, inbound_ns: u64, outbound_ns: u64) -> MergedRequest {
        let segments = vec![
            proxy("proxy_uds_to_tcp", "A", "sidecar-out", outbound_ns),
            proxy("proxy_tcp_to_uds", in_node, "sidecar-in", inbound_ns),
        ];
        MergedRequest {
            trace_id: "t".into(),
            client_node: "A".into(),
            server_node: Some(in_node.into()),
            join: JoinMethod::Offset,
            start_ns: 0,
            e2e_ns: inbound_ns + outbound_ns,
            complete: true,
            missing: Vec::new(),
            segments,
            notes: Vec::new(),
        }
    }

    /// `odd` of `n` requests carry one more segment of 4.6 ms.
    fn with_odd_requests(n: usize, odd: usize) -> Aggregate {
        let plain = request("B", 65_000, 15_900);
        let mut rare = plain.clone();
        rare.segments
            .push(proxy("odd_joined_stage", "A", "client", 4_600_000));
        let mut agg = Aggregate::default();
        for i in 0..n {
            agg.add_request(if i < odd { &rare } else { &plain });
        }
        agg.finish();
        agg
    }

    #[test]
    fn a_segment_in_under_one_request_in_a_hundred_is_no_step() {
        let steps = |after: Aggregate| {
            let runs = [run("B", 65_000, 15_900), after];
            let mut out = Vec::new();
            write_steps(&runs, &["a".to_owned(), "b".to_owned()], &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let one_in_200 = steps(with_odd_requests(200, 1));
        assert!(!one_in_200.contains("odd_joined_stage"), "{one_in_200}");
        let two_in_100 = steps(with_odd_requests(100, 2));
        assert!(
            two_in_100.contains("appeared (+4600.00 us in all): odd_joined_stage (A, client)"),
            "{two_in_100}"
        );
    }

    #[test]
    fn the_control_states_both_sidecar_ratios_side_by_side() {
        let runs = [run("B", 65_000, 15_900), run("A", 5_000, 5_000)];
        let labels = ["two-hop".to_owned(), "two-hop-same-node".to_owned()];
        let mut out = Vec::new();
        write_steps(&runs, &labels, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "sidecars in two-hop: inbound 65.00 us / outbound 15.90 us = 4.1x \
                 (inbound on B, outbound on A; sums of p50s)"
            ),
            "{text}"
        );
        assert!(
            text.contains("sidecars in two-hop-same-node: inbound 5.00 us / outbound 5.00 us = 1.0x (both on A;"),
            "{text}"
        );
        assert!(
            text.contains(
                "control: inbound/outbound is 4.1x in two-hop (inbound on B, outbound on A) \
                 and 1.0x in two-hop-same-node (both on A)"
            ),
            "{text}"
        );
    }

    #[test]
    fn without_a_control_there_is_no_control_line() {
        let runs = [run("B", 65_000, 15_900)];
        let mut out = Vec::new();
        write_steps(&runs, &["two-hop".to_owned()], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("sidecars in two-hop:"), "{text}");
        assert!(!text.contains("control:"), "{text}");
    }
}
