//! The figures of one run, as printed (text) and serialized (`--json`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::schema::{AttachEntry, DropShare, Kind, Layer, MergeSummary};

use super::aggregate::{Aggregate, Completeness, GroupKey, node_label};
use super::hops::HopRow;
use super::key::SegmentKey;
use super::own_cost::{OwnCost, StageMedian};
use super::quantile::Stats;

/// How quantiles are computed; printed in both outputs so figures can be re-derived.
pub(crate) const QUANTILE_METHOD: &str = "nearest-rank: the sample at 1-based rank ceil(q*n)";

#[derive(Debug, Serialize)]
pub struct RunReport {
    pub file: String,
    pub quantile_method: &'static str,
    pub completeness: Completeness,
    /// Kernel ring-buffer drops per node, from the merge summary (empty when it is absent).
    pub kernel_drops: BTreeMap<String, u64>,
    pub merge_errors: Vec<String>,
    pub nodes: Vec<NodeInfo>,
    pub e2e: Stats,
    pub segments: Vec<SegmentRow>,
    pub by_node: Vec<GroupRow>,
    pub by_unit: Vec<GroupRow>,
    pub by_kind: Vec<GroupRow>,
    /// Each process on the path and each leg between two of them, in path order.
    pub by_hop: Vec<HopRow>,
    /// 0-based request numbers (file order) of the median and the p99 request.
    pub median_request: usize,
    pub p99_request: usize,
    /// meshlab's own cost per node and its bound per stage (report/own_cost.rs).
    pub own_cost: OwnCost,
}

#[derive(Debug, Serialize)]
pub struct NodeInfo {
    pub node: String,
    pub hostname: String,
    pub kernel: String,
    pub command: Vec<String>,
    /// One connection in `sample_every` was traced.
    pub sample_every: u32,
    pub injected_skew_ns: i64,
    pub attach_plan: Vec<AttachEntry>,
}

#[derive(Debug, Serialize)]
pub struct SegmentRow {
    pub name: String,
    /// `derived` for cross-node segments.
    pub node: String,
    pub layer: Layer,
    pub unit: String,
    pub kind: Kind,
    pub derived: bool,
    #[serde(flatten)]
    pub stats: Stats,
    /// Σ this segment over all requests / Σ end-to-end over all requests.
    pub share: f64,
    /// Largest bound on the error from converting a userland clock to the node's monotonic
    /// clock (merge's `error_ns`); absent when every sample had both ends on one clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_error_ns: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct GroupRow {
    /// e.g. `A`, `B / kernel / qdisc`, `queue`.
    pub group: String,
    #[serde(flatten)]
    pub stats: Stats,
    pub share: f64,
}

/// What kernel drops do to the figures, said wherever drops are listed.
pub const DROPS_NOTE: &str = "a request with dropped events is incomplete, or absent when all \
     were dropped: the figures cover the recorded requests";

impl RunReport {
    /// Whether any node dropped kernel events (then [`DROPS_NOTE`] goes with the figures).
    pub fn has_drops(&self) -> bool {
        self.kernel_drops.values().any(|&d| d > 0)
    }

    /// `dropped` events of `node`, with their share of what its programs produced when the
    /// recording's `self_cost` says how many were written (`dropped + written` produced).
    pub fn dropped_figure(&self, node: &str, dropped: u64) -> String {
        let own = self.own_cost.nodes.iter().find(|n| n.node == node);
        match own.map(|n| n.events) {
            Some(written) if dropped > 0 => DropShare { dropped, written }.to_string(),
            _ => dropped.to_string(),
        }
    }

    /// Builds the figures; `agg` must have been through [`Aggregate::finish`].
    pub fn new(agg: &mut Aggregate) -> Self {
        let e2e = agg.e2e.finish().expect("at least one request");
        let share = |s: &Stats| s.sum_ns as f64 / e2e.sum_ns.max(1) as f64;
        let segments: Vec<SegmentRow> = agg
            .catalog
            .iter()
            .map(|key| {
                let stats = agg
                    .segments
                    .get_mut(key)
                    .and_then(|s| s.finish())
                    .expect("catalogued");
                let mut row = segment_row(key, share(&stats), stats);
                row.max_error_ns = agg.max_error_ns.get(key).copied();
                row
            })
            .collect();
        let mut by_node = Vec::new();
        let mut by_unit = Vec::new();
        let mut by_kind = Vec::new();
        for (key, samples) in agg.groups.iter_mut() {
            let Some(stats) = samples.finish() else {
                continue;
            };
            let (label, list) = match key {
                GroupKey::Node(n) => (n.clone(), &mut by_node),
                GroupKey::NodeUnit(n, l, u) => {
                    (format!("{n} / {} / {u}", l.as_str()), &mut by_unit)
                }
                GroupKey::Kind(k) => (k.as_str().to_owned(), &mut by_kind),
            };
            list.push(GroupRow {
                group: label,
                share: share(&stats),
                stats,
            });
        }
        let by_hop = agg.hops.rows(e2e.sum_ns);
        let (median_request, p99_request) = agg.representative_requests();
        let summary = agg.summary.as_ref();
        RunReport {
            own_cost: own_cost(summary, e2e.n, &segments),
            file: agg.file.display().to_string(),
            quantile_method: QUANTILE_METHOD,
            completeness: agg.completeness.clone(),
            kernel_drops: summary
                .map(|s| s.dropped_per_node.clone())
                .unwrap_or_default(),
            merge_errors: summary.map(|s| s.errors.clone()).unwrap_or_default(),
            nodes: node_infos(agg),
            e2e,
            segments,
            by_node,
            by_unit,
            by_kind,
            by_hop,
            median_request,
            p99_request,
        }
    }
}

/// The own-cost section from the merge summary's per-node figures and the stage medians.
fn own_cost(summary: Option<&MergeSummary>, requests: u64, segments: &[SegmentRow]) -> OwnCost {
    let Some(summary) = summary else {
        return OwnCost::default();
    };
    let medians: Vec<StageMedian> = segments
        .iter()
        .filter(|s| !s.derived)
        .map(|s| StageMedian {
            stage: &s.name,
            node: &s.node,
            p50_ns: s.stats.p50_ns,
        })
        .collect();
    OwnCost::new(&summary.self_cost, requests, &medians)
}

fn segment_row(key: &SegmentKey, share: f64, stats: Stats) -> SegmentRow {
    SegmentRow {
        name: key.name.clone(),
        node: node_label(key).to_owned(),
        layer: key.layer,
        unit: key.unit.clone(),
        kind: key.kind,
        derived: key.derived,
        stats,
        share,
        max_error_ns: None,
    }
}

fn node_infos(agg: &Aggregate) -> Vec<NodeInfo> {
    let Some(info) = &agg.info else {
        return Vec::new();
    };
    info.nodes
        .iter()
        .map(|s| NodeInfo {
            node: s.node.clone(),
            hostname: s.hostname.clone(),
            kernel: s.kernel.clone(),
            command: s.command.clone(),
            sample_every: s.filters.sample_every,
            injected_skew_ns: info.injected_skew_ns.get(&s.node).copied().unwrap_or(0),
            attach_plan: s.attach_plan.clone(),
        })
        .collect()
}
