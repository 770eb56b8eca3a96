//! Where a recording goes: a binary capture (default; events copied as the ring gives them)
//! or NDJSON lines (`record --format ndjson`; events decoded as they arrive). Both take the
//! same ring buffer records and the same non-event records, so `meshlab export` of the capture
//! equals the NDJSON output byte for byte (tests/capture_export.rs).

use std::collections::HashMap;
use std::io::{BufWriter, Write};

use meshlab_common::{Event, HOOK_COUNT};

use crate::capture::Meta;
use crate::capture::writer::CaptureWriter;
use crate::decode::{Decoder, HookTally};
use crate::schema::Record;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Binary capture (docs/capture-format.md); `meshlab export` turns it into NDJSON.
    #[default]
    Capture,
    /// NDJSON lines (docs/schema.md), decoded while recording (costs more CPU per event).
    Ndjson,
}

type Sink = Box<dyn Write + Send>;

pub enum RecordingOutput {
    Capture {
        writer: CaptureWriter<Sink>,
        tally: HookTally,
    },
    Ndjson {
        decoder: Decoder,
        out: BufWriter<Sink>,
    },
}

/// Offset of the hook id inside a raw event: counting needs only these two bytes.
const HOOK_OFFSET: usize = std::mem::offset_of!(Event, hook);

impl RecordingOutput {
    pub fn new(
        format: OutputFormat,
        node: String,
        dev_names: HashMap<u32, String>,
        out: Sink,
    ) -> std::io::Result<Self> {
        Ok(match format {
            OutputFormat::Capture => RecordingOutput::Capture {
                writer: CaptureWriter::new(out, &Meta { node, dev_names })?,
                tally: HookTally::default(),
            },
            OutputFormat::Ndjson => RecordingOutput::Ndjson {
                decoder: Decoder::new(node, dev_names),
                out: BufWriter::with_capacity(1 << 18, out),
            },
        })
    }

    /// One ring buffer record (an [`Event`], possibly followed by padding).
    pub fn write_ring_record(&mut self, item: &[u8]) -> anyhow::Result<()> {
        if item.len() < std::mem::size_of::<Event>() {
            anyhow::bail!(
                "ring buffer record of {} bytes, expected {}",
                item.len(),
                std::mem::size_of::<Event>()
            );
        }
        match self {
            RecordingOutput::Capture { writer, tally } => {
                let hook = u16::from_ne_bytes([item[HOOK_OFFSET], item[HOOK_OFFSET + 1]]);
                // Unknown hooks are kept in the capture (export skips them, like NDJSON).
                tally.count(hook);
                writer.write_event(item)?;
            }
            RecordingOutput::Ndjson { decoder, out } => {
                // SAFETY: the record holds at least size_of::<Event>() bytes written by the
                // kernel program as an Event; read_unaligned makes no alignment assumption.
                let ev: Event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                decoder.write_event(&ev, out)?;
            }
        }
        Ok(())
    }

    /// A startup, clock, drops or summary record.
    pub fn write_record(&mut self, record: &Record) -> std::io::Result<()> {
        match self {
            RecordingOutput::Capture { writer, .. } => writer.write_record(record),
            RecordingOutput::Ndjson { out, .. } => {
                serde_json::to_writer(&mut *out, record)?;
                out.write_all(b"\n")
            }
        }
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        match self {
            RecordingOutput::Capture { writer, .. } => writer.flush(),
            RecordingOutput::Ndjson { out, .. } => out.flush(),
        }
    }

    /// Events received per hook id.
    /// Events received so far, all hooks.
    pub fn received_total(&self) -> u64 {
        self.received().iter().sum()
    }

    pub fn received(&self) -> &[u64; HOOK_COUNT as usize] {
        match self {
            RecordingOutput::Capture { tally, .. } => &tally.received,
            RecordingOutput::Ndjson { decoder, .. } => decoder.received(),
        }
    }

    /// Records whose hook id this build does not know (a mismatched object; should be 0).
    pub fn unknown_hooks(&self) -> u64 {
        match self {
            RecordingOutput::Capture { tally, .. } => tally.unknown,
            RecordingOutput::Ndjson { decoder, .. } => decoder.unknown_hooks(),
        }
    }
}
