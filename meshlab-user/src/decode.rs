//! Turning raw ring buffer records into `kernel` NDJSON lines: stream offsets from the
//! connection's sequence bases, retransmission marks, device names. No per-event allocation:
//! lines are serialized from a borrowed view ([`KernelLine`]) straight into the buffered
//! writer, and the merge reduces a capture's events from the same view.

use std::collections::HashMap;
use std::io::Write;

use crate::incoming::{Addr, KernelLine, LineAddr};
use crate::schema::Direction;
use meshlab_common::{
    EVENT_FLAG_ACTIVE_OPEN, EVENT_FLAG_TUPLE, EVENT_FLAG_UNIX, Event, HOOK_COUNT, Hook,
};

/// Per-connection decoding state, keyed by cookie.
#[derive(Debug, Default)]
struct ConnState {
    snd_base: u32,
    rcv_base: u32,
    /// Highest stream offset seen per direction, to unwrap 32-bit sequence numbers.
    tx_hi: u64,
    rx_hi: u64,
    /// Highest segment end seen per skb hook, to mark retransmissions.
    seg_end: [u64; HOOK_COUNT as usize],
}

/// Byte counters of one unix socket (keyed by its kernel address).
#[derive(Debug, Default)]
struct UnixState {
    peer: u64,
    sent: u64,
    received: u64,
}

/// Events received per hook id, and records whose hook id this build does not know.
#[derive(Clone, Debug)]
pub struct HookTally {
    pub received: [u64; HOOK_COUNT as usize],
    pub unknown: u64,
}

impl Default for HookTally {
    fn default() -> Self {
        Self {
            received: [0; HOOK_COUNT as usize],
            unknown: 0,
        }
    }
}

impl HookTally {
    /// Counts one event; its hook, or `None` (counted as unknown) for an unknown id.
    pub fn count(&mut self, hook_id: u16) -> Option<Hook> {
        match Hook::from_u16(hook_id) {
            Some(hook) => {
                self.received[usize::from(hook_id)] += 1;
                Some(hook)
            }
            None => {
                self.unknown += 1;
                None
            }
        }
    }
}

/// The decoder's per-event lookups: foldhash, several times cheaper than SipHash (keys are
/// kernel values of the node being decoded; the maps are never iterated).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Decodes events of one node; counts what it received per hook.
pub struct Decoder {
    node: String,
    conns: FastMap<u64, ConnState>,
    unix: FastMap<u64, UnixState>,
    dev_names: FastMap<u32, String>,
    tally: HookTally,
}

impl Decoder {
    pub fn new(node: String, dev_names: HashMap<u32, String>) -> Self {
        Self {
            node,
            conns: FastMap::default(),
            unix: FastMap::default(),
            dev_names: dev_names.into_iter().collect(),
            tally: HookTally::default(),
        }
    }

    /// Events received per hook (index = hook id).
    pub fn received(&self) -> &[u64; HOOK_COUNT as usize] {
        &self.tally.received
    }

    /// Records with a hook id this build does not know (a mismatched object; should be 0).
    pub fn unknown_hooks(&self) -> u64 {
        self.tally.unknown
    }

    /// Decodes one ring buffer record and writes its NDJSON line.
    pub fn write_event(&mut self, ev: &Event, out: &mut impl Write) -> std::io::Result<()> {
        let Some(hook) = self.tally.count(ev.hook) else {
            return Ok(());
        };
        let line = self.line(hook, ev);
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")
    }

    /// Counts one raw event; its hook, or `None` for a hook id this build does not know (the
    /// event is then skipped, as its NDJSON line would be).
    pub fn count(&mut self, ev: &Event) -> Option<Hook> {
        self.tally.count(ev.hook)
    }

    /// The borrowed line of one counted event (its hook from [`Self::count`]): what its
    /// NDJSON line holds, without JSON and without an owned `KernelEvent` (the merge reduces
    /// a capture's events from this).
    pub fn line(&mut self, hook: Hook, ev: &Event) -> KernelLine<'_> {
        line_of(
            &self.node,
            &mut self.conns,
            &mut self.unix,
            &self.dev_names,
            hook,
            ev,
        )
    }
}

/// The borrowed line of one event, from the decoder's parts.
fn line_of<'a>(
    node: &'a str,
    conns: &mut FastMap<u64, ConnState>,
    unix: &mut FastMap<u64, UnixState>,
    dev_names: &'a FastMap<u32, String>,
    hook: Hook,
    ev: &Event,
) -> KernelLine<'a> {
    let mut line = KernelLine::common(node, hook, ev, dev_names);
    if ev.flags & EVENT_FLAG_UNIX != 0 {
        fill_unix_position(unix, hook, ev, &mut line);
        return line;
    }
    if ev.flags & EVENT_FLAG_TUPLE != 0 {
        line.saddr = Some(LineAddr::Raw(Addr(ev.saddr)));
        line.sport = Some(ev.sport);
        line.daddr = Some(LineAddr::Raw(Addr(ev.daddr)));
        line.dport = Some(ev.dport);
    }
    if ev.irq_entry_ns != 0 || matches!(hook, Hook::IrqEntry | Hook::IrqExit) {
        line.irq = Some(ev.irq);
    }
    fill_hook_fields(conns, hook, ev, &mut line);
    line
}

/// The fields only some hooks set (docs/probe-points.md); exhaustive, so a new hook must say
/// what it carries.
fn fill_hook_fields(
    conns: &mut FastMap<u64, ConnState>,
    hook: Hook,
    ev: &Event,
    line: &mut KernelLine<'_>,
) {
    match hook {
        Hook::SockEstablished => {
            line.seq = Some(ev.seq);
            line.aux = Some(ev.aux);
            line.active = Some(ev.flags & EVENT_FLAG_ACTIVE_OPEN != 0);
            conns.insert(
                ev.cookie,
                ConnState {
                    snd_base: ev.seq,
                    rcv_base: ev.aux as u32,
                    ..ConnState::default()
                },
            );
        }
        Hook::SockClosed => {}
        Hook::TcpSendmsg
        | Hook::SendReturn
        | Hook::NetDevQueue
        | Hook::NetDevStartXmit
        | Hook::NetDevXmit
        | Hook::TxComplete
        | Hook::TxTstampSched
        | Hook::TxTstampSw
        | Hook::TxTstampAck
        | Hook::TcpProbe
        | Hook::SkDataReady
        | Hook::SkbCopyDatagram
        | Hook::RecvReturn => fill_stream_position(conns, hook, ev, line),
        Hook::NetifReceiveSkb => {
            // `record --hw-timestamps`: the NIC clock's time of the frame's arrival.
            line.aux = (ev.aux != 0).then_some(ev.aux);
            fill_stream_position(conns, hook, ev, line);
        }
        Hook::TxTstampHw => {
            // The NIC clock's time of the send; ts_ns is when the kernel learnt it.
            line.aux = Some(ev.aux);
            fill_stream_position(conns, hook, ev, line);
        }
        Hook::SchedWakeup => line.aux = Some(ev.aux),
        Hook::SchedSwitch => {
            line.value = Some(i64::from(ev.value));
            if ev.value == 0 {
                line.aux = Some(ev.aux);
            }
        }
        Hook::IrqEntry
        | Hook::IrqExit
        | Hook::SoftirqRaise
        | Hook::SoftirqEntry
        | Hook::SoftirqExit => {
            line.value = Some(i64::from(ev.value));
        }
        Hook::NapiPoll => {
            line.value = Some(i64::from(ev.value));
            line.aux = Some(ev.aux);
        }
    }
}

/// Direction, raw sequence, length and (when the connection's bases are known) stream offset
/// and retransmission mark of a TX/RX event.
fn fill_stream_position(
    conns: &mut FastMap<u64, ConnState>,
    hook: Hook,
    ev: &Event,
    line: &mut KernelLine<'_>,
) {
    let Some(dir) = hook.direction() else {
        return;
    };
    line.dir = Some(dir);
    line.seq = Some(ev.seq);
    if !hook.is_pointer() {
        line.len = Some(ev.len);
    }
    if matches!(hook, Hook::SendReturn | Hook::RecvReturn | Hook::NetDevXmit) {
        line.value = Some(i64::from(ev.value));
    }
    let Some(conn) = conns.get_mut(&ev.cookie) else {
        // Connection established before the recording started: no bases, no offsets.
        return;
    };
    let offset = match dir {
        Direction::Tx => unwrap_offset(ev.seq, conn.snd_base, &mut conn.tx_hi),
        Direction::Rx => unwrap_offset(ev.seq, conn.rcv_base, &mut conn.rx_hi),
    };
    line.offset = Some(offset);
    if hook.is_skb_stage() {
        let end = offset + u64::from(ev.len);
        let seen = &mut conn.seg_end[usize::from(ev.hook)];
        line.retrans = end <= *seen;
        *seen = (*seen).max(end);
    }
}

/// Unix sockets: offsets count bytes per socket since the recording started (or since the
/// socket address was first seen with this peer: a new peer means a reused address).
fn fill_unix_position(
    unix: &mut FastMap<u64, UnixState>,
    hook: Hook,
    ev: &Event,
    line: &mut KernelLine<'_>,
) {
    line.skb = None;
    line.unix_sock = Some(ev.skb);
    line.unix_peer = (ev.aux != 0).then_some(ev.aux);
    let state = unix.entry(ev.skb).or_default();
    if state.peer != ev.aux {
        *state = UnixState {
            peer: ev.aux,
            ..UnixState::default()
        };
    }
    let bytes = u64::try_from(ev.value).unwrap_or(0);
    let counter = match hook {
        Hook::SendReturn => {
            line.dir = Some(Direction::Tx);
            &mut state.sent
        }
        Hook::RecvReturn => {
            line.dir = Some(Direction::Rx);
            &mut state.received
        }
        _ => {
            line.dir = Some(Direction::Rx);
            return;
        }
    };
    line.value = Some(i64::from(ev.value));
    line.offset = Some(*counter);
    line.len = Some(bytes as u32);
    *counter += bytes;
}

/// Maps a 32-bit sequence number to a 64-bit stream offset: the candidate nearest to the
/// highest offset seen so far, so streams longer than 4 GiB keep counting up.
pub fn unwrap_offset(seq: u32, base: u32, hi: &mut u64) -> u64 {
    let rel = seq.wrapping_sub(base);
    let delta = i64::from(rel.wrapping_sub(*hi as u32) as i32);
    let offset = (*hi as i64 + delta).max(0) as u64;
    *hi = (*hi).max(offset);
    offset
}

impl<'a> KernelLine<'a> {
    /// The fields every event has; hook-specific ones unset.
    fn common(
        node: &'a str,
        hook: Hook,
        ev: &Event,
        dev_names: &'a FastMap<u32, String>,
    ) -> KernelLine<'a> {
        KernelLine {
            node,
            hook,
            ts_ns: ev.ts_ns,
            cpu: ev.cpu,
            pid: ev.pid,
            tid: ev.tid,
            cookie: (ev.cookie != 0).then_some(ev.cookie),
            skb: (ev.skb != 0).then_some(ev.skb),
            seq: None,
            len: None,
            offset: None,
            dir: None,
            ifindex: (ev.ifindex != 0).then_some(ev.ifindex),
            dev: dev_names.get(&ev.ifindex).map(String::as_str),
            queue: (ev.queue != u32::MAX).then_some(ev.queue),
            value: None,
            aux: None,
            saddr: None,
            sport: None,
            daddr: None,
            dport: None,
            irq: None,
            irq_entry_ns: (ev.irq_entry_ns != 0).then_some(ev.irq_entry_ns),
            softirq_raise_ns: (ev.softirq_raise_ns != 0).then_some(ev.softirq_raise_ns),
            softirq_entry_ns: (ev.softirq_entry_ns != 0).then_some(ev.softirq_entry_ns),
            retrans: false,
            active: None,
            unix_sock: None,
            unix_peer: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{KernelEvent, Record};

    fn v4(a: [u8; 4]) -> [u8; 16] {
        [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
        ]
    }

    fn event(hook: Hook, seq: u32, len: u32) -> Event {
        Event {
            ts_ns: 1_000,
            cookie: 42,
            skb: 0xffff_8880_0000_1000,
            hook: hook as u16,
            seq,
            len,
            pid: 7,
            tid: 8,
            cpu: 1,
            queue: u32::MAX,
            flags: EVENT_FLAG_TUPLE,
            saddr: v4([10, 0, 0, 1]),
            daddr: v4([10, 0, 0, 2]),
            sport: 40000,
            dport: 8080,
            ..Event::default()
        }
    }

    /// Every hook through the decoder with every field of the raw event set: each line parses
    /// back (unknown fields denied) as its hook, stream hooks carry direction and offset in
    /// their hook's direction, pointer hooks no length, and hooks without a stream position none.
    #[test]
    fn every_hook_decodes_with_all_fields_set() {
        let mut d = Decoder::new("A".into(), HashMap::from([(3, "eth0".to_owned())]));
        let mut est = event(Hook::SockEstablished, 1_000_001, 0);
        est.aux = 5_000_001;
        decode(&mut d, &est);
        for hook in Hook::ALL {
            let ev = Event {
                ifindex: 3,
                queue: 2,
                value: 64,
                aux: 9,
                irq: 30,
                irq_entry_ns: 900,
                softirq_raise_ns: 910,
                softirq_entry_ns: 920,
                flags: EVENT_FLAG_TUPLE | EVENT_FLAG_ACTIVE_OPEN,
                ..event(hook, 1_000_101, 100)
            };
            let k = decode(&mut d, &ev);
            assert_eq!(k.hook, hook);
            assert_eq!(
                (k.dev.as_deref(), k.queue),
                (Some("eth0"), Some(2)),
                "{hook:?}"
            );
            assert_eq!(k.irq_entry_ns, Some(900), "{hook:?}");
            assert_eq!(k.dir, hook.direction(), "{hook:?}");
            let stream = hook.direction().is_some();
            assert_eq!(k.offset.is_some(), stream, "{hook:?}: {k:?}");
            if stream {
                assert_eq!(k.len.is_none(), hook.is_pointer(), "{hook:?}: {k:?}");
            }
        }
        assert_eq!(d.unknown_hooks(), 0);
        assert!(d.received().iter().all(|&n| n >= 1), "{:?}", d.received());
    }

    fn decode(d: &mut Decoder, ev: &Event) -> KernelEvent {
        let mut out = Vec::new();
        d.write_event(ev, &mut out).unwrap();
        match serde_json::from_slice::<Record>(&out)
            .expect("line parses with unknown fields denied")
        {
            Record::Kernel(k) => k,
            other => panic!("not a kernel record: {other:?}"),
        }
    }

    #[test]
    fn offsets_come_from_the_established_bases_and_retransmissions_are_marked() {
        let mut d = Decoder::new("A".into(), HashMap::from([(3, "veth-a".to_owned())]));
        let mut est = event(Hook::SockEstablished, 1_000_001, 0);
        est.aux = 5_000_001;
        est.flags |= EVENT_FLAG_ACTIVE_OPEN;
        let k = decode(&mut d, &est);
        assert_eq!(
            (k.seq, k.aux, k.active),
            (Some(1_000_001), Some(5_000_001), Some(true))
        );

        let mut q = event(Hook::NetDevQueue, 1_000_001 + 64, 100);
        q.ifindex = 3;
        let k = decode(&mut d, &q);
        assert_eq!(
            (k.offset, k.len, k.dir, k.retrans),
            (Some(64), Some(100), Some(Direction::Tx), false)
        );
        assert_eq!(k.dev.as_deref(), Some("veth-a"));
        assert_eq!(
            (k.saddr.as_deref(), k.dport),
            (Some("10.0.0.1"), Some(8080))
        );
        // The same range again on the same hook is a retransmission.
        assert!(decode(&mut d, &q).retrans);

        let rx = decode(&mut d, &event(Hook::NetifReceiveSkb, 5_000_001 + 10, 20));
        assert_eq!((rx.offset, rx.dir), (Some(10), Some(Direction::Rx)));
        assert_eq!(d.received()[Hook::NetDevQueue as usize], 2);
    }

    #[test]
    fn unix_sockets_count_bytes_per_socket_and_reset_on_a_new_peer() {
        let mut d = Decoder::new("A".into(), HashMap::new());
        let unix = |hook: Hook, sk: u64, peer: u64, bytes: i32| Event {
            hook: hook as u16,
            skb: sk,
            aux: peer,
            value: bytes,
            flags: meshlab_common::EVENT_FLAG_UNIX,
            queue: u32::MAX,
            ..Event::default()
        };
        let a = decode(&mut d, &unix(Hook::SendReturn, 0x1000, 0x2000, 100));
        assert_eq!(
            (a.unix_sock, a.unix_peer, a.offset, a.len),
            (Some(0x1000), Some(0x2000), Some(0), Some(100))
        );
        assert_eq!((a.skb, a.cookie, a.dir), (None, None, Some(Direction::Tx)));
        let b = decode(&mut d, &unix(Hook::SendReturn, 0x1000, 0x2000, 50));
        assert_eq!(b.offset, Some(100));
        let r = decode(&mut d, &unix(Hook::RecvReturn, 0x2000, 0x1000, 150));
        assert_eq!(
            (r.offset, r.len, r.dir),
            (Some(0), Some(150), Some(Direction::Rx))
        );
        // The same address with another peer is a new connection: counting restarts.
        let c = decode(&mut d, &unix(Hook::SendReturn, 0x1000, 0x3000, 10));
        assert_eq!(c.offset, Some(0));
    }

    #[test]
    fn sequence_wrap_keeps_offsets_growing() {
        let mut hi = 0;
        let base = u32::MAX - 10;
        assert_eq!(unwrap_offset(base.wrapping_add(5), base, &mut hi), 5);
        assert_eq!(unwrap_offset(base.wrapping_add(20), base, &mut hi), 20);
        // Past 4 GiB of stream the offset keeps growing instead of wrapping to 0.
        let mut hi = u64::from(u32::MAX) - 100;
        let off = unwrap_offset(base.wrapping_add(u32::MAX).wrapping_add(50), base, &mut hi);
        assert_eq!(off, u64::from(u32::MAX) + 50);
        // A late (retransmitted) segment just below the high mark stays below it.
        assert_eq!(
            unwrap_offset(base.wrapping_add(u32::MAX).wrapping_sub(10), base, &mut hi),
            u64::from(u32::MAX) - 10
        );
    }

    #[test]
    fn unknown_connection_has_no_offset_and_unknown_hook_is_counted() {
        let mut d = Decoder::new("B".into(), HashMap::new());
        let k = decode(&mut d, &event(Hook::TcpProbe, 123, 10));
        assert_eq!((k.offset, k.seq), (None, Some(123)));
        let mut bad = event(Hook::TcpProbe, 1, 1);
        bad.hook = 999;
        let mut out = Vec::new();
        d.write_event(&bad, &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(d.unknown_hooks(), 1);
    }

    /// Over a stream of events (devices set and unset, a tuple, unix sockets, an unknown hook
    /// between them), each decoded line made owned is the record its NDJSON line parses to,
    /// and the line of that parsed record serializes to the same bytes.
    #[test]
    fn decoded_lines_are_what_their_ndjson_lines_parse_to() {
        let devs = HashMap::from([(3, "eth0".to_owned()), (4, "veth-long-name".to_owned())]);
        let mut decoded = Decoder::new("A".into(), devs.clone());
        let mut by_line = Decoder::new("A".into(), devs);
        let mut est = event(Hook::SockEstablished, 1_000_001, 0);
        est.aux = 5_000_001;
        let mut events = vec![est];
        for (i, hook) in Hook::ALL
            .into_iter()
            .cycle()
            .take(3 * Hook::ALL.len())
            .enumerate()
        {
            let mut ev = event(hook, 1_000_101 + i as u32, 100);
            ev.ifindex = [0, 3, 4, 9][i % 4];
            ev.flags = [0, EVENT_FLAG_TUPLE, meshlab_common::EVENT_FLAG_UNIX][i % 3];
            // IPv4-mapped and IPv6 addresses, in turn.
            ev.saddr = [v4([10, 0, 0, 1]), v4([10, 0, 0, i as u8]), [i as u8; 16]][i / 3 % 3];
            ev.daddr = [v4([10, 0, 0, 2]), [7; 16], v4([192, 168, 1, i as u8])][i % 2];
            ev.hook = if i % 7 == 6 { 999 } else { ev.hook };
            events.push(ev);
        }
        for ev in &events {
            let mut line = Vec::new();
            by_line.write_event(ev, &mut line).unwrap();
            let hook = decoded.count(ev);
            assert_eq!(hook.is_some(), !line.is_empty(), "{ev:?}");
            let Some(hook) = hook else { continue };
            let owned = decoded.line(hook, ev).to_event();
            let Record::Kernel(parsed) = serde_json::from_slice::<Record>(&line).unwrap() else {
                panic!("not a kernel line");
            };
            assert_eq!(owned, parsed);
            let again = serde_json::to_vec(&KernelLine::of(&parsed)).unwrap();
            assert_eq!(again, line[..line.len() - 1]);
        }
        assert_eq!(decoded.unknown_hooks(), by_line.unknown_hooks());
        assert!(decoded.unknown_hooks() > 0);
    }
}
