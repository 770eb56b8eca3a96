//! Privileged: with `--sample-messages`, the kernel programs count the traced connections whose
//! current turn is sampled (TRACED_LIVE index 1, meshlab-ebpf turn.rs), and every hook that
//! never starts a turn returns at once while the count is zero. A count too low would lose a
//! sampled turn's events; one too high (or wrapped below zero) would only cost time, but
//! forever. The test reads the recorder's map by id while connections are open: both ends of
//! a loopback connection are traced on this machine and apply the same rule, so the count is
//! exactly twice the number of connections whose last request the rule sampled. After every
//! connection closed, both counts are zero.

mod support;

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use aya::maps::{Array, Map, MapData, MapInfo};
use meshlab_common::{conn_sample_hash, message_sampled};
use support::bpf_objects::BpfObjects;
use support::{LoopbackRecording, exchange_once, loopback_recording, mapped, privileged_or_skip};

const MESSAGE: usize = 100;
const EVERY: u32 = 2;
/// Connections, and the requests of connection i: REQUESTS_BASE + i, so their last
/// requests fall at different offsets (sampled for some, not for others).
const CONNECTIONS: usize = 16;
const REQUESTS_BASE: usize = 3;

#[test]
fn the_count_of_sampled_turns_is_exact_and_returns_to_zero() {
    if !privileged_or_skip("the_count_of_sampled_turns_is_exact_and_returns_to_zero") {
        return;
    }
    let every = format!("1/{EVERY}");
    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder,
    } = loopback_recording("sampled-count", &["--sample-messages", every.as_str()]);
    let live = TracedLive::of_recorder(recorder.pid());

    let mut pairs = Vec::new();
    let mut last_sampled = 0;
    for i in 0..CONNECTIONS {
        let (mut client, mut server) = open_pair(&listener, port);
        let requests = REQUESTS_BASE + i;
        for _ in 0..requests {
            exchange_once(&mut client, &mut server, MESSAGE);
        }
        last_sampled += usize::from(last_request_sampled(&client, &server, requests));
        pairs.push((client, server));
    }
    assert!(
        last_sampled > 0 && last_sampled < CONNECTIONS,
        "the test needs connections that end in a sampled turn and ones that do not \
         ({last_sampled} of {CONNECTIONS} do)"
    );
    assert_eq!(
        live.read(),
        (2 * CONNECTIONS as u64, 2 * last_sampled as u64)
    );

    drop(pairs);
    let deadline = Instant::now() + Duration::from_secs(10);
    while live.read().0 != 0 {
        assert!(
            Instant::now() < deadline,
            "traced connections still counted 10 s after every one closed: {:?}",
            live.read()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(live.read(), (0, 0), "(traced connections, sampled turns)");
    recorder.stop().assert_exact_accounting();
}

/// The recorder's TRACED_LIVE map, found among the BPF maps its process holds.
struct TracedLive(Array<MapData, u64>);

impl TracedLive {
    fn of_recorder(pid: u32) -> TracedLive {
        let id = BpfObjects::held_by(pid)
            .maps
            .into_iter()
            .find(|&id| {
                MapInfo::from_id(id).is_ok_and(|info| info.name_as_str() == Some("TRACED_LIVE"))
            })
            .expect("the recorder holds a TRACED_LIVE map");
        let map = Map::from_map_data(MapData::from_id(id).expect("open TRACED_LIVE by id"))
            .expect("TRACED_LIVE as a map");
        TracedLive(Array::try_from(map).expect("TRACED_LIVE is an array of u64"))
    }

    /// (traced connections, connections in a sampled turn).
    fn read(&self) -> (u64, u64) {
        let at = |index| self.0.get(&index, 0).expect("read TRACED_LIVE");
        (at(0), at(1))
    }
}

fn open_pair(listener: &TcpListener, port: u16) -> (TcpStream, TcpStream) {
    let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

/// Whether the shared rule samples the last of `requests` requests of this connection.
fn last_request_sampled(client: &TcpStream, server: &TcpStream, requests: usize) -> bool {
    let (c, s) = (client.local_addr().unwrap(), server.local_addr().unwrap());
    let hash = conn_sample_hash(&mapped(c.ip()), c.port(), &mapped(s.ip()), s.port());
    message_sampled(hash, ((requests - 1) * MESSAGE) as u32, EVERY)
}
