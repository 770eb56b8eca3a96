//! Privileged: a ring buffer far too small for a flood loses events, and every lost event is
//! counted: events received + drops counted == events the kernel programs produced (per-hook
//! hit counters), per hook, and the drops appear as `drops` records in the stream.

mod support;

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use meshlab_user::records::RecordSource;
use meshlab_user::schema::Record;
use support::{Recorder, privileged_or_skip};

#[test]
fn forced_overload_counts_every_lost_event() {
    if !privileged_or_skip("forced_overload_counts_every_lost_event") {
        return;
    }
    // 4 KiB holds ~28 records of 144 bytes (136 + ring header): a flood must overflow it.
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stderr_path = dir.path().join("flood.stderr");
    let recorder = Recorder::start_with_stderr(
        dir.path(),
        "flood",
        &["--port", &port.to_string(), "--ring-bytes", "4096"],
        File::create(&stderr_path).unwrap(),
    );
    let sink = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0usize;
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_nodelay(true).unwrap();
    const SENDS: usize = 20_000;
    for _ in 0..SENDS {
        client.write_all(&[7u8; 32]).unwrap();
    }
    drop(client);
    assert_eq!(sink.join().unwrap(), SENDS * 32);
    let output = recorder.output.clone();
    let rec = recorder.stop();

    assert!(
        rec.summary.dropped > 0,
        "a 4 KiB ring must overflow under this flood: {:?}",
        rec.summary
    );
    assert!(rec.summary.received > 0);
    rec.assert_exact_accounting();
    let hits: u64 = rec.summary.per_hook.values().map(|c| c.hits).sum();
    assert_eq!(rec.summary.received + rec.summary.dropped, hits);
    // tcp_sendmsg fires at least once per send call: its hit counter saw every one.
    assert!(rec.summary.per_hook["tcp_sendmsg"].hits >= SENDS as u64);

    // The last drops record in the stream carries the same total, per hook and per CPU.
    let last_drops = RecordSource::open(&output)
        .unwrap()
        .filter_map(|r| match r.unwrap() {
            Record::Drops(d) => Some(d),
            _ => None,
        })
        .last()
        .expect("drops records");
    assert_eq!(last_drops.total, rec.summary.dropped);
    assert_eq!(last_drops.per_cpu.iter().sum::<u64>(), rec.summary.dropped);
    assert_eq!(
        last_drops.per_hook.values().sum::<u64>(),
        rec.summary.dropped
    );
    // And the recorder said so at the end, with the share and what to do about it.
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    let produced = rec.summary.received + rec.summary.dropped;
    let percent = 100.0 * rec.summary.dropped as f64 / produced as f64;
    let said = format!("{} ({percent:.1} % of {produced})", rec.summary.dropped);
    assert!(
        stderr.contains(&said) && stderr.contains("--ring-bytes"),
        "{stderr}"
    );
}
