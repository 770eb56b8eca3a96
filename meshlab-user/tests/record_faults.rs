//! Faults while recording (docs/security.md): a stop signal at any moment, a full disk, a
//! closed output pipe, the traced namespace deleted, the traced process exiting. After each,
//! none of the recorder's BPF programs, maps or links exists any more, and every complete line
//! of its output parses.

mod support;

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use meshlab_user::lab::netns::NamedNetns;
use meshlab_user::records::RecordSource;
use meshlab_user::schema::Record;
use rand::Rng;
use support::bpf_objects::BpfObjects;
use support::privileged_or_skip;

fn record(out: &Path, ready: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshlab"));
    cmd.args(["record", "--clock-every", "1s", "-o"])
        .arg(out)
        .arg("--ready-file")
        .arg(ready)
        .args(extra)
        .stdin(Stdio::null());
    default_stop_signals(&mut cmd);
    cmd
}

/// Gives the child the default action for the stop signals the tests send. An ignored
/// disposition is inherited through fork and exec: a test run under `nohup`, or as a
/// background job of a script (which ignores SIGINT), would start the recorder ignoring
/// SIGHUP or SIGINT, and a signal that comes before its handlers are in place would then
/// neither end it nor stop it ("still running after 20s"; seen, docs/benchmarks-kernel.md).
fn default_stop_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
}

/// Waits for `ready` while collecting the BPF objects the child holds.
fn wait_ready(child: &mut Child, ready: &Path) -> BpfObjects {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("meshlab record exited before ready: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "meshlab record not ready in 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = BpfObjects::held_by(child.id());
    assert!(!held.progs.is_empty(), "a ready recorder holds no program");
    held
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child {} still running after {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads every complete record of a recording (a binary capture, the default): a record torn
/// by a full disk or a kill is not one, and the reader stops before it; anything else that
/// does not parse fails the test.
fn complete_records(path: &Path) -> Vec<Record> {
    let source = RecordSource::open(path)
        .unwrap_or_else(|e| panic!("{}: cannot open recording: {e}", path.display()));
    source
        .map(|r| r.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn ends_with_summary(records: &[Record], reason: &str) -> bool {
    matches!(records.last(), Some(Record::Summary(s)) if s.reason.as_str() == reason)
}

/// Loopback TCP traffic (small echoed messages) on a listener until dropped.
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(listener: TcpListener) -> Traffic {
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let server = std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let mut buf = [0u8; 256];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 || conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        });
        let flag = stop.clone();
        let client = std::thread::spawn(move || {
            let mut conn = TcpStream::connect(addr).unwrap();
            let mut buf = [0u8; 64];
            while !flag.load(Ordering::Relaxed) {
                if conn.write_all(&[7u8; 64]).is_err() || conn.read_exact(&mut buf).is_err() {
                    return;
                }
            }
        });
        Traffic {
            stop,
            threads: vec![server, client],
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[test]
fn a_stop_signal_at_any_moment_leaves_nothing_behind() {
    if !privileged_or_skip("a_stop_signal_at_any_moment_leaves_nothing_behind") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rng();
    let mut clean_stops = 0;
    let signals = [
        (libc::SIGINT, "sigint"),
        (libc::SIGTERM, "sigterm"),
        (libc::SIGHUP, "sighup"),
    ];
    for round in 0..9 {
        let (sig, name) = signals[round % 3];
        let out = dir.path().join(format!("{round}.ndjson"));
        let ready = dir.path().join(format!("{round}.ready"));
        let mut child = record(&out, &ready, &["--port", "1"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // From right after exec to well after attaching (which takes about a second).
        let moment = Duration::from_millis(rng.random_range(0..3000));
        let started = Instant::now();
        let mut held = BpfObjects::default();
        while started.elapsed() < moment {
            held.merge(&BpfObjects::held_by(child.id()));
            std::thread::sleep(Duration::from_millis(5));
        }
        held.merge(&BpfObjects::held_by(child.id()));
        let was_ready = ready.exists();
        signal(&child, sig);
        let status = wait_with_timeout(&mut child, Duration::from_secs(20));
        held.assert_released(&format!("{name} after {moment:?}"));
        if was_ready {
            // Handlers are in place before the ready file: a clean stop with a summary.
            let records = complete_records(&out);
            assert!(status.success(), "{name} after ready: {status}");
            assert!(ends_with_summary(&records, name), "{name}: no summary");
            clean_stops += 1;
        } else {
            // A signal right after exec may come before the output exists; what exists must
            // read as complete records.
            if out.exists() {
                complete_records(&out);
            }
            // Before that, the default action ends the process; the kernel frees the rest.
            assert!(
                status.success() || status.signal() == Some(sig),
                "{name} before ready: {status}"
            );
        }
    }
    eprintln!("{clean_stops} of 9 signals came after the recorder was ready");
}

/// A small tmpfs mounted on a fresh directory, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> SmallDisk {
        let path = dir.join("small");
        std::fs::create_dir(&path).unwrap();
        let target = CString::new(path.as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("size={size},mode=0755")).unwrap();
        // SAFETY: all pointers are valid NUL-terminated strings living across the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        SmallDisk(path)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let target = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn a_full_disk_stops_the_recorder_with_a_clear_error_and_a_valid_file() {
    if !privileged_or_skip("a_full_disk_stops_the_recorder_with_a_clear_error_and_a_valid_file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(dir.path(), "256k");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let out = disk.0.join("rec.ndjson");
    let ready = dir.path().join("rec.ready");
    let mut child = record(&out, &ready, &["--port", &port])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let held = wait_ready(&mut child, &ready);
    let traffic = Traffic::start(listener);
    let status = wait_with_timeout(&mut child, Duration::from_secs(60));
    drop(traffic);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "a full disk must fail the recording");
    assert!(
        stderr.contains("No space left on device") && stderr.contains("rec.ndjson"),
        "the error must say what and where: {stderr}"
    );
    held.assert_released("after ENOSPC");
    let records = complete_records(&out);
    assert!(matches!(records.first(), Some(Record::Startup(_))));
    let events = records
        .iter()
        .filter(|r| matches!(r, Record::Kernel(_)))
        .count();
    assert!(events > 100, "only {events} events before the disk filled");
}

#[test]
fn a_closed_output_pipe_ends_the_recording_successfully() {
    if !privileged_or_skip("a_closed_output_pipe_ends_the_recording_successfully") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("pipe.ready");
    let mut child = record(Path::new("-"), &ready, &["--port", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let held = wait_ready(&mut child, &ready);
    drop(child.stdout.take());
    // The next clock record (every second) meets the closed pipe.
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("output closed"), "{stderr}");
    held.assert_released("after a closed pipe");
}

#[test]
fn the_traced_namespace_deleted_under_the_recorder() {
    if !privileged_or_skip("the_traced_namespace_deleted_under_the_recorder") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ns = NamedNetns::create(&format!("mlab-{}-faults", std::process::id())).unwrap();
    let out = dir.path().join("ns.ndjson");
    let ready = dir.path().join("ns.ready");
    let netns = ns.path().to_str().unwrap().to_owned();
    let mut child = record(&out, &ready, &["--netns", &netns])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let held = wait_ready(&mut child, &ready);
    drop(ns); // like `ip netns del`: unmounted, and our handle closed
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the recorder keeps going when its namespace disappears"
    );
    signal(&child, libc::SIGINT);
    let status = wait_with_timeout(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(ends_with_summary(&complete_records(&out), "sigint"));
    held.assert_released("after the namespace was deleted");
}

fn lab(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("lab")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn the_traced_process_exiting_does_not_stop_the_recorder() {
    if !privileged_or_skip("the_traced_process_exiting_does_not_stop_the_recorder") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server_ready = dir.path().join("server.ready");
    let ready_arg = server_ready.to_str().unwrap();
    let mut server = lab(&[
        "server",
        "--listen",
        "127.0.0.1:0",
        "--ready-file",
        ready_arg,
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server_ready.exists() {
        assert!(Instant::now() < deadline, "lab server not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The ready file holds the bound endpoint, e.g. "tcp:127.0.0.1:40123".
    let bound = std::fs::read_to_string(&server_ready).unwrap();
    let addr = bound.trim().trim_start_matches("tcp:").to_owned();
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let out = dir.path().join("exit.ndjson");
    let ready = dir.path().join("exit.ready");
    let mut child = record(&out, &ready, &["--port", &port])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let held = wait_ready(&mut child, &ready);
    // The traced processes: the server is killed while a client talks to it, and the
    // client then gives up.
    let mut client = lab(&[
        "client",
        "--connect",
        &addr,
        "--warmup",
        "0s",
        "--duration",
        "3s",
    ]);
    std::thread::sleep(Duration::from_millis(700));
    server.kill().unwrap();
    server.wait().unwrap();
    let client_status = wait_with_timeout(&mut client, Duration::from_secs(10));
    assert!(
        !client_status.success(),
        "the client should see its server go"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the recorder stopped");
    signal(&child, libc::SIGTERM);
    let status = wait_with_timeout(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{status}");
    let records = complete_records(&out);
    assert!(ends_with_summary(&records, "sigterm"));
    assert!(records.iter().any(|r| matches!(r, Record::Kernel(_))));
    held.assert_released("after the traced process exited");
}
