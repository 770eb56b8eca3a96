//! Network namespace lab: setup, traffic across the veth, teardown (also after a panic),
//! coexisting labs, and `meshlab lab down` for leftovers of a dead owner.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use meshlab_testkit::privileged::privileged_or_skip;
use meshlab_user::lab::leftovers;
use meshlab_user::lab::netns::{Lab, NETNS_DIR, NamedNetns};

fn lab_paths(lab: &Lab) -> [PathBuf; 2] {
    [lab.a.path().to_owned(), lab.b.path().to_owned()]
}

#[test]
fn lab_passes_tcp_between_namespaces_and_is_removed_on_drop() {
    if !privileged_or_skip("lab_passes_tcp_between_namespaces_and_is_removed_on_drop") {
        return;
    }
    let lab = Lab::create().expect("create lab");
    let paths = lab_paths(&lab);
    assert!(paths.iter().all(|p| p.exists()), "{paths:?}");
    let server_addr = SocketAddr::from((lab.addrs.b, 7000));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = lab
        .b
        .run_in(move || {
            let listener = TcpListener::bind(server_addr).expect("bind in B");
            ready_tx.send(()).unwrap();
            let (mut conn, peer) = listener.accept().expect("accept");
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf).unwrap();
            conn.write_all(&buf).unwrap();
            peer
        })
        .unwrap();
    ready_rx.recv().unwrap();
    let a_addr = lab.addrs.a;
    let peer_seen = lab
        .a
        .run_in(move || {
            let mut c = TcpStream::connect(server_addr).expect("connect from A");
            c.write_all(b"hello").unwrap();
            let mut buf = [0u8; 5];
            c.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"hello");
            c.local_addr().unwrap()
        })
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    let server_peer = server.join().unwrap().unwrap();
    assert_eq!(peer_seen.ip(), a_addr);
    assert_eq!(
        server_peer, peer_seen,
        "B sees A's address: traffic crossed the veth"
    );
    // The host namespace has no such address: nothing leaked outside the lab.
    assert!(TcpListener::bind(SocketAddr::from((a_addr, 0))).is_err());
    drop(lab);
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?} left behind");
}

#[test]
fn lab_is_removed_after_a_panic() {
    if !privileged_or_skip("lab_is_removed_after_a_panic") {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let lab = Lab::create().expect("create lab");
        tx.send(lab_paths(&lab)).unwrap();
        panic!("test panics while the lab is up");
    });
    assert!(result.is_err());
    let paths = rx.recv().unwrap();
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?} left behind");
}

#[test]
fn several_labs_coexist() {
    if !privileged_or_skip("several_labs_coexist") {
        return;
    }
    let first = Lab::create().unwrap();
    let second = Lab::create().unwrap();
    assert_ne!(first.a.name(), second.a.name());
    assert_ne!(first.b.name(), second.b.name());
    assert!(
        lab_paths(&first)
            .iter()
            .chain(&lab_paths(&second))
            .all(|p| p.exists())
    );
}

fn dead_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    max + 1
}

#[test]
fn lab_down_removes_namespaces_of_dead_owners_only() {
    if !privileged_or_skip("lab_down_removes_namespaces_of_dead_owners_only") {
        return;
    }
    let live = Lab::create().unwrap();
    let dead_name = format!("mlab-{}-{}-a", dead_pid(), std::process::id());
    let crashed = NamedNetns::create(&dead_name).unwrap();
    // Simulate a crash: the guard never runs.
    std::mem::forget(crashed);
    let dead_path = Path::new(NETNS_DIR).join(&dead_name);
    assert!(dead_path.exists());
    let dead_runtime_dir = std::env::temp_dir().join(format!("mlab-{}-0", dead_pid()));
    std::fs::create_dir_all(dead_runtime_dir.join("sub")).unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["lab", "down"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dead_path.exists(),
        "leftover of a dead owner must be removed"
    );
    assert!(
        lab_paths(&live).iter().all(|p| p.exists()),
        "a live lab must survive"
    );
    assert!(
        leftovers::stale_namespaces()
            .unwrap()
            .iter()
            .all(|p| p != &dead_path)
    );
}
