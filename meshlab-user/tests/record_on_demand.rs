//! Privileged: `meshlab record --attach on-demand` holds no hot-hook link while its filters
//! match nothing, attaches the hot hooks when a matching connection is traced (and records
//! when, and how long after the connection), records that connection's later messages, and
//! detaches them again once no connection has been traced for a second.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use meshlab_user::schema::{AttachMode, AttachStatus, Hook, HotHooksChange};
use support::{LoopbackRecording, loopback_recording, privileged_or_skip, socket_cookie};

/// Messages exchanged once the hooks are attached; each is recorded on both ends.
const MESSAGES: usize = 10;

/// The kernel links a process holds, from /proc/PID/fdinfo: `link_type` and, for raw
/// tracepoint links (tp_btf and raw_tp both), `tp_name`.
#[derive(Debug, Default)]
struct Links {
    cgroup: usize,
    /// Every other link: "type" or "type:tracepoint".
    hot: Vec<String>,
}

fn links(pid: u32) -> Links {
    let mut out = Links::default();
    let dir = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("the recorder's fdinfo");
    for entry in dir {
        let Ok(info) = std::fs::read_to_string(entry.unwrap().path()) else {
            continue; // a descriptor closed meanwhile
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        match (field("link_type:"), field("tp_name:")) {
            (Some(t), _) if t == "cgroup" => out.cgroup += 1,
            (Some(t), Some(tp)) => out.hot.push(format!("{t}:{tp}")),
            (Some(t), None) => out.hot.push(t),
            (None, _) => {}
        }
    }
    out
}

/// Polls the recorder's links until `done` holds; the time it took.
fn wait_links(pid: u32, what: &str, limit: Duration, done: impl Fn(&Links) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let now = links(pid);
        if done(&now) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what} within {limit:?}: {now:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the recorder holds hot links and their number stayed the same for 50 ms (the
/// recorder attaches them one by one; how many depends on the kernel's tracepoints).
fn wait_attached(pid: u32) -> Vec<String> {
    let settle = Duration::from_millis(50);
    let seen = wait_links(pid, "hot links attached", Duration::from_secs(2), |l| {
        !l.hot.is_empty()
    });
    let (mut last, mut since) = (links(pid).hot, Instant::now());
    while since.elapsed() < settle {
        std::thread::sleep(Duration::from_millis(5));
        let now = links(pid).hot;
        if now.len() != last.len() {
            (last, since) = (now, Instant::now());
        }
    }
    eprintln!("first hot link seen {seen:?} after connect() returned: {last:?}");
    last
}

/// One request/response of 64 bytes each way.
fn exchange(client: &mut TcpStream, server: &mut TcpStream) {
    let mut buf = [0u8; 64];
    client.write_all(&[7u8; 64]).unwrap();
    server.read_exact(&mut buf).unwrap();
    server.write_all(&buf).unwrap();
    client.read_exact(&mut buf).unwrap();
}

/// Traffic the filters do not match: a second loopback listener on another port.
fn unmatched_exchange() {
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(other.local_addr().unwrap()).unwrap();
    let (mut server, _) = other.accept().unwrap();
    for _ in 0..5 {
        exchange(&mut client, &mut server);
    }
}

#[test]
fn hot_hooks_are_attached_only_while_a_connection_is_traced() {
    if !privileged_or_skip("hot_hooks_are_attached_only_while_a_connection_is_traced") {
        return;
    }
    let LoopbackRecording {
        dir,
        listener,
        port: _,
        recorder,
    } = loopback_recording("ondemand", &["--attach", "on-demand"]);
    let pid = recorder.pid();
    let idle = links(pid);
    assert_eq!(
        idle.cgroup, 1,
        "sock_ops is attached from the start: {idle:?}"
    );
    assert!(
        idle.hot.is_empty(),
        "hot links while nothing is traced: {idle:?}"
    );
    unmatched_exchange();
    std::thread::sleep(Duration::from_millis(200));
    let still = links(pid);
    assert!(
        still.hot.is_empty(),
        "unmatched traffic attached hot links: {still:?}"
    );

    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let hot = wait_attached(pid);
    assert!(hot.len() >= 10, "hot links: {hot:?}");
    for _ in 0..MESSAGES {
        exchange(&mut client, &mut server);
    }
    let cookie = socket_cookie(&client);
    drop((client, server));
    let gone = wait_links(pid, "hot links detached", Duration::from_secs(5), |l| {
        l.hot.is_empty()
    });
    eprintln!("hot links gone {gone:?} after close");
    assert!(
        gone >= Duration::from_millis(500),
        "detached after {gone:?}: too soon"
    );
    assert_eq!(links(pid).cgroup, 1, "sock_ops stays attached");

    let rec = recorder.stop();
    assert_recording(&rec, cookie);
    assert_merge_says_incomplete(dir.path(), &recorder_output(dir.path()));
}

fn recorder_output(dir: &Path) -> std::path::PathBuf {
    dir.join("ondemand.capture")
}

/// The startup record's plan, the two `hot_hooks` records, and the traced connection's events.
fn assert_recording(rec: &support::Recording, cookie: u64) {
    assert_eq!(rec.startup.attach_mode, AttachMode::OnDemand);
    let chosen = |status| {
        rec.startup
            .attach_plan
            .iter()
            .filter(move |e| e.status == status)
    };
    let sock_ops: Vec<_> = chosen(AttachStatus::Attached).map(|e| &e.hook).collect();
    assert_eq!(sock_ops, ["sock_ops"], "only sock_ops attached at start");
    let on_demand: Vec<String> = chosen(AttachStatus::OnDemand)
        .map(|e| e.hook.clone())
        .collect();
    assert!(on_demand.len() >= 10, "hot hooks on demand: {on_demand:?}");

    let [attached, detached] = rec.hot_hooks.as_slice() else {
        panic!("expected one attach and one detach: {:?}", rec.hot_hooks);
    };
    assert_eq!(attached.change, HotHooksChange::Attached);
    assert_eq!(detached.change, HotHooksChange::Detached);
    assert_eq!(attached.hooks, on_demand, "every on-demand hook attached");
    assert_eq!(detached.hooks, on_demand, "every on-demand hook detached");
    let established = rec.of(Hook::SockEstablished, cookie);
    let first_traced = rec
        .events
        .iter()
        .filter(|e| e.hook == Hook::SockEstablished)
        .map(|e| e.ts_ns)
        .min()
        .expect("sock_established events");
    assert_eq!(established.len(), 1, "the client's connection was traced");
    assert_eq!(attached.trigger_ns, Some(first_traced), "{attached:?}");
    let delay = attached.delay_ns.expect("delay_ns");
    assert_eq!(attached.ts_ns - first_traced, delay);
    assert_eq!(
        attached.missing_since_ns,
        Some(rec.startup.clock.monotonic_ns)
    );
    eprintln!(
        "on-demand attach delay: {:.3} ms from the first traced sock_established to all {} hooks attached",
        delay as f64 / 1e6,
        attached.hooks.len()
    );
    assert!(
        delay < 500_000_000,
        "attached {delay} ns after the connection"
    );
    assert!(detached.ts_ns > attached.ts_ns);

    // Every message was sent after the hooks were attached (the test waited for them).
    let sends = rec.of(Hook::TcpSendmsg, cookie);
    assert_eq!(sends.len(), MESSAGES, "client sends recorded: {sends:?}");
    assert!(sends.iter().all(|e| e.ts_ns > attached.ts_ns));
    let inside = |ts: u64| ts > attached.ts_ns && ts < detached.ts_ns;
    let hot_events = rec
        .events
        .iter()
        .filter(|e| !e.hook.name().starts_with("sock_"));
    assert!(
        hot_events.clone().all(|e| inside(e.ts_ns)),
        "a hot-hook event outside the attached window"
    );
    assert!(
        hot_events.count() >= 4 * MESSAGES,
        "events of both ends recorded"
    );
    rec.assert_exact_accounting();
}

/// `meshlab merge` of the recording says which requests are incomplete and why.
fn assert_merge_says_incomplete(dir: &Path, capture: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .arg(capture)
        .arg("-o")
        .arg(dir.join("merged.ndjson"))
        .output()
        .expect("run meshlab merge");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "merge failed: {stderr}");
    assert!(
        stderr.contains("--attach on-demand: hot hooks attached at")
            && stderr.contains("are incomplete"),
        "merge does not say why early requests are incomplete: {stderr}"
    );
}

#[test]
fn on_demand_refuses_unix_and_raw_irq() {
    if !privileged_or_skip("on_demand_refuses_unix_and_raw_irq") {
        return;
    }
    for flag in ["--unix", "--raw-irq"] {
        let out = Command::new(env!("CARGO_BIN_EXE_meshlab"))
            .args(["record", "--format", "ndjson", "--duration", "1s"])
            .args(["--attach", "on-demand", flag])
            .output()
            .expect("run meshlab record");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} accepted");
        assert!(
            stderr.contains("--attach on-demand cannot be combined with --unix or --raw-irq"),
            "{flag}: {stderr}"
        );
    }
}
