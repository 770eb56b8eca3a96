//! "meshlab's own cost": per node, the run time of meshlab's BPF programs and the recorder's
//! CPU (from the recordings' `self_cost`, carried by merge), and per stage an upper bound on
//! the part of it that is meshlab's own programs (docs/report.md, "meshlab's own cost").

use std::collections::BTreeMap;

use serde::Serialize;

use crate::schema::{BpfStatsState, SelfCost};

/// The programs that run inside a stage's interval: the hooks at its two ends. A program
/// takes its timestamp part-way through its run, so the part after it lies in the stage the
/// point starts and the part before it in the stage the point ends: one occurrence holds at
/// most one emitting run of each end program. Runs of the same programs for other packets or
/// other threads inside the interval are not counted.
#[derive(Clone, Copy, Debug)]
pub struct StagePrograms {
    /// Segment name (docs/segments.md).
    pub stage: &'static str,
    /// Attach-plan hook names (docs/probe-points.md) of the programs at its ends.
    pub hooks: &'static [&'static str],
}

const fn stage(stage: &'static str, hooks: &'static [&'static str]) -> StagePrograms {
    StagePrograms { stage, hooks }
}

/// The one statement of which of meshlab's programs sit inside which stage (a test checks it
/// against merge's segment table).
pub const STAGE_PROGRAMS: &[StagePrograms] = &[
    stage("tx_syscall_entry", &["tcp_sendmsg"]),
    stage("tx_tcp_ip", &["tcp_sendmsg", "net_dev_queue"]),
    stage("tx_qdisc", &["net_dev_queue", "net_dev_start_xmit"]),
    stage("tx_driver", &["net_dev_start_xmit", "net_dev_xmit"]),
    stage("tx_completion", &["net_dev_xmit", "tx_complete"]),
    stage("rx_irq_handler", &["irq_entry", "softirq_raise"]),
    stage("rx_softirq_delay", &["softirq_raise", "softirq_entry"]),
    stage("rx_napi_poll", &["softirq_entry", "netif_receive_skb"]),
    stage("rx_ip_tcp", &["netif_receive_skb", "tcp_probe"]),
    stage("rx_tcp_deliver", &["tcp_probe", "sk_data_ready"]),
    stage("rx_wakeup", &["sk_data_ready", "sched_wakeup"]),
    stage("rx_sched_delay", &["sched_wakeup", "sched_switch"]),
    stage("rx_socket_queue", &["sk_data_ready", "skb_copy_datagram"]),
    stage("rx_recv_entry", &["skb_copy_datagram"]),
    stage("rx_wakeup_to_copy", &["sched_switch", "skb_copy_datagram"]),
    stage("rx_copy", &["skb_copy_datagram", "recv_return"]),
];

/// Hooks whose program can emit two events in one run: sched_switch reports the tracked
/// thread switched out and the one switched in. Every other program emits at most one.
const TWO_EVENTS_PER_RUN: &[&str] = &["sched_switch"];

/// Runs that emitted at least one event, at least: events over the most one run emits.
fn emitting_runs_min(hook: &str, events: u64) -> u64 {
    if TWO_EVENTS_PER_RUN.contains(&hook) {
        events.div_ceil(2)
    } else {
        events
    }
}

#[derive(Debug, Default, Serialize)]
pub struct OwnCost {
    /// Requests in the report: the per-request denominator.
    pub requests: u64,
    pub nodes: Vec<NodeOwnCost>,
    pub stages: Vec<StageOwnShare>,
}

#[derive(Debug, Serialize)]
pub struct NodeOwnCost {
    pub node: String,
    pub bpf_stats: BpfStatsState,
    /// Empty when not measured.
    pub programs: Vec<ProgramCost>,
    pub bpf_total_ns: u64,
    pub bpf_ns_per_request: Option<f64>,
    pub user_cpu_ns: u64,
    pub sys_cpu_ns: u64,
    pub events: u64,
    /// (user + sys) / events.
    pub cpu_ns_per_event: Option<f64>,
    /// (user + sys) / requests.
    pub cpu_ns_per_request: Option<f64>,
    /// Program -> firings the kernel skipped it for (events lost outside `dropped`).
    pub missed_runs: BTreeMap<String, u64>,
}

impl NodeOwnCost {
    /// "prog=N, ..." of the programs the kernel skipped, or `None` when it skipped none.
    pub fn missed_runs_line(&self) -> Option<String> {
        let parts: Vec<String> = (self.missed_runs.iter())
            .map(|(program, n)| format!("{program}={n}"))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

#[derive(Debug, Serialize)]
pub struct ProgramCost {
    pub program: String,
    pub hook: String,
    pub runs: u64,
    pub total_ns: u64,
    /// Mean over every run, also those that filtered the packet or thread out.
    pub ns_per_run: Option<f64>,
    /// Events its hook emitted.
    pub events: u64,
    /// total_ns over the fewest runs that can have emitted `events` (events, or half of them
    /// for sched_switch): every run's time charged to the emitting ones, a bound on the mean
    /// cost of an emitting run (none without events).
    pub ns_per_event_max: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct StageOwnShare {
    pub stage: String,
    pub node: String,
    /// The hooks of [`STAGE_PROGRAMS`] whose program ran on the node.
    pub hooks: Vec<String>,
    /// Σ ns/run of those programs: one average run of each (an emitting run does more than
    /// the average one when most runs filter, so this tends to under-state).
    pub own_ns_est: f64,
    /// Σ ns_per_event_max of those programs: a bound on the mean of meshlab's own time in an
    /// occurrence; none when one of them emitted no event (its hook feeds state only).
    pub own_ns_max: Option<f64>,
    pub stage_p50_ns: u64,
    /// own_ns_est / stage_p50_ns.
    pub share_of_p50_est: f64,
    /// own_ns_max / stage_p50_ns.
    pub share_of_p50_max: Option<f64>,
}

/// A stage's median on one node, as the report measured it (non-derived segments only).
#[derive(Clone, Copy, Debug)]
pub struct StageMedian<'a> {
    pub stage: &'a str,
    pub node: &'a str,
    pub p50_ns: u64,
}

fn ratio(num: f64, den: u64) -> Option<f64> {
    (den > 0).then(|| num / den as f64)
}

impl OwnCost {
    /// `costs` by node from the merge summary; `stages` the report's stage medians in path
    /// order.
    pub fn new(costs: &BTreeMap<String, SelfCost>, requests: u64, stages: &[StageMedian]) -> Self {
        let nodes: Vec<NodeOwnCost> = costs
            .iter()
            .map(|(node, c)| node_cost(node, c, requests))
            .collect();
        let stages = stages
            .iter()
            .filter_map(|s| stage_share(s, nodes.iter().find(|n| n.node == s.node)?))
            .collect();
        OwnCost {
            requests,
            nodes,
            stages,
        }
    }
}

fn node_cost(node: &str, c: &SelfCost, requests: u64) -> NodeOwnCost {
    let programs: Vec<ProgramCost> = c
        .programs
        .iter()
        .map(|(name, p)| ProgramCost {
            program: name.clone(),
            hook: p.hook.clone(),
            runs: p.run_cnt,
            total_ns: p.run_time_ns,
            ns_per_run: ratio(p.run_time_ns as f64, p.run_cnt),
            events: p.events,
            ns_per_event_max: ratio(p.run_time_ns as f64, emitting_runs_min(&p.hook, p.events)),
        })
        .collect();
    let bpf_total_ns = programs.iter().map(|p| p.total_ns).sum();
    let cpu = (c.user_cpu_ns + c.sys_cpu_ns) as f64;
    NodeOwnCost {
        node: node.to_owned(),
        bpf_stats: c.bpf_stats,
        bpf_ns_per_request: match c.bpf_stats {
            BpfStatsState::Measured => ratio(bpf_total_ns as f64, requests),
            BpfStatsState::NotMeasured => None,
        },
        programs,
        bpf_total_ns,
        user_cpu_ns: c.user_cpu_ns,
        sys_cpu_ns: c.sys_cpu_ns,
        events: c.events,
        cpu_ns_per_event: ratio(cpu, c.events),
        cpu_ns_per_request: ratio(cpu, requests),
        missed_runs: c.missed_runs.clone(),
    }
}

/// The stage's estimate and bound, when the table lists it and one of its programs ran on
/// the node.
fn stage_share(s: &StageMedian, node: &NodeOwnCost) -> Option<StageOwnShare> {
    let spec = STAGE_PROGRAMS.iter().find(|p| p.stage == s.stage)?;
    let mut hooks = Vec::new();
    let (mut est, mut max) = (0.0, Some(0.0));
    for hook in spec.hooks {
        let Some(p) = node.programs.iter().find(|p| p.hook == *hook) else {
            continue;
        };
        hooks.push((*hook).to_owned());
        est += p.ns_per_run.unwrap_or(0.0);
        max = max.zip(p.ns_per_event_max).map(|(a, b)| a + b);
    }
    if hooks.is_empty() {
        return None;
    }
    Some(StageOwnShare {
        stage: s.stage.to_owned(),
        node: s.node.to_owned(),
        hooks,
        own_ns_est: est,
        own_ns_max: max,
        stage_p50_ns: s.p50_ns,
        share_of_p50_est: ratio(est, s.p50_ns).unwrap_or(0.0),
        share_of_p50_max: max.and_then(|m| ratio(m, s.p50_ns)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::plan::HOOKS;
    use crate::merge::segments::SEGMENTS;
    use crate::schema::ProgramRuns;

    #[test]
    fn every_stage_and_hook_of_the_table_exists() {
        for spec in STAGE_PROGRAMS {
            assert!(
                SEGMENTS.iter().any(|d| d.name == spec.stage),
                "{} is not a segment",
                spec.stage
            );
            for hook in spec.hooks {
                assert!(
                    HOOKS.iter().any(|h| h.name == *hook),
                    "{hook} ({}) is not an attach-plan hook",
                    spec.stage
                );
            }
        }
    }

    fn row(stage: &'static str, node: &'static str, p50_ns: u64) -> StageMedian<'static> {
        StageMedian {
            stage,
            node,
            p50_ns,
        }
    }

    /// Programs as (name, hook, runs, run time, events).
    fn cost(state: BpfStatsState, programs: &[(&str, &str, u64, u64, u64)]) -> SelfCost {
        SelfCost {
            bpf_stats: state,
            programs: programs
                .iter()
                .map(|(name, hook, run_cnt, run_time_ns, events)| {
                    let runs = ProgramRuns {
                        hook: (*hook).into(),
                        run_cnt: *run_cnt,
                        run_time_ns: *run_time_ns,
                        events: *events,
                    };
                    ((*name).to_owned(), runs)
                })
                .collect(),
            user_cpu_ns: 3_000_000,
            sys_cpu_ns: 1_000_000,
            events: 8_000,
            missed_runs: BTreeMap::new(),
        }
    }

    #[test]
    fn programs_the_kernel_skipped_are_named() {
        let mut skipped = cost(BpfStatsState::NotMeasured, &[]);
        let costs = [("A".to_owned(), skipped.clone())].into_iter().collect();
        assert_eq!(
            OwnCost::new(&costs, 1, &[]).nodes[0].missed_runs_line(),
            None
        );
        skipped.missed_runs = [
            ("net_dev_xmit_btf".to_owned(), 3),
            ("tcp_probe_btf".to_owned(), 1),
        ]
        .into_iter()
        .collect();
        let costs = [("A".to_owned(), skipped)].into_iter().collect();
        let own = OwnCost::new(&costs, 1, &[]);
        assert_eq!(
            own.nodes[0].missed_runs_line().as_deref(),
            Some("net_dev_xmit_btf=3, tcp_probe_btf=1")
        );
        let mut text = Vec::new();
        super::super::own_cost_text::write_own_cost(&own, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("A: EVENTS LOST") && text.contains("net_dev_xmit_btf=3"),
            "{text}"
        );
    }

    #[test]
    fn per_node_figures_and_stage_bounds() {
        let measured = cost(
            BpfStatsState::Measured,
            &[
                ("net_dev_queue_btf", "net_dev_queue", 100, 30_000, 50),
                (
                    "net_dev_start_xmit_btf",
                    "net_dev_start_xmit",
                    100,
                    20_000,
                    40,
                ),
                ("irq_entry_btf", "irq_entry", 10, 3_000, 0),
            ],
        );
        let costs = [("A".to_owned(), measured)].into_iter().collect();
        let segments = [
            row("tx_qdisc", "A", 1_000),
            row("tx_driver", "A", 4_000),
            row("rx_irq_handler", "A", 1_000),
            row("rx_copy", "A", 500),
            row("tx_qdisc", "B", 1_000),
        ];
        let own = OwnCost::new(&costs, 1_000, &segments);
        let a = &own.nodes[0];
        assert_eq!(a.bpf_total_ns, 53_000);
        assert_eq!(a.bpf_ns_per_request, Some(53.0));
        assert_eq!(a.cpu_ns_per_event, Some(500.0));
        assert_eq!(a.cpu_ns_per_request, Some(4_000.0));
        let queue = a
            .programs
            .iter()
            .find(|p| p.hook == "net_dev_queue")
            .unwrap();
        assert_eq!(queue.ns_per_run, Some(300.0));
        assert_eq!(queue.ns_per_event_max, Some(600.0));
        let irq = a.programs.iter().find(|p| p.hook == "irq_entry").unwrap();
        assert_eq!(irq.ns_per_event_max, None, "no events: no bound");
        // tx_qdisc: both ends ran: 300 + 200 ns per run, 600 + 500 ns per event, of a
        // 1000 ns median; tx_driver: only its start program was recorded; rx_irq_handler: its
        // start program emitted nothing, so no bound; rx_copy: none of its programs; B: no
        // cost recorded.
        let stages: Vec<&str> = own.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(stages, ["tx_qdisc", "tx_driver", "rx_irq_handler"]);
        let qdisc = &own.stages[0];
        assert_eq!(qdisc.own_ns_est, 500.0);
        assert_eq!(qdisc.share_of_p50_est, 0.5);
        assert_eq!(qdisc.own_ns_max, Some(1_100.0));
        assert_eq!(qdisc.share_of_p50_max, Some(1.1));
        let driver = &own.stages[1];
        assert_eq!(driver.hooks, vec!["net_dev_start_xmit".to_owned()]);
        assert_eq!(driver.share_of_p50_est, 0.05);
        assert_eq!(driver.share_of_p50_max, Some(0.125));
        let irq = &own.stages[2];
        assert_eq!((irq.own_ns_est, irq.own_ns_max), (300.0, None));
    }

    #[test]
    fn a_sched_switch_run_may_emit_two_events() {
        assert_eq!(emitting_runs_min("sched_switch", 79), 40);
        assert_eq!(emitting_runs_min("tcp_probe", 79), 79);
    }

    #[test]
    fn not_measured_has_cpu_but_no_bpf_figures() {
        let costs = [("A".to_owned(), cost(BpfStatsState::NotMeasured, &[]))]
            .into_iter()
            .collect();
        let own = OwnCost::new(&costs, 0, &[row("tx_qdisc", "A", 1_000)]);
        let a = &own.nodes[0];
        assert_eq!(a.bpf_stats, BpfStatsState::NotMeasured);
        assert_eq!(a.bpf_ns_per_request, None);
        assert_eq!(
            a.cpu_ns_per_request, None,
            "no requests: no per-request figure"
        );
        assert_eq!(a.cpu_ns_per_event, Some(500.0));
        assert!(own.stages.is_empty());
    }
}
