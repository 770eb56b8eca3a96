//! Privileged: `meshlab record --bpf-stats` writes meshlab's own cost into its summary (its
//! programs' run counts and times from the kernel's BPF statistics, the recorder's CPU),
//! leaves kernel.bpf_stats_enabled as it found it, and `meshlab merge` carries the figures
//! per node into its summary.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use meshlab_user::schema::{BpfStatsState, MergeSummary, Record, SelfCost, Summary};
use support::{LoopbackRecording, Recording, loopback_recording, privileged_or_skip};

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
/// (a program also runs for what its filters drop: other ports, other namespaces).
fn assert_runs_cover_events(summary: &Summary, cost: &SelfCost) {
    let mut checked = 0;
    for (hook, counts) in &summary.per_hook {
        let Some((program, runs)) = cost.programs.iter().find(|(_, p)| p.hook == *hook) else {
            // sock_established and sock_closed are events of the sock_ops hook.
            assert!(hook.starts_with("sock_"), "hook {hook} has no program");
            continue;
        };
        assert!(
            runs.run_cnt >= counts.hits,
            "{program}: {} runs for {} events",
            runs.run_cnt,
            counts.hits
        );
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
    assert_eq!(sock_ops.hook, "sock_ops");
}

fn merge_summary(dir: &Path, recording: &Path) -> MergeSummary {
    let merged = dir.join("merged.ndjson");
    let output = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .arg(recording)
        .arg("-o")
        .arg(&merged)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "merge failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&merged).unwrap();
    let last = text.lines().last().expect("merge output");
    match serde_json::from_str::<Record>(last).unwrap() {
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
