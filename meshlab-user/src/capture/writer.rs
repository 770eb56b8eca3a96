//! Writing a capture: large buffered writes, no allocation per event (an event is its 8-byte
//! record header and the ring buffer's bytes, copied into the buffer).

use std::io::{self, BufWriter, Write};

use crate::schema::Record;

use super::{EVENT_SIZE, Meta, RECORD_HEADER_LEN, RecordKind, file_header};

/// Bytes buffered before a write(2): a few thousand events per system call.
const BUFFER_BYTES: usize = 1 << 20;

pub struct CaptureWriter<W: Write> {
    out: BufWriter<W>,
    /// Reused for the JSON of non-event records.
    json: Vec<u8>,
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the file header and the [`Meta`] record.
    pub fn new(out: W, meta: &Meta) -> io::Result<Self> {
        let mut w = Self {
            out: BufWriter::with_capacity(BUFFER_BYTES, out),
            json: Vec::new(),
        };
        w.out.write_all(&file_header())?;
        serde_json::to_writer(&mut w.json, meta)?;
        w.write_json_buffer(RecordKind::Meta)?;
        Ok(w)
    }

    /// One raw event: the first [`EVENT_SIZE`] bytes of a ring buffer record (the caller has
    /// checked that it holds at least that many).
    pub fn write_event(&mut self, event: &[u8]) -> io::Result<()> {
        let mut header = [0u8; RECORD_HEADER_LEN];
        header[..4].copy_from_slice(&(RecordKind::Event as u32).to_le_bytes());
        header[4..].copy_from_slice(&(EVENT_SIZE as u32).to_le_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(&event[..EVENT_SIZE])
    }

    /// A startup, clock, drops or summary record as the JSON of its NDJSON line.
    pub fn write_record(&mut self, record: &Record) -> io::Result<()> {
        let kind = match record {
            Record::Startup(_) => RecordKind::Startup,
            Record::Clock(_) => RecordKind::Clock,
            Record::Drops(_) => RecordKind::Drops,
            Record::Summary(_) => RecordKind::Summary,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a capture holds only events and startup, clock, drops and summary records",
                ));
            }
        };
        serde_json::to_writer(&mut self.json, record)?;
        self.write_json_buffer(kind)
    }

    fn write_json_buffer(&mut self, kind: RecordKind) -> io::Result<()> {
        let len = u32::try_from(self.json.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "record over 4 GiB"))?;
        self.out.write_all(&(kind as u32).to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(&self.json)?;
        self.json.clear();
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> io::Result<W> {
        self.out.into_inner().map_err(|e| e.into_error())
    }
}
