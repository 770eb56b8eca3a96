//! Tests that boot real guests. They skip (loudly) when qemu or the prepared kernels are missing,
//! unless MESHLAB_REQUIRE_VM=1, which turns the skip into a failure.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::guest;
use super::image;
use super::kernel::KernelLabel;
use super::spec::{LINK_ADDRS, RunSpec};

/// Guests are TCG-emulated on 2 shared cores: one boot at a time keeps the timings sane.
static ONE_BOOT_AT_A_TIME: Mutex<()> = Mutex::new(());

fn spec_or_skip(label: KernelLabel, commands: Vec<String>) -> Option<RunSpec> {
    let boot = super::qemu::which_qemu().and_then(|_| image::prepared(label));
    match boot {
        Ok(boot) => Some(RunSpec {
            label,
            boot,
            commands,
            cwd: PathBuf::from("/"),
            timeout: Duration::from_secs(180),
            memory_mib: 512,
            cpus: 1,
            rw_dirs: Vec::new(),
            stream: false,
            wire: None,
            kernel_args: Vec::new(),
            queues: 1,
            nics: 1,
        }),
        Err(why) if super::vm_required() => panic!("MESHLAB_REQUIRE_VM=1 but: {why:#}"),
        Err(why) => {
            // Straight to fd 2: libtest captures eprintln! of passing tests, and a skip must show.
            let _ = writeln!(
                std::io::stderr(),
                "SKIP {label} VM test (set MESHLAB_REQUIRE_VM=1 to fail instead): {why:#}"
            );
            None
        }
    }
}

#[test]
fn exit_status_stdout_and_stderr_come_back_on_every_kernel() {
    for label in KernelLabel::ALL {
        let command = "echo out; echo err >&2; uname -r; exit 7".to_owned();
        let Some(spec) = spec_or_skip(label, vec![command]) else {
            continue;
        };
        let _serial = ONE_BOOT_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = guest::run_guests(&spec).expect("run");
        let g = &outcome.guests[0];
        assert_eq!(g.status, Some(7), "console log {}", g.console_log.display());
        let stdout = String::from_utf8_lossy(&g.stdout);
        assert_eq!(stdout, format!("out\n{}\n", spec.boot.release));
        assert_eq!(String::from_utf8_lossy(&g.stderr), "err\n");
        assert!(g.peak_rss_kib > 0);
    }
}

#[test]
fn host_built_binary_runs_in_the_guest_with_the_hosts_glibc() {
    // This test binary itself: dynamically linked against the host's glibc, found in the guest
    // through the read-only 9p root.
    let me = std::env::current_exe().expect("current exe");
    let command = super::script::exec_argv(&[
        me.display().to_string(),
        "--list".into(),
        "--format=terse".into(),
    ]);
    let Some(spec) = spec_or_skip(KernelLabel::V6_12, vec![command]) else {
        return;
    };
    let _serial = ONE_BOOT_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outcome = guest::run_guests(&spec).expect("run");
    let g = &outcome.guests[0];
    assert_eq!(
        g.status,
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&g.stderr)
    );
    assert!(
        String::from_utf8_lossy(&g.stdout)
            .contains("host_built_binary_runs_in_the_guest_with_the_hosts_glibc: test")
    );
}

#[test]
fn two_guests_report_their_own_status_and_reach_each_other_only_on_the_link() {
    let a = format!(
        "hostname; ip -4 -o addr show dev eth0 | awk '{{print $4}}'; ip route | grep -c default; \
         ping -c 1 -W 2 {} >/dev/null && echo reached",
        LINK_ADDRS[1]
    );
    let b = "hostname; exit 3".to_owned();
    let Some(spec) = spec_or_skip(KernelLabel::V6_1, vec![a, b]) else {
        return;
    };
    let _serial = ONE_BOOT_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outcome = guest::run_guests(&spec).expect("run");
    let statuses: Vec<Option<i32>> = outcome.guests.iter().map(|g| g.status).collect();
    // grep -c prints 0 and exits 1 when there is no default route: A's status is ping's.
    assert_eq!(statuses, [Some(0), Some(3)]);
    assert_eq!(guest::exit_code(&spec, &outcome).expect("code"), 3);
    let a_out = String::from_utf8_lossy(&outcome.guests[0].stdout);
    assert_eq!(
        a_out,
        format!("meshlab-a\n{}/24\n0\nreached\n", LINK_ADDRS[0])
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.guests[1].stdout),
        "meshlab-b\n"
    );
}

#[test]
fn a_guest_stopped_after_its_command_started_is_told_apart_from_a_failure() {
    // An immediate reset with -no-reboot: qemu exits with no status and nothing on the
    // console, as the TCG flake does (docs/truth.md).
    let command = "echo b > /proc/sysrq-trigger; sleep 60".to_owned();
    let Some(spec) = spec_or_skip(KernelLabel::V6_1, vec![command]) else {
        return;
    };
    let _serial = ONE_BOOT_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outcome = guest::run_guests(&spec).expect("run");
    let g = &outcome.guests[0];
    assert!(g.started, "console log {}", g.console_log.display());
    assert_eq!(g.status, None);
    assert!(!outcome.timed_out);
    let err = guest::exit_code(&spec, &outcome).expect_err("no status is an error");
    let stopped = err
        .downcast_ref::<guest::GuestStopped>()
        .expect("GuestStopped");
    assert_eq!(stopped.name, g.name);
    // The timeout is a different error, which no caller reruns.
    let timed_out = guest::RunOutcome {
        timed_out: true,
        ..outcome
    };
    let err = guest::exit_code(&spec, &timed_out).expect_err("timeout");
    assert!(!err.is::<guest::GuestStopped>(), "{err:#}");
    assert!(err.to_string().contains("timed out after 180 s"), "{err:#}");
    // Nor is a guest that never reached its command (its init failed).
    let mut not_started = guest::RunOutcome {
        timed_out: false,
        ..timed_out
    };
    not_started.guests[0].started = false;
    let err = guest::exit_code(&spec, &not_started).expect_err("init failure");
    assert!(!err.is::<guest::GuestStopped>(), "{err:#}");
    assert!(
        err.to_string().contains("before its command started"),
        "{err:#}"
    );
    // Two guests, B's command started and B stopped, A was stopped while still booting: a
    // stop after a command started, named after B.
    let stopped = |name, started| guest::GuestOutcome {
        name,
        status: None,
        stdout: Vec::new(),
        stderr: Vec::new(),
        peak_rss_kib: 0,
        console_log: PathBuf::from("/nonexistent/console.log"),
        started,
    };
    let both = guest::RunOutcome {
        guests: vec![stopped("a", false), stopped("b", true)],
        elapsed: Duration::ZERO,
        timed_out: false,
    };
    let err = guest::exit_code(&spec, &both).expect_err("no status");
    let b = err
        .downcast_ref::<guest::GuestStopped>()
        .expect("GuestStopped");
    assert_eq!(b.name, "b");
}
