//! Privileged: an unmodified server and its stock client (Debian's redis-server and
//! redis-benchmark) in two network namespaces, recorded on both "machines" with no probe file,
//! then merged in kernel-only mode. It checks what a user looks at first: nearly every request
//! complete, no negative segment, segments summing to end-to-end, and injected clock skew
//! leaving every duration bit-identical on a real recording (not a synthetic fixture).

mod support;

use std::collections::HashMap;
use std::path::Path;

use meshlab_user::lab::netns::Lab;
use meshlab_user::schema::{MergeSummary, MergedRequest, Record};
use support::redis::{PORT, in_netns, start_redis};
use support::{Recorder, merge_records};

/// Per redis-benchmark test; `-t ping` runs two (PING_INLINE and PING_MBULK).
const REQUESTS: usize = 3000;

fn merge(dir: &Path, out: &str, extra: &[&str]) -> (HashMap<String, MergedRequest>, MergeSummary) {
    let inputs = [dir.join("a.capture"), dir.join("b.capture")];
    let (mut requests, mut summary) = (HashMap::new(), None);
    for record in merge_records(&inputs, extra, &dir.join(out)) {
        match record {
            Record::Request(r) => {
                requests.insert(r.trace_id.clone(), r);
            }
            Record::MergeSummary(s) => summary = Some(s),
            _ => {}
        }
    }
    (requests, summary.expect("merge_summary"))
}

/// Everything of a request but its absolute times, which skew is allowed to move.
fn without_start_times(r: &MergedRequest) -> MergedRequest {
    let mut r = r.clone();
    r.start_ns = 0;
    for s in &mut r.segments {
        s.start_ns = None;
    }
    r
}

#[test]
fn unmodified_redis_merges_complete_and_skew_changes_no_duration() {
    let test = "unmodified_redis_merges_complete_and_skew_changes_no_duration";
    if !support::redis::can_run(test) {
        return;
    }
    let lab = Lab::create().expect("lab");
    let _server = start_redis(&lab);
    let dir = tempfile::tempdir().unwrap();
    let (a_ns, b_ns) = (
        lab.a.path().to_str().unwrap(),
        lab.b.path().to_str().unwrap(),
    );
    let rec_a = Recorder::start(
        dir.path(),
        "a",
        &["--node", "A", "--netns", a_ns, "--port", PORT],
    );
    let rec_b = Recorder::start(
        dir.path(),
        "b",
        &["--node", "B", "--netns", b_ns, "--port", PORT],
    );
    let bench = in_netns(&lab.a, "redis-benchmark")
        .args(["-h", &lab.addrs.b.to_string(), "-p", PORT, "-c", "1"])
        .args(["-n", &REQUESTS.to_string(), "-t", "ping", "--csv"])
        .output()
        .expect("run redis-benchmark");
    assert!(bench.status.success(), "redis-benchmark: {}", bench.status);
    let (a, b) = (rec_a.stop(), rec_b.stop());
    assert_eq!(
        (a.summary.dropped, b.summary.dropped),
        (0, 0),
        "kernel drops"
    );

    let (requests, summary) = merge(dir.path(), "merged.ndjson", &[]);
    let complete = requests.values().filter(|r| r.complete).count();
    assert!(
        requests.len() * 100 >= 2 * REQUESTS * 99 && complete * 100 >= requests.len() * 99,
        "{complete} of {} requests complete (client sent {}); errors: {:?}",
        requests.len(),
        2 * REQUESTS,
        summary.errors.iter().take(3).collect::<Vec<_>>()
    );
    eprintln!(
        "kernel-only redis: {complete} of {} requests complete (client sent {})",
        requests.len(),
        2 * REQUESTS
    );
    for r in requests.values().filter(|r| r.complete) {
        let sum: u64 = r.segments.iter().map(|s| s.dur_ns).sum();
        assert_eq!(sum, r.e2e_ns, "segments sum to end-to-end: {r:?}");
    }

    let (skewed, _) = merge(
        dir.path(),
        "skewed.ndjson",
        &["--inject-skew", "A=-250ms,B=16.34s"],
    );
    assert_eq!(skewed.len(), requests.len(), "the same requests with skew");
    for (id, r) in &requests {
        let s = &skewed[id];
        assert_ne!(r.start_ns, s.start_ns, "the skew moved absolute times");
        assert_eq!(without_start_times(r), without_start_times(s), "{id}");
    }
    eprintln!(
        "kernel-only redis with skew A=-250ms,B=16.34s: all {} requests identical but for start times",
        skewed.len()
    );
}
