//! Turning kernel NDJSON back into the raw events a recorder would have received, so the
//! synthetic recordings of the merge tests (and of `cargo xtask bench merge`, through
//! examples/capture_from_ndjson.rs) exist as binary captures too. The inverse of
//! `meshlab_user::decode::Decoder` for the fields recordings carry.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;

use meshlab_common::{EVENT_FLAG_ACTIVE_OPEN, EVENT_FLAG_TUPLE, EVENT_FLAG_UNIX, Event, Hook};
use meshlab_user::kernel::output::{OutputFormat, RecordingOutput};
use meshlab_user::ndjson::RecordReader;
use meshlab_user::schema::{Direction, KernelEvent, Record};

/// Device names synthetic and test recordings use, with the interface index they get.
pub const DEVICES: [(u32, &str); 3] = [(1, "lo"), (2, "eth0"), (3, "veth0")];

/// The bytes of one event as the ring buffer hands them over.
pub fn event_bytes(ev: &Event) -> &[u8] {
    // SAFETY: Event is repr(C), made of integers, without implicit padding (asserted in
    // meshlab-common), so all of its bytes are initialized.
    unsafe { std::slice::from_raw_parts((ev as *const Event).cast(), std::mem::size_of::<Event>()) }
}

/// Writes `input` (a kernel NDJSON recording) as a binary capture; returns the events.
pub fn ndjson_to_capture(input: &Path, output: &Path) -> anyhow::Result<u64> {
    let out = std::fs::File::create(output)?;
    let mut records = RecordReader::open(input)?;
    let node = match records.next() {
        Some(Ok(Record::Startup(s))) => s.node.clone(),
        other => anyhow::bail!(
            "{}: first record is not startup: {other:?}",
            input.display()
        ),
    };
    let mut reader = RecordReader::open(input)?;
    let dev_names: HashMap<u32, String> =
        DEVICES.iter().map(|(i, n)| (*i, (*n).to_owned())).collect();
    let mut capture = RecordingOutput::new(OutputFormat::Capture, node, dev_names, Box::new(out))?;
    let mut encoder = Encoder::default();
    let mut events = 0;
    for record in &mut reader {
        match record? {
            Record::Kernel(k) => {
                let ev = encoder
                    .encode(&k)
                    .map_err(|e| anyhow::anyhow!("{}:{}: {e}", input.display(), events))?;
                capture.write_ring_record(event_bytes(&ev))?;
                events += 1;
            }
            other => capture.write_record(&other)?,
        }
    }
    capture.flush()?;
    Ok(events)
}

/// Sequence bases per connection, to turn stream offsets back into sequence numbers.
#[derive(Default)]
pub struct Encoder {
    bases: HashMap<u64, (u32, u32)>,
}

impl Encoder {
    pub fn encode(&mut self, k: &KernelEvent) -> Result<Event, String> {
        let hook = &k.hook;
        let mut ev = Event {
            ts_ns: k.ts_ns,
            cookie: k.cookie.unwrap_or(0),
            skb: k.skb.or(k.unix_sock).unwrap_or(0),
            irq_entry_ns: k.irq_entry_ns.unwrap_or(0),
            softirq_raise_ns: k.softirq_raise_ns.unwrap_or(0),
            softirq_entry_ns: k.softirq_entry_ns.unwrap_or(0),
            aux: k.aux.or(k.unix_peer).unwrap_or(0),
            pid: k.pid,
            tid: k.tid,
            seq: k.seq.unwrap_or(0),
            len: k.len.unwrap_or(0),
            ifindex: self.ifindex(k)?,
            value: k.value.unwrap_or(0) as i32,
            hook: *hook as u16,
            cpu: k.cpu,
            irq: k.irq.unwrap_or(0),
            queue: k.queue.unwrap_or(u32::MAX),
            ..Event::default()
        };
        if let (Some(s), Some(d)) = (&k.saddr, &k.daddr) {
            ev.saddr = addr(s)?;
            ev.daddr = addr(d)?;
            ev.sport = k.sport.unwrap_or(0);
            ev.dport = k.dport.unwrap_or(0);
            ev.flags |= EVENT_FLAG_TUPLE;
        }
        if k.active == Some(true) {
            ev.flags |= EVENT_FLAG_ACTIVE_OPEN;
        }
        if k.unix_sock.is_some() {
            ev.flags |= EVENT_FLAG_UNIX;
            ev.value = k.len.unwrap_or(0) as i32;
        } else if *hook == Hook::SockEstablished {
            self.bases
                .insert(ev.cookie, (ev.seq, k.aux.unwrap_or(0) as u32));
        } else if let (Some(offset), Some(dir)) = (k.offset, k.dir) {
            let (snd, rcv) = self
                .bases
                .get(&ev.cookie)
                .ok_or_else(|| format!("offset without sock_established of {}", ev.cookie))?;
            let base = if dir == Direction::Tx { *snd } else { *rcv };
            ev.seq = base.wrapping_add(offset as u32);
        }
        Ok(ev)
    }

    fn ifindex(&self, k: &KernelEvent) -> Result<u32, String> {
        match &k.dev {
            None => Ok(k.ifindex.unwrap_or(0)),
            Some(dev) => DEVICES
                .iter()
                .find(|(_, n)| n == dev)
                .map(|(i, _)| *i)
                .ok_or_else(|| format!("device {dev} is not in DEVICES")),
        }
    }
}

fn addr(text: &str) -> Result<[u8; 16], String> {
    match text.parse::<IpAddr>().map_err(|e| format!("{text}: {e}"))? {
        IpAddr::V4(v4) => Ok(v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => Ok(v6.octets()),
    }
}

/// A `Write` whose bytes stay readable after it was boxed away.
#[derive(Clone, Default)]
pub struct SharedBuf(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedBuf {
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
