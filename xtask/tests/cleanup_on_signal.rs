//! `cargo xtask` killed mid-run (SIGTERM, SIGINT) leaves nothing behind: the namespaces it
//! made are gone, so are the processes it started, and kernel.bpf_stats_enabled is as before.
//! Real runs of `xtask truth` and `xtask bench`, stopped once their namespaces and children
//! exist (xtask/src/cleanup.rs).

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use meshlab_testkit::privileged::{can_run_with, privileged_or_skip, skip};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
/// Each run loads the machine: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// xtask running one task; on drop (also when an assertion failed) it is stopped and what it
/// may have left is removed, so a failing test does not leave the machine dirty either.
struct Xtask {
    child: Child,
    log: PathBuf,
    netns: Vec<String>,
    stats_before: String,
    /// Its descendants when last looked at (pid -> comm): what a failed test has to stop.
    seen: BTreeMap<i32, String>,
}

impl Xtask {
    /// `xtask ARGS` with `CARGO=true`: its `cargo build` of meshlab is a no-op (the nested
    /// cargo would wait for the build lock `cargo test` holds); `cargo test` built it.
    fn start(args: &[&str], netns: impl Fn(u32) -> Vec<String>) -> Xtask {
        let log =
            std::env::temp_dir().join(format!("xtask-{}-{}.log", args[0], std::process::id()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
        // A test run started in the background by a non-interactive shell (`cmd &`, nohup)
        // inherits SIGINT and SIGHUP ignored, and xtask rightly keeps an ignored signal
        // ignored (cleanup.rs): the child gets the default dispositions, which is what the
        // signals sent here test.
        // SAFETY: between fork and exec only signal(2), which is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(signal, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let child = command
            .args(args)
            .env("CARGO", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starting xtask");
        let netns = netns(child.id());
        Xtask {
            child,
            log,
            netns,
            stats_before: std::fs::read_to_string(STATS_SYSCTL).expect("bpf_stats_enabled"),
            seen: BTreeMap::new(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 40 s) until `ready` holds of its descendants (pid -> comm).
    fn wait_until(&mut self, ready: impl Fn(&BTreeMap<i32, String>) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("xtask ended early ({status}):\n{}", self.log());
            }
            if ready(&descendants(self.child.id() as i32)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready in 40 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal`; asserts the exit status 128+signal, and that the namespaces and the
    /// descendants seen just before are gone and bpf_stats_enabled is back.
    fn kill_and_check(&mut self, signal: libc::c_int) {
        self.seen = descendants(self.child.id() as i32);
        let started = self.seen.clone();
        // SAFETY: kill(2) on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
        let status = self.child.wait().expect("wait");
        let log = self.log();
        assert_eq!(status.code(), Some(128 + signal), "{log}");
        assert!(log.contains("cleaned up"), "no clean-up line:\n{log}");
        for name in &self.netns {
            assert!(!netns_exists(name), "namespace {name} left:\n{log}");
        }
        // xtask reaps what it started before it exits: no grace for a straggler.
        let left: Vec<_> = started.iter().filter(|(pid, _)| alive(**pid)).collect();
        assert!(
            left.is_empty(),
            "left running: {left:?} (of {started:?}):\n{log}"
        );
        let stats = std::fs::read_to_string(STATS_SYSCTL).expect("bpf_stats_enabled");
        assert_eq!(
            stats, self.stats_before,
            "kernel.bpf_stats_enabled not restored"
        );
    }
}

impl Drop for Xtask {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        if let Ok(None) = self.child.try_wait() {
            // The test failed before its signal. SIGTERM: xtask's own clean-up knows best.
            self.seen.extend(descendants(pid));
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                // SAFETY: kill(2) on our own child, not yet reaped (try_wait found it running).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            // What xtask may have left: the processes it started (still the same programs),
            // the switch. Not on success: a later change of the switch is not ours to undo.
            for (pid, comm) in &self.seen {
                let now = std::fs::read_to_string(format!("/proc/{pid}/comm"));
                if now.is_ok_and(|now| now.trim() == comm) {
                    // SAFETY: kill(2) has no memory effects.
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
            }
            let _ = std::fs::write(STATS_SYSCTL, &self.stats_before);
            // The scratch directories of bench (procs::tempdir) and truth (Scratch).
            for task in ["bench", "truth"] {
                let dir = std::env::temp_dir().join(format!("meshlab-{task}-{pid}"));
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        for name in self.netns.iter().filter(|n| netns_exists(n)) {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Running (a zombie has ended: only its parent has not reaped it yet).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// Every process below `root`: pid -> comm.
fn descendants(root: i32) -> BTreeMap<i32, String> {
    let mut parent_of = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesised name: state, ppid, ...
        let (comm, rest) = stat
            .split_once(" (")
            .and_then(|(_, r)| r.rsplit_once(") "))
            .unzip();
        let ppid = rest.and_then(|r| r.split(' ').nth(1)?.parse::<i32>().ok());
        if let (Some(comm), Some(ppid)) = (comm, ppid) {
            parent_of.insert(pid, (ppid, comm.to_owned()));
        }
    }
    let mut found = BTreeMap::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, (ppid, comm)) in &parent_of {
            if *ppid == parent && found.insert(*pid, comm.clone()).is_none() {
                frontier.push(*pid);
            }
        }
    }
    found
}

/// Root, `ip`, and the debug meshlab the tasks run (built by `cargo test --all-targets`).
fn can_run(test: &str, tool: &str) -> bool {
    if !privileged_or_skip(test) || !can_run_with(test, "ip") || !can_run_with(test, tool) {
        return false;
    }
    workspace().join("target/debug/meshlab").is_file()
        || skip(
            test,
            "target/debug/meshlab is not built (cargo test --all-targets builds it)",
        )
}

#[test]
fn sigterm_to_truth_removes_its_namespaces_recorders_and_bpf_stats_switch() {
    if !can_run("sigterm_to_truth", "tc") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = "mlsigtest";
    let args = [
        "truth",
        "--quick",
        "--debug",
        "--no-reference",
        "--prefix",
        prefix,
    ];
    let mut xtask = Xtask::start(&args, |pid| {
        vec![format!("{prefix}-{pid}-a"), format!("{prefix}-{pid}-b")]
    });
    let netns = xtask.netns.clone();
    xtask.wait_until(|procs| {
        // Both recorders started: the namespaces and the statistics switch came before them.
        let recorders = procs.values().filter(|comm| *comm == "meshlab").count();
        recorders >= 2 && netns.iter().all(|n| netns_exists(n))
    });
    let stats = std::fs::read_to_string(STATS_SYSCTL).expect("bpf_stats_enabled");
    assert_eq!(
        stats.trim(),
        "1",
        "truth turns the statistics on before its runs"
    );
    xtask.kill_and_check(libc::SIGTERM);
}

#[test]
fn sigint_to_bench_removes_its_namespaces_and_servers() {
    if !can_run("sigint_to_bench", "redis-server") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut xtask = Xtask::start(&["bench", "--quick"], |pid| {
        vec![format!("mlbench{pid}s"), format!("mlbench{pid}c")]
    });
    let netns = xtask.netns.clone();
    xtask.wait_until(|procs| {
        let has = |name: &str| procs.values().any(|comm| comm == name);
        has("redis-server") && has("meshlab") && netns.iter().all(|n| netns_exists(n))
    });
    xtask.kill_and_check(libc::SIGINT);
}
