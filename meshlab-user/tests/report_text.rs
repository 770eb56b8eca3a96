//! The terminal and JSON report: exact figures from hand-sized and realistic fixtures.

mod report_support;

use report_support::*;

/// Whitespace-separated cells of the first line whose cell number `at` is `value`.
fn row_where(text: &str, at: usize, value: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(at) == Some(value))
        .unwrap_or_else(|| panic!("no row with {value:?} in column {at} in\n{text}"));
    line.split_whitespace().map(str::to_owned).collect()
}

fn row(text: &str, first: &str) -> Vec<String> {
    row_where(text, 0, first)
}

#[test]
fn small_run_figures_are_exact() {
    // small_a: 4 requests; x = 10, 12, 11, 13 us; y = 5, 9, 5, 9 us; e2e = 15, 21, 16, 22 us.
    // Nearest rank over 4 samples: p50 = 2nd smallest, p90 = p99 = 4th. x: 11, 13, 13, mean
    // 11.5; y: 5, 9, 9, mean 7; e2e: 16, 22, 22, mean 18.5. Shares: x 46/74 = 62.2 %, y 37.8 %.
    let text = run_ok(&["report", fixture("small_a.ndjson").to_str().unwrap()]);
    assert!(
        text.contains("requests: 4  complete: 3  incomplete: 1  joins: offset 4\n"),
        "{text}"
    );
    assert!(
        text.contains("missing stages (requests):\n  B:tcp_probe 1\n"),
        "{text}"
    );
    assert!(text.contains("kernel drops per node: A 2, B 0\n"), "{text}");
    assert!(
        text.contains("  a request with dropped events is incomplete, or absent"),
        "{text}"
    );
    assert!(
        text.contains("end-to-end (us): n 4  p50 16.00  p90 22.00  p99 22.00  mean 18.50\n"),
        "{text}"
    );
    assert_eq!(
        row_where(&text, 4, "x"),
        [
            "A", "process", "client", "compute", "x", "4", "11.00", "13.00", "13.00", "11.50",
            "62.2%"
        ]
    );
    assert_eq!(
        row_where(&text, 4, "y"),
        [
            "A", "kernel", "qdisc", "queue", "y", "4", "5.00", "9.00", "9.00", "7.00", "37.8%"
        ]
    );
    assert!(text.contains("shares add up to 100.0%"), "{text}");
    // Groups: node A holds everything; by kind compute = x, queue = y.
    assert_eq!(
        row(&text, "compute"),
        ["compute", "4", "11.00", "13.00", "13.00", "11.50", "62.2%"]
    );
    assert_eq!(
        row(&text, "queue"),
        ["queue", "4", "5.00", "9.00", "9.00", "7.00", "37.8%"]
    );
    // Provenance: kernel and attach tier per node, failed hooks with their reason.
    assert!(text.contains("6.1.0-27-amd64"), "{text}");
    assert_eq!(
        row(&text, "tcp_sendmsg"),
        ["tcp_sendmsg", "fentry", "kprobe"]
    );
    assert_eq!(
        row(&text, "sk_data_ready"),
        ["sk_data_ready", "fentry", "FAILED"]
    );
    assert!(
        text.contains("failed: B sk_data_ready (kprobe): kprobe: sock_def_readable not found"),
        "{text}"
    );
    assert!(text.contains("quantiles: nearest-rank"), "{text}");
}

#[test]
fn small_run_json_is_exact() {
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "report",
        "--json",
        fixture("small_a.ndjson").to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(v["e2e"]["p50_ns"], 16_000);
    assert_eq!(v["e2e"]["p99_ns"], 22_000);
    assert_eq!(v["e2e"]["mean_ns"], 18_500.0);
    assert_eq!(v["completeness"]["incomplete"], 1);
    assert_eq!(v["completeness"]["missing"]["B:tcp_probe"], 1);
    assert_eq!(v["kernel_drops"]["A"], 2);
    let x = &v["segments"][0];
    assert_eq!(
        (
            x["name"].as_str(),
            x["p50_ns"].as_u64(),
            x["p90_ns"].as_u64()
        ),
        (Some("x"), Some(11_000), Some(13_000))
    );
    assert!((x["share"].as_f64().unwrap() - 46.0 / 74.0).abs() < 1e-12);
    // Median request: e2e 16 us is request #2; p99 (22 us) is request #3.
    assert_eq!(
        (v["median_request"].as_u64(), v["p99_request"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(v["nodes"][1]["kernel"], "6.12.9-amd64");
    assert_eq!(v["nodes"][1]["injected_skew_ns"], 16_340_000_000i64);
}

#[test]
fn realistic_run_matches_an_independent_computation() {
    let reqs = requests("direct.ndjson");
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "report",
        "--json",
        fixture("direct.ndjson").to_str().unwrap(),
    ]))
    .unwrap();
    let all = e2e(&reqs);
    assert_eq!(v["e2e"]["n"], all.len() as u64);
    for (q, field) in [(0.5, "p50_ns"), (0.9, "p90_ns"), (0.99, "p99_ns")] {
        assert_eq!(v["e2e"][field], nearest_rank(&all, q), "{field}");
    }
    let samples = segment_samples(&reqs);
    let rows = v["segments"].as_array().unwrap();
    assert_eq!(rows.len(), samples.len());
    assert!(
        rows.len() >= 39,
        "a direct request has 39 segments (plus the drop-spanning one)"
    );
    let total_e2e: u64 = all.iter().sum();
    for r in rows {
        let key = format!(
            "{}@{}",
            r["name"].as_str().unwrap(),
            r["node"].as_str().unwrap()
        );
        let s = &samples[&key];
        assert_eq!(r["n"], s.len() as u64, "{key}");
        for (q, field) in [(0.5, "p50_ns"), (0.9, "p90_ns"), (0.99, "p99_ns")] {
            assert_eq!(r[field], nearest_rank(s, q), "{key} {field}");
        }
        let sum: u64 = s.iter().sum();
        assert!(
            (r["mean_ns"].as_f64().unwrap() - sum as f64 / s.len() as f64).abs() < 1e-6,
            "{key}"
        );
        assert!(
            (r["share"].as_f64().unwrap() - sum as f64 / total_e2e as f64).abs() < 1e-12,
            "{key}"
        );
    }
    // Path order: the client's encode first, the derived round trip after A's TX stages.
    assert_eq!(rows[0]["name"], "client_encode");
    assert_eq!(rows[6]["name"], "network_round_trip");
    assert_eq!(rows[6]["derived"], true);
    assert_eq!(rows[6]["node"], "derived");
    assert_eq!(v["median_request"], representative(&reqs, 0.5) as u64);
    assert_eq!(v["p99_request"], representative(&reqs, 0.99) as u64);

    // The text table prints the same figures for the biggest segment (A's scheduling delay).
    let text = run_ok(&["report", fixture("direct.ndjson").to_str().unwrap()]);
    let sched = &samples["rx_sched_delay@A"];
    let cells: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.len() > 4 && c[0] == "A" && c[4] == "rx_sched_delay")
        .unwrap();
    assert_eq!(
        cells[5..9],
        [
            sched.len().to_string(),
            us(nearest_rank(sched, 0.5)),
            us(nearest_rank(sched, 0.9)),
            us(nearest_rank(sched, 0.99))
        ]
    );
}

#[test]
fn bad_input_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("kernel.ndjson");
    std::fs::write(
        &kernel,
        "{\"type\":\"kernel\",\"node\":\"A\",\"hook\":\"tcp_probe\",\"ts_ns\":1,\"cpu\":0,\"pid\":1,\"tid\":1}\n",
    )
    .unwrap();
    let out = run(&["report", kernel.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kernel.ndjson:1: expected a merged record"),
        "{err}"
    );
    assert!(err.contains("found a `kernel` record"), "{err}");

    let broken = dir.path().join("broken.ndjson");
    let mut text = std::fs::read_to_string(fixture("small_a.ndjson")).unwrap();
    text = text.replacen("\"e2e_ns\":15000", "\"e2e_ns\":\"fifteen\"", 1);
    std::fs::write(&broken, text).unwrap();
    let out = run(&["report", broken.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.ndjson:2: in a `request` record"),
        "{err}"
    );
    assert!(err.contains("expected u64"), "{err}");

    let empty = dir.path().join("empty.ndjson");
    std::fs::write(&empty, "").unwrap();
    let err =
        String::from_utf8_lossy(&run(&["report", empty.to_str().unwrap()]).stderr).into_owned();
    assert!(err.contains("empty.ndjson: no `request` records"), "{err}");
}

#[test]
fn a_closed_pipe_is_success() {
    use std::process::Stdio;
    let mut child = meshlab()
        .args(["report", fixture("direct.ndjson").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // like `| head -0`
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reads_what_meshlab_merge_writes() {
    // The merge's own scenario inputs, merged for real (with timeline lines), then reported.
    let scenarios = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/merge");
    let dir = tempfile::tempdir().unwrap();
    for scenario in [
        "plain",
        "veth_no_irq",
        "dropped_event",
        "pipelined",
        "retransmission",
        "interleaved",
        "gro_rx",
        "tso_tx",
        "kernel_only",
        "server_kernel_only",
    ] {
        let mut inputs: Vec<String> = std::fs::read_dir(scenarios.join(scenario))
            .unwrap()
            .map(|e| e.unwrap().path().display().to_string())
            .filter(|p| p.ends_with(".ndjson"))
            .collect();
        inputs.sort();
        let merged = dir.path().join(format!("{scenario}.ndjson"));
        let mut args = vec!["merge", "--timeline", "-o", merged.to_str().unwrap()];
        args.extend(inputs.iter().map(String::as_str));
        run_ok(&args);
        let reqs = requests_in(&merged);
        assert!(!reqs.is_empty(), "{scenario}");
        let html = dir.path().join(format!("{scenario}.html"));
        let trace = dir.path().join(format!("{scenario}.json"));
        let v: serde_json::Value = serde_json::from_str(&run_ok(&[
            "report",
            "--json",
            merged.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--perfetto",
            trace.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(
            v["e2e"]["p50_ns"],
            nearest_rank(&e2e(&reqs), 0.5),
            "{scenario}"
        );
        let samples = segment_samples(&reqs);
        assert_eq!(
            v["segments"].as_array().unwrap().len(),
            samples.len(),
            "{scenario}"
        );
        let shares: f64 = v["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["share"].as_f64().unwrap())
            .sum();
        assert!(
            (shares - 1.0).abs() < 1e-9,
            "{scenario}: shares add up to {shares}"
        );
        // The largest clock-conversion bound per segment, as merge wrote them.
        for row in v["segments"].as_array().unwrap() {
            let worst = reqs
                .iter()
                .flat_map(|r| r["segments"].as_array().unwrap())
                .filter(|s| {
                    s["name"] == row["name"]
                        && s["node"].as_str().unwrap_or("derived") == row["node"]
                })
                .filter_map(|s| s["error_ns"].as_u64())
                .max();
            assert_eq!(
                row["max_error_ns"].as_u64(),
                worst,
                "{scenario} {}",
                row["name"]
            );
        }
        let incomplete = reqs.iter().filter(|r| r["complete"] == false).count() as u64;
        assert_eq!(v["completeness"]["incomplete"], incomplete, "{scenario}");
        assert!(
            std::fs::read_to_string(&html)
                .unwrap()
                .contains("id=\"waterfall-p99\"")
        );
        let t: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
        let segments_in_trace = t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["args"]["segment"].is_string())
            .count();
        let derived = reqs
            .iter()
            .flat_map(|r| r["segments"].as_array().unwrap())
            .filter(|s| s["derived"].is_object())
            .count();
        let all: usize = reqs
            .iter()
            .map(|r| r["segments"].as_array().unwrap().len())
            .sum();
        assert_eq!(
            segments_in_trace,
            all + derived,
            "{scenario}: derived segments are drawn in two halves"
        );
    }
}

/// The sidecar ladder's one-hop run per hop: the sidecar's time is the per-request sum of its
/// process segments, and the unix leg from the client to it holds only unix stages.
#[test]
fn each_proxy_and_each_unix_leg_is_a_hop() {
    let reqs = requests("one_hop.ndjson");
    let text = run_ok(&["report", fixture("one_hop.ndjson").to_str().unwrap()]);
    let hops = text
        .split("by hop")
        .nth(1)
        .unwrap_or_else(|| panic!("no by-hop section in\n{text}"));
    let sidecar_sums: Vec<u64> = reqs
        .iter()
        .map(|r| {
            r["segments"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["layer"] == "process" && s["unit"] == "sidecar-out")
                .map(|s| s["dur_ns"].as_u64().unwrap())
                .sum()
        })
        .collect();
    let sidecar = row_where(hops, 0, "sidecar-out");
    assert_eq!(sidecar[..3], ["sidecar-out", "on", "A"], "{hops}");
    assert_eq!(sidecar[4], reqs.len().to_string());
    assert_eq!(sidecar[5], us(nearest_rank(&sidecar_sums, 0.5)), "{hops}");
    let leg = row_where(hops, 0, "client@A");
    assert_eq!(
        leg[..5],
        ["client@A", "->", "sidecar-out@A", "unix", "leg"],
        "{hops}"
    );
    assert!(
        leg.iter().skip(11).all(|stage| stage.starts_with("uds_")),
        "{leg:?}"
    );
}

#[test]
fn drops_are_a_share_of_what_the_programs_produced_when_the_recording_says() {
    // small_a's summary with A's self_cost: 98 events written, 2 dropped -> 2 of 100.
    let fixture_text = std::fs::read_to_string(fixture("small_a.ndjson")).expect("fixture");
    let with_cost = fixture_text.replace(
        r#""dropped_per_node":{"A":2,"B":0}}"#,
        r#""dropped_per_node":{"A":2,"B":0},"self_cost":{"A":{"bpf_stats":"not_measured","user_cpu_ns":1000,"sys_cpu_ns":500,"events":98}}}"#,
    );
    assert_ne!(with_cost, fixture_text, "the summary line was found");
    let dir = std::env::temp_dir().join(format!("report-drops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("merged.ndjson");
    std::fs::write(&path, with_cost).expect("write");
    let html = dir.join("report.html");
    let text = run_ok(&[
        "report",
        path.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let page = std::fs::read_to_string(&html).expect("html");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        text.contains("kernel drops per node: A 2 (2.0 % of 100), B 0\n"),
        "{text}"
    );
    assert!(
        page.contains("A 2 (2.0 % of 100), B 0: a request with dropped events is"),
        "the HTML's kernel drops item"
    );
}
