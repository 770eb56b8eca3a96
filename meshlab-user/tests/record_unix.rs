//! Privileged: `record --unix --netns` sees the unix stream sockets of that namespace (the
//! sidecar legs of the mesh topologies) with per-socket byte offsets and the peer link.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use meshlab_user::lab::netns::NamedNetns;
use meshlab_user::schema::{Direction, Hook};
use support::{Recorder, privileged_or_skip};

#[test]
fn unix_stream_legs_are_recorded_with_byte_offsets_and_peers() {
    if !privileged_or_skip("unix_stream_legs_are_recorded_with_byte_offsets_and_peers") {
        return;
    }
    let ns = NamedNetns::create(&format!("mlab-{}-unix", std::process::id())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rec = Recorder::start(
        dir.path(),
        "unix",
        &["--unix", "--netns", ns.path().to_str().unwrap()],
    );
    // Sockets belong to the namespace of the thread that creates them.
    let (mut left, mut right) = ns
        .run_in(UnixStream::pair)
        .unwrap()
        .join()
        .unwrap()
        .unwrap()
        .unwrap();
    // Traffic outside the namespace must not appear.
    let (mut outside_a, mut outside_b) = UnixStream::pair().unwrap();
    outside_a.write_all(b"not traced").unwrap();
    let mut sink = [0u8; 10];
    outside_b.read_exact(&mut sink).unwrap();
    for size in [100usize, 200, 300] {
        left.write_all(&vec![1u8; size]).unwrap();
        let mut buf = vec![0u8; size];
        right.read_exact(&mut buf).unwrap();
    }
    right.write_all(&[2u8; 50]).unwrap();
    let mut buf = [0u8; 50];
    left.read_exact(&mut buf).unwrap();
    drop((left, right));
    let rec = rec.stop();

    let unix_events: Vec<_> = rec
        .events
        .iter()
        .filter(|e| e.unix_sock.is_some())
        .collect();
    let sends: Vec<_> = unix_events
        .iter()
        .filter(|e| e.hook == Hook::SendReturn)
        .collect();
    assert_eq!(
        sends.len(),
        4,
        "three sends left->right, one back: {sends:?}"
    );
    let left_sock = sends[0].unix_sock;
    let right_sock = sends[0].unix_peer;
    assert_ne!(left_sock, right_sock);
    let offsets: Vec<_> = sends
        .iter()
        .filter(|e| e.unix_sock == left_sock)
        .map(|e| (e.offset, e.len))
        .collect();
    assert_eq!(
        offsets,
        vec![
            (Some(0), Some(100)),
            (Some(100), Some(200)),
            (Some(300), Some(300))
        ]
    );
    assert!(sends.iter().all(|e| e.dir == Some(Direction::Tx)));
    let back = sends
        .iter()
        .find(|e| e.unix_sock == right_sock)
        .expect("reply send");
    assert_eq!(
        (back.unix_peer, back.offset, back.len),
        (left_sock, Some(0), Some(50))
    );

    // The receiver's byte count of the stream matches the sender's.
    let received: u64 = unix_events
        .iter()
        .filter(|e| e.hook == Hook::RecvReturn && e.unix_sock == right_sock)
        .map(|e| u64::from(e.len.unwrap()))
        .sum();
    assert_eq!(received, 600);
    // sock:sk_data_ready exists since 6.6: on older kernels (the 6.1 guest) the hook is not
    // attached, and the attach plan says so.
    if rec.attached("sk_data_ready") {
        assert!(
            unix_events
                .iter()
                .any(|e| e.hook == Hook::SkDataReady && e.unix_sock == right_sock)
        );
    }
    // Only the namespace's two sockets were traced.
    assert!(
        unix_events
            .iter()
            .all(|e| e.unix_sock == left_sock || e.unix_sock == right_sock)
    );
    rec.assert_exact_accounting();
}
