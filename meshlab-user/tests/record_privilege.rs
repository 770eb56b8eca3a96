//! Least privilege (kernel/privilege.rs, docs/security.md): `record` runs as an ordinary user
//! holding exactly the capabilities it documents, gives them all up after attaching, and
//! never writes a payload byte: a marker sent through the traced connection is nowhere in
//! the recording.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meshlab_user::kernel::privilege::RECORD_NEEDS;
use support::Recording;
use support::bpf_objects::BpfObjects;
use support::privileged_or_skip;

/// The conventional `nobody`.
const NOBODY: &str = "65534";

/// `+bpf,+perfmon,...` for setpriv, from the documented list.
fn setpriv_caps() -> String {
    let caps: Vec<String> = RECORD_NEEDS
        .iter()
        .map(|c| format!("+{}", c.name.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    format!("-all,{}", caps.join(","))
}

/// Capability sets of a process, from /proc/PID/status.
fn cap_sets(pid: u32) -> Vec<(String, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .filter(|l| l.starts_with("Cap"))
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_owned(), u64::from_str_radix(v.trim(), 16).ok()?))
        })
        .collect()
}

#[test]
fn record_runs_as_nobody_with_exactly_the_documented_capabilities_and_drops_them() {
    if !privileged_or_skip("record_runs_with_exactly_the_documented_capabilities") {
        return;
    }
    // A copy of the binary and an output directory that `nobody` can use (sticky, like /tmp).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let exe = dir.path().join("meshlab");
    std::fs::copy(env!("CARGO_BIN_EXE_meshlab"), &exe).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let out = dir.path().join("rec.ndjson");
    let ready = dir.path().join("rec.ready");
    let caps = setpriv_caps();
    let mut child = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .args([
            "--inh-caps",
            &caps,
            "--ambient-caps",
            &caps,
            "--bounding-set",
            &caps,
        ])
        .arg(&exe)
        .args(["record", "--port", &port, "-o"])
        .arg(&out)
        .arg("--ready-file")
        .arg(&ready)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("record with {caps} exited before ready ({status}): {err}");
        }
        assert!(Instant::now() < deadline, "not ready in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = BpfObjects::held_by(child.id());
    // After attaching, every capability set is empty.
    std::thread::sleep(Duration::from_millis(200));
    for (set, bits) in cap_sets(child.id()) {
        if set != "CapBnd" {
            assert_eq!(bits, 0, "{set} after attaching");
        }
    }
    let marker = send_marker(listener);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    held.assert_released("record without root");
    let recording = Recording::read(&out);
    assert!(!recording.events.is_empty(), "nothing recorded");
    assert_no_payload(&out, &marker);
    // Nothing is given up for want of privilege: root attaches the same tiers.
    assert_eq!(attached(&recording), attached(&record_as_root(dir.path())));
}

fn attached(recording: &Recording) -> Vec<(String, String)> {
    let attached = meshlab_user::schema::AttachStatus::Attached;
    let mut plan: Vec<_> = recording
        .startup
        .attach_plan
        .iter()
        .filter(|e| e.status == attached)
        .map(|e| (e.hook.clone(), e.tier.as_str().to_owned()))
        .collect();
    plan.sort();
    plan
}

fn record_as_root(dir: &Path) -> Recording {
    let out = dir.join("root.ndjson");
    let status = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["record", "--port", "1", "--duration", "300ms", "-o"])
        .arg(&out)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    Recording::read(&out)
}

/// Sends a marker payload through a loopback connection (both ways) and returns it.
fn send_marker(listener: TcpListener) -> Vec<u8> {
    let marker = format!("MESHLAB-PAYLOAD-MARKER-{:016x}", rand::random::<u64>()).into_bytes();
    let addr = listener.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 || conn.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut conn = TcpStream::connect(addr).unwrap();
    let mut back = vec![0u8; marker.len()];
    for _ in 0..20 {
        conn.write_all(&marker).unwrap();
        conn.read_exact(&mut back).unwrap();
    }
    drop(conn);
    echo.join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    marker
}

/// Neither the marker nor its hex or its bytes as a JSON number list are in the recording.
fn assert_no_payload(path: &Path, marker: &[u8]) {
    let text = std::fs::read(path).unwrap();
    let hex: String = marker.iter().map(|b| format!("{b:02x}")).collect();
    let as_list: Vec<String> = marker.iter().map(u8::to_string).collect();
    for needle in [
        marker.to_vec(),
        hex.into_bytes(),
        as_list.join(",").into_bytes(),
    ] {
        assert!(
            !text.windows(needle.len()).any(|w| w == needle.as_slice()),
            "payload bytes found in {}",
            path.display()
        );
    }
    // The marker's distinctive middle, in case a prefix was cut: 16 bytes of it.
    let middle = &marker[7..23];
    assert!(!text.windows(middle.len()).any(|w| w == middle));
}
