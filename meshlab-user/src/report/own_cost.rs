//! "meshlab's own cost": per node, the run time of meshlab's BPF programs and the recorder's
//! CPU (from the recordings' `self_cost`, carried by merge), and per stage an upper bound on
//! the part of it that is meshlab's own programs (docs/report.md, "meshlab's own cost").

use std::collections::BTreeMap;

use serde::Serialize;

use crate::schema::{BpfStatsState, SelfCost};

/// The programs that run inside a stage's interval: the hooks at its two ends. A program
/// takes its timestamp part-way through its run, so the part after it lies in the stage the
/// point starts and the part before it in the stage the point ends; one run of each end
/// program per occurrence bounds meshlab's own time inside the stage from above. Runs of the
/// same programs for other packets or other threads inside the interval are not counted.
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
}

#[derive(Debug, Serialize)]
pub struct ProgramCost {
    pub program: String,
    pub hook: String,
    pub runs: u64,
    pub total_ns: u64,
    pub ns_per_run: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct StageOwnShare {
    pub stage: String,
    pub node: String,
    /// The hooks of [`STAGE_PROGRAMS`] whose program ran on the node.
    pub hooks: Vec<String>,
    /// Σ ns/run of those programs: at most this much of one occurrence is meshlab's own.
    pub own_ns_max: f64,
    pub stage_p50_ns: u64,
    /// own_ns_max / stage_p50_ns: an upper bound on meshlab's share of the stage's median.
    pub share_of_p50_max: f64,
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
    }
}

/// The stage's bound, when the table lists it and one of its programs ran on the node.
fn stage_share(s: &StageMedian, node: &NodeOwnCost) -> Option<StageOwnShare> {
    let spec = STAGE_PROGRAMS.iter().find(|p| p.stage == s.stage)?;
    let mut hooks = Vec::new();
    let mut own_ns_max = 0.0;
    for hook in spec.hooks {
        let per_run: Vec<f64> = node
            .programs
            .iter()
            .filter(|p| p.hook == *hook)
            .filter_map(|p| p.ns_per_run)
            .collect();
        if !per_run.is_empty() {
            hooks.push((*hook).to_owned());
            own_ns_max += per_run.iter().sum::<f64>();
        }
    }
    if hooks.is_empty() {
        return None;
    }
    Some(StageOwnShare {
        stage: s.stage.to_owned(),
        node: s.node.to_owned(),
        hooks,
        own_ns_max,
        stage_p50_ns: s.p50_ns,
        share_of_p50_max: ratio(own_ns_max, s.p50_ns).unwrap_or(0.0),
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

    fn cost(state: BpfStatsState, programs: &[(&str, &str, u64, u64)]) -> SelfCost {
        SelfCost {
            bpf_stats: state,
            programs: programs
                .iter()
                .map(|(name, hook, run_cnt, run_time_ns)| {
                    let runs = ProgramRuns {
                        hook: (*hook).into(),
                        run_cnt: *run_cnt,
                        run_time_ns: *run_time_ns,
                    };
                    ((*name).to_owned(), runs)
                })
                .collect(),
            user_cpu_ns: 3_000_000,
            sys_cpu_ns: 1_000_000,
            events: 8_000,
        }
    }

    #[test]
    fn per_node_figures_and_stage_bounds() {
        let measured = cost(
            BpfStatsState::Measured,
            &[
                ("net_dev_queue_btf", "net_dev_queue", 100, 30_000),
                ("net_dev_start_xmit_btf", "net_dev_start_xmit", 100, 20_000),
            ],
        );
        let costs = [("A".to_owned(), measured)].into_iter().collect();
        let segments = [
            row("tx_qdisc", "A", 1_000),
            row("tx_driver", "A", 4_000),
            row("rx_copy", "A", 500),
            row("tx_qdisc", "B", 1_000),
        ];
        let own = OwnCost::new(&costs, 1_000, &segments);
        let a = &own.nodes[0];
        assert_eq!(a.bpf_total_ns, 50_000);
        assert_eq!(a.bpf_ns_per_request, Some(50.0));
        assert_eq!(a.cpu_ns_per_event, Some(500.0));
        assert_eq!(a.cpu_ns_per_request, Some(4_000.0));
        assert_eq!(a.programs[0].ns_per_run, Some(300.0));
        // tx_qdisc: both ends ran (300 + 200 ns of a 1000 ns median); tx_driver: only its
        // start program was recorded; rx_copy: none of its programs; B: no cost recorded.
        assert_eq!(own.stages.len(), 2, "{:?}", own.stages);
        let qdisc = &own.stages[0];
        assert_eq!(qdisc.stage, "tx_qdisc");
        assert_eq!(qdisc.own_ns_max, 500.0);
        assert_eq!(qdisc.share_of_p50_max, 0.5);
        let driver = &own.stages[1];
        assert_eq!(driver.hooks, vec!["net_dev_start_xmit".to_owned()]);
        assert_eq!(driver.share_of_p50_max, 0.05);
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
