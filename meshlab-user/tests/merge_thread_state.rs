//! The thread's own spans (docs/segments.md, "The thread's own spans"): time the thread that
//! made a half's syscalls spent runnable but off its CPU inside its process time or its
//! syscalls is cut out as `runqueue_wait`. Constructed scheduler events on two fixtures:
//! kernel-only (B's first request: copy at 7000001024400, recv return at 7000001025500,
//! tcp_sendmsg at 7000001056700, all by the server thread 2000; `server_app` 31200 ns) and
//! plain (probes; B's `server_handler` from 7000001029100 to 7000001054100 on the node's
//! monotonic clock).

mod merge_common;

use merge_common::edit::{off, on_cpu, with_kernel_lines, woken_by_other};
use merge_common::expect::{RX_STAGES, Seg, TX_STAGES, assert_request, on, plain};
use merge_common::merge;
use meshlab_user::schema::{Kind, Layer, MergedRequest, Segment};

const RECV_RETURN: u64 = 7_000_001_025_500;
const HANDLER_BEGIN: u64 = 7_000_001_029_100;

/// The first request of `fixture` with `sched` inserted into B's kernel recording after line
/// `after` (0-based; the events keep the file in time order), and `edit` applied to its lines.
fn first_request(
    fixture: &str,
    after: usize,
    sched: &[String],
    edit: impl Fn(&mut Vec<String>),
) -> MergedRequest {
    let dir = tempfile::tempdir().unwrap();
    let files = with_kernel_lines(dir.path(), fixture, "B", |lines| {
        lines.splice(after + 1..after + 1, sched.iter().cloned());
        edit(lines);
    });
    let out = merge(&files, &[]);
    assert!(out.summary.errors.is_empty(), "{:?}", out.summary.errors);
    let mut rs = out.requests;
    rs.sort_by_key(|r| r.start_ns);
    rs.remove(0)
}

/// Kernel-only, events inserted after B's recv return (line 8).
fn kernel_only(sched: &[String]) -> MergedRequest {
    let r = first_request("kernel_only", 8, sched, |lines| {
        assert!(lines[8].contains("recv_return") && lines[8].contains("7000001025500"));
    });
    assert!(r.complete, "{r:?}");
    r
}

/// The kernel-only request with B's `server_app` (31200 ns) as `app`.
fn expected(rx_copy: &[(&'static str, u64)], app: &[(&'static str, u64)]) -> Vec<Seg> {
    let mut v = on("A", &TX_STAGES);
    v.push(("network_round_trip", None, 20_000));
    v.extend(on("B", &RX_STAGES));
    v.extend(on("B", &[("rx_wakeup_to_copy", 1300)]));
    v.extend(on("B", rx_copy));
    v.extend(on("B", app));
    v.extend(on("B", &TX_STAGES));
    v.extend(on("A", &RX_STAGES));
    v.extend(on("A", &[("rx_wakeup_to_copy", 1300), ("rx_copy", 1100)]));
    v
}

const E2E: u64 = 78_600;

fn only<'r>(r: &'r MergedRequest, name: &str) -> &'r Segment {
    let mut found = r.segments.iter().filter(|s| s.name == name);
    let seg = found.next().unwrap_or_else(|| panic!("no {name}: {r:?}"));
    assert!(found.next().is_none(), "one {name}");
    seg
}

#[test]
fn preempted_inside_server_app_is_runqueue_wait() {
    // Preempted (prev_state 0 = TASK_RUNNING) 4500 ns after its recv returned, back on its
    // CPU 10000 ns later.
    let r = kernel_only(&[off(RECV_RETURN + 4500, 0), on_cpu(RECV_RETURN + 14_500)]);
    let app = [
        ("server_app", 4500),
        ("runqueue_wait", 10_000),
        ("server_app", 16_700),
    ];
    assert_request(&r, &expected(&[("rx_copy", 1100)], &app), E2E);
    let wait = only(&r, "runqueue_wait");
    assert_eq!((wait.layer, wait.kind), (Layer::Kernel, Kind::Queue));
    assert_eq!(wait.unit, "scheduler");
    assert_eq!(wait.node.as_deref(), Some("B"));
    assert_eq!(wait.start_ns, Some(RECV_RETURN + 4500));
    assert_eq!((wait.place.as_ref(), wait.error_ns), (None, None));
    let app: Vec<&Segment> = r
        .segments
        .iter()
        .filter(|s| s.name == "server_app")
        .collect();
    assert_eq!(app[1].start_ns, Some(RECV_RETURN + 14_500));
    assert!(
        app.iter()
            .all(|s| s.unit == "server" && s.layer == Layer::Process)
    );
}

#[test]
fn woken_inside_server_app_waits_for_its_cpu() {
    // Slept (prev_state 1) 4500 ns in, woken by something else 5000 ns later, on its CPU 5000
    // ns after that: the sleep is the process's own wait, the time after the wake-up is the
    // scheduler's.
    let r = kernel_only(&[
        off(RECV_RETURN + 4500, 1),
        woken_by_other(RECV_RETURN + 9500),
        on_cpu(RECV_RETURN + 14_500),
    ]);
    let app = [
        ("server_app", 9500),
        ("runqueue_wait", 5000),
        ("server_app", 16_700),
    ];
    assert_request(&r, &expected(&[("rx_copy", 1100)], &app), E2E);
}

#[test]
fn preempted_with_a_sleep_state_set_is_runqueue_wait() {
    // prev_state 1 but on its CPU again without a wake-up: preempted after setting it.
    let r = kernel_only(&[off(RECV_RETURN + 4500, 1), on_cpu(RECV_RETURN + 14_500)]);
    let app = [
        ("server_app", 4500),
        ("runqueue_wait", 10_000),
        ("server_app", 16_700),
    ];
    assert_request(&r, &expected(&[("rx_copy", 1100)], &app), E2E);
}

#[test]
fn preempted_inside_its_recv_syscall_cuts_rx_copy() {
    // After line 7 (the copy at 7000001024400): off at +400, on at +600.
    let copy = RECV_RETURN - 1100;
    let sched = [off(copy + 400, 0), on_cpu(copy + 600)];
    let r = first_request("kernel_only", 7, &sched, |lines| {
        assert!(lines[7].contains("skb_copy_datagram"));
    });
    let rx_copy = [("rx_copy", 400), ("runqueue_wait", 200), ("rx_copy", 500)];
    assert_request(&r, &expected(&rx_copy, &[("server_app", 31_200)]), E2E);
}

#[test]
fn a_span_handed_between_threads_is_not_cut() {
    // The reply is sent by thread 2001: no one thread ran the whole of server_app, so the
    // reading thread's preemption says nothing about it.
    let sched = [off(RECV_RETURN + 4500, 0), on_cpu(RECV_RETURN + 14_500)];
    let r = first_request("kernel_only", 8, &sched, |lines| {
        let send = lines
            .iter()
            .position(|l| l.contains("\"tcp_sendmsg\""))
            .unwrap();
        lines[send] = lines[send].replace("\"tid\":2000", "\"tid\":2001");
    });
    assert_request(
        &r,
        &expected(&[("rx_copy", 1100)], &[("server_app", 31_200)]),
        E2E,
    );
}

#[test]
fn without_a_preemption_nothing_changes() {
    // Switched out asleep only after the reply's TX (beyond the half): the fixture as is.
    let r = kernel_only(&[]);
    assert_request(
        &r,
        &expected(&[("rx_copy", 1100)], &[("server_app", 31_200)]),
        E2E,
    );
}

#[test]
fn preempted_inside_a_probed_handler() {
    // Plain fixture (probes): preempted 900 ns into server_handler (25000 ns), on its CPU
    // again 10000 ns later; the events go after B's recv return (line 8).
    let sched = [off(HANDLER_BEGIN + 900, 0), on_cpu(HANDLER_BEGIN + 10_900)];
    let r = first_request("plain", 8, &sched, |lines| {
        assert!(lines[8].contains("recv_return"));
    });
    assert!(r.complete, "{r:?}");
    let mut want = plain();
    let at = want.iter().position(|s| s.0 == "server_handler").unwrap();
    want.splice(
        at..=at,
        [
            ("server_handler", Some("B"), 900),
            ("runqueue_wait", Some("B"), 10_000),
            ("server_handler", Some("B"), 14_100),
        ],
    );
    let e2e = plain().iter().map(|s| s.2).sum();
    assert_request(&r, &want, e2e);
    // The handler's ends are converted probe times, the cuts kernel times: each handler part
    // keeps the conversion error of its probe end, the wait between two kernel times has none.
    let handler: Vec<&Segment> = r
        .segments
        .iter()
        .filter(|s| s.name == "server_handler")
        .collect();
    assert!(
        handler.iter().all(|s| s.error_ns.is_some_and(|e| e > 0)),
        "{handler:?}"
    );
    assert_eq!(only(&r, "runqueue_wait").error_ns, None);
}

#[test]
fn a_queue_stage_is_not_the_threads_time() {
    // Preempted while its reply sat in the qdisc (net_dev_queue at 7000001058700, line 10):
    // the packet's wait does not depend on the thread running, so tx_qdisc stays whole.
    let sched = [off(7_000_001_058_800, 0), on_cpu(7_000_001_059_000)];
    let r = first_request("kernel_only", 10, &sched, |lines| {
        assert!(lines[10].contains("net_dev_queue"));
    });
    assert_request(
        &r,
        &expected(&[("rx_copy", 1100)], &[("server_app", 31_200)]),
        E2E,
    );
}
