//! Helpers shared by the lab integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use meshlab_user::lab::workload::latency::LatencySummary;

/// A lab server on loopback, stopped (SIGINT) and reaped on drop.
pub struct ServerProcess {
    child: Child,
    pub addr: String,
}

impl ServerProcess {
    pub fn start(dir: &Path, proto: &str, extra: &[&str]) -> Self {
        let ready = dir.join("server.ready");
        let child = Command::new(env!("CARGO_BIN_EXE_meshlab"))
            .args(["lab", "server", "--listen", "127.0.0.1:0", "--proto", proto])
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn server");
        let mut server = Self {
            child,
            addr: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "server did not get ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        server.addr = std::fs::read_to_string(&ready)
            .unwrap()
            .trim()
            .trim_start_matches("tcp:")
            .to_owned();
        server
    }

    /// SIGINT and wait: the server flushes its probes and exits 0.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "server exit: {status}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run_client(addr: &str, proto: &str, extra: &[&str]) -> LatencySummary {
    let out = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args([
            "lab",
            "client",
            "--connect",
            addr,
            "--proto",
            proto,
            "--json",
        ])
        .args(["--warmup", "100ms", "--duration", "500ms"])
        .args(extra)
        .output()
        .expect("run client");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed: {stderr}");
    assert!(
        stderr.contains(" p50="),
        "one-line summary on stderr: {stderr}"
    );
    serde_json::from_slice(&out.stdout).expect("client --json prints one summary object")
}
