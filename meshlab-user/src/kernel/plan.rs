//! The hook table: every probe point, its family, and its attach tiers fastest first.
//!
//! The same table drives `meshlab doctor` (which tries every tier) and `meshlab record` (which
//! takes the first tier that attaches, per hook).

pub use crate::schema::Tier;

/// The attach plan's entry for socket TX timestamps: no program of its own, a switch of the
/// sock_ops program (`record --tx-timestamps`) that needs the kfunc [`TX_TSTAMP_KFUNC`].
pub const TX_TIMESTAMPS_HOOK: &str = "tx_timestamps";
/// The kfunc that turns socket TX timestamps on for one send (Linux 6.15+).
pub const TX_TSTAMP_KFUNC: &str = "bpf_sock_ops_enable_tx_tstamp";

/// The sock_ops program's name in the eBPF object.
pub const SOCK_OPS_PROGRAM: &str = "meshlab_sock_ops";

/// Hook families: one module of meshlab-ebpf each (docs/probe-points.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    SockOps,
    Tx,
    Rx,
    Irq,
    Sched,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::SockOps => "sockops",
            Family::Tx => "tx",
            Family::Rx => "rx",
            Family::Irq => "irq",
            Family::Sched => "sched",
        }
    }
}

/// One way to attach one hook: the program (by its name in the eBPF object) and its target.
#[derive(Clone, Copy, Debug)]
pub struct TierSpec {
    pub tier: Tier,
    pub program: &'static str,
    /// Kernel function (fentry/kprobe), tracepoint name (tp_btf/raw_tp) or
    /// `category:name` (tracepoint); empty for sock_ops.
    pub target: &'static str,
}

/// A probe point and its tiers, fastest first.
#[derive(Clone, Copy, Debug)]
pub struct HookSpec {
    /// Name in the attach plan (and docs/probe-points.md).
    pub name: &'static str,
    pub family: Family,
    pub tiers: &'static [TierSpec],
    /// Recorded only with `--raw-irq` (otherwise its state feeds RX events and costs nothing
    /// to leave detached, except for the IRQ/softirq context hooks, which are always needed).
    pub raw_stream_only: bool,
}

impl HookSpec {
    /// Whether `record --attach on-demand` attaches this hook only while a connection is
    /// traced. sock_ops is the one hook that notices a connection becoming traced; every other
    /// hook only ever emits for traced connections (or --raw-irq, --unix, which on-demand
    /// refuses), so nothing is lost by leaving them detached while none is.
    pub fn on_demand(&self) -> bool {
        self.family != Family::SockOps
    }
}

const fn tp(
    program_btf: &'static str,
    program_raw: &'static str,
    target: &'static str,
) -> [TierSpec; 2] {
    [
        TierSpec {
            tier: Tier::TpBtf,
            program: program_btf,
            target,
        },
        TierSpec {
            tier: Tier::RawTp,
            program: program_raw,
            target,
        },
    ]
}

macro_rules! tracepoint_hook {
    ($name:literal, $family:expr, $btf:literal, $raw:literal, $target:literal) => {
        HookSpec {
            name: $name,
            family: $family,
            tiers: &tp($btf, $raw, $target),
            raw_stream_only: false,
        }
    };
}

/// Every hook `record` attaches, in path order within each family.
pub const HOOKS: &[HookSpec] = &[
    HookSpec {
        name: "sock_ops",
        family: Family::SockOps,
        tiers: &[TierSpec {
            tier: Tier::SockOps,
            program: SOCK_OPS_PROGRAM,
            target: "",
        }],
        raw_stream_only: false,
    },
    HookSpec {
        name: "tcp_sendmsg",
        family: Family::Tx,
        tiers: &[
            TierSpec {
                tier: Tier::Fentry,
                program: "tcp_sendmsg_fentry",
                target: "tcp_sendmsg",
            },
            TierSpec {
                tier: Tier::Kprobe,
                program: "tcp_sendmsg_kprobe",
                target: "tcp_sendmsg",
            },
            TierSpec {
                tier: Tier::TpBtf,
                program: "tcp_sendmsg_locked_btf",
                target: "tcp_sendmsg_locked",
            },
            TierSpec {
                tier: Tier::RawTp,
                program: "tcp_sendmsg_locked_raw",
                target: "tcp_sendmsg_locked",
            },
        ],
        raw_stream_only: false,
    },
    tracepoint_hook!(
        "net_dev_queue",
        Family::Tx,
        "net_dev_queue_btf",
        "net_dev_queue_raw",
        "net_dev_queue"
    ),
    tracepoint_hook!(
        "net_dev_start_xmit",
        Family::Tx,
        "net_dev_start_xmit_btf",
        "net_dev_start_xmit_raw",
        "net_dev_start_xmit"
    ),
    tracepoint_hook!(
        "net_dev_xmit",
        Family::Tx,
        "net_dev_xmit_btf",
        "net_dev_xmit_raw",
        "net_dev_xmit"
    ),
    HookSpec {
        name: "send_return",
        family: Family::Tx,
        tiers: &[
            // Not sock_sendmsg: since "net: prevent rewrite of msg_name in sock_sendmsg()"
            // (6.6, in stable 6.1.57+, 5.15.134+, ...) write(2), send(2)/sendto(2) and
            // sendmsg(2) call __sock_sendmsg directly, so fexit sock_sendmsg attaches and never
            // fires for them. __sock_sendmsg is in BTF where it was not inlined (Debian 6.1);
            // where it was (6.12) this tier fails and the tracepoint, on every path, is used.
            TierSpec {
                tier: Tier::Fexit,
                program: "send_return_fexit",
                target: "__sock_sendmsg",
            },
            TierSpec {
                tier: Tier::TpBtf,
                program: "send_return_btf",
                target: "sock_send_length",
            },
            TierSpec {
                tier: Tier::RawTp,
                program: "send_return_raw",
                target: "sock_send_length",
            },
        ],
        raw_stream_only: false,
    },
    tracepoint_hook!(
        "tx_complete",
        Family::Tx,
        "tx_complete_btf",
        "tx_complete_raw",
        "consume_skb"
    ),
    tracepoint_hook!(
        "netif_receive_skb",
        Family::Rx,
        "netif_receive_skb_btf",
        "netif_receive_skb_raw",
        "netif_receive_skb"
    ),
    tracepoint_hook!(
        "tcp_probe",
        Family::Rx,
        "tcp_probe_btf",
        "tcp_probe_raw",
        "tcp_probe"
    ),
    tracepoint_hook!(
        "sk_data_ready",
        Family::Rx,
        "sk_data_ready_btf",
        "sk_data_ready_raw",
        "sk_data_ready"
    ),
    tracepoint_hook!(
        "skb_copy_datagram",
        Family::Rx,
        "skb_copy_btf",
        "skb_copy_raw",
        "skb_copy_datagram_iovec"
    ),
    HookSpec {
        name: "recv_return",
        family: Family::Rx,
        tiers: &[
            TierSpec {
                tier: Tier::Fexit,
                program: "recv_return_fexit",
                target: "sock_recvmsg",
            },
            TierSpec {
                tier: Tier::TpBtf,
                program: "recv_return_btf",
                target: "sock_recv_length",
            },
            TierSpec {
                tier: Tier::RawTp,
                program: "recv_return_raw",
                target: "sock_recv_length",
            },
        ],
        raw_stream_only: false,
    },
    tracepoint_hook!(
        "irq_entry",
        Family::Irq,
        "irq_entry_btf",
        "irq_entry_raw",
        "irq_handler_entry"
    ),
    HookSpec {
        name: "irq_exit",
        family: Family::Irq,
        tiers: &tp("irq_exit_btf", "irq_exit_raw", "irq_handler_exit"),
        raw_stream_only: true,
    },
    tracepoint_hook!(
        "softirq_raise",
        Family::Irq,
        "softirq_raise_btf",
        "softirq_raise_raw",
        "softirq_raise"
    ),
    tracepoint_hook!(
        "softirq_entry",
        Family::Irq,
        "softirq_entry_btf",
        "softirq_entry_raw",
        "softirq_entry"
    ),
    tracepoint_hook!(
        "softirq_exit",
        Family::Irq,
        "softirq_exit_btf",
        "softirq_exit_raw",
        "softirq_exit"
    ),
    HookSpec {
        name: "napi_poll",
        family: Family::Irq,
        tiers: &tp("napi_poll_btf", "napi_poll_raw", "napi_poll"),
        raw_stream_only: true,
    },
    tracepoint_hook!(
        "sched_wakeup",
        Family::Sched,
        "sched_waking_btf",
        "sched_waking_raw",
        "sched_waking"
    ),
    tracepoint_hook!(
        "sched_switch",
        Family::Sched,
        "sched_switch_btf",
        "sched_switch_raw",
        "sched_switch"
    ),
];

/// Capability probes for tiers `record` never needs on this family (doctor only): a classic
/// tracepoint per family, so the table shows whether perf tracepoints attach at all.
pub(crate) const TRACEPOINT_PROBE: TierSpec = TierSpec {
    tier: Tier::Tracepoint,
    program: "net_dev_queue_tracepoint",
    target: "net:net_dev_queue",
};

#[cfg(test)]
mod tests {
    use super::*;

    /// fexit sock_sendmsg attaches on the Debian 6.1 and 6.12 guests but never fires for
    /// write(2), send(2) or sendmsg(2) (they call __sock_sendmsg directly since the msg_name
    /// fix): with it, send_return recorded nothing there (record_slot_collisions in `cargo
    /// xtask vm test`).
    #[test]
    fn send_return_never_attaches_where_send_syscalls_do_not_pass() {
        let hook = HOOKS.iter().find(|h| h.name == "send_return").unwrap();
        let fexit: Vec<_> = hook
            .tiers
            .iter()
            .filter(|t| t.tier == Tier::Fexit)
            .map(|t| t.target)
            .collect();
        assert_eq!(fexit, ["__sock_sendmsg"]);
    }

    #[test]
    fn hook_names_are_unique_and_tiers_fastest_first() {
        let mut names: Vec<_> = HOOKS.iter().map(|h| h.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), HOOKS.len());
        let rank = |t: Tier| {
            [
                Tier::Fentry,
                Tier::Fexit,
                Tier::Kprobe,
                Tier::TpBtf,
                Tier::RawTp,
            ]
            .iter()
            .position(|x| *x == t)
        };
        for hook in HOOKS {
            let ranks: Vec<_> = hook.tiers.iter().filter_map(|t| rank(t.tier)).collect();
            assert!(
                ranks.windows(2).all(|w| w[0] < w[1]),
                "{} tiers out of order",
                hook.name
            );
        }
    }
}
