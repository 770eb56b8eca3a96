//! Privileged: `record --sample-messages 1/10` on two "machines" (network namespaces joined by
//! veth, one recorder each) picks exactly the same requests on both ends, without talking: the
//! ones the shared rule (meshlab_common::message_sampled) selects, about 1 in 10 of them, each
//! with its response; and merge attributes every one of them completely.

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::process::Command;

use meshlab_common::{conn_sample_hash, message_sampled};
use meshlab_user::lab::netns::Lab;
use meshlab_user::ndjson::RecordReader;
use meshlab_user::schema::{Hook, Record};
use support::{Recorder, Recording, mapped, privileged_or_skip, socket_cookie};

const PORT: u16 = 47_310;
const EVERY: u32 = 10;
const REQUESTS: usize = 400;

/// Request k's size: varied, so request start offsets are not a regular progression.
fn request_size(k: usize) -> usize {
    64 + (k * 389) % 1500
}

/// Stream-offset range of each request (the echo server's responses have the same ranges).
fn ranges() -> Vec<Range<u64>> {
    let mut start = 0u64;
    (0..REQUESTS)
        .map(|k| {
            let end = start + request_size(k) as u64;
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

/// Indexes of the requests that have at least one `hook` event of `cookie` in their range.
fn seen(rec: &Recording, hook: Hook, cookie: u64, ranges: &[Range<u64>]) -> BTreeSet<usize> {
    rec.of(hook, cookie)
        .into_iter()
        .filter_map(|e| e.offset)
        .filter_map(|off| ranges.iter().position(|r| r.contains(&off)))
        .collect()
}

struct Run {
    rec_a: Recording,
    rec_b: Recording,
    client_cookie: u64,
    server_cookie: u64,
    client: SocketAddr,
    server: SocketAddr,
    dir: tempfile::TempDir,
}

/// REQUESTS echo request/response turns from a client in A to a server in B, both recorded with
/// `--sample-messages 1/EVERY`.
fn run() -> Run {
    let lab = Lab::create().expect("lab");
    let dir = tempfile::tempdir().unwrap();
    let (port, every) = (PORT.to_string(), format!("1/{EVERY}"));
    let ns = |n: &meshlab_user::lab::netns::NamedNetns| n.path().to_str().unwrap().to_owned();
    let (a_ns, b_ns) = (ns(&lab.a), ns(&lab.b));
    let common = ["--port", &port, "--sample-messages", &every];
    let rec_a = Recorder::start(
        dir.path(),
        "a",
        &[&["--node", "A", "--netns", &a_ns][..], &common].concat(),
    );
    let rec_b = Recorder::start(
        dir.path(),
        "b",
        &[&["--node", "B", "--netns", &b_ns][..], &common].concat(),
    );
    let server_addr = SocketAddr::from((lab.addrs.b, PORT));
    let listener = lab
        .b
        .run_in(move || TcpListener::bind(server_addr))
        .unwrap()
        .join()
        .unwrap()
        .unwrap()
        .unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let cookie = socket_cookie(&conn);
        for k in 0..REQUESTS {
            let mut buf = vec![0u8; request_size(k)];
            conn.read_exact(&mut buf).unwrap();
            conn.write_all(&buf).unwrap();
        }
        cookie
    });
    let mut client = lab
        .a
        .run_in(move || TcpStream::connect(server_addr))
        .unwrap()
        .join()
        .unwrap()
        .unwrap()
        .unwrap();
    let client_cookie = socket_cookie(&client);
    let client_addr = client.local_addr().unwrap();
    for k in 0..REQUESTS {
        client.write_all(&vec![b'q'; request_size(k)]).unwrap();
        let mut buf = vec![0u8; request_size(k)];
        client.read_exact(&mut buf).unwrap();
    }
    let server_cookie = server.join().unwrap();
    drop(client);
    Run {
        rec_a: rec_a.stop(),
        rec_b: rec_b.stop(),
        client_cookie,
        server_cookie,
        client: client_addr,
        server: server_addr,
        dir,
    }
}

/// `meshlab merge` of the two recordings: (requests, complete requests).
fn merge(run: &Run) -> (u64, u64) {
    let out = run.dir.path().join("merged.ndjson");
    let status = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("merge")
        .arg(run.rec_a_path())
        .arg(run.rec_b_path())
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run meshlab merge");
    assert!(status.success(), "meshlab merge failed: {status}");
    let file = std::fs::File::open(&out).unwrap();
    let reader = RecordReader::new(out.clone(), std::io::BufReader::new(file));
    let mut requests = Vec::new();
    for record in reader {
        if let Record::Request(r) = record.expect("merge output parses") {
            requests.push(r);
        }
    }
    let complete = requests.iter().filter(|r| r.complete).count() as u64;
    (requests.len() as u64, complete)
}

impl Run {
    fn rec_a_path(&self) -> std::path::PathBuf {
        self.dir.path().join("a.capture")
    }
    fn rec_b_path(&self) -> std::path::PathBuf {
        self.dir.path().join("b.capture")
    }
}

#[test]
fn both_ends_sample_the_same_requests_and_merge_completes_them() {
    if !privileged_or_skip("both_ends_sample_the_same_requests_and_merge_completes_them") {
        return;
    }
    let run = run();
    let ranges = ranges();
    let hash = conn_sample_hash(
        &mapped(run.client.ip()),
        run.client.port(),
        &mapped(run.server.ip()),
        run.server.port(),
    );
    let expected: BTreeSet<usize> = (0..REQUESTS)
        .filter(|&k| message_sampled(hash, ranges[k].start as u32, EVERY))
        .collect();
    // Binomial(400, 1/10): mean 40, standard deviation 6; 5 deviations either side.
    assert!(
        (10..=70).contains(&expected.len()),
        "the rule kept {} of {REQUESTS} requests",
        expected.len()
    );
    let (a, b) = (&run.rec_a, &run.rec_b);
    let (client, server) = (run.client_cookie, run.server_cookie);
    // Requests: sent by the client in A, received by the server in B.
    assert_eq!(
        seen(a, Hook::TcpSendmsg, client, &ranges),
        expected,
        "A sends"
    );
    assert_eq!(
        seen(b, Hook::TcpProbe, server, &ranges),
        expected,
        "B receives"
    );
    // Responses follow their request's decision.
    assert_eq!(
        seen(b, Hook::TcpSendmsg, server, &ranges),
        expected,
        "B answers"
    );
    assert_eq!(
        seen(a, Hook::TcpProbe, client, &ranges),
        expected,
        "A receives"
    );
    for rec in [a, b] {
        rec.assert_exact_accounting();
    }
    let (requests, complete) = merge(&run);
    assert_eq!(requests, expected.len() as u64, "merged requests");
    assert_eq!(complete, requests, "every sampled request complete");
}
