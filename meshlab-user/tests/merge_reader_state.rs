//! The reader's scheduler state splits `rx_socket_queue` (docs/segments.md, "The reader's
//! scheduler state"): constructed event sequences on the kernel-only fixture, whose first
//! request reaches B's socket at 7000001019000 (sk_data_ready) and is copied by the server
//! thread 2000 at 7000001024400. In the fixture the thread was asleep and woken by the data
//! (rx_wakeup 100 + rx_sched_delay 4000 + rx_wakeup_to_copy 1300 = 5400 ns); here its wake-up
//! and switch-in (lines 6 and 7) are replaced by other scheduler histories.

mod merge_common;

use merge_common::edit::{off, on_cpu, with_kernel_lines, woken_by_other};
use merge_common::expect::{RX_STAGES, Seg, TX_STAGES, assert_request, on};
use merge_common::merge;
use meshlab_user::schema::{Kind, Layer, MergedRequest};

const DATA_READY: u64 = 7_000_001_019_000;

/// The first request of the kernel-only fixture with B's lines 6-7 (the server thread's
/// wake-up and switch-in) replaced by the scheduler event lines `sched`.
fn first_request(sched: &[String]) -> MergedRequest {
    let dir = tempfile::tempdir().unwrap();
    let files = with_kernel_lines(dir.path(), "kernel_only", "B", |lines| {
        assert!(lines[5].contains("sched_wakeup") && lines[6].contains("sched_switch"));
        lines.splice(5..7, sched.iter().cloned());
    });
    let out = merge(&files, &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    let mut rs = out.requests;
    rs.sort_by_key(|r| r.start_ns);
    rs.remove(0)
}

/// The kernel-only request with B's wait from sk_data_ready to the copy (5400 ns) as `wait`.
fn expected(wait: &[(&'static str, u64)]) -> Vec<Seg> {
    let mut v = on("A", &TX_STAGES);
    v.push(("network_round_trip", None, 20_000));
    v.extend(on("B", &RX_STAGES[..5]));
    v.extend(on("B", wait));
    v.extend(on("B", &[("rx_copy", 1100), ("server_app", 31_200)]));
    v.extend(on("B", &TX_STAGES));
    v.extend(on("A", &RX_STAGES));
    v.extend(on("A", &[("rx_wakeup_to_copy", 1300), ("rx_copy", 1100)]));
    v
}

fn segment<'r>(r: &'r MergedRequest, name: &str) -> &'r meshlab_user::schema::Segment {
    r.segments.iter().find(|s| s.name == name).unwrap()
}

#[test]
fn preempted_reader_is_runqueue_wait_and_running_reader_is_busy() {
    // Running when the data came, preempted 500 ns later (prev_state 0 = TASK_RUNNING),
    // back on its CPU 3600 ns after that, copying 1300 ns later.
    let r = first_request(&[off(DATA_READY + 500, 0), on_cpu(DATA_READY + 4100)]);
    let wait = [
        ("rx_reader_busy", 500),
        ("rx_runqueue_wait", 3600),
        ("rx_reader_busy", 1300),
    ];
    assert_request(&r, &expected(&wait), 78_600);
    assert!(r.complete, "{r:?}");
    let busy = segment(&r, "rx_reader_busy");
    assert_eq!((busy.layer, busy.kind), (Layer::Process, Kind::Compute));
    assert_eq!(busy.unit, "server");
    assert_eq!(busy.start_ns, Some(DATA_READY));
    let queued = segment(&r, "rx_runqueue_wait");
    assert_eq!((queued.layer, queued.kind), (Layer::Kernel, Kind::Queue));
    assert_eq!(queued.unit, "scheduler");
    assert_eq!(queued.start_ns, Some(DATA_READY + 500));
}

#[test]
fn reader_already_on_the_run_queue_when_the_data_came() {
    // The first switch in the wait is a switch-in: it was off its CPU, and nothing woke it.
    let r = first_request(&[off(DATA_READY - 2000, 0), on_cpu(DATA_READY + 4100)]);
    let wait = [("rx_runqueue_wait", 4100), ("rx_reader_busy", 1300)];
    assert_request(&r, &expected(&wait), 78_600);
}

#[test]
fn preempted_with_a_sleep_state_set_is_still_runnable() {
    // prev_state 1 (TASK_INTERRUPTIBLE) but switched in again without a wake-up: preempted
    // between setting its state and sleeping.
    let r = first_request(&[off(DATA_READY + 500, 1), on_cpu(DATA_READY + 4100)]);
    let wait = [
        ("rx_reader_busy", 500),
        ("rx_runqueue_wait", 3600),
        ("rx_reader_busy", 1300),
    ];
    assert_request(&r, &expected(&wait), 78_600);
}

#[test]
fn reader_asleep_on_something_else_leaves_socket_queue() {
    // Went to sleep (prev_state 1), woken by another socket 1500 ns later, on its CPU 2100 ns
    // after that: asleep = the data waited in the socket; woken = run-queue wait.
    let r = first_request(&[
        off(DATA_READY + 500, 1),
        woken_by_other(DATA_READY + 2000),
        on_cpu(DATA_READY + 4100),
    ]);
    let wait = [
        ("rx_reader_busy", 500),
        ("rx_socket_queue", 1500),
        ("rx_runqueue_wait", 2100),
        ("rx_reader_busy", 1300),
    ];
    assert_request(&r, &expected(&wait), 78_600);
    let queue = segment(&r, "rx_socket_queue");
    assert_eq!((&*queue.unit, queue.kind), ("socket", Kind::Queue));
}

#[test]
fn without_scheduler_events_the_wait_stays_socket_queue() {
    // Nothing tells what the reader did: not guessed.
    let r = first_request(&[]);
    assert_request(&r, &expected(&[("rx_socket_queue", 5400)]), 78_600);
    assert!(r.complete, "{r:?}");
}

#[test]
fn reader_running_throughout_is_busy() {
    // Switched in before the data came and never out: on its CPU the whole wait.
    let r = first_request(&[on_cpu(DATA_READY - 3000)]);
    assert_request(&r, &expected(&[("rx_reader_busy", 5400)]), 78_600);
}
