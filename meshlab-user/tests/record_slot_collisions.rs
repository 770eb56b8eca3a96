//! Privileged: connections that share a slot of the kernel programs' prefilter arrays
//! (meshlab-ebpf/src/prefilter.rs) are recorded like any other. Two traced connections whose
//! cookies have the same 16 low bits share a CONN_SLOTS slot (their records then come from
//! TRACED_CONNS, and the first one's turn is handed over there); two whose 4-tuples hash to
//! the same TUPLE_SLOTS slot make netif_receive_skb ask TUPLES. The test makes both happen on
//! purpose, then checks that every connection's messages are recorded on both ends with that
//! connection's own ports, and that the accounting is exact. With `--sample-messages`, the
//! turn's direction of a connection in its own slot lives in the slot's second line and moves
//! into TRACED_CONNS when a second connection collides: the second test checks that every
//! connection, before and after that hand-over, is sampled by the shared rule on both ends.

mod support;

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::os::fd::FromRawFd;

use meshlab_common::{PREFILTER_SLOTS, conn_sample_hash, message_sampled, tuple_slot_index};
use meshlab_user::schema::Hook;
use support::{
    LoopbackRecording, Recording, exchange_once, loopback_recording, mapped, privileged_or_skip,
    socket_cookie,
};

const SLOTS: u64 = PREFILTER_SLOTS as u64;
const MESSAGE: usize = 100;
const ROUNDS: usize = 2;

#[test]
fn connections_sharing_a_prefilter_slot_are_each_recorded_whole() {
    if !privileged_or_skip("connections_sharing_a_prefilter_slot_are_each_recorded_whole") {
        return;
    }
    // Cookies come from a per-CPU counter: on one CPU, consecutive sockets get consecutive
    // cookies, which is what lets the test aim at a slot.
    pin_to_current_cpu();
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("collide", &[]);

    let mut pairs = vec![open_pair(&listener, port, None)];
    let first_cookie = socket_cookie(&pairs[0].0);
    let (cookie_pair, attempts) = pair_in_slot_of(first_cookie, &listener, port);
    pairs.extend(attempts);
    pairs.push(cookie_pair);
    let (addr_a, port_a, addr_b, port_b) = colliding_clients(port);
    pairs.push(open_pair(&listener, port, Some((addr_a, port_a))));
    pairs.push(open_pair(&listener, port, Some((addr_b, port_b))));

    let sockets: Vec<(u64, u16, u16)> = pairs
        .iter()
        .flat_map(|(client, server)| [ends(client), ends(server)])
        .collect();
    for (client, server) in &mut pairs {
        exchange(client, server);
    }
    drop(pairs);
    let rec = recorder.stop();

    for (cookie, local, remote) in sockets {
        check_connection(&rec, cookie, local, remote);
    }
    rec.assert_exact_accounting();
}

/// Requests per connection in the sampled test, and its sampling rate.
const SAMPLED_REQUESTS: usize = 36;
const SAMPLE_EVERY: u32 = 3;

#[test]
fn sampled_turns_of_connections_sharing_a_slot_follow_the_shared_rule() {
    let name = "sampled_turns_of_connections_sharing_a_slot_follow_the_shared_rule";
    if !privileged_or_skip(name) {
        return;
    }
    pin_to_current_cpu();
    let every = format!("1/{SAMPLE_EVERY}");
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("collide-sampled", &["--sample-messages", every.as_str()]);

    // The first connection runs a third of its turns alone in its slot, so the hand-over of
    // its turn to TRACED_CONNS happens between two of its turns.
    let mut first = open_pair(&listener, port, None);
    let before = SAMPLED_REQUESTS / 3;
    for _ in 0..before {
        exchange_once(&mut first.0, &mut first.1, MESSAGE);
    }
    let (cookie_pair, attempts) = pair_in_slot_of(socket_cookie(&first.0), &listener, port);
    let mut pairs: Vec<((TcpStream, TcpStream), usize)> = vec![(first, before)];
    pairs.extend(attempts.into_iter().map(|pair| (pair, 0)));
    pairs.push((cookie_pair, 0));
    let (addr_a, port_a, addr_b, port_b) = colliding_clients(port);
    pairs.push((open_pair(&listener, port, Some((addr_a, port_a))), 0));
    pairs.push((open_pair(&listener, port, Some((addr_b, port_b))), 0));
    for ((client, server), done) in &mut pairs {
        for _ in *done..SAMPLED_REQUESTS {
            exchange_once(client, server, MESSAGE);
        }
    }
    let connections: Vec<SampledConnection> = pairs
        .iter()
        .map(|((client, server), _)| SampledConnection::of(client, server))
        .collect();
    drop(pairs);
    let rec = recorder.stop();

    for conn in connections {
        conn.check(&rec);
    }
    rec.assert_exact_accounting();
}

/// One connection of the sampled test: both ends' cookies and the requests the rule picks.
struct SampledConnection {
    client: u64,
    server: u64,
    expected: BTreeSet<usize>,
}

impl SampledConnection {
    fn of(client: &TcpStream, server: &TcpStream) -> Self {
        let (c, s) = (client.local_addr().unwrap(), server.local_addr().unwrap());
        let hash = conn_sample_hash(&mapped(c.ip()), c.port(), &mapped(s.ip()), s.port());
        let expected = (0..SAMPLED_REQUESTS)
            .filter(|&k| message_sampled(hash, (k * MESSAGE) as u32, SAMPLE_EVERY))
            .collect();
        SampledConnection {
            client: socket_cookie(client),
            server: socket_cookie(server),
            expected,
        }
    }

    /// Requests are sampled where the rule says, on both ends, and so are their responses.
    fn check(&self, rec: &Recording) {
        let seen = |hook: Hook, cookie: u64| -> BTreeSet<usize> {
            rec.of(hook, cookie)
                .into_iter()
                .filter_map(|e| e.offset)
                .map(|offset| (offset / MESSAGE as u64) as usize)
                // The FIN (one sequence number after the last request) starts a turn too.
                .filter(|&k| k < SAMPLED_REQUESTS)
                .collect()
        };
        let (client, server) = (self.client, self.server);
        for (what, hook, cookie) in [
            ("client sends the request", Hook::TcpSendmsg, client),
            ("server receives it", Hook::TcpProbe, server),
            ("server sends the response", Hook::TcpSendmsg, server),
            ("client receives it", Hook::TcpProbe, client),
        ] {
            assert_eq!(
                seen(hook, cookie),
                self.expected,
                "connection {client}/{server}: {what} ({hook:?}), sampled turns"
            );
        }
    }
}

/// Keeps this thread on the CPU it runs on (cookies are handed out per CPU).
fn pin_to_current_cpu() {
    // SAFETY: sched_getcpu has no preconditions; the set is a plain bit set for this thread.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(
            cpu >= 0,
            "sched_getcpu: {}",
            std::io::Error::last_os_error()
        );
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A connected (client, server) pair, the client bound to `client` (address, port) if given.
fn open_pair(
    listener: &TcpListener,
    port: u16,
    client: Option<([u8; 4], u16)>,
) -> (TcpStream, TcpStream) {
    let client = match client {
        Some((addr, local)) => connect_from(addr, local, port),
        None => TcpStream::connect(("127.0.0.1", port)).unwrap(),
    };
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

/// A pair whose client cookie shares `cookie`'s CONN_SLOTS slot: cookies are burnt (a socket
/// asked for SO_COOKIE) until the last one is one short of the slot, so the next connection's
/// client gets it. Another process taking a cookie on this CPU in between, or a new per-CPU
/// batch, can spoil an attempt; the pairs of spoilt attempts are returned too (they are traced
/// and checked like the others).
fn pair_in_slot_of(
    cookie: u64,
    listener: &TcpListener,
    port: u16,
) -> ((TcpStream, TcpStream), Vec<(TcpStream, TcpStream)>) {
    let mut spoilt = Vec::new();
    for _ in 0..4 {
        burn_cookies_until_slot((cookie + SLOTS - 1) % SLOTS);
        let pair = open_pair(listener, port, None);
        let got = socket_cookie(&pair.0);
        if got % SLOTS == cookie % SLOTS {
            return (pair, spoilt);
        }
        spoilt.push(pair);
    }
    panic!("4 attempts gave no connection whose cookie shares cookie {cookie}'s slot");
}

/// Takes cookies (SO_COOKIE of fresh sockets) until one lands in `slot`.
fn burn_cookies_until_slot(slot: u64) {
    for _ in 0..8 * SLOTS {
        // SAFETY: plain socket syscalls on an fd this function owns and closes.
        let cookie = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let sock = TcpStream::from_raw_fd(fd);
            socket_cookie(&sock)
        };
        if cookie % SLOTS == slot {
            return;
        }
    }
    panic!("no cookie in slot {slot} after {} sockets", 8 * SLOTS);
}

/// Two client ends (loopback address, port) whose client-side 4-tuples (remote
/// 127.0.0.1:`port`) share a TUPLE_SLOTS slot. Every 127/8 address is on `lo`.
fn colliding_clients(port: u16) -> ([u8; 4], u16, [u8; 4], u16) {
    let server = u32::from_le_bytes([127, 0, 0, 1]);
    let mut seen = std::collections::HashMap::new();
    for last in 1..=254u8 {
        let addr = [127, 0, 0, last];
        for client in 40_000..40_256u16 {
            let slot = tuple_slot_index(u32::from_le_bytes(addr), client, server, port);
            if let Some(&(other_addr, other)) = seen.get(&slot) {
                return (other_addr, other, addr, client);
            }
            seen.insert(slot, (addr, client));
        }
    }
    panic!("no two client ends share a tuple slot");
}

/// A loopback connection to 127.0.0.1:`port` from `addr`:`local` (std cannot bind before
/// connect).
fn connect_from(addr: [u8; 4], local: u16, port: u16) -> TcpStream {
    let sockaddr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket syscalls with valid, correctly sized arguments; the fd is handed to
    // the TcpStream, which closes it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let sock = TcpStream::from_raw_fd(fd);
        let one: libc::c_int = 1;
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&raw const one).cast(),
            size,
        );
        let local_addr = sockaddr(addr, local);
        let rc = libc::bind(fd, (&raw const local_addr).cast(), len);
        assert_eq!(
            rc,
            0,
            "bind {addr:?}:{local}: {}",
            std::io::Error::last_os_error()
        );
        let remote = sockaddr([127, 0, 0, 1], port);
        let rc = libc::connect(fd, (&raw const remote).cast(), len);
        assert_eq!(
            rc,
            0,
            "connect from {local}: {}",
            std::io::Error::last_os_error()
        );
        sock
    }
}

fn ends(sock: &TcpStream) -> (u64, u16, u16) {
    (
        socket_cookie(sock),
        sock.local_addr().unwrap().port(),
        sock.peer_addr().unwrap().port(),
    )
}

/// ROUNDS request/response exchanges of MESSAGE bytes each way.
fn exchange(client: &mut TcpStream, server: &mut TcpStream) {
    for _ in 0..ROUNDS {
        exchange_once(client, server, MESSAGE);
    }
}

/// Both directions of one socket are recorded, every event with this socket's own ports.
fn check_connection(rec: &Recording, cookie: u64, local: u16, remote: u16) {
    for hook in [
        Hook::TcpSendmsg,
        Hook::SendReturn,
        Hook::NetifReceiveSkb,
        Hook::TcpProbe,
        Hook::SkbCopyDatagram,
        Hook::RecvReturn,
    ] {
        let events = rec.of(hook, cookie);
        assert!(
            events.len() >= ROUNDS,
            "cookie {cookie} (port {local}): {} {hook:?} events, want >= {ROUNDS}",
            events.len()
        );
        for ev in events {
            assert_eq!(
                (ev.sport, ev.dport),
                (Some(local), Some(remote)),
                "cookie {cookie}: {hook:?} event with another connection's ports"
            );
        }
    }
}
