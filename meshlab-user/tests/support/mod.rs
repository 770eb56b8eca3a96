//! Shared helpers for privileged integration tests.
#![allow(dead_code)]

pub mod bpf_objects;
pub mod redis;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use meshlab_user::records::RecordSource;
use meshlab_user::schema::{Hook, HotHooks, KernelEvent, Record, Startup, Summary};

pub use meshlab_testkit::privileged::privileged_or_skip;

/// A `meshlab record` child that is interrupted (SIGINT) and reaped when dropped.
pub struct Recorder {
    child: Option<Child>,
    pub output: PathBuf,
}

impl Recorder {
    /// Starts `meshlab record -o <dir>/<name>.capture --ready-file ... <extra>` (the default
    /// binary capture) and waits until every program is attached.
    pub fn start(dir: &Path, name: &str, extra: &[&str]) -> Recorder {
        Self::start_with_stderr(dir, name, extra, Stdio::inherit())
    }

    /// [`Recorder::start`] with the recorder's stderr sent to `stderr` (a file, so the test
    /// can read it; RUST_LOG is cleared for the recorder's default log filter).
    pub fn start_with_stderr(
        dir: &Path,
        name: &str,
        extra: &[&str],
        stderr: impl Into<Stdio>,
    ) -> Recorder {
        let output = dir.join(format!("{name}.capture"));
        let ready = dir.join(format!("{name}.ready"));
        let child = Command::new(env!("CARGO_BIN_EXE_meshlab"))
            .arg("record")
            .arg("-o")
            .arg(&output)
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn meshlab record");
        let mut rec = Recorder {
            child: Some(child),
            output,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(status) = rec.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("meshlab record exited before ready: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "meshlab record not ready after 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        rec
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Interrupts the recorder like Ctrl-C and returns its parsed output.
    pub fn stop(self) -> Recording {
        self.stop_with(libc::SIGINT)
    }

    /// Stops the recorder with `signal` (SIGINT or SIGTERM) and returns its parsed output.
    pub fn stop_with(mut self, signal: libc::c_int) -> Recording {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().expect("wait for recorder");
        assert!(status.success(), "meshlab record failed: {status}");
        Recording::read(&self.output)
    }
}

impl Recorder {
    /// Kills the recorder with SIGKILL (no flush, no summary), as a crash would.
    pub fn kill_hard(mut self) {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let _ = child.wait();
        }
    }
}

/// A parsed recording: startup, kernel events, `hot_hooks` records (`--attach on-demand`),
/// summary.
pub struct Recording {
    pub startup: Startup,
    pub events: Vec<KernelEvent>,
    pub hot_hooks: Vec<HotHooks>,
    pub summary: Summary,
}

impl Recording {
    pub fn read(path: &Path) -> Recording {
        let mut records = RecordSource::open(path)
            .expect("open recording")
            .map(|r| r.expect("valid record"));
        let startup = match records.next() {
            Some(Record::Startup(s)) => s,
            other => panic!("first record is not startup: {other:?}"),
        };
        let mut events = Vec::new();
        let mut hot_hooks = Vec::new();
        let mut summary = None;
        for record in records {
            match record {
                Record::Kernel(k) => events.push(k),
                Record::HotHooks(h) => hot_hooks.push(h),
                Record::Summary(s) => summary = Some(s),
                _ => {}
            }
        }
        Recording {
            startup,
            events,
            hot_hooks,
            summary: summary.expect("summary record at the end"),
        }
    }

    /// Whether `hook` got attached at some tier (a kernel may lack a tracepoint: sk_data_ready
    /// exists since 6.6, so its events are legitimately missing on 6.1).
    pub fn attached(&self, hook: &str) -> bool {
        self.startup
            .attach_plan
            .iter()
            .any(|e| e.hook == hook && e.status == meshlab_user::schema::AttachStatus::Attached)
    }

    pub fn of(&self, hook: Hook, cookie: u64) -> Vec<&KernelEvent> {
        self.events
            .iter()
            .filter(|e| e.hook == hook && e.cookie == Some(cookie))
            .collect()
    }

    /// received + dropped == hits for every hook: nothing lost silently.
    pub fn assert_exact_accounting(&self) {
        // Firings the kernel skipped a program for are outside hits: loud, not (yet) a failure.
        let missed = self.summary.self_cost.as_ref().map(|c| &c.missed_runs);
        if let Some(missed) = missed.filter(|m| !m.is_empty()) {
            eprintln!(
                "node {}: PROGRAMS SKIPPED BY THE KERNEL: {missed:?}",
                self.startup.node
            );
        }
        for (hook, c) in &self.summary.per_hook {
            assert_eq!(c.received + c.dropped, c.hits, "hook {hook}: {c:?}");
            let written = self.events.iter().filter(|e| e.hook.name() == hook).count() as u64;
            assert_eq!(
                written, c.received,
                "hook {hook}: lines written vs received"
            );
        }
    }
}

/// A loopback listener and a recorder tracing its port; `dir` holds the recording and must
/// outlive the recorder.
pub struct LoopbackRecording {
    pub dir: tempfile::TempDir,
    pub listener: std::net::TcpListener,
    pub port: u16,
    pub recorder: Recorder,
}

/// Binds a loopback listener and starts `meshlab record --port PORT <extra>` for it.
pub fn loopback_recording(name: &str, extra: &[&str]) -> LoopbackRecording {
    let dir = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let port_text = port.to_string();
    let args: Vec<&str> = ["--port", port_text.as_str()]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let recorder = Recorder::start(dir.path(), name, &args);
    LoopbackRecording {
        dir,
        listener,
        port,
        recorder,
    }
}

/// SO_COOKIE of a socket.
pub fn socket_cookie(sock: &impl AsRawFd) -> u64 {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid fd and out-pointers.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    assert_eq!(
        rc,
        0,
        "getsockopt(SO_COOKIE): {}",
        std::io::Error::last_os_error()
    );
    cookie
}

/// `meshlab merge INPUTS ARGS -o OUT`, which must succeed; the records it wrote, in order.
pub fn merge_records(inputs: &[PathBuf], args: &[&str], out: &Path) -> Vec<Record> {
    let output = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .args(inputs)
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run meshlab merge");
    assert!(
        output.status.success(),
        "merge failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(out).expect("read the merged file");
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a merged record"))
        .collect()
}

/// An address as the 16 bytes the kernel programs key connections by (IPv4-mapped for IPv4).
pub fn mapped(addr: std::net::IpAddr) -> [u8; 16] {
    match addr {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// One request/response exchange of `len` bytes each way: the client writes, the server reads
/// it whole and echoes it, the client reads the echo whole.
pub fn exchange_once(
    client: &mut std::net::TcpStream,
    server: &mut std::net::TcpStream,
    len: usize,
) {
    use std::io::{Read, Write};
    let mut buf = vec![b'q'; len];
    client.write_all(&buf).unwrap();
    server.read_exact(&mut buf).unwrap();
    server.write_all(&buf).unwrap();
    client.read_exact(&mut buf).unwrap();
}
