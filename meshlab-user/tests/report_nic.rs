//! `meshlab report --nic` and `--compare ... --nic` on constructed merged files and
//! recordings: per-queue and per-CPU figures worked out by hand.

mod report_support;

use std::path::{Path, PathBuf};

use report_support::*;
use serde_json::{Value, json};

/// Node B's startup: eth0 with RX vector 40 (queue 0) and TX vector 41 (queue 1).
fn startup(rx_ring: u32) -> Value {
    json!({"type":"startup","schema_version":1,"tool":"meshlab","version":"gen","node":"B",
        "hostname":"host-B","kernel":"6.12.0-synthetic","command":["meshlab","record"],"pid":1,
        "clock":{"realtime_ns":1,"monotonic_ns":1,"tai_ns":1,"boottime_ns":1,"bracket_ns":1},
        "attach_plan":[],"filters":{"ports":[],"addrs":[],"cgroup":"","sample_every":1,
        "raw_irq_stream":true},"ring_buffer_bytes":16777216,
        "nic_irqs":[{"irq":40,"dev":"eth0","ifindex":2,"queue":0}],
        "devices":[{"dev":"eth0","ifindex":2,"driver":"virtio_net",
            "rings":{"rx":rx_ring,"tx":256,"rx_max":1024,"tx_max":1024},
            "rx_queues":[],"tx_queues":[],
            "irqs":[{"irq":40,"name":"virtio0-input.0","role":"rx","queue":0,"affinity":[0,1]},
                    {"irq":41,"name":"virtio0-output.1","role":"tx","queue":1,"affinity":[0,1]}]}]})
}

fn seg(name: &str, dur: u64, place: Value) -> Value {
    json!({"name":name,"node":"B","layer":"kernel","unit":"x","kind":"compute","start_ns":1,
        "dur_ns":dur,"place":place})
}

/// A request with RX stages on queue 0 (CPU `cpu`) and a TX stage on queue 1 (CPU 0).
fn request(i: u64, cpu: u32, napi: u64, qdisc: u64) -> Value {
    let rx = json!({"cpu":cpu,"dev":"eth0","queue":0,"irq":40});
    let tx = json!({"cpu":0,"dev":"eth0","queue":1,"irq":41});
    let segs = vec![
        seg("rx_napi_poll", napi, rx.clone()),
        seg("rx_ip_tcp", 100, json!({"cpu":cpu})),
        seg("tx_qdisc", qdisc, tx),
    ];
    let e2e = napi + 100 + qdisc;
    json!({"type":"request","trace_id":format!("t{i}"),"client_node":"B","join":"kernel_only",
        "start_ns":i,"e2e_ns":e2e,"complete":true,"missing":[],"segments":segs})
}

/// The raw stream: queue 0's vector twice on CPU 1 (IRQ 400 and 600 ns, IRQ -> NET_RX 1000 and
/// 2000 ns), polls of 64 (the whole budget) and 4 packets; one IRQ after the window's end.
fn raw_events() -> Vec<Value> {
    let k = |hook: &str, ts: u64, extra: Value| {
        let mut v =
            json!({"type":"kernel","node":"B","hook":hook,"ts_ns":ts,"cpu":1,"pid":0,"tid":0});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let irq = json!({"irq":40,"ifindex":2,"dev":"eth0","queue":0,"value":0});
    let net_rx = json!({"value":3});
    let poll = |work: i64| json!({"ifindex":2,"dev":"eth0","value":work,"aux":64});
    vec![
        k("irq_entry", 1000, irq.clone()),
        k("irq_exit", 1400, irq.clone()),
        k("softirq_entry", 2000, net_rx.clone()),
        k("napi_poll", 2100, poll(64)),
        k("softirq_exit", 2200, net_rx.clone()),
        k("irq_entry", 5000, irq.clone()),
        k("irq_exit", 5600, irq.clone()),
        k("softirq_entry", 7000, net_rx.clone()),
        k("napi_poll", 7100, poll(4)),
        k("softirq_exit", 7200, net_rx.clone()),
        k("irq_entry", 90_000, irq),
    ]
}

fn write_lines(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// A merged file (and its recording) of three requests; `slow` ns are added to every qdisc.
fn run_files(dir: &Path, name: &str, rx_ring: u32, slow: u64) -> PathBuf {
    let rec = dir.join(format!("{name}.b.ndjson"));
    let mut rec_lines = vec![startup(rx_ring)];
    rec_lines.extend(raw_events());
    write_lines(&rec, &rec_lines);
    let mut node = startup(rx_ring);
    node.as_object_mut().unwrap().remove("type");
    let info = json!({"type":"merge_info","schema_version":1,"version":"gen","command":["meshlab"],
        "inputs":[{"file":rec.display().to_string(),"node":"B","kind":"kernel"}],"nodes":[node],
        "injected_skew_ns":{}});
    let mut lines = vec![info];
    // rx_napi_poll on queue 0: 300, 500, 900 ns (CPUs 1, 1, 0); tx_qdisc: 2000, 4000, 3000.
    lines.push(request(1, 1, 300, 2000 + slow));
    lines.push(request(2, 1, 500, 4000 + slow));
    lines.push(request(3, 0, 900, 3000 + slow));
    lines.push(
        json!({"type":"merge_summary","requests":3,"complete":3,"incomplete":0,
        "errors":[],"dropped_per_node":{}}),
    );
    let merged = dir.join(format!("{name}.merged.ndjson"));
    write_lines(&merged, &lines);
    merged
}

fn queue<'a>(report: &'a Value, dir: &str, q: u64) -> &'a Value {
    report["nodes"][0]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["dir"] == dir && r["queue"] == q)
        .unwrap_or_else(|| panic!("no {dir} queue {q} in {report:#}"))
}

fn stage<'a>(row: &'a Value, name: &str) -> &'a Value {
    row["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {row:#}"))
}

#[test]
fn per_queue_and_per_cpu_figures_with_the_raw_stream() {
    let dir = tempfile::tempdir().unwrap();
    let merged = run_files(dir.path(), "a", 256, 0);
    let args = ["report", merged.to_str().unwrap(), "--nic", "--json"];
    let report: Value =
        serde_json::from_str(&run_ok(&[&args[..], &["--raw-window", "0,10000"]].concat())).unwrap();
    let rx = queue(&report, "rx", 0);
    assert_eq!(
        (rx["irq"].as_u64(), rx["requests"].as_u64()),
        (Some(40), Some(3))
    );
    // Nearest rank of [300, 500, 900]: p50 = 500, p99 = 900.
    let napi = stage(rx, "rx_napi_poll");
    assert_eq!(
        (napi["n"].as_u64(), napi["p50_ns"].as_u64()),
        (Some(3), Some(500))
    );
    assert_eq!(napi["p99_ns"], 900);
    let raw = &rx["raw"];
    assert_eq!(
        raw["hard_irqs"], 2,
        "the IRQ after the window is not counted"
    );
    assert_eq!(raw["hard_irqs_per_cpu"]["1"], 2);
    // Durations [400, 600] and delays [1000, 2000]: p50 = the smaller.
    assert_eq!(raw["hard_irq_ns"]["p50_ns"], 400);
    assert_eq!(raw["irq_to_softirq_ns"]["p99_ns"], 2000);
    assert_eq!(raw["packets_per_poll"]["polls"], 2);
    assert_eq!(raw["packets_per_poll"]["max"], 64);
    assert_eq!(raw["budget_exhausted"], 1);
    let tx = queue(&report, "tx", 1);
    assert_eq!(tx["irq"], 41);
    assert_eq!(stage(tx, "tx_qdisc")["p50_ns"], 3000);
    assert!(tx.get("raw").is_none(), "TX queues have no raw figures");
    // CPU 1: requests 1 and 2 (rx stages); CPU 0: all three (tx_qdisc) .
    let cpus = report["nodes"][0]["cpus"].as_array().unwrap();
    let cpu = |n: u64| cpus.iter().find(|c| c["cpu"] == n).unwrap();
    assert_eq!(cpu(1)["requests"], 2);
    assert_eq!(cpu(1)["hard_irqs"], 2);
    assert_eq!(cpu(1)["net_rx_softirqs"], 2);
    assert_eq!(cpu(0)["requests"], 3);
    assert_eq!(stage(cpu(0), "tx_qdisc")["n"], 3);
    // Without a window the late IRQ counts; the text form names the same rows.
    let report: Value = serde_json::from_str(&run_ok(&args)).unwrap();
    assert_eq!(queue(&report, "rx", 0)["raw"]["hard_irqs"], 3);
    let text = run_ok(&args[..3]);
    assert!(text.contains("kernel stages per queue"), "{text}");
    let html = dir.path().join("r.html");
    run_ok(&[&args[..3], &["--html", html.to_str().unwrap()]].concat());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<section id=\"nic\">"), "no NIC section");
    assert!(page.contains("<td>rx_napi_poll</td>"), "no stage row");
    assert!(
        text.lines()
            .any(|l| l.contains("rx_napi_poll") && l.contains("0.50")),
        "{text}"
    );
}

#[test]
fn compare_lists_steps_per_queue_and_the_settings_that_differ() {
    let dir = tempfile::tempdir().unwrap();
    let a = run_files(dir.path(), "a", 256, 0);
    let b = run_files(dir.path(), "b", 1024, 1000);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let args = ["report", "--compare", a, b, "--labels", "a,b", "--nic"];
    let out: Value = serde_json::from_str(&run_ok(&[&args[..], &["--json"]].concat())).unwrap();
    let node = &out["nic"]["nodes"][0];
    let diffs = node["context_diffs"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{diffs:#?}");
    assert_eq!(diffs[0]["field"], "eth0 rings.rx");
    assert_eq!(diffs[0]["values"], json!(["256", "1024"]));
    let row = node["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stage"] == "tx_qdisc" && r["queue"] == 1)
        .unwrap();
    assert_eq!(row["cells"][0]["p50_ns"], 3000);
    assert_eq!(row["cells"][1]["p50_ns"], 4000);
    assert_eq!(row["cells"][1]["step_p50_ns"], 1000);
    let text = run_ok(&args);
    assert!(text.contains("eth0 rings.rx"), "{text}");
    assert!(text.contains("(+1.00)"), "{text}");
}

#[test]
fn a_bad_raw_window_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let merged = run_files(dir.path(), "a", 256, 0);
    let out = run(&[
        "report",
        merged.to_str().unwrap(),
        "--nic",
        "--raw-window",
        "9,1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--raw-window"), "{err}");
}

/// Four interleaved rounds each: A's tx_qdisc p50 is 3000 ns in every round, B's 4000, 4100,
/// 4200 and 4300 (median 4150); every B round above every A round: p = 2 / C(8, 4) = 0.029,
/// flagged. rx_napi_poll is 500 ns in all rounds: a tie, no separation.
#[test]
fn rounds_compare_each_queue_stage_by_the_median_of_its_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for round in 0..4u64 {
        files.push(run_files(dir.path(), &format!("a{round}"), 256, 0));
        files.push(run_files(
            dir.path(),
            &format!("b{round}"),
            1024,
            1000 + 100 * round,
        ));
    }
    let mut args = vec!["report", "--compare"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    args.extend(["--labels", "A,B,A,B,A,B,A,B", "--nic"]);
    let out: Value = serde_json::from_str(&run_ok(&[&args[..], &["--json"]].concat())).unwrap();
    assert_eq!(out["nic"]["runs"][2], "A#2");
    let rounds = &out["nic_rounds"];
    assert_eq!(rounds["labels"], json!(["A", "B"]));
    assert_eq!(rounds["rounds"], json!([4, 4]));
    let rows = rounds["nodes"][0]["rows"].as_array().unwrap();
    let row = |stage: &str, q: u64| {
        rows.iter()
            .find(|r| r["stage"] == stage && r["queue"] == q)
            .unwrap_or_else(|| panic!("no {stage} on queue {q}: {rows:#?}"))
    };
    let qdisc = &row("tx_qdisc", 1)["cells"];
    assert_eq!(qdisc[0]["median_p50_ns"], 3000);
    assert_eq!(qdisc[1]["median_p50_ns"], 4150);
    assert_eq!(qdisc[1]["lowest_p50_ns"], 4000);
    assert_eq!(qdisc[1]["step_ns"], 1150);
    assert_eq!(qdisc[1]["flagged"], true);
    let napi = &row("rx_napi_poll", 0)["cells"][1];
    assert_eq!(
        (napi["step_ns"].as_i64(), napi["flagged"].as_bool()),
        (Some(0), Some(false))
    );
    assert!(napi["separated_p"].is_null());
    let text = run_ok(&args);
    let nic_rounds = text
        .split("NIC rounds (median of the rounds' p50s")
        .nth(1)
        .unwrap_or_else(|| panic!("no NIC rounds in\n{text}"));
    let qdisc = nic_rounds.lines().find(|l| l.contains("tx_qdisc"));
    assert!(qdisc.is_some_and(|l| l.contains("+1.15*")), "{nic_rounds}");
}
