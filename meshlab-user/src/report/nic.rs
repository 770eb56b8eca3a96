//! `report --nic`: the kernel stages of the merged requests grouped by device queue and by CPU
//! (each kernel segment's `place`, docs/schema.md), next to what the raw IRQ/NAPI stream of the
//! recordings says about each queue ([`super::nic_raw`]).
//!
//! A queue row is (node, device, direction, queue): RX and TX queues with the same number are
//! different rows. A request counts once per row it has a stage in; a stage repeated within a
//! request (a combined name aside) is summed into one sample, as in the main table.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::merge::segments::SEGMENTS;
use crate::schema::{Direction, Layer, MergedRequest, Segment, Startup};

use super::nic_raw::{NodeRaw, QueueRaw};
use super::quantile::{Samples, Stats};

/// Which way a queue carries packets, from the stage's name (`rx_*`, `tx_*`).
fn dir_of(stage: &str) -> Option<Direction> {
    if stage.starts_with("rx_") {
        Some(Direction::Rx)
    } else if stage.starts_with("tx_") {
        Some(Direction::Tx)
    } else {
        None
    }
}

/// A queue's identity: node, device, direction, queue number (`None`: not known).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    pub node: String,
    pub dev: String,
    pub dir: Direction,
    pub queue: Option<u32>,
}

/// Stage samples of one row, and the requests that had a stage in it.
#[derive(Debug, Default)]
struct RowAgg {
    requests: u64,
    irq: Option<u32>,
    stages: BTreeMap<String, Samples>,
}

impl RowAgg {
    fn add(&mut self, per_stage: BTreeMap<String, u64>, irq: Option<u32>) {
        self.requests += 1;
        self.irq = self.irq.or(irq);
        for (stage, ns) in per_stage {
            self.stages.entry(stage).or_default().push(ns);
        }
    }

    fn stats(&mut self) -> Vec<StageStats> {
        let mut rows: Vec<StageStats> = (self.stages.iter_mut())
            .filter_map(|(stage, s)| {
                s.finish().map(|stats| StageStats {
                    stage: stage.clone(),
                    stats,
                })
            })
            .collect();
        rows.sort_by_key(|r| (path_rank(&r.stage), r.stage.clone()));
        rows
    }
}

/// Position of a stage's first component in the merge's segment table (path order).
fn path_rank(stage: &str) -> usize {
    let first = stage.split('+').next().unwrap_or(stage);
    SEGMENTS
        .iter()
        .position(|d| d.name == first)
        .unwrap_or(usize::MAX)
}

/// The merged side of `report --nic`, filled request by request (part of the report's one
/// pass, super::aggregate).
#[derive(Debug, Default)]
pub struct NicAgg {
    /// Off unless `--nic` asked: its samples would double the memory of the main table's.
    enabled: bool,
    queues: BTreeMap<QueueKey, RowAgg>,
    cpus: BTreeMap<(String, u32), RowAgg>,
}

impl NicAgg {
    pub fn new(enabled: bool) -> NicAgg {
        NicAgg {
            enabled,
            ..NicAgg::default()
        }
    }

    pub fn add_request(&mut self, req: &MergedRequest) {
        if !self.enabled {
            return;
        }
        let mut queues: BTreeMap<QueueKey, (BTreeMap<String, u64>, Option<u32>)> = BTreeMap::new();
        let mut cpus: BTreeMap<(String, u32), BTreeMap<String, u64>> = BTreeMap::new();
        for seg in req.segments.iter().filter(|s| s.layer == Layer::Kernel) {
            let (Some(place), Some(node)) = (&seg.place, &seg.node) else {
                continue;
            };
            let per_cpu = cpus.entry((node.to_string(), place.cpu)).or_default();
            *per_cpu.entry(seg.name.to_string()).or_default() += seg.dur_ns;
            if let Some(key) = queue_key(node, seg) {
                let (stages, irq) = queues.entry(key).or_default();
                *stages.entry(seg.name.to_string()).or_default() += seg.dur_ns;
                *irq = irq.or(place.irq);
            }
        }
        for (key, (stages, irq)) in queues {
            self.queues.entry(key).or_default().add(stages, irq);
        }
        for (key, stages) in cpus {
            self.cpus.entry(key).or_default().add(stages, None);
        }
    }

    /// Whether any merged stage carried a place (merged by a meshlab that records them).
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

/// The queue row of a device stage; `None` for stages of no device (socket, scheduler).
fn queue_key(node: &str, seg: &Segment) -> Option<QueueKey> {
    let place = seg.place.as_ref()?;
    Some(QueueKey {
        node: node.to_owned(),
        dev: place.dev.as_deref()?.to_owned(),
        dir: dir_of(&seg.name)?,
        queue: place.queue,
    })
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageStats {
    pub stage: String,
    #[serde(flatten)]
    pub stats: Stats,
}

#[derive(Debug, Serialize)]
pub struct NicReport {
    pub file: String,
    /// The raw stream was counted only inside this span of each node's CLOCK_MONOTONIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_window_ns: Option<[u64; 2]>,
    pub nodes: Vec<NodeNicReport>,
}

#[derive(Debug, Serialize)]
pub struct NodeNicReport {
    pub node: String,
    /// Where the raw IRQ/NAPI stream was read from, or why there is none.
    pub raw_stream: String,
    /// Per traced device: what it can timestamp, in words (kernel/nic/stamping.rs), from the
    /// node's startup record.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub timestamps: BTreeMap<String, String>,
    pub queues: Vec<QueueReport>,
    pub cpus: Vec<CpuReport>,
}

#[derive(Debug, Serialize)]
pub struct QueueReport {
    pub dev: String,
    pub dir: Direction,
    pub queue: Option<u32>,
    pub irq: Option<u32>,
    /// Requests with a stage on this queue.
    pub requests: u64,
    pub stages: Vec<StageStats>,
    /// RX queues: the raw stream's figures for the queue's vector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw: Option<QueueRaw>,
}

#[derive(Debug, Serialize)]
pub struct CpuReport {
    pub cpu: u32,
    /// Requests with a kernel stage on this CPU.
    pub requests: u64,
    pub stages: Vec<StageStats>,
    /// Raw stream: NIC hard IRQs and NET_RX softirq runs on this CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_irqs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net_rx_softirqs: Option<u64>,
}

impl NicReport {
    /// Each node's devices' timestamping verdicts, from the merged file's startup records.
    pub fn add_timestamps(&mut self, startups: &[Startup]) {
        for node in &mut self.nodes {
            let Some(startup) = startups.iter().find(|s| s.node == node.node) else {
                continue;
            };
            node.timestamps = (startup.devices.iter())
                .map(|d| (d.dev.clone(), crate::kernel::nic::stamping::verdict(d)))
                .collect();
        }
    }

    /// Builds the report from the merged side and each node's raw stream (`raw[node]`).
    pub fn new(
        file: String,
        agg: &mut NicAgg,
        mut raw: BTreeMap<String, NodeRaw>,
        window: Option<[u64; 2]>,
    ) -> NicReport {
        let mut nodes: BTreeMap<String, NodeNicReport> = BTreeMap::new();
        for (key, row) in agg.queues.iter_mut() {
            let raw_queue = (key.dir == Direction::Rx)
                .then(|| raw.get_mut(&key.node)?.take_queue(&key.dev, key.queue))
                .flatten();
            let queue = QueueReport {
                dev: key.dev.clone(),
                dir: key.dir,
                queue: key.queue,
                irq: row.irq.or(raw_queue.as_ref().and_then(|r| r.irq)),
                requests: row.requests,
                stages: row.stats(),
                raw: raw_queue,
            };
            node_entry(&mut nodes, &key.node, &raw).queues.push(queue);
        }
        for ((node, cpu), row) in agg.cpus.iter_mut() {
            let counts = raw
                .get(node)
                .map(|r| r.cpus.get(cpu).copied().unwrap_or_default());
            let report = CpuReport {
                cpu: *cpu,
                requests: row.requests,
                stages: row.stats(),
                hard_irqs: counts.map(|c| c.hard_irqs),
                net_rx_softirqs: counts.map(|c| c.net_rx_softirqs),
            };
            node_entry(&mut nodes, node, &raw).cpus.push(report);
        }
        add_raw_only(&mut nodes, &mut raw);
        NicReport {
            file,
            raw_window_ns: window,
            nodes: nodes.into_values().collect(),
        }
    }
}

fn node_entry<'a>(
    nodes: &'a mut BTreeMap<String, NodeNicReport>,
    name: &str,
    raw: &BTreeMap<String, NodeRaw>,
) -> &'a mut NodeNicReport {
    nodes
        .entry(name.to_owned())
        .or_insert_with(|| NodeNicReport {
            node: name.to_owned(),
            raw_stream: raw
                .get(name)
                .map_or_else(|| "no recording given".to_owned(), |r| r.source.clone()),
            timestamps: BTreeMap::new(),
            queues: Vec::new(),
            cpus: Vec::new(),
        })
}

/// Queues and CPUs the raw stream saw but no merged request used: listed with no stages, so
/// the per-queue IRQ counts are complete.
fn add_raw_only(nodes: &mut BTreeMap<String, NodeNicReport>, raw: &mut BTreeMap<String, NodeRaw>) {
    let names: Vec<String> = raw.keys().cloned().collect();
    for name in names {
        let node_raw = raw.get_mut(&name).expect("listed");
        let rest = node_raw.take_rest();
        let cpus = node_raw.cpus.clone();
        let entry = node_entry(nodes, &name, raw);
        for (dev, queue, q) in rest {
            entry.queues.push(QueueReport {
                dev,
                dir: Direction::Rx,
                queue,
                irq: q.irq,
                requests: 0,
                stages: Vec::new(),
                raw: Some(q),
            });
        }
        for (cpu, counts) in cpus {
            if !entry.cpus.iter().any(|c| c.cpu == cpu) {
                entry.cpus.push(CpuReport {
                    cpu,
                    requests: 0,
                    stages: Vec::new(),
                    hard_irqs: Some(counts.hard_irqs),
                    net_rx_softirqs: Some(counts.net_rx_softirqs),
                });
            }
        }
        entry
            .queues
            .sort_by(|a, b| (&a.dev, a.dir, a.queue).cmp(&(&b.dev, b.dir, b.queue)));
        entry.cpus.sort_by_key(|c| c.cpu);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{JoinMethod, Kind, Placement};

    fn seg(name: &str, dur_ns: u64, cpu: u32, queue: Option<u32>) -> Segment {
        Segment {
            name: name.to_owned().into(),
            node: Some("B".into()),
            layer: Layer::Kernel,
            unit: "x".into(),
            kind: Kind::Compute,
            start_ns: Some(0),
            dur_ns,
            error_ns: None,
            derived: None,
            place: Some(Placement {
                cpu,
                dev: queue.map(|_| "eth0".into()),
                queue,
                irq: None,
            }),
        }
    }

    #[test]
    fn a_request_counts_once_per_queue_and_repeated_stages_are_summed() {
        let req = MergedRequest {
            trace_id: "t".into(),
            client_node: "B".into(),
            server_node: None,
            join: JoinMethod::KernelOnly,
            start_ns: 0,
            e2e_ns: 0,
            complete: true,
            missing: Vec::new(),
            segments: vec![
                seg("rx_irq_handler+rx_softirq_delay", 100, 1, Some(2)),
                seg("tx_driver", 30, 1, Some(2)),
                seg("tx_driver", 20, 1, Some(2)),
                seg("rx_copy", 7, 3, None),
            ],
            notes: Vec::new(),
        };
        let mut agg = NicAgg::new(true);
        agg.add_request(&req);
        agg.add_request(&req);
        let mut report = NicReport::new("f".into(), &mut agg, BTreeMap::new(), None);
        let node = report.nodes.remove(0);
        assert_eq!(node.raw_stream, "no recording given");
        let dirs: Vec<_> = node
            .queues
            .iter()
            .map(|q| (q.dir, q.queue, q.requests))
            .collect();
        assert_eq!(
            dirs,
            [(Direction::Tx, Some(2), 2), (Direction::Rx, Some(2), 2)]
        );
        let tx = &node.queues[0].stages[0];
        assert_eq!(
            (tx.stage.as_str(), tx.stats.n, tx.stats.p50_ns),
            ("tx_driver", 2, 50)
        );
        // The socket copy is on no device: only in the CPU rows.
        let cpus: Vec<_> = node.cpus.iter().map(|c| (c.cpu, c.requests)).collect();
        assert_eq!(cpus, [(1, 2), (3, 2)]);
        assert_eq!(node.cpus[1].stages[0].stage, "rx_copy");
    }
}
