//! `meshlab report --compare`: the ladder, checked against figures worked out by hand.

mod report_support;

use report_support::*;

fn cells(text: &str, first: &str) -> Vec<String> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first:?} in\n{text}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn hand_computed_ladder() {
    // Four requests per run, nearest-rank p50 = 2nd smallest. Noise: 2 blocks of 2 requests
    // (k = min(8, n/2)); block p50 = the smaller value; se = |difference of the two| / 2.
    //   e2e  a 15 21 16 22 -> p50 16, blocks 15|16 se 0.5
    //        b 26 26 31 29 -> p50 26, blocks 26|29 se 1.5; step +10 > 3*sqrt(.25+2.25)=4.74 *
    //        c 16.7 16.7 16.9 16.9 -> 16.7, se 0.1; step +0.7 < 3*sqrt(.25+.01)=1.53
    //   x    a 10 12 11 13 -> 11, se 0.5; b 20 21 22 20 -> 20, se 0; step +9 > 1.5 *
    //   y    a 5 9 5 9 -> 5, se 0; b 6 5 9 9 -> 6, blocks 5|9 se 2; step +1 < 6
    //   z    only in c: 0.7 0.7 0.9 0.9 -> 0.7
    let a = fixture("small_a.ndjson");
    let b = fixture("small_b.ndjson");
    let c = fixture("small_c.ndjson");
    let args = [
        "report",
        "--compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
    ];
    let text = run_ok(&[&args[..], &["--labels", "a,b,c"]].concat());
    assert!(
        text.contains("small_b.ndjson (4 requests, 3 complete, kernel drops 2)\n"),
        "{text}"
    );
    assert!(
        text.contains("  runs with kernel drops (a request with dropped events is incomplete"),
        "{text}"
    );
    assert_eq!(
        cells(&text, "segment"),
        ["segment", "node", "a", "b", "step", "%", "c", "step", "%"]
    );
    assert_eq!(
        cells(&text, "end-to-end"),
        [
            "end-to-end",
            "16.00",
            "26.00",
            "+10.00*",
            "+62.5%",
            "16.70",
            "+0.70",
            "+4.4%"
        ]
    );
    assert_eq!(
        cells(&text, "x"),
        [
            "x", "A", "11.00", "20.00", "+9.00*", "+81.8%", "11.00", "+0.00", "+0.0%"
        ]
    );
    assert_eq!(
        cells(&text, "y"),
        [
            "y", "A", "5.00", "6.00", "+1.00", "+20.0%", "5.00", "+0.00", "+0.0%"
        ]
    );
    assert_eq!(
        cells(&text, "z"),
        ["z", "A", "-", "-", "-", "-", "0.70", "new", "-"]
    );
    assert!(
        text.contains("end-to-end p50 se (us): a 0.50, b 1.50, c 0.10"),
        "{text}"
    );

    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&[&args[..], &["--json"]].concat())).unwrap();
    assert_eq!(
        v["runs"][0]["label"], "small_a",
        "file stems label runs by default"
    );
    assert_eq!(v["runs"][1]["kernel_drops"], 2, "A 2 + B 0");
    let e2e = &v["rows"][0]["cells"];
    assert_eq!(e2e[1]["step_ns"], 10_000);
    assert_eq!(e2e[1]["flagged"], true);
    assert!(
        (e2e[1]["threshold_ns"].as_f64().unwrap() - 3.0 * (250_000f64 + 2_250_000f64).sqrt()).abs()
            < 1e-6
    );
    assert_eq!(e2e[2]["flagged"], false);
    assert_eq!(v["rows"][2]["segment"], "y");
    assert_eq!(v["rows"][2]["cells"][1]["p50_se_ns"], 2000.0);
    assert_eq!(v["rows"][2]["cells"][1]["flagged"], false);
    assert!(v["rows"][3]["cells"][0].is_null(), "z is absent from run a");
}

#[test]
fn topology_ladder_is_one_table() {
    let runs = ["direct.ndjson", "one_hop.ndjson", "two_hops.ndjson"];
    let paths: Vec<String> = runs
        .iter()
        .map(|r| fixture(r).display().to_string())
        .collect();
    let mut args = vec!["report", "--compare"];
    args.extend(paths.iter().map(String::as_str));
    args.extend(["--labels", "direct,one-hop,two-hops"]);
    let text = run_ok(&args);
    let p50: Vec<u64> = runs
        .iter()
        .map(|r| nearest_rank(&e2e(&requests(r)), 0.5))
        .collect();
    let row = cells(&text, "end-to-end");
    assert_eq!(row[1], us(p50[0]));
    assert_eq!(row[2], us(p50[1]));
    assert!(
        row[3].starts_with(&format!("+{}", us(p50[1] - p50[0]))),
        "{row:?}"
    );
    assert_eq!(row[5], us(p50[2]));
    assert!(
        row[6].starts_with(&format!("+{}", us(p50[2] - p50[0]))),
        "{row:?}"
    );
    // Sidecar stages appear in path order, marked new; the client's scheduling delay (the seed's
    // 11.4 -> 2.8 us) is the one kernel stage that moved beyond noise.
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let at = |name: &str, node: &str| {
        lines
            .iter()
            .position(|c| c.len() > 1 && c[0] == name && c[1] == node)
            .unwrap_or_else(|| panic!("no row {name} {node}"))
    };
    let route = &lines[at("proxy_route", "A")];
    let one_hop_route = nearest_rank(
        &segment_samples(&requests("one_hop.ndjson"))["proxy_route@A"],
        0.5,
    );
    assert_eq!(route[2], "-");
    assert_eq!(route[3], us(one_hop_route));
    assert_eq!((route[4], route[7]), ("new", "new"));
    let inbound = &lines[at("proxy_route", "B")];
    assert_eq!((inbound[3], inbound[4], inbound[7]), ("-", "-", "new"));
    let sched = &lines[at("rx_sched_delay", "A")];
    assert!(
        sched[4].ends_with('*') && sched[7].ends_with('*'),
        "{sched:?}"
    );
    assert!(!lines[at("rx_sched_delay", "B")][4].ends_with('*'));
    assert!(at("client_pre_write", "A") < at("uds_write", "A"));
    assert!(at("uds_write", "A") < at("proxy_read", "A"));
    assert!(at("proxy_write", "A") < at("tx_syscall_entry", "A"));
    assert!(at("tx_driver", "A") < at("network_round_trip", "derived"));
    assert!(at("server_read_return", "B") < at("proxy_read", "B"));
    assert!(at("uds_read", "B") < at("server_decode", "B"));
    assert!(at("client_read_return", "A") < at("proxy_relay", "A"));
    assert!(at("uds_read", "A") < at("client_decode", "A"));
}

#[test]
fn labels_must_match_runs() {
    let a = fixture("small_a.ndjson");
    let out = run(&[
        "report",
        "--compare",
        a.to_str().unwrap(),
        a.to_str().unwrap(),
        "--labels",
        "only-one",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--labels has 1 names for 2 runs"));
}

#[test]
fn the_steps_are_stated_in_words() {
    // Same runs as `hand_computed_ladder`: x grows by 9 us from a to b beyond the noise, y's
    // +1 us is within it (not named), z appears in c.
    let runs = ["small_a.ndjson", "small_b.ndjson", "small_c.ndjson"].map(fixture);
    let mut args = vec!["report", "--compare"];
    args.extend(runs.iter().map(|p| p.to_str().unwrap()));
    args.extend(["--labels", "a,b,c"]);
    let text = run_ok(&args);
    let words = text
        .split("steps in words")
        .nth(1)
        .unwrap_or_else(|| panic!("no steps in words in\n{text}"));
    assert!(words.contains("b over a: end-to-end +10.00 us"), "{words}");
    assert!(
        words.contains("grew (+9.00 us in all): x (A, client) +9.00"),
        "{words}"
    );
    assert!(!words.contains("y ("), "y moved within the noise: {words}");
    assert!(
        words.contains("appeared (+0.70 us in all): z (A) +0.70"),
        "{words}"
    );
    assert!(words.contains("process time in b (sum of its segments' p50s, us): client on A 20.00"));
}

/// Runs without drops print no drops note; a run without a merge_summary says its drops are
/// unknown (null in JSON).
#[test]
fn drops_are_zero_or_unknown_without_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let fixture_text = std::fs::read_to_string(fixture("small_a.ndjson")).unwrap();
    let clean = fixture_text.replace(
        r#""dropped_per_node":{"A":2,"B":0}"#,
        r#""dropped_per_node":{"A":0,"B":0}"#,
    );
    let unknown: String = fixture_text
        .lines()
        .filter(|l| !l.contains(r#""type":"merge_summary""#))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(clean != fixture_text && unknown.len() < fixture_text.len());
    let (clean_path, unknown_path) = (
        dir.path().join("clean.ndjson"),
        dir.path().join("unknown.ndjson"),
    );
    std::fs::write(&clean_path, clean).unwrap();
    std::fs::write(&unknown_path, unknown).unwrap();
    let args = [
        "report",
        "--compare",
        clean_path.to_str().unwrap(),
        unknown_path.to_str().unwrap(),
    ];
    let text = run_ok(&args);
    assert!(
        text.contains("(4 requests, 3 complete, kernel drops 0)\n"),
        "{text}"
    );
    assert!(text.contains("kernel drops unknown)\n"), "{text}");
    assert!(!text.contains("runs with kernel drops"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&[&args[..], &["--json"]].concat())).unwrap();
    assert_eq!(v["runs"][0]["kernel_drops"], 0);
    assert!(v["runs"][1]["kernel_drops"].is_null());
    let single = run_ok(&["report", clean_path.to_str().unwrap()]);
    assert!(
        single.contains("kernel drops per node: A 0, B 0\n"),
        "{single}"
    );
    assert!(
        !single.contains("a request with dropped events"),
        "{single}"
    );
}

/// Runs with repeated labels are rounds of two configurations. The fixtures' p50s (see
/// `hand_computed_ladder`): A's rounds a, c, a, c give end-to-end 16, 16.7, 16, 16.7 -> median
/// 16.35; B's four rounds of b give 26. Every B round is above every A round: p = 2 / C(8, 4)
/// = 0.029 <= 0.05, flagged. z is only in c, so in 2 of A's 4 rounds and none of B's.
#[test]
fn repeated_labels_are_rounds_with_medians_and_separation() {
    let runs = [
        "small_a.ndjson",
        "small_b.ndjson",
        "small_c.ndjson",
        "small_b.ndjson",
    ]
    .map(fixture);
    let mut args = vec!["report", "--compare"];
    args.extend(runs.iter().chain(&runs).map(|p| p.to_str().unwrap()));
    args.extend(["--labels", "A,B,A,B,A,B,A,B"]);
    let text = run_ok(&args);
    assert!(
        text.contains("  A: 4 rounds, 16 requests, 12 complete, kernel drops 8:\n    "),
        "{text}"
    );
    assert!(!text.contains("steps in words"), "no per-run steps: {text}");
    assert_eq!(
        cells(&text, "segment"),
        [
            "segment", "node", "A", "range", "B", "range", "step", "%", "p"
        ]
    );
    assert_eq!(
        cells(&text, "end-to-end"),
        [
            "end-to-end",
            "16.35",
            "[16.00-16.70]",
            "26.00",
            "[26.00-26.00]",
            "+9.65*",
            "+59.0%",
            "0.029"
        ]
    );
    assert_eq!(
        cells(&text, "z"),
        [
            "z",
            "A",
            "0.70",
            "[0.70-0.70]",
            "2/4",
            "-",
            "-",
            "-",
            "-",
            "-"
        ]
    );
    // Two rounds each cannot be flagged: separated, but p = 2 / C(4, 2) = 0.333.
    let mut two = vec!["report", "--compare"];
    two.extend(runs.iter().map(|p| p.to_str().unwrap()));
    two.extend(["--labels", "A,B,A,B"]);
    let text = run_ok(&two);
    assert_eq!(
        cells(&text, "end-to-end"),
        [
            "end-to-end",
            "16.35",
            "[16.00-16.70]",
            "26.00",
            "[26.00-26.00]",
            "+9.65",
            "+59.0%",
            "0.333"
        ]
    );
    // JSON: the per-run ladder and the rounds.
    let json = run_ok(&[&two[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ladder"]["runs"].as_array().unwrap().len(), 4);
    let e2e = &v["rounds"]["rows"][0]["cells"][1];
    assert_eq!(e2e["median_p50_ns"], 26_000);
    assert_eq!(e2e["flagged"], false);
    assert!(v["nic"].is_null());
}

/// Rounds come from labels given, not from file names that happen to repeat (two runs'
/// `merged.ndjson` in two directories stay two runs of the ladder).
#[test]
fn repeated_file_names_without_labels_are_not_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = (dir.path().join("x"), dir.path().join("y"));
    for (d, f) in [(&x, "small_a.ndjson"), (&y, "small_b.ndjson")] {
        std::fs::create_dir(d).unwrap();
        std::fs::copy(fixture(f), d.join("merged.ndjson")).unwrap();
    }
    let (x, y) = (x.join("merged.ndjson"), y.join("merged.ndjson"));
    let text = run_ok(&[
        "report",
        "--compare",
        x.to_str().unwrap(),
        y.to_str().unwrap(),
    ]);
    assert!(text.starts_with("ladder: "), "{text}");
    assert_eq!(cells(&text, "end-to-end")[3], "+10.00*", "{text}");
}
