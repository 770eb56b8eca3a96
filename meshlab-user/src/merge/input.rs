//! Input files: which kind (kernel recording or probe file), which node, their clock samples
//! and drop totals, and `--inject-skew`; records become items in [`super::reduce`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::capture::source::non_event_records;
use crate::ndjson::{Lines, NdjsonError};
use crate::records::{file_is_capture, first_record};
use crate::schema::{
    ClockId, ClockSample, HotHooks, HotHooksChange, InputKind, Record, SelfCost, Startup,
};

use super::MergeError;
use super::clock::ClockTable;
use super::nic::NodeNic;
use super::time::NodeId;

#[derive(Clone, Debug)]
pub struct InputFile {
    pub path: PathBuf,
    pub display: String,
    pub kind: InputKind,
    /// Kernel: the startup record's node. Probe: the `--node NAME=FILE` default, if any.
    pub node: Option<String>,
    /// Probe files: every node its lines name.
    pub nodes: Vec<String>,
}

/// Everything known before the streaming pass: files, nodes, clocks, drops, skews.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub files: Vec<InputFile>,
    pub nodes: Vec<String>,
    pub startups: Vec<Startup>,
    /// Per node (by `NodeId`).
    pub clocks: Vec<ClockTable>,
    /// Per node: queue <-> IRQ maps of its device context.
    pub nics: Vec<NodeNic>,
    pub skew_ns: Vec<i64>,
    pub dropped: BTreeMap<String, u64>,
    /// Per node name: meshlab's own cost, from its recording's summary.
    pub self_cost: BTreeMap<String, SelfCost>,
    /// Per node: it has a kernel recording (else its probes keep their declared clock).
    pub kernel_recorded: Vec<bool>,
    /// Per node: the clocks its probe lines declare.
    pub probe_clocks: Vec<Vec<ClockId>>,
    /// Per node name: the spans (start, end; node time, skew applied) in which its recording
    /// had its hot hooks detached (`record --attach on-demand`): its kernel events are missing
    /// there, which the requests touching them say in a note.
    pub detached: BTreeMap<String, Vec<(u64, u64)>>,
}

impl Plan {
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n == name)
            .map(|i| NodeId(i as u16))
    }

    pub fn has_probes(&self, node: NodeId) -> bool {
        let name = &self.nodes[usize::from(node.0)];
        self.files
            .iter()
            .any(|f| f.kind == InputKind::Probe && f.nodes.contains(name))
    }
}

pub(super) fn parse_err(file: &str, line: u64, message: String) -> MergeError {
    MergeError::Input(NdjsonError::Parse {
        file: file.into(),
        line,
        message,
    })
}

/// Reads kinds, nodes and clock samples of all inputs. `files` are plain paths; `named` are
/// `--node NAME=FILE` pairs.
pub fn plan(
    files: &[PathBuf],
    named: &[(String, PathBuf)],
    skews: &BTreeMap<String, i64>,
) -> Result<Plan, MergeError> {
    let mut plan = Plan::default();
    let mut probe_clocks: Vec<(String, ClockId)> = Vec::new();
    let all = files
        .iter()
        .map(|f| (None, f))
        .chain(named.iter().map(|(n, f)| (Some(n.clone()), f)));
    for (given_node, path) in all {
        plan.add_file(path, given_node, &mut probe_clocks)?;
    }
    for f in &plan.files {
        for n in &f.nodes {
            if !plan.nodes.contains(n) {
                plan.nodes.push(n.clone());
            }
        }
    }
    if plan.nodes.len() > usize::from(u16::MAX) {
        return Err(MergeError::Usage("too many nodes".into()));
    }
    plan.set_skews(skews)?;
    plan.clocks = vec![ClockTable::default(); plan.nodes.len()];
    plan.kernel_recorded = plan
        .nodes
        .iter()
        .map(|n| plan.startups.iter().any(|s| s.node == *n))
        .collect();
    plan.set_probe_clocks(&probe_clocks)?;
    plan.nics = vec![NodeNic::default(); plan.nodes.len()];
    for i in 0..plan.files.len() {
        if plan.files[i].kind == InputKind::Kernel {
            scan_kernel_file(&mut plan, i)?;
        }
    }
    plan.clocks.iter_mut().for_each(ClockTable::seal);
    Ok(plan)
}

impl Plan {
    /// Registers one input by its first record: a kernel recording (startup) or a probe file.
    fn add_file(
        &mut self,
        path: &Path,
        given_node: Option<String>,
        probe_clocks: &mut Vec<(String, ClockId)>,
    ) -> Result<(), MergeError> {
        let display = path.display().to_string();
        let (position, first) = first_record(path)?.ok_or_else(|| {
            parse_err(
                &display,
                1,
                "empty file: expected a `startup` record (kernel recording) or `probe` records"
                    .into(),
            )
        })?;
        match first {
            Record::Startup(startup) => self.add_recording(path, display, given_node, startup),
            Record::Probe(_) => {
                let pairs = probe_nodes(path, &display, given_node.as_deref())?;
                let mut nodes: Vec<String> = Vec::new();
                for (node, _) in &pairs {
                    if !nodes.contains(node) {
                        nodes.push(node.clone());
                    }
                }
                probe_clocks.extend(pairs);
                self.files.push(InputFile {
                    path: path.to_owned(),
                    display,
                    kind: InputKind::Probe,
                    node: given_node,
                    nodes,
                });
                Ok(())
            }
            other => Err(parse_err(
                &display,
                position,
                format!(
                    "expected a `startup` record (kernel recording) or a `probe` record first, found a `{}` record",
                    other.type_name()
                ),
            )),
        }
    }

    fn add_recording(
        &mut self,
        path: &Path,
        display: String,
        given_node: Option<String>,
        startup: Startup,
    ) -> Result<(), MergeError> {
        if let Some(n) = given_node.as_ref().filter(|n| **n != startup.node) {
            return Err(parse_err(
                &display,
                1,
                format!(
                    "in a `startup` record: field `node` is \"{}\" but the file was given as --node {n}=...",
                    startup.node
                ),
            ));
        }
        if self.startups.iter().any(|s| s.node == startup.node) {
            return Err(parse_err(
                &display,
                1,
                format!(
                    "in a `startup` record: field `node`: a second kernel recording of node \"{}\"",
                    startup.node
                ),
            ));
        }
        self.files.push(InputFile {
            path: path.to_owned(),
            display,
            kind: InputKind::Kernel,
            node: Some(startup.node.clone()),
            nodes: vec![startup.node.clone()],
        });
        self.startups.push(startup);
        Ok(())
    }

    fn set_skews(&mut self, skews: &BTreeMap<String, i64>) -> Result<(), MergeError> {
        for name in skews.keys() {
            if !self.nodes.contains(name) {
                return Err(MergeError::Usage(format!(
                    "--inject-skew names node \"{name}\", which no input has (nodes: {})",
                    self.nodes.join(", ")
                )));
            }
        }
        self.skew_ns = self
            .nodes
            .iter()
            .map(|n| skews.get(n).copied().unwrap_or(0))
            .collect();
        Ok(())
    }

    /// The clocks each node's probes declare; a node without a kernel recording (no clock
    /// samples) may declare only one.
    fn set_probe_clocks(&mut self, probe_clocks: &[(String, ClockId)]) -> Result<(), MergeError> {
        self.probe_clocks = self
            .nodes
            .iter()
            .map(|n| {
                let mut v: Vec<ClockId> = Vec::new();
                for (_, c) in probe_clocks.iter().filter(|(pn, _)| pn == n) {
                    if !v.contains(c) {
                        v.push(*c);
                    }
                }
                v
            })
            .collect();
        for (i, name) in self.nodes.iter().enumerate() {
            if !self.kernel_recorded[i] && self.probe_clocks[i].len() > 1 {
                return Err(MergeError::Usage(format!(
                    "node {name} has no kernel recording and its probes declare different clocks ({:?}): without clock samples they cannot be related",
                    self.probe_clocks[i]
                )));
            }
        }
        Ok(())
    }
}

/// The nodes a probe file's lines name (or the `--node` default for lines without one).
/// Lines are scanned in place for their node and clock (crate::probe_line); only a line the
/// scan is not sure of is parsed here. The streaming pass parses every line in full.
fn probe_nodes(
    path: &Path,
    display: &str,
    default: Option<&str>,
) -> Result<Vec<(String, ClockId)>, MergeError> {
    let file = File::open(path).map_err(|source| NdjsonError::Open {
        file: path.into(),
        source,
    })?;
    let mut nodes: Vec<(String, ClockId)> = Vec::new();
    let mut lines = Lines::new(file);
    loop {
        let read_error = |source, line| NdjsonError::Read {
            file: path.into(),
            line,
            source,
        };
        let next = lines.number() + 1;
        let Some((line_no, line)) = lines.next_line().map_err(|e| read_error(e, next))? else {
            break;
        };
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let (node, clock) = match crate::probe_line::scan_node_and_clock(text) {
            Some((node, clock)) => (node.map(Cow::Borrowed), clock),
            None => {
                let line = std::str::from_utf8(line)
                    .map_err(|_| read_error(crate::ndjson::invalid_utf8(), line_no))?;
                if line.trim().is_empty() {
                    continue;
                }
                node_and_clock(line, display, line_no)?
            }
        };
        let node = match (&node, default) {
            (Some(n), _) => n.as_ref(),
            (None, Some(d)) => d,
            (None, None) => {
                return Err(parse_err(display, line_no, "in a `probe` record: field `node` is missing and the file was not given as --node NAME=FILE".into()));
            }
        };
        if !nodes.iter().any(|(n, c)| n == node && *c == clock) {
            nodes.push((node.to_owned(), clock));
        }
    }
    Ok(nodes)
}

/// A probe line's `node` (if any) and `clock`: the compact probe form without serde
/// (crate::probe_line), anything else through serde as before.
fn node_and_clock<'a>(
    line: &'a str,
    display: &str,
    line_no: u64,
) -> Result<(Option<Cow<'a, str>>, ClockId), MergeError> {
    #[derive(serde::Deserialize)]
    struct NodeOnly {
        #[serde(default)]
        node: Option<String>,
        clock: ClockId,
    }
    if let Some(p) = crate::probe_line::parse(line.trim()) {
        let clock = p.clock.expect("parsed lines have one");
        return Ok((p.node.map(Cow::Borrowed), clock));
    }
    // The line as read (its newline aside), so serde's error columns stay what they were.
    let unended = line.strip_suffix('\r').unwrap_or(line);
    let n: NodeOnly = serde_json::from_str(unended)
        .map_err(|e| parse_err(display, line_no, format!("in a `probe` record: {e}")))?;
    Ok((n.node.map(Cow::Owned), n.clock))
}

/// Pre-pass over a kernel recording: clock samples and drop totals (a few lines per second of
/// recording, so this costs one extra read but no memory proportional to events).
fn scan_kernel_file(plan: &mut Plan, file: usize) -> Result<(), MergeError> {
    let (path, display) = (
        plan.files[file].path.clone(),
        plan.files[file].display.clone(),
    );
    let node_name = plan.files[file]
        .node
        .clone()
        .expect("kernel files have a node");
    let node = plan.node_id(&node_name).expect("registered");
    let skew = plan.skew_ns[usize::from(node.0)];
    let startup = plan
        .startups
        .iter()
        .find(|s| s.node == node_name)
        .expect("registered");
    plan.nics[usize::from(node.0)] = NodeNic::new(startup);
    let mut first = startup.clock.clone();
    shift_sample(&mut first, skew).map_err(|m| {
        parse_err(
            &display,
            1,
            format!("in a `startup` record: field `clock`: {m}"),
        )
    })?;
    plan.clocks[usize::from(node.0)].push(first);
    let (clocks, dropped, self_cost, hot_hooks) = scan_clocks_and_drops(&path, &display, skew)?;
    warn_hot_hooks(&node_name, &hot_hooks);
    let spans = detached_spans(&hot_hooks, skew);
    if !spans.is_empty() {
        plan.detached.insert(node_name.clone(), spans);
    }
    clocks
        .into_iter()
        .for_each(|c| plan.clocks[usize::from(node.0)].push(c));
    if let Some(cost) = self_cost {
        plan.self_cost.insert(node_name.clone(), cost);
    }
    plan.dropped.insert(node_name, dropped);
    Ok(())
}

/// `record --attach on-demand`: says, per window without hot-hook events, that requests which
/// started before the hooks were attached are incomplete for that reason (their kernel stages
/// are missing), so a reader of the merge output does not take them for lost events.
fn warn_hot_hooks(node: &str, records: &[HotHooks]) {
    for r in records
        .iter()
        .filter(|r| r.change == HotHooksChange::Attached)
    {
        let since = r.missing_since_ns.unwrap_or(0);
        let delay = r.delay_ns.map_or(String::new(), |d| {
            format!(
                ", {:.3} ms after the first traced connection",
                d as f64 / 1e6
            )
        });
        log::warn!(
            "node {node}: recorded with --attach on-demand: hot hooks attached at {} ns{delay}; \
             requests between {since} ns and then are incomplete: their kernel events were not \
             recorded (hooks detached)",
            r.ts_ns
        );
    }
}

/// The spans without hot-hook events of an on-demand recording, shifted by `skew`: before
/// every attachment (from the start or the previous detach), and after a detach that was not
/// followed by another attachment, to the end.
fn detached_spans(records: &[HotHooks], skew: i64) -> Vec<(u64, u64)> {
    let moved = |ns: u64| shift(ns, skew).unwrap_or(ns);
    let mut spans = Vec::new();
    let mut open = None;
    for r in records {
        match r.change {
            HotHooksChange::Attached => {
                let since = r.missing_since_ns.unwrap_or(0);
                spans.push((moved(since), moved(r.ts_ns)));
                open = None;
            }
            HotHooksChange::Detached => open = Some(moved(r.ts_ns)),
        }
    }
    spans.extend(open.map(|from| (from, u64::MAX)));
    spans
}

/// What the pre-pass over a kernel recording found: clock samples, drop total, self-cost and
/// the `hot_hooks` records.
type KernelScan = (Vec<ClockSample>, u64, Option<SelfCost>, Vec<HotHooks>);

/// The clock samples (shifted by `skew`) of a kernel recording (capture or NDJSON), its drop
/// total (the summary's, else the last drops record's), the summary's self-accounting and
/// its `hot_hooks` records.
fn scan_clocks_and_drops(path: &Path, display: &str, skew: i64) -> Result<KernelScan, MergeError> {
    let mut clocks = Vec::new();
    let records = if file_is_capture(path)? {
        non_event_records(path).map_err(NdjsonError::from)?
    } else {
        ndjson_clock_and_drop_records(path, display)?
    };
    let (mut summary_drops, mut drops_total, mut self_cost) = (None, 0u64, None);
    let mut hot_hooks = Vec::new();
    for (line_no, record) in records {
        match record {
            Record::Clock(mut s) => {
                shift_sample(&mut s, skew).map_err(|m| {
                    parse_err(display, line_no, format!("in a `clock` record: {m}"))
                })?;
                clocks.push(s);
            }
            Record::Summary(s) => {
                summary_drops = Some(s.dropped);
                self_cost = s.self_cost;
            }
            Record::Drops(d) => drops_total = drops_total.max(d.total),
            Record::HotHooks(h) => hot_hooks.push(h),
            _ => {}
        }
    }
    let dropped = summary_drops.unwrap_or(drops_total);
    Ok((clocks, dropped, self_cost, hot_hooks))
}

/// The clock, summary and drops lines of an NDJSON recording, with their line numbers.
fn ndjson_clock_and_drop_records(
    path: &Path,
    display: &str,
) -> Result<Vec<(u64, Record)>, MergeError> {
    let f = File::open(path).map_err(|source| NdjsonError::Open {
        file: path.into(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in BufReader::with_capacity(1 << 16, f).lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = line.map_err(|source| NdjsonError::Read {
            file: path.into(),
            line: line_no,
            source,
        })?;
        if !(line.contains("\"clock\"")
            || line.contains("\"summary\"")
            || line.contains("\"drops\"")
            || line.contains("\"hot_hooks\""))
        {
            continue;
        }
        let record: Record = serde_json::from_str(line.trim())
            .map_err(|e| parse_err(display, line_no, format!("{e}")))?;
        out.push((line_no, record));
    }
    Ok(out)
}

pub(super) fn shift(ns: u64, skew: i64) -> Option<u64> {
    ns.checked_add_signed(skew)
}

fn shift_sample(s: &mut ClockSample, skew: i64) -> Result<(), String> {
    for (field, v) in [
        ("realtime_ns", &mut s.realtime_ns),
        ("monotonic_ns", &mut s.monotonic_ns),
        ("tai_ns", &mut s.tai_ns),
        ("boottime_ns", &mut s.boottime_ns),
    ] {
        *v = shift(*v, skew).ok_or_else(|| {
            format!("field `{field}`: --inject-skew {skew} moves {v} out of range")
        })?;
    }
    // The NIC clock is the NIC's own: only its system-clock side moves with the node's clock.
    for nic in &mut s.nic_clocks {
        nic.monotonic_ns = shift(nic.monotonic_ns, skew).ok_or_else(|| {
            format!(
                "field `nic_clocks[].monotonic_ns`: --inject-skew {skew} moves {} out of range",
                nic.monotonic_ns
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(change: HotHooksChange, ts_ns: u64, since: Option<u64>) -> HotHooks {
        HotHooks {
            node: "A".into(),
            ts_ns,
            change,
            hooks: Vec::new(),
            missing_since_ns: since,
            trigger_ns: None,
            delay_ns: None,
        }
    }

    #[test]
    fn detached_spans_cover_before_each_attach_and_after_the_last_detach() {
        let records = [
            record(HotHooksChange::Attached, 100, Some(10)),
            record(HotHooksChange::Detached, 200, None),
            record(HotHooksChange::Attached, 300, Some(200)),
            record(HotHooksChange::Detached, 400, None),
        ];
        assert_eq!(
            detached_spans(&records, 5),
            [(15, 105), (205, 305), (405, u64::MAX)]
        );
        assert!(detached_spans(&[], 0).is_empty());
    }
}
