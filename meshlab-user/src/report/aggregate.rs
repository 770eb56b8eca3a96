//! One streaming pass over a merged NDJSON file: per-segment and per-group duration samples,
//! completeness counters and provenance. Requests themselves are not kept; only their
//! end-to-end times in file order, so a second pass can fetch the few the pictures need.

use super::hops::Hops;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ndjson::{NdjsonError, RecordReader};
use crate::schema::{Kind, Layer, MergeInfo, MergeSummary, MergedRequest, Record};

use super::key::SegmentKey;
use super::nic::NicAgg;
use super::order::PathOrder;
use super::quantile::Samples;

/// Why a merged file could not be reported on.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Ndjson(#[from] NdjsonError),
    #[error(
        "{file}:{line}: expected a merged record (merge_info, request, merge_summary or a timeline probe), found a `{found}` record; run `meshlab merge` first"
    )]
    NotMerged {
        file: PathBuf,
        line: u64,
        found: String,
    },
    #[error(
        "{file}:{line}: a second `merge_info` record: concatenated merge outputs are not one run"
    )]
    SecondMergeInfo { file: PathBuf, line: u64 },
    #[error("{file}: no `request` records: nothing to report")]
    NoRequests { file: PathBuf },
}

/// Label of a group a segment's time is added to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupKey {
    /// Node name, or `derived` for cross-node segments.
    Node(String),
    /// node / layer / unit, e.g. `B / kernel / qdisc`.
    NodeUnit(String, Layer, String),
    Kind(Kind),
}

/// Completeness counters of a run, always reported.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Completeness {
    pub requests: u64,
    pub complete: u64,
    pub incomplete: u64,
    /// Stage name -> requests it was missing from.
    pub missing: BTreeMap<String, u64>,
    /// Requests whose segments do not add up to their end-to-end time (a merge bug).
    pub sum_mismatch: u64,
    /// Join method -> requests (offset / pid_tid_time / kernel_only).
    pub joins: BTreeMap<String, u64>,
}

/// Everything one pass collects.
#[derive(Debug, Default)]
pub struct Aggregate {
    pub file: PathBuf,
    pub info: Option<MergeInfo>,
    pub summary: Option<MergeSummary>,
    pub completeness: Completeness,
    pub e2e: Samples,
    /// End-to-end of each request in file order (index = request number, 0-based).
    pub e2e_by_index: Vec<u64>,
    /// Segments in path order (see order.rs); filled by `finish`.
    pub catalog: Vec<SegmentKey>,
    /// What precedes what in the requests seen.
    pub order: PathOrder,
    pub segments: BTreeMap<SegmentKey, Samples>,
    pub groups: BTreeMap<GroupKey, Samples>,
    /// Standard error of each segment's p50 (batch medians); set by `finish`.
    pub median_se: BTreeMap<SegmentKey, f64>,
    pub e2e_median_se: Option<f64>,
    /// Largest clock-conversion error bound (`error_ns`) seen per segment.
    pub max_error_ns: BTreeMap<SegmentKey, u64>,
    /// The path cut at its processes: each process's time and each leg's stages (hops.rs).
    pub hops: Hops,
    /// Timeline lines (`probe` records from `merge --timeline`), skipped.
    pub timeline_points: u64,
    /// Kernel stages by queue and CPU (`report --nic`).
    pub nic: NicAgg,
}

impl Aggregate {
    /// Reads `path` once; `nic`: also by queue and CPU (`report --nic`).
    pub fn from_file(path: &Path, nic: bool) -> Result<Self, ReportError> {
        let mut agg = Aggregate {
            file: path.into(),
            nic: NicAgg::new(nic),
            ..Default::default()
        };
        let mut reader = RecordReader::open(path)?;
        while let Some(record) = reader.next() {
            match record? {
                Record::MergeInfo(info) => {
                    if agg.info.is_some() {
                        return Err(ReportError::SecondMergeInfo {
                            file: path.into(),
                            line: reader.line(),
                        });
                    }
                    agg.info = Some(info);
                }
                Record::Request(req) => agg.add_request(&req),
                Record::MergeSummary(s) => agg.summary = Some(s),
                // `merge --timeline` writes each request's observed points before it.
                Record::Probe(_) => agg.timeline_points += 1,
                other => {
                    return Err(ReportError::NotMerged {
                        file: path.into(),
                        line: reader.line(),
                        found: other.type_name().into(),
                    });
                }
            }
        }
        if agg.completeness.requests == 0 {
            return Err(ReportError::NoRequests { file: path.into() });
        }
        if agg.info.is_none() {
            log::warn!(
                "{}: no merge_info record: provenance unknown",
                path.display()
            );
        }
        if agg.summary.is_none() {
            log::warn!(
                "{}: no merge_summary record: the merge may have been cut short",
                path.display()
            );
        }
        agg.finish();
        Ok(agg)
    }

    pub(crate) fn add_request(&mut self, req: &MergedRequest) {
        let c = &mut self.completeness;
        c.requests += 1;
        if req.complete {
            c.complete += 1;
        } else {
            c.incomplete += 1;
        }
        for stage in &req.missing {
            *c.missing.entry(stage.clone()).or_default() += 1;
        }
        *c.joins.entry(req.join.as_str().into()).or_default() += 1;
        let total: u128 = req.segments.iter().map(|s| u128::from(s.dur_ns)).sum();
        if total != u128::from(req.e2e_ns) {
            c.sum_mismatch += 1;
        }
        self.e2e.push(req.e2e_ns);
        self.e2e_by_index.push(req.e2e_ns);
        self.hops.add_request(req);
        self.nic.add_request(req);

        // One sample per request and key: a segment repeated within a request is summed.
        let mut per_segment: Vec<(SegmentKey, u64)> = Vec::new();
        let mut per_group: BTreeMap<GroupKey, u64> = BTreeMap::new();
        let keys: Vec<SegmentKey> = req.segments.iter().map(segment_key).collect();
        self.order.observe(&keys);
        for (seg, key) in req.segments.iter().zip(keys) {
            if let Some(e) = seg.error_ns {
                let worst = self.max_error_ns.entry(key.clone()).or_default();
                *worst = (*worst).max(e);
            }
            match per_segment.iter_mut().find(|(k, _)| *k == key) {
                Some((_, d)) => *d += seg.dur_ns,
                None => per_segment.push((key.clone(), seg.dur_ns)),
            }
            for g in group_keys(&key) {
                *per_group.entry(g).or_default() += seg.dur_ns;
            }
        }
        for (key, dur) in per_segment {
            self.segments.entry(key).or_default().push(dur);
        }
        for (key, dur) in per_group {
            self.groups.entry(key).or_default().push(dur);
        }
    }

    /// Request numbers (0-based, file order) of the median and the p99 request: the first
    /// request whose end-to-end equals the nearest-rank p50 / p99 of all end-to-end times.
    pub(crate) fn representative_requests(&self) -> (usize, usize) {
        let pick = |value: u64| {
            self.e2e_by_index
                .iter()
                .position(|&v| v == value)
                .expect("a quantile is one of the samples")
        };
        (pick(self.e2e.quantile(500)), pick(self.e2e.quantile(990)))
    }

    /// Notes the p50 standard errors, then sorts every sample set; called once after the pass.
    pub(super) fn finish(&mut self) {
        self.catalog = self.order.sorted();
        self.e2e_median_se = self.e2e.median_standard_error();
        self.e2e.finish();
        for (key, s) in self.segments.iter_mut() {
            if let Some(se) = s.median_standard_error() {
                self.median_se.insert(key.clone(), se);
            }
            s.finish();
        }
        for s in self.groups.values_mut() {
            s.finish();
        }
    }
}

pub(crate) fn segment_key(seg: &crate::schema::Segment) -> SegmentKey {
    SegmentKey {
        name: seg.name.to_string(),
        node: seg.node.as_deref().map(str::to_owned),
        layer: seg.layer,
        unit: seg.unit.to_string(),
        kind: seg.kind,
        derived: seg.derived.is_some(),
    }
}

/// The node column of a segment: its node, or `derived` for cross-node segments.
pub(crate) fn node_label(key: &SegmentKey) -> &str {
    key.node.as_deref().unwrap_or("derived")
}

fn group_keys(key: &SegmentKey) -> [GroupKey; 3] {
    let node = node_label(key).to_owned();
    [
        GroupKey::Node(node.clone()),
        GroupKey::NodeUnit(node, key.layer, key.unit.clone()),
        GroupKey::Kind(key.kind),
    ]
}
