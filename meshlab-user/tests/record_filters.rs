//! Privileged: the in-kernel connection filters of `meshlab record` (sampling, addresses,
//! cgroup) trace exactly the connections they should, and nothing else.

mod support;

use meshlab_user::schema::Hook;
use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use meshlab_common::{conn_sample_hash, conn_sampled};
use meshlab_user::kernel::sysinfo;
use support::{Recorder, Recording, privileged_or_skip};

fn mapped(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Local ports of the client sockets the recording saw established (active opens).
fn traced_client_ports(rec: &Recording) -> BTreeSet<u16> {
    rec.events
        .iter()
        .filter(|e| e.hook == Hook::SockEstablished && e.active == Some(true))
        .filter_map(|e| e.sport)
        .collect()
}

/// Opens `n` connections to `listener`, sends a byte on each, returns their local addresses.
fn connect_many(listener: &TcpListener, n: usize) -> Vec<SocketAddr> {
    let target = listener.local_addr().unwrap();
    (0..n)
        .map(|_| {
            let mut sock = TcpStream::connect(target).unwrap();
            sock.write_all(b"x").unwrap();
            let _ = listener.accept().unwrap();
            sock.local_addr().unwrap()
        })
        .collect()
}

#[test]
fn sampling_traces_exactly_the_connections_the_shared_hash_selects() {
    if !privileged_or_skip("sampling_traces_exactly_the_connections_the_shared_hash_selects") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let rec = Recorder::start(
        dir.path(),
        "sample",
        &["--port", &port.to_string(), "--sample-conns", "1/4"],
    );
    let locals = connect_many(&listener, 40);
    let rec = rec.stop();

    let server = listener.local_addr().unwrap();
    let expected: BTreeSet<u16> = locals
        .iter()
        .filter(|l| {
            let h = conn_sample_hash(
                &mapped(l.ip()),
                l.port(),
                &mapped(server.ip()),
                server.port(),
            );
            conn_sampled(h, 4)
        })
        .map(|l| l.port())
        .collect();
    assert!(
        !expected.is_empty() && expected.len() < locals.len(),
        "1/4 of 40 should pick some, not all"
    );
    assert_eq!(traced_client_ports(&rec), expected);
    // The server side of each sampled connection computes the same hash: traced as well.
    let passive = rec
        .events
        .iter()
        .filter(|e| e.hook == Hook::SockEstablished && e.active == Some(false))
        .count();
    assert_eq!(passive, expected.len());
}

#[test]
fn address_filter_keeps_only_connections_of_that_address() {
    if !privileged_or_skip("address_filter_keeps_only_connections_of_that_address") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wanted = TcpListener::bind("127.0.0.2:0").unwrap();
    let other = TcpListener::bind("127.0.0.3:0").unwrap();
    let rec = Recorder::start(dir.path(), "addr", &["--addr", "127.0.0.2"]);
    let wanted_locals = connect_many(&wanted, 3);
    let _other_locals = connect_many(&other, 3);
    let rec = rec.stop();
    let expected: BTreeSet<u16> = wanted_locals.iter().map(|l| l.port()).collect();
    assert_eq!(traced_client_ports(&rec), expected);
    let wanted_ip = "127.0.0.2".to_owned();
    for e in rec
        .events
        .iter()
        .filter(|e| e.hook == Hook::SockEstablished)
    {
        assert!(
            e.saddr.as_ref() == Some(&wanted_ip) || e.daddr.as_ref() == Some(&wanted_ip),
            "{e:?}"
        );
    }
}

/// A child cgroup removed on drop (after its processes have exited).
struct ChildCgroup(PathBuf);

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn cgroup_filter_traces_only_sockets_created_inside_the_cgroup() {
    if !privileged_or_skip("cgroup_filter_traces_only_sockets_created_inside_the_cgroup") {
        return;
    }
    let root = sysinfo::find_mount(&sysinfo::mounts(), "cgroup2").expect("cgroup2 mounted");
    let cgroup = ChildCgroup(root.join(format!("meshlab-test-{}", std::process::id())));
    std::fs::create_dir(&cgroup.0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let rec = Recorder::start(
        dir.path(),
        "cg",
        &[
            "--cgroup",
            cgroup.0.to_str().unwrap(),
            "--port",
            &port.to_string(),
        ],
    );

    // A client process inside the cgroup: its socket belongs to it.
    let procs = std::ffi::CString::new(
        cgroup
            .0
            .join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    let mut inside = Command::new("bash");
    inside
        .args([
            "-c",
            &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; echo -n x >&3; sleep 0.2"),
        ])
        .stdout(Stdio::null());
    // SAFETY: the hook only calls open/write/close (async-signal-safe) on a pre-built path.
    unsafe {
        inside.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            libc::close(fd);
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = inside.spawn().expect("bash with /dev/tcp");
    let (_in_conn, inside_peer) = listener.accept().unwrap();
    assert!(child.wait().unwrap().success());
    // A connection from this process, outside the cgroup.
    let outside = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let outside_port = outside.local_addr().unwrap().port();
    let _ = listener.accept().unwrap();
    let rec = rec.stop();

    let traced = traced_client_ports(&rec);
    assert_eq!(
        traced,
        BTreeSet::from([inside_peer.port()]),
        "outside port {outside_port} must not be traced"
    );
}
