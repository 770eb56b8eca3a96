//! Privileged: one event ring per CPU. A client pinned to CPU 0 and a server pinned to CPU 1
//! send on their own CPUs, so their send events go to two different rings; every one of them
//! must reach the recording (the reader drains every ring), merged in time order, with exact
//! accounting, and the startup record must say how many rings were read.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use meshlab_user::schema::Hook;
use support::{LoopbackRecording, loopback_recording, privileged_or_skip, socket_cookie};

/// Request/response exchanges: each side sends this many messages from its own CPU.
const EXCHANGES: usize = 3_000;
const MESSAGE: usize = 64;

#[test]
fn events_of_every_cpu_ring_are_all_read() {
    if !privileged_or_skip("events_of_every_cpu_ring_are_all_read") {
        return;
    }
    let possible = possible_cpus();
    let online = aya::util::online_cpus().unwrap_or_default();
    if (possible.len() < 2 || !online.contains(&0) || !online.contains(&1))
        && !meshlab_testkit::privileged::skip(
            "events_of_every_cpu_ring_are_all_read",
            &format!("needs CPUs 0 and 1 online (possible: {possible:?})"),
        )
    {
        return;
    }
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("rings", &[]);
    let server = std::thread::spawn(move || {
        pin_to(1);
        let (mut conn, _) = listener.accept().unwrap();
        let cookie = socket_cookie(&conn);
        let mut buf = [0u8; MESSAGE];
        for _ in 0..EXCHANGES {
            conn.read_exact(&mut buf).unwrap();
            conn.write_all(&buf).unwrap();
        }
        cookie
    });
    pin_to(0);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_nodelay(true).unwrap();
    let client_cookie = socket_cookie(&client);
    let mut buf = [9u8; MESSAGE];
    for _ in 0..EXCHANGES {
        client.write_all(&buf).unwrap();
        client.read_exact(&mut buf).unwrap();
    }
    let server_cookie = server.join().unwrap();
    drop(client);
    let rec = recorder.stop();

    let expected_rings = expected_rings(&possible);
    assert_eq!(
        rec.startup.event_rings, expected_rings,
        "possible CPUs {possible:?}"
    );
    rec.assert_exact_accounting();
    assert_eq!(rec.summary.dropped, 0, "8 MiB rings: {:?}", rec.summary);
    // Every send of each side is a tcp_sendmsg event from its pinned CPU: all of them read,
    // from two rings.
    for (side, cookie, cpu) in [("client", client_cookie, 0), ("server", server_cookie, 1)] {
        let sends = rec.of(Hook::TcpSendmsg, cookie);
        assert_eq!(sends.len(), EXCHANGES, "{side}: tcp_sendmsg events");
        let on_cpu = sends.iter().filter(|e| e.cpu == cpu).count();
        assert_eq!(on_cpu, EXCHANGES, "{side}: events from CPU {cpu}");
    }
    // Within one ring the reader keeps commit order: one side's sends, all from one CPU,
    // come out in time order.
    for cookie in [client_cookie, server_cookie] {
        let stamps: Vec<u64> = rec
            .of(Hook::TcpSendmsg, cookie)
            .iter()
            .map(|e| e.ts_ns)
            .collect();
        assert!(
            stamps.windows(2).all(|w| w[0] <= w[1]),
            "one CPU's events out of order"
        );
    }
    // The reader merges the rings in time stamp order (ring.rs, the decoder's per-socket
    // state needs it), each ring in its own (reservation) order: a step back in time between
    // consecutive events is allowed only where the later event's own ring steps back at
    // least as far (a program interrupted between reservation and clock read by a nested
    // one, docs/architecture.md); a send after a migration to the other CPU must not come
    // out before the sends that preceded it.
    let mut last_of_ring = [0u64; 8];
    let mut previous = 0u64;
    let (mut steps_back, mut worst) = (0, 0u64);
    for e in &rec.events {
        let ring = meshlab_common::event_ring_of_cpu(e.cpu) as usize;
        let back = previous.saturating_sub(e.ts_ns);
        let own_back = last_of_ring[ring].saturating_sub(e.ts_ns);
        assert!(
            back <= own_back,
            "event at {} ns (CPU {}) after one at {previous} ns: {back} ns back in time, its \
             own ring only {own_back} ns",
            e.ts_ns,
            e.cpu
        );
        steps_back += usize::from(back > 0);
        worst = worst.max(back);
        previous = e.ts_ns;
        last_of_ring[ring] = last_of_ring[ring].max(e.ts_ns);
    }
    eprintln!(
        "{} events: {steps_back} steps back in time, all within their own ring, largest \
         {worst} ns",
        rec.events.len()
    );
}

/// The rings the loader sizes and the reader drains: one per distinct `cpu % 8`.
fn expected_rings(possible: &[u32]) -> u32 {
    let mut rings: Vec<u32> = possible
        .iter()
        .map(|&c| meshlab_common::event_ring_of_cpu(c))
        .collect();
    rings.sort_unstable();
    rings.dedup();
    rings.len() as u32
}

/// /sys/devices/system/cpu/possible, e.g. "0-1" or "0,2-3".
fn possible_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    meshlab_user::kernel::nic::sysfs::parse_cpu_list(&text)
}

/// Keeps the calling thread on `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a plain bit set for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}
