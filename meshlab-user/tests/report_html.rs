//! `meshlab report --html`: one self-contained page with every chart, checked for content.

mod report_support;

use report_support::*;

/// The text of `<section id="ID">...</section>`.
fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<section id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id}"));
    let end = start + html[start..].find("</section>").unwrap();
    &html[start..end]
}

fn render(name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.html");
    run_ok(&[
        "report",
        fixture(name).to_str().unwrap(),
        "--html",
        out.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&out).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");
    html
}

#[test]
fn page_is_self_contained() {
    let html = render("direct.ndjson");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
    let lower = html.to_lowercase();
    for banned in [
        "<script",
        "<link",
        "@import",
        "<img",
        "<iframe",
        "@font-face",
        "src=",
    ] {
        assert!(!lower.contains(banned), "page contains {banned}");
    }
    // The only URL is the SVG namespace (an identifier, never fetched); url() only points into
    // the page's own patterns.
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(
        !without_ns.contains("http://")
            && !without_ns.contains("https://")
            && !without_ns.contains("//cdn")
    );
    assert_eq!(
        html.matches("url(").count(),
        html.matches("url(#hatch-").count()
    );
    assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
    assert_eq!(
        html.matches("<svg").count(),
        5,
        "2 waterfalls, stacked bars, 2 CDFs"
    );
}

#[test]
fn waterfalls_show_the_median_and_p99_requests_across_both_nodes() {
    let html = render("direct.ndjson");
    let reqs = requests("direct.ndjson");
    for (id, q) in [("waterfall-median", 0.5), ("waterfall-p99", 0.99)] {
        let r = &reqs[representative(&reqs, q)];
        let sec = section(&html, id);
        assert!(
            sec.contains(&format!("trace {}", r["trace_id"].as_str().unwrap())),
            "{id}"
        );
        assert!(
            sec.contains(&format!("{} µs", us(r["e2e_ns"].as_u64().unwrap()))),
            "{id}"
        );
        // One bar per segment (two halves for the derived round trip), each with its duration;
        // names repeat across nodes, so count bars per name.
        let segs = r["segments"].as_array().unwrap();
        for s in segs {
            let name = s["name"].as_str().unwrap();
            let bars = sec.matches(&format!("data-segment=\"{name}\"")).count();
            let expected: usize = segs
                .iter()
                .filter(|x| x["name"] == name)
                .map(|x| if x["derived"].is_object() { 2 } else { 1 })
                .sum();
            assert_eq!(bars, expected, "{id} {name}");
            assert!(
                sec.contains(&format!("{name}: {} µs", us(s["dur_ns"].as_u64().unwrap()))),
                "{id} {name}"
            );
        }
        assert!(
            sec.contains("node A · client · own clock, exact positions"),
            "{id}"
        );
        assert!(sec.contains("node B · own clock"), "{id}");
        assert!(
            sec.contains("derived across nodes (difference method) · placed for display only"),
            "{id}"
        );
        assert!(sec.contains("(derived, display placement)"), "{id}");
    }
}

#[test]
fn stacked_bars_split_mean_time_by_kind() {
    let html = render("direct.ndjson");
    let reqs = requests("direct.ndjson");
    let sec = section(&html, "by-kind");
    for row in [
        "all nodes (mean)",
        "node A (mean)",
        "node B (mean)",
        "derived across nodes (mean)",
        "median request",
        "p99 request",
    ] {
        assert!(sec.contains(&format!(">{row}</text>")), "row {row}");
    }
    for kind in ["compute", "wait", "queue", "network"] {
        assert!(sec.contains(&format!(">{kind}</text>")), "legend {kind}");
    }
    // The "all" bar is as long as the mean end-to-end time; per kind, the mean of its segments.
    let all = e2e(&reqs);
    let mean = all.iter().sum::<u64>() as f64 / all.len() as f64;
    assert!(
        sec.contains(&format!(">{} µs</text>", us(mean.round() as u64))),
        "mean e2e label"
    );
    let mut network = 0u64;
    for r in &reqs {
        for s in r["segments"].as_array().unwrap() {
            if s["kind"] == "network" {
                network += s["dur_ns"].as_u64().unwrap();
            }
        }
    }
    let network_mean = us((network as f64 / reqs.len() as f64).round() as u64);
    assert!(
        sec.contains(&format!("all nodes (mean): network {network_mean} µs")),
        "{network_mean}"
    );
    let p99 = &reqs[representative(&reqs, 0.99)];
    assert!(
        sec.contains(&format!(
            ">{} µs</text>",
            us(p99["e2e_ns"].as_u64().unwrap())
        )),
        "p99 bar total"
    );
}

#[test]
fn cdfs_of_end_to_end_and_the_largest_segments() {
    let html = render("direct.ndjson");
    let reqs = requests("direct.ndjson");
    let e2e_sec = section(&html, "cdf-e2e");
    assert_eq!(e2e_sec.matches("class=\"cdf-line\"").count(), 1);
    assert!(e2e_sec.contains("data-series=\"end-to-end\""));
    // The staircase has one step per sample for 120 requests (<= 400 points): 120 vertical
    // moves plus the start.
    let path = e2e_sec
        .split(" d=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert_eq!(path.matches(" L").count(), 2 * reqs.len());

    // The five segments holding the most time over all requests.
    let mut by_total: Vec<(u64, String)> = segment_samples(&reqs)
        .into_iter()
        .map(|(k, v)| (v.iter().sum::<u64>(), k))
        .collect();
    by_total.sort_by_key(|x| std::cmp::Reverse(x.0));
    let sec = section(&html, "cdf-segments");
    assert_eq!(sec.matches("class=\"cdf-line\"").count(), 5);
    for (_, key) in &by_total[..5] {
        let (name, node) = key.split_once('@').unwrap();
        assert!(
            sec.contains(&format!("data-series=\"{name} ({node})\"")),
            "{key}"
        );
    }
}

#[test]
fn provenance_and_table() {
    let html = render("direct.ndjson");
    let sec = section(&html, "provenance");
    for needle in [
        "meshlab merge A.ndjson B.ndjson A-probes.ndjson B-probes.ndjson",
        "meshlab record --node A --port 9000 -o A.ndjson",
        "6.1.0-27-amd64",
        "6.12.9-amd64",
        "1 connection in 1",
        "A 0, B 3",
        "B 16340000000 ns",
        "B:tcp_probe 5",
        "<span class=\"failed\" title=\"fentry: -EINVAL: program of this type cannot use helper\">fentry failed</span> → <span class=\"ok\">kprobe</span>",
        "<span class=\"ok\">tp_btf</span>",
    ] {
        assert!(sec.contains(needle), "provenance lacks {needle}");
    }
    let table = section(&html, "segments");
    assert_eq!(
        table.matches("<tr>").count(),
        1 + segment_samples(&requests("direct.ndjson")).len()
    );
    assert!(table.contains("network_round_trip <em>(derived)</em>"));
}

#[test]
fn a_failed_run_leaves_earlier_output_alone() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    std::fs::write(&html, "earlier report").unwrap();
    let bad_trace = dir.path().join("missing-dir/trace.json");
    let out = run(&[
        "report",
        fixture("direct.ndjson").to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--perfetto",
        bad_trace.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open directory") && err.contains("missing-dir"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&html).unwrap(), "earlier report");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing else written"
    );
}
