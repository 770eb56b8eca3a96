//! Recorder hot path without the kernel: decoding ring buffer records into NDJSON lines.
//! Prints events per second for a mix shaped like a real RPC recording, so the reader's
//! capacity can be compared with the event rate a workload produces (`cargo xtask bench decode`).

use std::collections::HashMap;
use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::time::Instant;

use meshlab_common::{EVENT_FLAG_TUPLE, Event, Hook};
use meshlab_user::decode::Decoder;

/// One request/response turn as one node records it (TX of the request, RX of the response).
const TURN: [Hook; 12] = [
    Hook::TcpSendmsg,
    Hook::NetDevQueue,
    Hook::NetDevStartXmit,
    Hook::NetDevXmit,
    Hook::SendReturn,
    Hook::NetifReceiveSkb,
    Hook::TcpProbe,
    Hook::SkDataReady,
    Hook::SchedWakeup,
    Hook::SchedSwitch,
    Hook::SkbCopyDatagram,
    Hook::RecvReturn,
];

fn events(n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    let mut established = Event {
        hook: Hook::SockEstablished as u16,
        cookie: 7,
        seq: 1000,
        aux: 5000,
        ..Event::default()
    };
    established.flags = EVENT_FLAG_TUPLE;
    out.push(established);
    let mut seq = 1000u32;
    while out.len() < n {
        for hook in TURN {
            out.push(Event {
                ts_ns: out.len() as u64 * 1000,
                cookie: 7,
                skb: 0xffff_8880_0000_0000 + out.len() as u64,
                hook: hook as u16,
                seq,
                len: 64,
                pid: 100,
                tid: 101,
                cpu: 1,
                queue: 0,
                ifindex: 2,
                flags: EVENT_FLAG_TUPLE,
                saddr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1],
                daddr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
                sport: 40000,
                dport: 9000,
                ..Event::default()
            });
        }
        seq = seq.wrapping_add(64);
    }
    out
}

fn main() {
    const N: usize = 1_000_000;
    const ROUNDS: usize = 5;
    let input = events(N);
    let mut rates = Vec::new();
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let mut decoder = Decoder::new("A".into(), HashMap::from([(2, "eth0".to_owned())]));
        let mut sink = CountingSink(0);
        let start = Instant::now();
        {
            let mut out = BufWriter::with_capacity(1 << 18, &mut sink);
            for ev in &input {
                decoder.write_event(black_box(ev), &mut out).unwrap();
            }
            out.flush().unwrap();
        }
        rates.push(N as f64 / start.elapsed().as_secs_f64());
        bytes = sink.0;
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "decode: {N} events x {ROUNDS} rounds, median {:.0} events/s (min {:.0}, max {:.0}), {:.0} bytes/event",
        rates[ROUNDS / 2],
        rates[0],
        rates[ROUNDS - 1],
        bytes as f64 / N as f64
    );
}

/// Counts bytes like a file would receive them, without disk noise.
struct CountingSink(usize);

impl Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
