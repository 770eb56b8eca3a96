//! Privileged: `meshlab record` sees a loopback TCP exchange this test makes itself, with the
//! cookies the sockets report (SO_COOKIE) and the stream offsets of the bytes sent.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use meshlab_user::schema::{AttachStatus, Direction, Hook, StopReason};
use support::{LoopbackRecording, loopback_recording, privileged_or_skip, socket_cookie};

const MESSAGES: [usize; 3] = [100, 200, 300];

#[test]
fn record_sees_loopback_messages_with_their_cookies_and_offsets() {
    if !privileged_or_skip("record_sees_loopback_messages_with_their_cookies_and_offsets") {
        return;
    }
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("lo", &["--node", "lo-test"]);

    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let client_cookie = socket_cookie(&client);
    let server_cookie = socket_cookie(&server);
    let client_port = client.local_addr().unwrap().port();
    // The server answers after a pause, so this (client) thread really blocks in read and the
    // scheduler hooks see it sleep, get woken by the response's data-ready, and run again.
    let server_thread = std::thread::spawn(move || {
        for size in MESSAGES {
            let mut buf = vec![0u8; size];
            server.read_exact(&mut buf).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            server.write_all(&buf).unwrap();
        }
    });
    for size in MESSAGES {
        client.write_all(&vec![b'q'; size]).unwrap();
        let mut buf = vec![0u8; size];
        client.read_exact(&mut buf).unwrap();
    }
    server_thread.join().unwrap();
    drop(client);
    let rec = recorder.stop();

    assert_eq!(rec.startup.node, "lo-test");
    assert_eq!(rec.summary.reason, StopReason::Sigint);
    let sock_ops = rec
        .startup
        .attach_plan
        .iter()
        .find(|e| e.hook == "sock_ops")
        .unwrap();
    assert_eq!(sock_ops.status, AttachStatus::Attached);

    // sock_ops saw both ends with the cookies the sockets report and the right 4-tuple.
    let est = rec.of(Hook::SockEstablished, client_cookie);
    assert_eq!(est.len(), 1, "client established");
    assert_eq!(
        (est[0].sport, est[0].dport, est[0].active),
        (Some(client_port), Some(port), Some(true))
    );
    let est = rec.of(Hook::SockEstablished, server_cookie);
    assert_eq!(
        (est[0].sport, est[0].dport, est[0].active),
        (Some(port), Some(client_port), Some(false))
    );

    // Every message, in both directions, at the stream offset of its first byte.
    let mut offset = 0u64;
    for size in MESSAGES {
        for (sender, receiver) in [
            (client_cookie, server_cookie),
            (server_cookie, client_cookie),
        ] {
            let at = |hook: Hook, cookie| {
                let found: Vec<_> = rec
                    .of(hook, cookie)
                    .into_iter()
                    .filter(|e| e.offset == Some(offset) && !e.retrans)
                    .collect();
                assert!(
                    !found.is_empty(),
                    "{hook:?} of cookie {cookie} at offset {offset} missing"
                );
                found[0].clone()
            };
            let send = at(Hook::TcpSendmsg, sender);
            assert_eq!(
                (send.len, send.dir),
                (Some(size as u32), Some(Direction::Tx))
            );
            let queue = at(Hook::NetDevQueue, sender);
            assert_eq!(
                (queue.len, queue.dev.as_deref()),
                (Some(size as u32), Some("lo"))
            );
            let start = at(Hook::NetDevStartXmit, sender);
            let xmit = at(Hook::NetDevXmit, sender);
            assert!(
                send.ts_ns <= queue.ts_ns
                    && queue.ts_ns <= start.ts_ns
                    && start.ts_ns <= xmit.ts_ns
            );

            let rx = at(Hook::NetifReceiveSkb, receiver);
            assert_eq!((rx.len, rx.dir), (Some(size as u32), Some(Direction::Rx)));
            let probe = at(Hook::TcpProbe, receiver);
            let copy = at(Hook::SkbCopyDatagram, receiver);
            assert!(
                start.ts_ns <= rx.ts_ns,
                "loopback: the driver hands over before RX starts"
            );
            assert!(
                rx.ts_ns <= probe.ts_ns && probe.ts_ns <= copy.ts_ns,
                "RX path order"
            );
            // data_ready and recv return report the END of the queued / consumed data.
            let end = offset + size as u64;
            if rec.attached("sk_data_ready") {
                let ready = rec
                    .of(Hook::SkDataReady, receiver)
                    .into_iter()
                    .find(|e| e.offset == Some(end))
                    .cloned();
                let ready = ready.unwrap_or_else(|| panic!("sk_data_ready up to {end} missing"));
                assert!(probe.ts_ns <= ready.ts_ns && ready.ts_ns <= copy.ts_ns);
            }
            let ret = rec
                .of(Hook::RecvReturn, receiver)
                .into_iter()
                .find(|e| e.offset == Some(end))
                .cloned();
            let ret = ret.unwrap_or_else(|| panic!("recv_return up to {end} missing"));
            assert!(copy.ts_ns <= ret.ts_ns);
            assert_eq!(ret.tid, copy.tid, "the reader thread copies and returns");
        }
        offset += size as u64;
    }

    // This thread waited for each response: the response's data-ready woke it (the wakeup
    // carries the client socket's cookie) and it was switched in afterwards.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let mut offset = 0u64;
    for size in MESSAGES {
        let end = offset + size as u64;
        // Without the sk_data_ready tracepoint (< 6.6) the wakeup is still seen, credited to
        // the thread's socket; the reference point is then the response's TCP processing.
        let cause = if rec.attached("sk_data_ready") {
            Hook::SkDataReady
        } else {
            Hook::TcpProbe
        };
        let ready = rec
            .of(cause, client_cookie)
            .into_iter()
            .find(|e| match (e.offset, e.len) {
                (Some(o), Some(l)) if cause == Hook::TcpProbe => o + u64::from(l) == end,
                (o, _) => o == Some(end),
            })
            .cloned()
            .unwrap_or_else(|| panic!("{cause:?} up to {end} missing"));
        let wake = rec
            .of(Hook::SchedWakeup, client_cookie)
            .into_iter()
            .find(|e| e.tid == me && e.ts_ns >= ready.ts_ns)
            .unwrap_or_else(|| panic!("no wakeup of thread {me} after data-ready up to {end}"))
            .clone();
        let run = rec.events.iter().find(|e| {
            e.hook == Hook::SchedSwitch
                && e.tid == me
                && e.value == Some(1)
                && e.ts_ns >= wake.ts_ns
        });
        assert!(
            run.is_some(),
            "thread {me} not switched in after its wakeup at {}",
            wake.ts_ns
        );
        offset = end;
    }
    rec.assert_exact_accounting();
}

#[test]
fn raw_irq_stream_and_sigterm_flush_and_detach() {
    if !privileged_or_skip("raw_irq_stream_and_sigterm_flush_and_detach") {
        return;
    }
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("raw", &["--raw-irq"]);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    for _ in 0..10 {
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).unwrap();
    }
    drop((client, server));
    let rec = recorder.stop_with(libc::SIGTERM);
    assert_eq!(rec.summary.reason, StopReason::Sigterm);
    // Loopback delivers through the NET_RX softirq: with --raw-irq its entry/exit are streamed
    // (vector 3), and the plan shows napi_poll/irq_exit attached instead of skipped.
    let net_rx = |hook: Hook| {
        rec.events
            .iter()
            .filter(|e| e.hook == hook && e.value == Some(3))
            .count()
    };
    assert!(net_rx(Hook::SoftirqEntry) > 0 && net_rx(Hook::SoftirqExit) > 0);
    for hook in ["napi_poll", "irq_exit"] {
        let entry = rec
            .startup
            .attach_plan
            .iter()
            .find(|e| e.hook == hook && e.status == AttachStatus::Attached);
        assert!(entry.is_some(), "{hook} not attached with --raw-irq");
    }
    rec.assert_exact_accounting();
}

#[test]
fn a_killed_recorder_leaves_a_capture_valid_up_to_its_last_write() {
    if !privileged_or_skip("a_killed_recorder_leaves_a_capture_valid_up_to_its_last_write") {
        return;
    }
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("killed", &[]);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let cookie = socket_cookie(&client);
    client.write_all(&[1u8; 100]).unwrap();
    let mut buf = [0u8; 100];
    server.read_exact(&mut buf).unwrap();
    // The recorder writes its buffer out every second; then it dies without a summary.
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    let output = recorder.output.clone();
    recorder.kill_hard();

    let mut records = meshlab_user::records::RecordSource::open(&output).unwrap();
    let first = records.next().unwrap().unwrap();
    assert!(matches!(first, meshlab_user::schema::Record::Startup(_)));
    let mut sends = 0;
    for record in records {
        match record.expect("every complete record of a killed recording reads") {
            meshlab_user::schema::Record::Kernel(k) => {
                sends += usize::from(k.hook == Hook::TcpSendmsg && k.cookie == Some(cookie));
            }
            meshlab_user::schema::Record::Summary(_) => panic!("a killed recorder wrote a summary"),
            _ => {}
        }
    }
    assert_eq!(
        sends, 1,
        "the send made before the last write is in the capture"
    );
    let export = std::process::Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .arg("export")
        .arg(&output)
        .output()
        .unwrap();
    assert!(export.status.success(), "{export:?}");
}
