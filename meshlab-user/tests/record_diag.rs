//! Privileged: `meshlab record -v` prints the kernel programs' diagnostics on stderr, named by
//! program; without `-v` nothing reads or prints them.
//!
//! The diagnostic provoked is sock_ops' "closed connection was not in TRACED_CONNS": a
//! connection traced by one recording asks the kernel for its close callback, and when it
//! closes during the next recording, that recording's sock_ops is called for a connection it
//! never traced. (The other diagnostics need a failing kernel read or a refused map update,
//! which a test cannot cause on a healthy kernel.)

mod support;

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use support::{Recorder, privileged_or_skip, socket_cookie};

/// A connection traced by a first recording is closed during a second one (with `-v` or
/// not); returns the second recorder's stderr and the cookies of the two closed sockets.
fn close_during_next_recording(verbose: bool) -> (String, [u64; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let first = Recorder::start(dir.path(), "first", &["--port", &port]);
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    // The established callbacks ran before connect and accept returned.
    let first = first.stop();
    assert_eq!(
        first.summary.per_hook["sock_established"].received, 2,
        "the first recording traces both ends"
    );

    let cookies = [socket_cookie(&client), socket_cookie(&server)];
    let stderr_path = dir.path().join("second.stderr");
    let mut args = vec!["--port", port.as_str()];
    if verbose {
        args.push("-v");
    }
    let second = Recorder::start_with_stderr(
        dir.path(),
        "second",
        &args,
        File::create(&stderr_path).unwrap(),
    );
    drop(client);
    drop(server);
    // Both ends reach TCP_CLOSE within a loopback round trip; the recorder prints what its
    // programs logged once a second and when it stops.
    std::thread::sleep(Duration::from_millis(300));
    let second = second.stop();
    assert!(
        !second.summary.per_hook.contains_key("sock_closed"),
        "the second recording never traced the connection"
    );
    (std::fs::read_to_string(&stderr_path).unwrap(), cookies)
}

const DIAGNOSTIC: &str = "was not in TRACED_CONNS";

#[test]
fn with_v_a_kernel_diagnostic_reaches_stderr_named_by_its_program() {
    if !privileged_or_skip("with_v_a_kernel_diagnostic_reaches_stderr_named_by_its_program") {
        return;
    }
    let (stderr, cookies) = close_during_next_recording(true);
    for cookie in cookies {
        let line = stderr
            .lines()
            .find(|l| l.contains(DIAGNOSTIC) && l.contains(&format!("connection {cookie} ")))
            .unwrap_or_else(|| panic!("no diagnostic for cookie {cookie} in:\n{stderr}"));
        assert!(
            line.contains("WARN") && line.contains(" kernel] meshlab_sock_ops: closed connection"),
            "{line}"
        );
        assert!(line.contains("meshlab-ebpf/src/sockops.rs:"), "{line}");
    }
}

#[test]
fn without_v_no_kernel_diagnostic_is_printed() {
    if !privileged_or_skip("without_v_no_kernel_diagnostic_is_printed") {
        return;
    }
    let (stderr, _) = close_during_next_recording(false);
    assert!(!stderr.contains(DIAGNOSTIC), "{stderr}");
    assert!(!stderr.contains(" kernel] "), "{stderr}");
    assert!(stderr.contains("meshlab record: node"), "{stderr}");
}
