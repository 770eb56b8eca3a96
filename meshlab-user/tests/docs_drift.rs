//! The docs describe what the code does: docs/segments.md's table is the merge's segment table,
//! docs/schema.md lists exactly the fields the schema writes, and docs/report.md's own-cost
//! table is the report's STAGE_PROGRAMS.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use meshlab_user::merge::segments::{
    NETWORK_ROUND_TRIP, PEER_WAIT, RUNQUEUE_WAIT, RX_SOCKET_QUEUE, ReaderState, SEGMENTS, Unit,
    reader_segment,
};
use meshlab_user::report::own_cost::STAGE_PROGRAMS;
use meshlab_user::schema::{
    BpfStatsState, ClockId, ClockSample, ConnRef, Direction, Hook, HotHooks, HotHooksChange,
    KernelEvent, NicClockSample, PhcSysClock, ProbeEvent, ProgramRuns, Record, SelfCost,
};

fn doc(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Rows of the first markdown table whose header row starts with `| first |`, as trimmed cells.
fn table(text: &str, first: &str) -> Vec<Vec<String>> {
    tables(text, first)
        .into_iter()
        .next()
        .expect("table header")
}

/// Rows of every markdown table whose header row starts with `| first |` (segments.md has
/// one for the standard chain and one for hops and legs).
fn tables(text: &str, first: &str) -> Vec<Vec<Vec<String>>> {
    let header = format!("| {first} |");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, _) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with(&header))
    {
        let rows = lines[i + 1..]
            .iter()
            .skip(1) // |---|
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_owned())
                    .collect()
            })
            .collect();
        out.push(rows);
    }
    out
}

#[test]
fn segments_md_table_is_the_code_segment_table() {
    let rows: Vec<Vec<String>> = tables(&doc("segments.md"), "name").concat();
    // One row may name several segments ("client_poll_return / server_poll_return").
    let mut documented: BTreeMap<String, &Vec<String>> = BTreeMap::new();
    for row in &rows {
        for name in row[0].split(" / ") {
            documented.insert(name.to_owned(), row);
        }
    }
    let mut in_code: BTreeSet<String> = SEGMENTS.iter().map(|d| d.name.to_owned()).collect();
    in_code.extend([
        NETWORK_ROUND_TRIP.to_owned(),
        PEER_WAIT.to_owned(),
        RUNQUEUE_WAIT.name.to_owned(),
    ]);
    let documented_names: BTreeSet<String> = documented.keys().cloned().collect();
    assert_eq!(
        documented_names, in_code,
        "segment names: docs/segments.md vs SEGMENTS"
    );
    let Unit::Fixed(unit) = RUNQUEUE_WAIT.unit else {
        panic!("runqueue_wait has a fixed unit")
    };
    let row = documented[RUNQUEUE_WAIT.name];
    assert_eq!(
        (row[3].as_str(), row[4].as_str(), row[5].as_str()),
        (
            RUNQUEUE_WAIT.layer.as_str(),
            unit,
            RUNQUEUE_WAIT.kind.as_str()
        ),
        "layer/unit/kind of runqueue_wait"
    );
    for def in SEGMENTS {
        let row = documented[def.name];
        let unit = match def.unit {
            Unit::Process => "role",
            Unit::Fixed(u) => u,
        };
        assert_eq!(
            (row[3].as_str(), row[4].as_str(), row[5].as_str()),
            (def.layer.as_str(), unit, def.kind.as_str()),
            "layer/unit/kind of {}",
            def.name
        );
        // Point names in the doc may be written for both roles (`client/server.write_begin`,
        // `ROLE.read_ready`): the part after the role must appear.
        for (cell, point) in [(&row[1], def.from), (&row[2], def.to)] {
            let bare = point.name().rsplit('.').next().expect("non-empty");
            assert!(
                cell.contains(bare),
                "{}: `{cell}` lacks {}",
                def.name,
                point.name()
            );
        }
    }
}

#[test]
fn segments_md_reader_state_table_is_the_code_table() {
    let rows = table(&doc("segments.md"), "state");
    let states = [
        ReaderState::Busy,
        ReaderState::Runnable,
        ReaderState::Blocked,
        ReaderState::Unknown,
    ];
    assert_eq!(rows.len(), states.len(), "one row per reader state");
    for state in states {
        let label = format!("{state:?}").to_lowercase();
        let row = rows
            .iter()
            .find(|r| r[0] == label)
            .unwrap_or_else(|| panic!("no row for {label}"));
        // A state without a definition keeps the segment it cuts.
        let (name, layer, unit, kind) = match reader_segment(state) {
            Some(d) => (
                d.name,
                d.layer.as_str(),
                match d.unit {
                    Unit::Process => "role",
                    Unit::Fixed(u) => u,
                },
                d.kind.as_str(),
            ),
            None => {
                let d = SEGMENTS.iter().find(|d| d.name == RX_SOCKET_QUEUE).unwrap();
                let Unit::Fixed(unit) = d.unit else {
                    panic!("rx_socket_queue has a fixed unit")
                };
                (d.name, d.layer.as_str(), unit, d.kind.as_str())
            }
        };
        assert_eq!(
            (
                row[1].as_str(),
                row[2].as_str(),
                row[3].as_str(),
                row[4].as_str()
            ),
            (name, layer, unit, kind),
            "reader state {label}"
        );
    }
}

/// Field names documented in the first table after `### \`section\``.
fn schema_fields(text: &str, section: &str) -> BTreeSet<String> {
    let heading = format!("### `{section}`");
    let rest = &text[text
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/schema.md has no {heading}"))..];
    let rows = table(rest, "field");
    rows.iter()
        .flat_map(|r| r[0].split(", ").map(|f| f.trim_matches('`').to_owned()))
        .collect()
}

/// Keys of a record serialized with every optional field set, without the `type` tag.
fn written_fields(record: Record) -> BTreeSet<String> {
    let value = serde_json::to_value(&record).expect("serializable");
    let object = value.as_object().expect("an object");
    object.keys().filter(|k| *k != "type").cloned().collect()
}

fn full_kernel_event() -> KernelEvent {
    KernelEvent {
        cpu: 1,
        pid: 2,
        tid: 3,
        cookie: Some(4),
        skb: Some(5),
        seq: Some(6),
        len: Some(7),
        offset: Some(8),
        dir: Some(Direction::Tx),
        ifindex: Some(9),
        dev: Some("eth0".into()),
        queue: Some(10),
        value: Some(11),
        aux: Some(12),
        saddr: Some("10.0.0.1".into()),
        sport: Some(13),
        daddr: Some("10.0.0.2".into()),
        dport: Some(14),
        irq: Some(15),
        irq_entry_ns: Some(16),
        softirq_raise_ns: Some(17),
        softirq_entry_ns: Some(18),
        retrans: true,
        active: Some(true),
        unix_sock: Some(19),
        unix_peer: Some(20),
        ..KernelEvent::new("A".into(), Hook::NetDevQueue, 1)
    }
}

fn full_hot_hooks() -> HotHooks {
    HotHooks {
        node: "A".into(),
        ts_ns: 3,
        change: HotHooksChange::Attached,
        hooks: vec!["tcp_probe".into()],
        missing_since_ns: Some(1),
        trigger_ns: Some(2),
        delay_ns: Some(1),
    }
}

fn full_probe_event() -> ProbeEvent {
    ProbeEvent {
        node: Some("A".into()),
        process: "client".into(),
        pid: 1,
        tid: 2,
        ts_ns: 3,
        clock: ClockId::Realtime,
        trace_id: "t".into(),
        point: "client.write_begin".into(),
        conn: Some(ConnRef {
            cookie: Some(4),
            ..ConnRef::default()
        }),
        dir: Some(Direction::Tx),
        offset: Some(5),
        len: Some(6),
    }
}

#[test]
fn schema_md_lists_exactly_the_fields_the_schema_writes() {
    let text = doc("schema.md");
    let clock = ClockSample {
        node: Some("A".into()),
        realtime_ns: 1,
        monotonic_ns: 2,
        tai_ns: 3,
        boottime_ns: 4,
        bracket_ns: 5,
        nic_clocks: vec![NicClockSample {
            dev: "eth0".into(),
            phc_index: 0,
            phc_ns: 6,
            monotonic_ns: 7,
            window_ns: 8,
            sys_clock: PhcSysClock::Monotonic,
        }],
    };
    for (section, record) in [
        ("kernel", Record::Kernel(full_kernel_event())),
        ("clock", Record::Clock(clock)),
        ("hot_hooks", Record::HotHooks(full_hot_hooks())),
    ] {
        assert_eq!(
            schema_fields(&text, section),
            written_fields(record),
            "docs/schema.md `{section}` fields vs schema.rs"
        );
    }
    let rest = &text[text.find("## Userland probes").expect("probe section")..];
    let probe_doc: BTreeSet<String> = table(rest, "field")
        .iter()
        .flat_map(|r| r[0].split(", ").map(|f| f.trim_matches('`').to_owned()))
        .collect();
    assert_eq!(
        probe_doc,
        written_fields(Record::Probe(full_probe_event())),
        "docs/schema.md probe fields vs schema.rs"
    );
}

#[test]
fn schema_md_self_cost_table_lists_exactly_its_fields() {
    let cost = SelfCost {
        bpf_stats: BpfStatsState::Measured,
        programs: [(
            "p".to_owned(),
            ProgramRuns {
                hook: "tcp_probe".into(),
                run_cnt: 1,
                run_time_ns: 2,
                events: 3,
            },
        )]
        .into_iter()
        .collect(),
        user_cpu_ns: 3,
        sys_cpu_ns: 4,
        events: 5,
        missed_runs: [("p".to_owned(), 6)].into_iter().collect(),
    };
    let value = serde_json::to_value(&cost).expect("serializable");
    let written: BTreeSet<String> = value.as_object().unwrap().keys().cloned().collect();
    // The only table of the `summary` section is self_cost's.
    assert_eq!(
        schema_fields(&doc("schema.md"), "summary"),
        written,
        "docs/schema.md self_cost fields vs schema.rs"
    );
}

#[test]
fn report_md_stage_table_is_the_own_cost_table() {
    let documented: Vec<(String, String)> = table(&doc("report.md"), "stage")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    let in_code: Vec<(String, String)> = STAGE_PROGRAMS
        .iter()
        .map(|s| (s.stage.to_owned(), s.hooks.join(", ")))
        .collect();
    assert_eq!(documented, in_code, "docs/report.md vs STAGE_PROGRAMS");
}
