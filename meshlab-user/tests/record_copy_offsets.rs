//! Privileged: a reader taking one queued skb in several recv calls records each copy at the
//! stream bytes it copied (the socket's `copied_seq`), not at the skb's first byte: the merge
//! finds a message's last byte in the copy that carried it (docs/probe-points.md).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use meshlab_user::schema::Hook;
use support::{LoopbackRecording, loopback_recording, privileged_or_skip, socket_cookie};

const MESSAGE: usize = 3000;
const CHUNK: usize = 750;

#[test]
fn each_copy_of_a_partly_read_skb_names_the_bytes_it_copied() {
    if !privileged_or_skip("each_copy_of_a_partly_read_skb_names_the_bytes_it_copied") {
        return;
    }
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("lo", &["--node", "lo-copy"]);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let server_cookie = socket_cookie(&server);
    // One write: on loopback one skb carries the whole message.
    client.write_all(&[b'c'; MESSAGE]).unwrap();
    // Let it be queued whole before the first, short, read.
    std::thread::sleep(std::time::Duration::from_millis(20));
    for _ in 0..MESSAGE / CHUNK {
        let mut buf = [0u8; CHUNK];
        server.read_exact(&mut buf).unwrap();
    }
    drop(client);
    drop(server);
    let rec = recorder.stop();

    let skbs: Vec<_> = rec
        .of(Hook::NetifReceiveSkb, server_cookie)
        .into_iter()
        .map(|e| (e.offset, e.len))
        .collect();
    assert_eq!(skbs, [(Some(0), Some(MESSAGE as u32))], "one skb");
    let copies: Vec<_> = rec
        .of(Hook::SkbCopyDatagram, server_cookie)
        .into_iter()
        .map(|e| (e.offset, e.len))
        .collect();
    let expected: Vec<_> = (0..MESSAGE / CHUNK)
        .map(|i| (Some((i * CHUNK) as u64), Some(CHUNK as u32)))
        .collect();
    assert_eq!(copies, expected, "copies of the one skb");
}
