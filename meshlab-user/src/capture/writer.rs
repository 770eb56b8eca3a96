//! Writing a capture (format version 2). The recorder's hot path: no allocation per event,
//! an event is encoded from the ring buffer's bytes straight into the output buffer
//! ([`super::compact`]), and the buffer goes out in one write(2) when it fills.

use std::io::{self, Write};

use crate::schema::Record;

use super::compact::{Contexts, EVENT_SLOT};
use super::{EVENT_SIZE, Meta, RecordKind, file_header, json_record_bytes};

/// Bytes buffered before a write(2): some ten thousand events per system call.
const BUFFER_BYTES: usize = 1 << 20;

pub struct CaptureWriter<W: Write> {
    /// Taken only by [`Self::into_inner`]; until then always there.
    out: Option<W>,
    /// [`BUFFER_BYTES`] plus room for one more event, so an event is encoded in place
    /// whenever the buffer is not full.
    buf: Box<[u8]>,
    used: usize,
    contexts: Contexts,
    /// Reused for the JSON of non-event records.
    json: Vec<u8>,
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the file header and the [`Meta`] record.
    pub fn new(out: W, meta: &Meta) -> io::Result<Self> {
        let mut w = Self {
            out: Some(out),
            buf: vec![0u8; BUFFER_BYTES + EVENT_SLOT].into_boxed_slice(),
            used: 0,
            contexts: Contexts::default(),
            json: Vec::new(),
        };
        w.append(&file_header())?;
        serde_json::to_writer(&mut w.json, meta)?;
        w.write_json_buffer(RecordKind::Meta)?;
        Ok(w)
    }

    /// One raw event: the first [`EVENT_SIZE`] bytes of a ring buffer record (the caller has
    /// checked that it holds at least that many).
    #[inline]
    pub fn write_event(&mut self, event: &[u8]) -> io::Result<()> {
        let event: &[u8; EVENT_SIZE] = event[..EVENT_SIZE].try_into().expect("EVENT_SIZE bytes");
        // used <= BUFFER_BYTES here (the buffer is written out once it passes that), so the
        // slot is inside the buffer.
        let slot: &mut [u8; EVENT_SLOT] = (&mut self.buf[self.used..self.used + EVENT_SLOT])
            .try_into()
            .expect("EVENT_SLOT bytes");
        self.used += self.contexts.encode(RecordKind::Event as u8, event, slot);
        if self.used >= BUFFER_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    /// A startup, clock, drops, summary or hot_hooks record as the JSON of its NDJSON line.
    pub fn write_record(&mut self, record: &Record) -> io::Result<()> {
        let kind = match record {
            Record::Startup(_) => RecordKind::Startup,
            Record::Clock(_) => RecordKind::Clock,
            Record::Drops(_) => RecordKind::Drops,
            Record::Summary(_) => RecordKind::Summary,
            Record::HotHooks(_) => RecordKind::HotHooks,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a capture holds only events and startup, clock, drops, summary and hot_hooks records",
                ));
            }
        };
        serde_json::to_writer(&mut self.json, record)?;
        self.write_json_buffer(kind)
    }

    fn write_json_buffer(&mut self, kind: RecordKind) -> io::Result<()> {
        let record = json_record_bytes(kind, &self.json)?;
        self.json.clear();
        self.append(&record)
    }

    /// Appends bytes to the buffer (writing it out first when they do not fit; a record
    /// larger than the buffer goes straight to the output).
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.used + bytes.len() > BUFFER_BYTES {
            self.write_out()?;
        }
        if bytes.len() > BUFFER_BYTES {
            return self.output().write_all(bytes);
        }
        self.buf[self.used..self.used + bytes.len()].copy_from_slice(bytes);
        self.used += bytes.len();
        Ok(())
    }

    /// Writes the buffer out: what is in it is whole records, or a record's first part whose
    /// rest follows in the next write (a crash in between leaves a prefix of the capture).
    fn write_out(&mut self) -> io::Result<()> {
        let used = std::mem::take(&mut self.used);
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        out.write_all(&self.buf[..used])
    }

    fn output(&mut self) -> &mut W {
        self.out
            .as_mut()
            .expect("the output is taken only by into_inner")
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.write_out()?;
        self.output().flush()
    }

    pub fn into_inner(mut self) -> io::Result<W> {
        self.write_out()?;
        Ok(self.out.take().expect("the output is taken only here"))
    }
}

/// A writer dropped without [`CaptureWriter::into_inner`] (the recording stopped on an error)
/// still writes out the events it buffered, up to a second of them: what was recorded is not
/// lost, as with the `BufWriter` this replaced.
impl<W: Write> Drop for CaptureWriter<W> {
    fn drop(&mut self) {
        let _ = self.write_out();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::reader::CaptureReader;

    /// Events still in the buffer when the writer is dropped (a recording stopped on an error)
    /// reach the output, and read back whole.
    #[test]
    fn a_dropped_writer_writes_out_its_buffered_events() {
        let mut out = Vec::new();
        let meta = Meta {
            node: "A".into(),
            dev_names: Default::default(),
        };
        {
            let mut w = CaptureWriter::new(&mut out, &meta).unwrap();
            let mut event = [0u8; EVENT_SIZE];
            for i in 0..3u8 {
                event[0] = i + 1;
                w.write_event(&event).unwrap();
            }
        }
        let mut r = CaptureReader::new("dropped.capture".into(), &out[..]).unwrap();
        assert_eq!(r.meta(), &meta);
        let mut events = Vec::new();
        while let Some(rec) = r.next_raw().unwrap() {
            if rec.kind == RecordKind::Event {
                events.push(rec.payload[0]);
            }
        }
        assert_eq!(events, [1, 2, 3]);
        assert_eq!(r.truncated_at(), None);
    }
}
