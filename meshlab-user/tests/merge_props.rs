//! Properties over generated traffic: clock skew never changes a duration, and every request's
//! segments are non-negative and sum exactly to its end-to-end time.

mod merge_common;

use std::collections::BTreeMap;

use merge_common::{generate_into, merge};
use meshlab_testkit::synth::GenConfig;
use meshlab_user::schema::MergedRequest;
use proptest::prelude::*;

fn traffic() -> impl Strategy<Value = GenConfig> {
    (
        any::<u64>(),
        1usize..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(None), (2usize..6).prop_map(Some)],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(seed, connections, nic_irq, tso, gro, retransmit_every, disorder, probes)| {
                GenConfig {
                    requests: 12,
                    connections,
                    nic_irq,
                    tso,
                    gro,
                    request_len: 3_000,
                    response_len: 2_000,
                    retransmit_every,
                    disorder,
                    probes,
                    jitter_seed: Some(seed),
                    ..Default::default()
                }
            },
        )
}

/// (name, node, dur_ns, error_ns) of one segment.
type SegmentFigures = (String, Option<String>, u64, Option<u64>);

/// Everything of a request that must not move with skew: all but absolute start times.
fn durations(r: &MergedRequest) -> (u64, bool, Vec<String>, Vec<SegmentFigures>) {
    (
        r.e2e_ns,
        r.complete,
        r.missing.clone(),
        r.segments
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    s.node.as_deref().map(str::to_owned),
                    s.dur_ns,
                    s.error_ns,
                )
            })
            .collect(),
    )
}

fn by_trace(rs: &[MergedRequest]) -> BTreeMap<String, &MergedRequest> {
    rs.iter().map(|r| (r.trace_id.clone(), r)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn skew_never_changes_a_duration(
        cfg in traffic(),
        skew_a in -900_000_000_000i64..900_000_000_000,
        skew_b in -900_000_000_000i64..900_000_000_000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let files = generate_into(&cfg, dir.path());
        let base = merge(&files, &[]);
        let skewed = merge(&files, &[("A", skew_a), ("B", skew_b)]);
        prop_assert_eq!(base.requests.len(), cfg.requests);
        prop_assert_eq!(skewed.requests.len(), base.requests.len());
        let (base, skewed) = (by_trace(&base.requests), by_trace(&skewed.requests));
        for (id, b) in &base {
            let s = skewed[id];
            prop_assert_eq!(durations(b), durations(s));
            // Absolute times do move, by exactly the node's skew.
            let a_shift = i128::from(s.start_ns) - i128::from(b.start_ns);
            prop_assert_eq!(a_shift, i128::from(skew_a));
            for (bs, ss) in b.segments.iter().zip(&s.segments) {
                if let (Some(x), Some(y), Some(node)) = (bs.start_ns, ss.start_ns, &bs.node) {
                    let skew = if node == "A" { skew_a } else { skew_b };
                    prop_assert_eq!(i128::from(y) - i128::from(x), i128::from(skew));
                }
            }
        }
    }

    #[test]
    fn segments_sum_to_e2e_and_none_is_negative(cfg in traffic()) {
        let dir = tempfile::tempdir().unwrap();
        let files = generate_into(&cfg, dir.path());
        let out = merge(&files, &[]);
        prop_assert_eq!(out.requests.len(), cfg.requests);
        prop_assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
        for r in &out.requests {
            let sum: u64 = r.segments.iter().map(|s| s.dur_ns).sum();
            prop_assert_eq!(sum, r.e2e_ns, "{}", r.trace_id);
            prop_assert!(r.complete, "{:?}", r);
            // Non-negative and non-overlapping: each node's measured segments follow each other
            // without gaps or overlap in that node's time.
            let mut next: BTreeMap<&str, u64> = BTreeMap::new();
            for s in &r.segments {
                if let (Some(node), Some(start)) = (s.node.as_deref(), s.start_ns) {
                    if let Some(expected) = next.get(node) {
                        // The client's chain resumes after the server's part at the response's arrival.
                        prop_assert!(start >= *expected, "{} overlaps in {}", s.name, r.trace_id);
                    }
                    next.insert(node, start + s.dur_ns);
                }
            }
            let rtt = r.segments.iter().find(|s| s.name == "network_round_trip");
            prop_assert!(rtt.is_some_and(|s| s.dur_ns > 0), "{:?}", r);
        }
    }
}
