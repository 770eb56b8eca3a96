//! The raw IRQ/NAPI stream of a recording (`record --raw-irq`), per NIC queue and per CPU:
//! hard-IRQ count and duration (`irq_entry` -> `irq_exit` of the vector on its CPU), IRQ ->
//! softirq delay (the first NIC IRQ on a CPU since its last NET_RX run -> the next NET_RX
//! `softirq_entry` there, the pairing the kernel programs use for the RX context), packets per
//! NAPI poll (`napi_poll`'s work) and polls that used their whole budget.
//!
//! `napi_poll` does not say which queue it polled: a poll counts for the queue whose IRQ
//! started the NET_RX run it is in (exact with one IRQ per run; otherwise the first IRQ's
//! queue), and for the device with an unknown queue when no NIC IRQ started the run.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::records::RecordSource;
use crate::schema::{Hook, KernelEvent, Record};

use super::quantile::{Samples, Stats};
use crate::ndjson::NdjsonError;

/// NET_RX in `softirq_*` events' `value` (the kernel's softirq number).
const NET_RX: i64 = 3;
/// An IRQ older than this when NET_RX starts did not start that run (the kernel programs'
/// `PENDING_WINDOW_NS`).
const PENDING_WINDOW_NS: u64 = 10_000_000;

/// Packets per NAPI poll.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PollStats {
    pub polls: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

/// One RX queue's raw-stream figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueRaw {
    /// The vector (the first seen, if the queue has several); none for the polls of a device
    /// whose NET_RX run no NIC IRQ started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub irq: Option<u32>,
    pub hard_irqs: u64,
    /// CPU -> `irq_entry` events of the queue's vector.
    pub hard_irqs_per_cpu: BTreeMap<u32, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_irq_ns: Option<Stats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub irq_to_softirq_ns: Option<Stats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packets_per_poll: Option<PollStats>,
    /// Polls whose work reached their budget (the softirq will poll the queue again).
    pub budget_exhausted: u64,
}

#[derive(Debug, Default)]
struct QueueAcc {
    irq: Option<u32>,
    per_cpu: BTreeMap<u32, u64>,
    durations: Samples,
    delays: Samples,
    work: Samples,
    exhausted: u64,
}

impl QueueAcc {
    fn finish(mut self) -> QueueRaw {
        let polls = self.work.finish().map(|s| PollStats {
            polls: s.n,
            p50: s.p50_ns,
            p99: s.p99_ns,
            max: self.work.sorted().last().copied().unwrap_or(0),
            mean: s.mean_ns,
        });
        QueueRaw {
            irq: self.irq,
            hard_irqs: self.per_cpu.values().sum(),
            hard_irqs_per_cpu: self.per_cpu,
            hard_irq_ns: self.durations.finish(),
            irq_to_softirq_ns: self.delays.finish(),
            packets_per_poll: polls,
            budget_exhausted: self.exhausted,
        }
    }
}

/// (device, queue) of a vector or a poll.
type RawKey = (String, Option<u32>);

/// Per CPU: NIC hard IRQs and NET_RX softirq runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuRaw {
    pub hard_irqs: u64,
    pub net_rx_softirqs: u64,
}

/// What one CPU is in the middle of.
#[derive(Default)]
struct CpuState {
    /// The vector in its handler: (irq, entry time, queue).
    in_irq: Option<(u32, u64, RawKey)>,
    /// The first NIC IRQ since the last NET_RX run started: (entry time, queue).
    pending: Option<(u64, RawKey)>,
    /// The queue whose IRQ started the running NET_RX softirq.
    running: Option<RawKey>,
}

/// One node's raw stream.
#[derive(Debug, Default)]
pub struct NodeRaw {
    /// The recording read, or why it has no stream.
    pub source: String,
    queues: BTreeMap<RawKey, QueueRaw>,
    pub cpus: BTreeMap<u32, CpuRaw>,
}

impl NodeRaw {
    /// The figures of `dev`'s RX `queue`, taken out (so the rest are the queues no request used).
    pub fn take_queue(&mut self, dev: &str, queue: Option<u32>) -> Option<QueueRaw> {
        self.queues.remove(&(dev.to_owned(), queue))
    }

    /// Queues left after [`Self::take_queue`], as (device, queue, figures).
    pub fn take_rest(&mut self) -> Vec<(String, Option<u32>, QueueRaw)> {
        std::mem::take(&mut self.queues)
            .into_iter()
            .map(|((dev, queue), raw)| (dev, queue, raw))
            .collect()
    }
}

/// Accumulates one recording's stream.
#[derive(Default)]
struct Counter {
    cpus: BTreeMap<u32, (CpuState, CpuRaw)>,
    queues: BTreeMap<RawKey, QueueAcc>,
}

fn key_of(k: &KernelEvent) -> RawKey {
    let dev = k.dev.clone().unwrap_or_else(|| match k.ifindex {
        Some(i) => format!("ifindex {i}"),
        None => "?".into(),
    });
    (dev, k.queue)
}

impl Counter {
    fn event(&mut self, k: &KernelEvent) {
        let (state, counts) = self.cpus.entry(k.cpu).or_default();
        match (k.hook, k.value) {
            (Hook::IrqEntry, _) => {
                let irq = k.irq.unwrap_or(0);
                let key = key_of(k);
                counts.hard_irqs += 1;
                let acc = self.queues.entry(key.clone()).or_default();
                acc.irq = acc.irq.or(Some(irq));
                *acc.per_cpu.entry(k.cpu).or_default() += 1;
                state.pending.get_or_insert((k.ts_ns, key.clone()));
                state.in_irq = Some((irq, k.ts_ns, key));
            }
            (Hook::IrqExit, _) => {
                if let Some((irq, t0, key)) = state.in_irq.take()
                    && Some(irq) == k.irq
                    && k.ts_ns >= t0
                {
                    let acc = self.queues.entry(key).or_default();
                    acc.durations.push(k.ts_ns - t0);
                }
            }
            (Hook::SoftirqEntry, Some(NET_RX)) => {
                counts.net_rx_softirqs += 1;
                state.running = None;
                if let Some((t0, key)) = state.pending.take() {
                    let delay = k.ts_ns.saturating_sub(t0);
                    if delay < PENDING_WINDOW_NS {
                        let acc = self.queues.entry(key.clone()).or_default();
                        acc.delays.push(delay);
                        state.running = Some(key);
                    }
                }
            }
            (Hook::SoftirqExit, Some(NET_RX)) => state.running = None,
            (Hook::NapiPoll, Some(work)) => {
                let key = state.running.clone().unwrap_or_else(|| (key_of(k).0, None));
                let acc = self.queues.entry(key).or_default();
                let work = work.max(0) as u64;
                acc.work.push(work);
                if k.aux.is_some_and(|budget| work >= budget) {
                    acc.exhausted += 1;
                }
            }
            _ => {}
        }
    }
}

/// Why a recording's raw stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    #[error(transparent)]
    Ndjson(#[from] NdjsonError),
    #[error("{file}: no `startup` record: not a `meshlab record` recording")]
    NotARecording { file: std::path::PathBuf },
}

/// Reads one recording's raw stream (only events inside `window`, when given); returns the
/// node it recorded and its figures.
pub fn read(path: &Path, window: Option<[u64; 2]>) -> Result<(String, NodeRaw), RawError> {
    let mut node = None;
    let mut streamed = false;
    let mut counter = Counter::default();
    for record in RecordSource::open(path)? {
        match record? {
            Record::Startup(s) => {
                node = Some(s.node);
                streamed = s.filters.raw_irq_stream;
            }
            Record::Kernel(k) if window.is_none_or(|[a, b]| k.ts_ns >= a && k.ts_ns <= b) => {
                counter.event(&k);
            }
            _ => {}
        }
    }
    let node = node.ok_or_else(|| RawError::NotARecording { file: path.into() })?;
    let source = if streamed {
        path.display().to_string()
    } else {
        format!("{}: recorded without --raw-irq", path.display())
    };
    let raw = NodeRaw {
        source,
        queues: (counter.queues.into_iter())
            .map(|(key, acc)| (key, acc.finish()))
            .collect(),
        cpus: (counter.cpus.into_iter())
            .map(|(cpu, (_, counts))| (cpu, counts))
            .collect(),
    };
    Ok((node, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(hook: Hook, cpu: u32, ts: u64, value: Option<i64>) -> KernelEvent {
        let mut k = KernelEvent::new("B".into(), hook, ts);
        k.cpu = cpu;
        k.value = value;
        k
    }

    fn irq(hook: Hook, cpu: u32, ts: u64, irq: u32, queue: u32) -> KernelEvent {
        let mut k = ev(hook, cpu, ts, Some(0));
        k.irq = Some(irq);
        k.queue = Some(queue);
        k.dev = Some("eth0".into());
        k
    }

    fn poll(cpu: u32, ts: u64, work: i64, budget: u64) -> KernelEvent {
        let mut k = ev(Hook::NapiPoll, cpu, ts, Some(work));
        k.aux = Some(budget);
        k.dev = Some("eth0".into());
        k
    }

    #[test]
    fn irq_duration_delay_polls_and_budget_per_queue() {
        let mut c = Counter::default();
        let events = [
            irq(Hook::IrqEntry, 1, 1000, 30, 0),
            irq(Hook::IrqExit, 1, 1400, 30, 0),
            ev(Hook::SoftirqEntry, 1, 2000, Some(NET_RX)),
            poll(1, 2100, 64, 64),
            poll(1, 2200, 3, 64),
            ev(Hook::SoftirqExit, 1, 2300, Some(NET_RX)),
            // Queue 1 on CPU 0; a NET_RX run without an IRQ polls an unknown queue.
            irq(Hook::IrqEntry, 0, 5000, 31, 1),
            irq(Hook::IrqExit, 0, 5100, 31, 1),
            ev(Hook::SoftirqEntry, 0, 5600, Some(NET_RX)),
            ev(Hook::SoftirqExit, 0, 5700, Some(NET_RX)),
            ev(Hook::SoftirqEntry, 0, 9000, Some(NET_RX)),
            poll(0, 9100, 1, 64),
        ];
        events.iter().for_each(|e| c.event(e));
        let q0 = c.queues.remove(&("eth0".into(), Some(0))).unwrap().finish();
        assert_eq!((q0.irq, q0.hard_irqs), (Some(30), 1));
        assert_eq!(q0.hard_irqs_per_cpu, BTreeMap::from([(1, 1)]));
        assert_eq!(q0.hard_irq_ns.unwrap().p50_ns, 400);
        assert_eq!(q0.irq_to_softirq_ns.unwrap().p50_ns, 1000);
        let polls = q0.packets_per_poll.unwrap();
        assert_eq!((polls.polls, polls.max, q0.budget_exhausted), (2, 64, 1));
        let q1 = c.queues.remove(&("eth0".into(), Some(1))).unwrap().finish();
        assert_eq!(q1.irq_to_softirq_ns.unwrap().p50_ns, 600);
        assert!(q1.packets_per_poll.is_none());
        let unknown = c.queues.remove(&("eth0".into(), None)).unwrap().finish();
        assert_eq!(unknown.packets_per_poll.unwrap().polls, 1);
        let cpu0 = c.cpus[&0].1;
        assert_eq!((cpu0.hard_irqs, cpu0.net_rx_softirqs), (1, 2));
    }
}
