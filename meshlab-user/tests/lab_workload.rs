//! The echo workload: quantiles against known distributions, and a real client/server run
//! over loopback (no privileges needed) with both framings.

mod lab_support;

use lab_support::{ServerProcess, run_client};
use meshlab_user::lab::workload::latency::{new_histogram, quantiles};

fn assert_close(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= want * rel,
        "{what}: got {got}, want {want} within {:.2}%",
        rel * 100.0
    );
}

#[test]
fn quantiles_of_a_uniform_distribution() {
    let mut h = new_histogram();
    for ns in 1..=1_000_000u64 {
        h.record(ns).unwrap();
    }
    let q = quantiles(&h);
    // HDR histogram at 3 significant digits: 0.1% relative error.
    assert_close("p50", q.p50_us, 500.0, 0.001);
    assert_close("p90", q.p90_us, 900.0, 0.001);
    assert_close("p99", q.p99_us, 990.0, 0.001);
    assert_close("p999", q.p999_us, 999.0, 0.001);
    assert_close("max", q.max_us, 1000.0, 0.001);
    assert_close("mean", q.mean_us, 500.0, 0.001);
}

#[test]
fn quantiles_of_an_exponential_distribution() {
    // Deterministic exponential sample through the inverse CDF; quantile p = -ln(1-p) * mean.
    let mean_ns = 150_000.0;
    let n = 200_000;
    let mut h = new_histogram();
    for i in 0..n {
        let u = (f64::from(i) + 0.5) / f64::from(n);
        h.record((-(1.0 - u).ln() * mean_ns) as u64).unwrap();
    }
    let q = quantiles(&h);
    let expected = |p: f64| -(1.0 - p).ln() * mean_ns / 1000.0;
    assert_close("p50", q.p50_us, expected(0.5), 0.002);
    assert_close("p90", q.p90_us, expected(0.9), 0.002);
    assert_close("p99", q.p99_us, expected(0.99), 0.002);
    assert_close("p999", q.p999_us, expected(0.999), 0.002);
}

#[test]
fn client_and_server_echo_over_loopback_in_both_framings() {
    for proto in ["ttheader", "framed"] {
        let dir = tempfile::tempdir().unwrap();
        let server = ServerProcess::start(dir.path(), proto, &[]);
        let s = run_client(
            &server.addr,
            proto,
            &["--concurrency", "2", "--payload", "200"],
        );
        server.stop();
        assert_eq!(s.proto, proto);
        assert_eq!((s.concurrency, s.payload), (2, 200));
        assert!(s.requests > 100, "{proto}: only {} requests", s.requests);
        assert!(
            s.requests_total > s.requests,
            "warm-up requests are sent but not measured"
        );
        assert!(0.0 < s.p50_us && s.p50_us <= s.p90_us && s.p90_us <= s.p99_us);
        assert!(s.p99_us <= s.p999_us && s.p999_us <= s.max_us);
    }
}

#[test]
fn qps_limit_is_respected() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), "ttheader", &[]);
    let s = run_client(&server.addr, "ttheader", &["--qps", "200"]);
    server.stop();
    // 200 qps for 0.5 s = 100 requests. The limit is the upper bound: unlimited would be
    // thousands. Fewer than 100 only means a slow machine (it failed at the old floor of 80
    // under a loaded CI machine), so the floor only checks that the client ran at all.
    assert!(
        (25..=110).contains(&s.requests),
        "{} requests at --qps 200",
        s.requests
    );
}

/// `lab client --redis-ping` against Debian's redis-server on loopback (a free port): every
/// PING answered, latencies in order.
#[test]
fn redis_ping_times_a_redis_server() {
    let test = "redis_ping_times_a_redis_server";
    if !meshlab_testkit::privileged::can_run_with(test, "redis-server") {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut server = std::process::Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start redis-server");
    let addr = format!("127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args([
            "lab",
            "client",
            "--connect",
            &addr,
            "--redis-ping",
            "--json",
        ])
        .args(["--warmup", "100ms", "--duration", "500ms"])
        .output()
        .expect("run client");
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: meshlab_user::lab::workload::latency::LatencySummary =
        serde_json::from_slice(&out.stdout).expect("one summary object");
    assert_eq!((s.proto.as_str(), s.payload), ("redis-ping", 0));
    assert!(s.requests > 100, "only {} PINGs", s.requests);
    assert!(0.0 < s.p50_us && s.p50_us <= s.p90_us && s.p90_us <= s.max_us);
}

/// A server that answers a PING with anything but `+PONG` fails the client, naming the reply.
#[test]
fn redis_ping_refuses_a_reply_that_is_not_pong() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let answer = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut conn, _) = listener.accept().expect("accept");
        let mut ping = [0u8; 14];
        conn.read_exact(&mut ping).expect("a whole PING");
        assert_eq!(&ping, b"*1\r\n$4\r\nPING\r\n");
        conn.write_all(b"-ERR!\r\n").expect("answer");
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["lab", "client", "--connect", &addr, "--redis-ping"])
        .args(["--warmup", "0s", "--duration", "5s"])
        .output()
        .expect("run client");
    answer.join().expect("the fake server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("answered \"-ERR!\\r\\n\" to PING, not +PONG"),
        "{stderr}"
    );
}
