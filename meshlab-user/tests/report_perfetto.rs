//! `meshlab report --perfetto`: a valid trace-event file holding every segment of the requests
//! it covers, each node on its own clock, display-only placements labelled.

mod report_support;

use std::collections::{BTreeMap, BTreeSet};

use report_support::*;
use serde_json::Value;

fn ns(v: &Value) -> u64 {
    (v.as_f64().expect("a number") * 1000.0).round() as u64
}

#[test]
fn trace_is_valid_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("trace.json");
    run_ok(&[
        "report",
        fixture("direct.ndjson").to_str().unwrap(),
        "--perfetto",
        trace_path.to_str().unwrap(),
        "--perfetto-max",
        "30",
    ]);
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    assert_eq!(trace["displayTimeUnit"], "ns");
    let events = trace["traceEvents"].as_array().expect("traceEvents array");

    // Structure: every event is a complete event or metadata with the fields the format needs,
    // and every track used is named.
    let mut process_names: BTreeMap<u64, String> = BTreeMap::new();
    let mut thread_names: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut complete = Vec::new();
    for e in events {
        let pid = e["pid"].as_u64().expect("pid");
        let tid = e["tid"].as_u64().expect("tid");
        match e["ph"].as_str() {
            Some("M") => {
                let name = e["args"]["name"].as_str();
                match e["name"].as_str().unwrap() {
                    "process_name" => drop(process_names.insert(pid, name.unwrap().to_owned())),
                    "thread_name" => {
                        drop(thread_names.insert((pid, tid), name.unwrap().to_owned()))
                    }
                    "process_sort_index" | "thread_sort_index" => {
                        assert!(e["args"]["sort_index"].is_u64())
                    }
                    other => panic!("unexpected metadata {other}"),
                }
            }
            Some("X") => {
                assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
                assert!(
                    e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0,
                    "{e}"
                );
                complete.push(e);
            }
            other => panic!("unexpected phase {other:?} in {e}"),
        }
    }
    for e in &complete {
        let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        assert!(process_names.contains_key(&pid), "unnamed process {pid}");
        assert!(
            thread_names.contains_key(&(pid, tid)),
            "unnamed track {pid}/{tid}"
        );
    }
    let pid_of = |node: &str| {
        *process_names
            .iter()
            .find(|(_, n)| n.starts_with(&format!("node {node} ")))
            .unwrap_or_else(|| panic!("no process for node {node}: {process_names:?}"))
            .0
    };
    assert_ne!(pid_of("A"), pid_of("B"));

    // Coverage: the first 30 requests plus the median and the p99 one.
    let reqs = requests("direct.ndjson");
    let mut covered: BTreeSet<usize> = (0..30).collect();
    covered.insert(representative(&reqs, 0.5));
    covered.insert(representative(&reqs, 0.99));
    let request_events: BTreeSet<String> = complete
        .iter()
        .filter(|e| e["cat"] == "request")
        .map(|e| e["args"]["trace_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: BTreeSet<String> = covered
        .iter()
        .map(|&i| reqs[i]["trace_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(request_events, expected);
    let median_id = reqs[representative(&reqs, 0.5)]["trace_id"]
        .as_str()
        .unwrap();
    assert!(
        complete
            .iter()
            .any(|e| e["name"] == format!("request {median_id} (median)"))
    );

    let mut checked = 0;
    for &i in &covered {
        let r = &reqs[i];
        let id = r["trace_id"].as_str().unwrap();
        let segs = r["segments"].as_array().unwrap();
        // Names repeat across nodes (tx_qdisc on A and on B): match on name and node.
        let of = |name: &str, node: Option<&str>| -> Vec<&&Value> {
            complete
                .iter()
                .filter(|e| e["args"]["trace_id"] == id && e["args"]["segment"] == name)
                .filter(|e| node.is_none_or(|n| e["args"]["node"] == n))
                .collect()
        };
        for s in segs {
            let name = s["name"].as_str().unwrap();
            let found = of(name, s["node"].as_str());
            match s["node"].as_str() {
                Some(node) => {
                    // Own clock: ts is the segment's start on its node's monotonic clock.
                    assert_eq!(found.len(), 1, "{id} {name}");
                    let e = found[0];
                    assert_eq!(e["pid"].as_u64().unwrap(), pid_of(node), "{id} {name}");
                    assert_eq!(ns(&e["ts"]), s["start_ns"].as_u64().unwrap(), "{id} {name}");
                    assert_eq!(ns(&e["dur"]), s["dur_ns"].as_u64().unwrap(), "{id} {name}");
                    assert!(e["args"]["display_only"].is_null(), "{id} {name}");
                }
                None => {
                    // Derived: two halves on the client's clock filling its wait, labelled.
                    assert_eq!(found.len(), 2, "{id} {name}");
                    let (first, second) = (found[0], found[1]);
                    assert_eq!(
                        (
                            first["args"]["part"].as_str(),
                            second["args"]["part"].as_str()
                        ),
                        (Some("1/2"), Some("2/2"))
                    );
                    for e in [first, second] {
                        assert_eq!(e["args"]["display_only"], true);
                        assert_eq!(e["pid"].as_u64().unwrap(), pid_of("A"));
                        assert!(
                            e["args"]["placement"]
                                .as_str()
                                .unwrap()
                                .contains("display only")
                        );
                        assert_eq!(e["args"]["derived"]["method"], "difference");
                    }
                    assert_eq!(
                        ns(&first["dur"]) + ns(&second["dur"]),
                        s["dur_ns"].as_u64().unwrap()
                    );
                    // A's own segments leave one gap (its wait for B): the halves fill it
                    // from both ends.
                    let mut a_spans: Vec<(u64, u64)> = segs
                        .iter()
                        .filter(|x| x["node"] == "A")
                        .map(|x| {
                            let start = x["start_ns"].as_u64().unwrap();
                            (start, start + x["dur_ns"].as_u64().unwrap())
                        })
                        .collect();
                    a_spans.sort();
                    let gap = a_spans
                        .windows(2)
                        .map(|w| (w[0].1, w[1].0))
                        .max_by_key(|(from, to)| to - from)
                        .unwrap();
                    assert_eq!(ns(&first["ts"]), gap.0, "{id}");
                    assert_eq!(ns(&second["ts"]) + ns(&second["dur"]), gap.1, "{id}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 30 * 39, "{checked} segments checked");
}

#[test]
fn concurrent_requests_never_share_a_thread_slot() {
    // Requests of the direct fixture pulled together so that about ten are in flight at once
    // (as with concurrency > 1): slices on one trace thread must still not overlap.
    let dir = tempfile::tempdir().unwrap();
    let merged = dir.path().join("concurrent.ndjson");
    let mut text = String::new();
    let mut n = 0i64;
    for line in std::fs::read_to_string(fixture("direct.ndjson"))
        .unwrap()
        .lines()
    {
        let mut v: Value = serde_json::from_str(line).unwrap();
        if v["type"] == "request" {
            let shift = |x: &mut Value| *x = Value::from(x.as_i64().unwrap() - n * 988_000);
            shift(&mut v["start_ns"]);
            for s in v["segments"].as_array_mut().unwrap() {
                if s["start_ns"].is_u64() {
                    shift(&mut s["start_ns"]);
                }
            }
            n += 1;
        }
        text.push_str(&v.to_string());
        text.push('\n');
    }
    std::fs::write(&merged, text).unwrap();
    let trace_path = dir.path().join("trace.json");
    run_ok(&[
        "report",
        merged.to_str().unwrap(),
        "--perfetto",
        trace_path.to_str().unwrap(),
    ]);
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let mut by_thread: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let start = ns(&e["ts"]);
        by_thread
            .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .or_default()
            .push((start, start + ns(&e["dur"])));
    }
    for (thread, spans) in &mut by_thread {
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[1].0 >= w[0].1,
                "overlap on {thread:?}: {:?} then {:?}",
                w[0],
                w[1]
            );
        }
    }
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"requests #2"), "{names:?}");
    assert_eq!(
        events.iter().filter(|e| e["cat"] == "request").count(),
        n as usize,
        "every request still present"
    );
}
