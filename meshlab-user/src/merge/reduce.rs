//! Reduction of one validated record to the merge's [`Item`]: node check, `--inject-skew`,
//! clock conversion of probe timestamps, and field errors naming file, line and field.

use crate::incoming::{Incoming, KernelLine};
use crate::schema::{Hook, InputKind, ProbeEvent, Record};

use super::MergeError;
use super::event::{
    Endpoint, Established, Extra, Extras, KEvent, Origin, PEvent, Reduced, Role, RxContext, Stamp,
    UnixEnds,
};
use super::input::{Plan, parse_err, shift};
use super::nic_clock::OnMonotonic;
use super::time::{NodeId, NodeTime};

/// Reduces one record of `file` (already parsed, or a capture's event as its decoder's
/// borrowed line) to an item of `node`, or `None` when the record is not an event of that node
/// (other records, other nodes' probe lines).
pub fn to_item(
    plan: &Plan,
    file: usize,
    line: u64,
    node: NodeId,
    record: Incoming<'_>,
) -> Result<Option<Reduced>, MergeError> {
    let f = &plan.files[file];
    let origin = Origin {
        file: file as u16,
        line,
    };
    let skew = plan.skew_ns[usize::from(node.0)];
    let node_name = &plan.nodes[usize::from(node.0)];
    let bad = |record: &str, field: &str, what: String| {
        parse_err(
            &f.display,
            line,
            format!("in a `{record}` record: field `{field}`: {what}"),
        )
    };
    let kernel = |k: &KernelLine<'_>| {
        node_checked(node_name, k)
            .and_then(|k| kernel_item(plan, node, origin, skew, k))
            .map(Some)
            .map_err(|(field, what)| bad("kernel", field, what))
    };
    // Matched on the record alone, its file's kind in the guards: a `(kind, record)` tuple
    // was a copy of the whole record per event.
    let kernel_file = f.kind == InputKind::Kernel;
    match record {
        Incoming::Kernel(k) if kernel_file => kernel(k),
        Incoming::Owned(Record::Kernel(k)) if kernel_file => kernel(&KernelLine::of(&k)),
        Incoming::Owned(Record::Probe(_)) if kernel_file => Err(bad(
            "probe",
            "type",
            "a probe record inside a kernel recording".into(),
        )),
        Incoming::Owned(Record::Startup(_)) if kernel_file && line > 1 => {
            Err(bad("startup", "type", "a second startup record".into()))
        }
        _ if kernel_file => Ok(None),
        Incoming::Owned(Record::Probe(p)) => {
            let this = p.node.as_ref().or(f.node.as_ref());
            if this != Some(node_name) {
                return Ok(None);
            }
            probe_item(plan, node, origin, skew, p)
                .map(|p| p.map(|p| Reduced::Probe(Box::new(p))))
                .map_err(|(field, what)| bad("probe", field, what))
        }
        other => Err(bad(
            other.type_name(),
            "type",
            "expected a `probe` record in a probe file".into(),
        )),
    }
}

type FieldError = (&'static str, String);

/// `k`, if it is an event of `node_name` (the node whose recording it came in).
fn node_checked<'k, 'a>(
    node_name: &str,
    k: &'k KernelLine<'a>,
) -> Result<&'k KernelLine<'a>, FieldError> {
    if k.node != node_name {
        let what = format!("\"{}\" in the recording of node \"{node_name}\"", k.node);
        return Err(("node", what));
    }
    Ok(k)
}

fn kernel_item(
    plan: &Plan,
    node: NodeId,
    origin: Origin,
    skew: i64,
    k: &KernelLine<'_>,
) -> Result<Reduced, FieldError> {
    let moved = |field: &'static str, v: u64| {
        shift(v, skew).ok_or_else(|| (field, format!("--inject-skew {skew} moves {v} below zero")))
    };
    let hook = k.hook;
    let ts = moved("ts_ns", k.ts_ns)?;
    let established = if hook == Hook::SockEstablished {
        Some(established(k)?)
    } else {
        None
    };
    if hook.byte_position().is_some() && k.offset.is_some() && k.dir.is_none() {
        return Err(("dir", "required when `offset` is set".into()));
    }
    let rx = if hook == Hook::NetifReceiveSkb {
        Some(rx_context(plan, node, k, &moved)?)
    } else {
        None
    };
    let tx_wire = on_nic_clock(plan, node, k.aux.filter(|_| hook == Hook::TxTstampHw));
    let (ts, error_ns, sample) =
        tx_wire.map_or((ts, 0, u32::MAX), |at| (at.ns, at.error_ns, at.sample));
    Ok(Reduced::Kernel(KEvent {
        hook,
        stamp: Stamp {
            time: NodeTime::new(node, ts),
            error_ns,
            sample,
            origin,
            place: plan.nics[usize::from(node.0)].place(k),
        },
        tid: k.tid,
        cookie: k.cookie,
        dir: k.dir,
        offset: k.offset,
        len: k.len.unwrap_or(0),
        value: k.value,
        retrans: k.retrans,
        extra: Extra::new(Extras {
            rx,
            established,
            unix: k.unix_sock.map(|sock| UnixEnds {
                sock,
                peer: k.unix_peer.unwrap_or(0),
            }),
            aux: k.aux.filter(|_| hook == Hook::SchedSwitch),
        }),
    }))
}

/// The receive context a `netif_receive_skb` event carries, its times moved by `moved`.
fn rx_context(
    plan: &Plan,
    node: NodeId,
    k: &KernelLine<'_>,
    moved: &dyn Fn(&'static str, u64) -> Result<u64, FieldError>,
) -> Result<RxContext, FieldError> {
    let nic = &plan.nics[usize::from(node.0)];
    let moved_opt = |field, v: Option<u64>| v.map(|v| moved(field, v)).transpose();
    let irq_expected = nic.expects_irq(k);
    // A NIC's frame came from its own hardware queue: another NIC's or another queue's IRQ
    // in its CPU's context (NICs or queues sharing a CPU, merge/nic.rs) and that IRQ's raise
    // are not its. Without them it counts as polled without an IRQ of its own, placed on its
    // own queue where the driver recorded it. A frame of a device without IRQs (veth, a
    // bridge) keeps them: routed there from a NIC in the same softirq run, it did start at
    // that IRQ.
    let foreign = nic.foreign_context_irq(k);
    let own = |v: Option<u64>| v.filter(|_| !foreign);
    Ok(RxContext {
        irq_entry_ns: moved_opt("irq_entry_ns", own(k.irq_entry_ns))?,
        softirq_raise_ns: moved_opt("softirq_raise_ns", own(k.softirq_raise_ns))?,
        softirq_entry_ns: moved_opt("softirq_entry_ns", k.softirq_entry_ns)?,
        irq_expected,
        wire: on_nic_clock(plan, node, k.aux),
    })
}

/// A hardware stamp (`aux` of `tx_tstamp_hw` or `netif_receive_skb`) on the node's monotonic
/// clock when its clock records carry its NIC clock (merge/nic_clock.rs); `None` otherwise
/// (a TX stamp then stays where the kernel reported it, an RX one is no point). The samples
/// are already moved by the node's `--inject-skew`.
fn on_nic_clock(plan: &Plan, node: NodeId, hw_ns: Option<u64>) -> Option<OnMonotonic> {
    plan.clocks[usize::from(node.0)].nic().to_monotonic(hw_ns?)
}

/// The connection a `sock_established` event opens; every field it needs is required. The
/// only hook whose addresses the merge reads: they are printed here, not per decoded event.
fn established(k: &KernelLine<'_>) -> Result<Established, FieldError> {
    fn need<T: Clone>(v: &Option<T>, field: &'static str) -> Result<T, FieldError> {
        v.clone()
            .ok_or((field, "required for sock_established".to_owned()))
    }
    need(&k.cookie, "cookie")?;
    Ok(Established {
        local: Endpoint::new(need(&k.saddr, "saddr")?.text(), need(&k.sport, "sport")?),
        remote: Endpoint::new(need(&k.daddr, "daddr")?.text(), need(&k.dport, "dport")?),
        active: need(&k.active, "active")?,
    })
}

fn probe_item(
    plan: &Plan,
    node: NodeId,
    origin: Origin,
    skew: i64,
    p: ProbeEvent,
) -> Result<Option<PEvent>, FieldError> {
    let Some((role, point)) = p.point.split_once('.') else {
        return Err(bad_point(&p.point));
    };
    // Other roles (a probed proxy, any process on the path) keep their whole point name and
    // are placed into the node's chain by time (merge/catalog.rs).
    let role = match role {
        "client" => Some(Role::Client),
        "server" => Some(Role::Server),
        _ => None,
    };
    // The point's own String, its `ROLE.` prefix cut in place (a few bytes moved), rather than
    // a second allocation per probe line.
    let cut = if role.is_some() {
        p.point.len() - point.len()
    } else {
        0
    };
    let ts = shift(p.ts_ns, skew).ok_or_else(|| {
        (
            "ts_ns",
            format!("--inject-skew {skew} moves {} below zero", p.ts_ns),
        )
    })?;
    let table = &plan.clocks[usize::from(node.0)];
    let converted = if plan.kernel_recorded[usize::from(node.0)] {
        table
            .to_monotonic(node, p.clock, ts)
            .map_err(|e| ("clock", e.to_string()))?
    } else {
        // No kernel recording: the node's time is its probes' one declared clock.
        super::clock::Converted {
            time: NodeTime::new(node, ts),
            error_ns: 0,
            sample: u32::MAX,
        }
    };
    let mut point = p.point;
    point.drain(..cut);
    Ok(Some(PEvent {
        role,
        point,
        process: p.process,
        trace_id: p.trace_id,
        stamp: converted.stamp(origin),
        tid: p.tid,
        conn: p.conn,
        dir: p.dir,
        offset: p.offset,
        len: p.len,
    }))
}

fn bad_point(point: &str) -> FieldError {
    let what = format!("\"{point}\": expected ROLE.NAME, e.g. client.write_begin");
    ("point", what)
}
