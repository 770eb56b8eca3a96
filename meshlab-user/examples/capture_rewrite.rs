//! The recorder's user-space output path without the ring buffer and the kernel: the events of
//! a capture written again, into a sink. For instruction counts per event, which (unlike the
//! time on this shared machine) are the same from run to run:
//!
//!     cargo build --release -p meshlab-user --example capture_rewrite
//!     valgrind --tool=callgrind --toggle-collect='*write_ring_record*' \
//!         target/release/examples/capture_rewrite CAPTURE 200000
//!     valgrind --tool=callgrind --toggle-collect='*encode_all*' \
//!         target/release/examples/capture_rewrite CAPTURE 200000 --encoder scalar
//!
//! The first counts what the recorder runs per ring record (`RecordingOutput::
//! write_ring_record`: the hook tally, the encoder the CPU has, the output buffer); the second
//! only the event encoder named (`scalar`, `ssse3` or `avx512`; valgrind runs no AVX-512, so
//! under it the first form uses SSSE3). The "Collected" count divided by the events is the
//! figure per event.

use meshlab_user::capture::compact::{Contexts, EVENT_SLOT, Simd};
use meshlab_user::capture::reader::CaptureReader;
use meshlab_user::capture::{EVENT_SIZE, RecordKind};
use meshlab_user::kernel::output::{OutputFormat, RecordingOutput};

/// A ring record's bytes: 8-byte aligned, as the ring buffer hands them over.
type RingEvent = [u64; EVENT_SIZE / 8];

fn bytes(ev: &RingEvent) -> &[u8; EVENT_SIZE] {
    // SAFETY: [u64; 17] is 136 initialized bytes, and u8 has no alignment requirement.
    unsafe { &*ev.as_ptr().cast::<[u8; EVENT_SIZE]>() }
}

fn read_events(
    path: &str,
    max: usize,
) -> anyhow::Result<(CaptureReader<impl std::io::BufRead>, Vec<RingEvent>)> {
    let mut reader = CaptureReader::open(path.as_ref())?;
    let mut events = Vec::new();
    while events.len() < max {
        let Some(raw) = reader.next_raw()? else { break };
        if raw.kind == RecordKind::Event {
            let mut ev = [0u64; EVENT_SIZE / 8];
            for (w, b) in ev.iter_mut().zip(raw.payload.chunks_exact(8)) {
                *w = u64::from_ne_bytes(b.try_into()?);
            }
            events.push(ev);
        }
    }
    Ok((reader, events))
}

/// Every event through one encoder, into a reused slot; returns the bytes the records took.
#[inline(never)]
fn encode_all(simd: Simd, events: &[RingEvent]) -> usize {
    let mut contexts = Contexts::with_simd(simd);
    let mut slot = [0u8; EVENT_SLOT];
    let mut total = 0;
    for ev in events {
        total += contexts.encode(RecordKind::Event as u8, bytes(ev), &mut slot);
    }
    total
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: capture_rewrite CAPTURE [MAX_EVENTS] [--encoder scalar|ssse3|avx512]";
    let path = args.get(1).ok_or_else(|| anyhow::anyhow!(usage))?;
    let max: usize = args.get(2).map_or(Ok(1_000_000), |s| s.parse())?;
    let encoder = match args.get(3).map(String::as_str) {
        None => None,
        Some("--encoder") => Some(match args.get(4).map(String::as_str) {
            Some("scalar") => Simd::None,
            Some("ssse3") => Simd::Ssse3,
            Some("avx512") => Simd::Avx512,
            _ => anyhow::bail!(usage),
        }),
        Some(_) => anyhow::bail!(usage),
    };
    let (reader, events) = read_events(path, max)?;
    if let Some(simd) = encoder {
        anyhow::ensure!(simd.available(), "this CPU cannot run the {simd:?} encoder");
        let total = encode_all(simd, &events);
        eprintln!(
            "{} events encoded ({simd:?}): {:.1} bytes per event record",
            events.len(),
            total as f64 / events.len() as f64
        );
        return Ok(());
    }
    let meta = reader.meta().clone();
    let mut out = RecordingOutput::new(
        OutputFormat::Capture,
        meta.node,
        meta.dev_names,
        Box::new(std::io::sink()),
    )?;
    for ev in &events {
        out.write_ring_record(bytes(ev))?;
    }
    out.flush()?;
    eprintln!(
        "{} events written ({:?} encoder)",
        events.len(),
        Simd::detect()
    );
    Ok(())
}
