//! Privileged: `meshlab record --bpf-stats` writes meshlab's own cost into its summary (its
//! programs' run counts and times from the kernel's BPF statistics, the recorder's CPU),
//! leaves kernel.bpf_stats_enabled as it found it, and `meshlab merge` carries the figures
//! per node into its summary.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use meshlab_user::schema::{BpfStatsState, MergeSummary, Record, SelfCost, Summary};
use support::{
    LoopbackRecording, Recording, loopback_recording, merge_records, privileged_or_skip,
};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
const ROUND_TRIPS: usize = 20;

fn sysctl() -> String {
    std::fs::read_to_string(STATS_SYSCTL)
        .expect("read the sysctl")
        .trim()
        .to_owned()
}

/// Records `ROUND_TRIPS` request/response exchanges on loopback with `extra` flags.
fn record_exchanges(name: &str, extra: &[&str]) -> (tempfile::TempDir, Recording) {
    let LoopbackRecording {
        dir,
        listener,
        port,
        recorder,
    } = loopback_recording(name, extra);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let server_thread = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..ROUND_TRIPS {
            server.read_exact(&mut buf).unwrap();
            server.write_all(&buf).unwrap();
        }
    });
    let mut buf = [0u8; 64];
    for _ in 0..ROUND_TRIPS {
        client.write_all(&[7u8; 64]).unwrap();
        client.read_exact(&mut buf).unwrap();
    }
    server_thread.join().unwrap();
    drop(client);
    (dir, recorder.stop())
}

/// Every hook that emitted events has its program's runs counted, at least once per event
/// (twice for sched_switch), as a program also runs for what its filters drop (other ports,
/// namespaces, threads).
fn assert_runs_cover_events(summary: &Summary, cost: &SelfCost) {
    let mut checked = 0;
    for (hook, counts) in &summary.per_hook {
        let Some((program, runs)) = cost.programs.iter().find(|(_, p)| p.hook == *hook) else {
            // sock_established and sock_closed are events of the sock_ops hook.
            assert!(hook.starts_with("sock_"), "hook {hook} has no program");
            continue;
        };
        // One sched_switch run can report the thread switched out and the one switched in.
        let per_run = if hook == "sched_switch" { 2 } else { 1 };
        assert!(
            runs.run_cnt * per_run >= counts.hits,
            "{program}: {} runs for {} events",
            runs.run_cnt,
            counts.hits
        );
        if hook != "sock_ops" {
            assert_eq!(
                runs.events, counts.hits,
                "{program}: events are its hook's hits"
            );
        }
        if counts.hits > 0 {
            assert!(runs.run_time_ns > 0, "{program}: runs without run time");
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "only {checked} hooks with events: {summary:?}"
    );
    let sock_ops = &cost.programs["meshlab_sock_ops"];
    assert!(sock_ops.run_cnt > 0, "sock_ops saw the connection open");
    let sock_events: u64 = ["sock_established", "sock_closed"]
        .iter()
        .filter_map(|h| summary.per_hook.get(*h))
        .map(|c| c.hits)
        .sum();
    assert_eq!(sock_ops.events, sock_events);
    assert_eq!(sock_ops.hook, "sock_ops");
}

fn merge_summary(dir: &Path, recording: &Path) -> MergeSummary {
    let records = merge_records(&[recording.to_owned()], &[], &dir.join("merged.ndjson"));
    match records.into_iter().last().expect("merge output") {
        Record::MergeSummary(s) => s,
        other => panic!("last merge record is not merge_summary: {other:?}"),
    }
}

#[test]
fn bpf_stats_flag_measures_own_programs_and_restores_the_switch() {
    let test = "bpf_stats_flag_measures_own_programs_and_restores_the_switch";
    if !privileged_or_skip(test) {
        return;
    }
    let before = sysctl();
    let (dir, rec) = record_exchanges("self", &["--node", "self-test", "--bpf-stats"]);
    assert_eq!(sysctl(), before, "the sysctl is left as it was");
    let cost = rec
        .summary
        .self_cost
        .clone()
        .expect("summary has self_cost");
    println!("self_cost: {cost:?}");
    assert_eq!(cost.bpf_stats, BpfStatsState::Measured);
    assert_eq!(cost.events, rec.summary.received);
    assert!(cost.events > 0, "the exchange produced events");
    assert!(
        cost.user_cpu_ns + cost.sys_cpu_ns > 0,
        "the recorder used CPU"
    );
    // Every attached program is listed, and only those.
    let attached = rec
        .startup
        .attach_plan
        .iter()
        .filter(|e| e.status == meshlab_user::schema::AttachStatus::Attached)
        .count();
    assert_eq!(cost.programs.len(), attached);
    assert_runs_cover_events(&rec.summary, &cost);

    let merged = merge_summary(dir.path(), &rec_path(&dir));
    assert_eq!(merged.self_cost.get("self-test"), Some(&cost));
}

fn rec_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("self.capture")
}

#[test]
fn without_the_flag_and_with_the_sysctl_off_bpf_time_is_not_measured() {
    let test = "without_the_flag_and_with_the_sysctl_off_bpf_time_is_not_measured";
    if !privileged_or_skip(test) {
        return;
    }
    if sysctl() != "0" {
        eprintln!("skipped {test}: kernel.bpf_stats_enabled is on (another user turned it on)");
        return;
    }
    let (_dir, rec) = record_exchanges("off", &["--node", "off-test"]);
    let cost = rec
        .summary
        .self_cost
        .clone()
        .expect("summary has self_cost");
    assert_eq!(cost.bpf_stats, BpfStatsState::NotMeasured);
    assert!(cost.programs.is_empty(), "{cost:?}");
    assert_eq!(cost.events, rec.summary.received);
    assert!(cost.user_cpu_ns + cost.sys_cpu_ns > 0);
}

/// The lab server in `ns`, stopped and reaped on drop (also when an assertion fails).
struct LabServer(std::process::Child);

impl Drop for LabServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn meshlab_in(ns: &meshlab_user::lab::netns::NamedNetns) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshlab"));
    ns.command(&mut cmd);
    cmd
}

fn start_lab_server(lab: &meshlab_user::lab::netns::Lab, dir: &Path) -> LabServer {
    let ready = dir.join("server.ready");
    let child = meshlab_in(&lab.b)
        .args(["lab", "server", "--listen"])
        .arg(format!("{}:{LAB_PORT}", lab.addrs.b))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn lab server");
    let server = LabServer(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ready.exists() {
        assert!(std::time::Instant::now() < deadline, "server not ready");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    server
}

const LAB_PORT: &str = "7410";

/// Two namespaces, kernel-only: both recordings' costs reach the report, with a bound for the
/// TX stages of both nodes.
#[test]
fn two_node_report_shows_own_cost_per_node_and_stage() {
    let test = "two_node_report_shows_own_cost_per_node_and_stage";
    if !privileged_or_skip(test) {
        return;
    }
    let lab = meshlab_user::lab::netns::Lab::create().expect("lab");
    let dir = tempfile::tempdir().unwrap();
    let _server = start_lab_server(&lab, dir.path());
    let recorders: Vec<support::Recorder> = [("a", "A", &lab.a), ("b", "B", &lab.b)]
        .into_iter()
        .map(|(file, node, ns)| {
            let ns_path = ns.path().to_str().unwrap();
            let args = [
                "--node",
                node,
                "--netns",
                ns_path,
                "--port",
                LAB_PORT,
                "--bpf-stats",
            ];
            support::Recorder::start(dir.path(), file, &args)
        })
        .collect();
    let client = meshlab_in(&lab.a)
        .args(["lab", "client", "--connect"])
        .arg(format!("{}:{LAB_PORT}", lab.addrs.b))
        .args(["--qps", "500", "--warmup", "100ms", "--duration", "1s"])
        .output()
        .expect("run lab client");
    assert!(client.status.success(), "client: {}", client.status);
    for rec in recorders {
        rec.stop();
    }
    let merged = dir.path().join("merged.ndjson");
    let status = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .args([dir.path().join("a.capture"), dir.path().join("b.capture")])
        .arg("-o")
        .arg(&merged)
        .status()
        .unwrap();
    assert!(status.success(), "merge: {status}");
    let report = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_meshlab"))
            .arg("report")
            .arg(&merged)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "report: {}", out.status);
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&report(&["--json"])).unwrap();
    assert_own_cost(&json["own_cost"]);
    let text = report(&[]);
    let section = &text[text.find("meshlab's own cost").expect("text section")..];
    println!("{section}");
    assert!(section.contains("tx_qdisc"), "{section}");
}

fn assert_own_cost(own: &serde_json::Value) {
    let requests = own["requests"].as_u64().unwrap();
    assert!(requests > 100, "requests: {own}");
    let nodes = own["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(names, ["A", "B"]);
    for n in nodes {
        assert_eq!(n["bpf_stats"], "measured", "{n}");
        assert!(n["bpf_total_ns"].as_u64().unwrap() > 0, "{n}");
        assert!(n["cpu_ns_per_event"].as_f64().unwrap() > 0.0, "{n}");
        assert!(n["cpu_ns_per_request"].as_f64().unwrap() > 0.0, "{n}");
    }
    for node in ["A", "B"] {
        let qdisc = own["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == "tx_qdisc" && s["node"] == node)
            .unwrap_or_else(|| panic!("no tx_qdisc bound on {node}: {own}"));
        assert_eq!(
            qdisc["hooks"],
            serde_json::json!(["net_dev_queue", "net_dev_start_xmit"])
        );
        // Both end programs emitted events: the bound exists and is at least the estimate.
        let (est, max) = (
            qdisc["own_ns_est"].as_f64().unwrap(),
            qdisc["own_ns_max"].as_f64().unwrap(),
        );
        assert!(est > 0.0 && max >= est, "{qdisc}");
        assert!(qdisc["share_of_p50_max"].as_f64().unwrap() > 0.0, "{qdisc}");
    }
}

/// Context switches (voluntary and not) of every thread of `pid` so far: each is a wakeup.
fn context_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("recorder's threads");
    tasks
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("status")).unwrap_or_default())
        .flat_map(|status| {
            (status.lines())
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// A recorder whose filters match nothing must vanish into the noise: it wakes for its 1 s
/// housekeeping and a backed-off drain (kernel/session.rs DrainPace), not 100 times a second.
#[test]
fn an_idle_recorder_wakes_only_a_few_times_a_second() {
    if !privileged_or_skip("an_idle_recorder_wakes_only_a_few_times_a_second") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Port 1 (tcpmux): nothing on this machine talks on it, so nothing is traced.
    let recorder = support::Recorder::start(dir.path(), "idle", &["--port", "1"]);
    // Past the back-off to the longest pause (10 ms doubling to 320 ms takes 0.63 s).
    std::thread::sleep(Duration::from_millis(1500));
    let before = context_switches(recorder.pid());
    let window = Duration::from_secs(3);
    std::thread::sleep(window);
    let woke = context_switches(recorder.pid()) - before;
    // 3 s: 3 housekeeping ticks + about 10 drains; a 10 ms drain tick alone would be 300.
    eprintln!("idle recorder: {woke} context switches in {window:?}");
    assert!(woke <= 45, "idle recorder woke {woke} times in {window:?}");
    let recording = recorder.stop();
    assert!(
        recording.events.is_empty(),
        "port 1 traced: {:?}",
        recording.events.first()
    );
}
