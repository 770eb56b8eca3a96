//! Reading a capture record by record. A record cut short at the end of the file (a recorder
//! that crashed or was killed mid-write) ends the capture; everything before it is valid.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use meshlab_common::Event;

use super::compact::{self, Contexts, EVENT_HEADER_LEN, EVENT_RECORD_MAX};
use super::{
    CaptureError, EVENT_SIZE, FILE_HEADER_LEN, FORMAT_VERSION_1, MAX_PAYLOAD, Meta,
    RECORD_HEADER_LEN, RecordKind, V1_RECORD_HEADER_LEN, check_file_header,
};

/// Bytes read per read(2).
const BUFFER_BYTES: usize = 1 << 20;

/// One record as stored: its kind, where it starts, its number (meta = 0) and its payload.
#[derive(Debug)]
pub struct RawRecord<'a> {
    pub kind: RecordKind,
    pub offset: u64,
    pub number: u64,
    pub payload: &'a [u8],
}

impl RawRecord<'_> {
    /// The raw event of an [`RecordKind::Event`] record (the reader decodes every event
    /// record into its [`EVENT_SIZE`] raw bytes).
    pub fn event(&self) -> Event {
        debug_assert_eq!(self.payload.len(), EVENT_SIZE);
        // SAFETY: the reader only yields Event payloads of exactly EVENT_SIZE bytes, and Event
        // is a repr(C) struct of integers, valid for any bit pattern; read_unaligned makes no
        // alignment assumption about the buffer.
        unsafe { std::ptr::read_unaligned(self.payload.as_ptr().cast()) }
    }
}

pub struct CaptureReader<R> {
    file: PathBuf,
    input: R,
    /// The file's format version: 1 (raw events) or 2 (compact events).
    version: u32,
    offset: u64,
    /// Number of the next record: the meta record is 0, so record N is line N of the export.
    next_number: u64,
    payload: Vec<u8>,
    /// Version 2: the previous event of every context, and a compact event's changed words.
    contexts: Contexts,
    words: Vec<u8>,
    meta: Meta,
    /// Byte offset of an incomplete last record, once the reader has reached it.
    truncated_at: Option<u64>,
    /// False: events are not returned; version 2 events are read past, not decoded.
    decode_events: bool,
}

impl CaptureReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let f = File::open(path).map_err(|source| CaptureError::Open {
            file: path.into(),
            source,
        })?;
        Self::new(path.into(), BufReader::with_capacity(BUFFER_BYTES, f))
    }
}

impl<R: BufRead> CaptureReader<R> {
    /// Checks the file header and reads the [`Meta`] record.
    pub fn new(file: PathBuf, mut input: R) -> Result<Self, CaptureError> {
        let mut header = [0u8; FILE_HEADER_LEN];
        let got = read_full(&mut input, &mut header).map_err(|source| CaptureError::Read {
            file: file.clone(),
            offset: 0,
            source,
        })?;
        let version = check_file_header(&file, &header[..got])?;
        let mut reader = Self {
            file,
            input,
            version,
            offset: FILE_HEADER_LEN as u64,
            next_number: 0,
            payload: Vec::with_capacity(EVENT_SIZE),
            contexts: Contexts::default(),
            words: Vec::with_capacity(EVENT_SIZE),
            meta: Meta::default(),
            truncated_at: None,
            decode_events: true,
        };
        let file = reader.file.clone();
        let bad = |offset: u64, kind: &str, message: &str| {
            CaptureError::record(&file, offset, 0, kind, message.into())
        };
        let meta = match reader.next_raw()? {
            Some(r) if r.kind == RecordKind::Meta => serde_json::from_slice::<Meta>(r.payload)
                .map_err(|e| bad(r.offset, "meta", &e.to_string())),
            Some(r) => Err(bad(
                r.offset,
                r.kind.name(),
                "expected the `meta` record first",
            )),
            None => Err(bad(
                FILE_HEADER_LEN as u64,
                "meta",
                "missing: the capture ends after its file header",
            )),
        }?;
        reader.meta = meta;
        Ok(reader)
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Where an incomplete last record starts, once reading has reached the end.
    pub fn truncated_at(&self) -> Option<u64> {
        self.truncated_at
    }

    /// From now on [`Self::next_raw`] returns only the records that are not events, for a
    /// reader that wants only those (the merge's first pass over a capture). Version 2 events
    /// are stepped over without decoding, in bulk where they lie whole in the read buffer.
    pub fn skip_events(&mut self) {
        self.decode_events = false;
    }

    /// Number of the record returned last (the meta record is 0).
    pub fn number(&self) -> u64 {
        self.next_number.saturating_sub(1)
    }

    fn record_error(&self, offset: u64, record: u64, kind: &str, message: String) -> CaptureError {
        CaptureError::record(&self.file, offset, record, kind, message)
    }

    /// The next complete record, or `None` at the end of the file or at an incomplete last
    /// record (see [`Self::truncated_at`]).
    pub fn next_raw(&mut self) -> Result<Option<RawRecord<'_>>, CaptureError> {
        loop {
            let Some((kind, offset, number)) = self.advance()? else {
                return Ok(None);
            };
            if kind == RecordKind::Event && !self.decode_events {
                continue;
            }
            return Ok(Some(RawRecord {
                kind,
                offset,
                number,
                payload: &self.payload,
            }));
        }
    }

    /// Reads the next record into the payload buffer: its kind, offset and number.
    fn advance(&mut self) -> Result<Option<(RecordKind, u64, u64)>, CaptureError> {
        if !self.decode_events && self.version != FORMAT_VERSION_1 {
            self.skip_buffered_events();
        }
        let start = self.offset;
        let number = self.next_number;
        let read = if self.version == FORMAT_VERSION_1 {
            self.read_v1(start, number)?
        } else {
            self.read_v2(start, number)?
        };
        let Some((kind, bytes)) = read else {
            return Ok(None);
        };
        self.offset += bytes as u64;
        self.next_number = number + 1;
        Ok(Some((kind, start, number)))
    }

    /// Steps over the version 2 event records lying whole in the input's buffer, each by its
    /// header alone, refilling the buffer as long as it ends on a record boundary. Stops at
    /// anything else (another kind, a record straddling the buffer's end, a bad header, a
    /// read error), which [`Self::read_v2`] then reads, so errors and truncation are reported
    /// as on the one-by-one path. ~15 instructions an event against ~85 through `read_v2`.
    fn skip_buffered_events(&mut self) {
        loop {
            let Ok(buf) = self.input.fill_buf() else {
                return;
            };
            let (mut at, mut events) = (0, 0);
            while let Some(whole) = WholeEvent::at_start_of(&buf[at..]) {
                at += whole.bytes;
                events += 1;
            }
            if events == 0 {
                return;
            }
            self.input.consume(at);
            self.offset += at as u64;
            self.next_number += events;
        }
    }

    /// The kind of a record's kind field; an error for a number that is none.
    fn kind(&self, kind_id: u32, start: u64, number: u64) -> Result<RecordKind, CaptureError> {
        RecordKind::from_u32(kind_id).ok_or_else(|| {
            self.record_error(
                start,
                number,
                "?",
                format!("field `kind`: {kind_id} is not a record kind (1-7)"),
            )
        })
    }

    /// Reads `len` payload bytes into the payload buffer; false when the input ended first.
    fn read_payload(&mut self, len: usize) -> Result<bool, CaptureError> {
        self.payload.resize(len, 0);
        let got = read_full(&mut self.input, &mut self.payload).map_err(|e| self.read_error(e))?;
        Ok(got == len)
    }

    /// Fills `buf` from the input; false (and the capture marked truncated at `start`) when
    /// the input ended after `started` bytes of this record were already read.
    fn read_part(
        &mut self,
        buf: &mut [u8],
        start: u64,
        started: bool,
    ) -> Result<bool, CaptureError> {
        let got = read_full(&mut self.input, buf).map_err(|e| self.read_error(e))?;
        if got < buf.len() && (started || got > 0) {
            self.truncated_at = Some(start);
        }
        Ok(got == buf.len())
    }

    /// A version 1 record: `kind:u32 length:u32 payload`, events raw. Returns its kind and
    /// its bytes in the file.
    fn read_v1(
        &mut self,
        start: u64,
        number: u64,
    ) -> Result<Option<(RecordKind, usize)>, CaptureError> {
        let mut header = [0u8; V1_RECORD_HEADER_LEN];
        if !self.read_part(&mut header, start, false)? {
            return Ok(None);
        }
        let kind_id = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let kind = self.kind(kind_id, start, number)?;
        self.check_length(kind, len, start, number)?;
        if !self.read_payload(len as usize)? {
            self.truncated_at = Some(start);
            return Ok(None);
        }
        Ok(Some((kind, V1_RECORD_HEADER_LEN + len as usize)))
    }

    /// A version 2 record: a compact event (decoded into the payload buffer as its raw
    /// bytes), or `kind:u8 length:u32 payload`.
    fn read_v2(
        &mut self,
        start: u64,
        number: u64,
    ) -> Result<Option<(RecordKind, usize)>, CaptureError> {
        if let Some(bytes) = self.buffered_event() {
            return Ok(Some((RecordKind::Event, bytes)));
        }
        let mut header = [0u8; EVENT_HEADER_LEN];
        if !self.read_part(&mut header[..1], start, false)? {
            return Ok(None);
        }
        let kind = self.kind(u32::from(header[0]), start, number)?;
        if kind != RecordKind::Event {
            if !self.read_part(&mut header[1..RECORD_HEADER_LEN], start, true)? {
                return Ok(None);
            }
            let len = u32::from_le_bytes(header[1..RECORD_HEADER_LEN].try_into().expect("4 bytes"));
            self.check_length(kind, len, start, number)?;
            if !self.read_payload(len as usize)? {
                self.truncated_at = Some(start);
                return Ok(None);
            }
            return Ok(Some((kind, RECORD_HEADER_LEN + len as usize)));
        }
        if !self.read_part(&mut header[1..], start, true)? {
            return Ok(None);
        }
        let (context, mask) = compact::parse_header(&header)
            .map_err(|m| self.record_error(start, number, kind.name(), m))?;
        let mut words = std::mem::take(&mut self.words);
        words.resize(4 * mask.count_ones() as usize, 0);
        let complete = self.read_part(&mut words, start, true)?;
        if complete && !self.decode_events {
            self.payload.clear();
        } else if complete {
            let mut event = [0u8; EVENT_SIZE];
            self.contexts.decode(context, mask, &words, &mut event);
            self.payload.clear();
            self.payload.extend_from_slice(&event);
        }
        let bytes = EVENT_HEADER_LEN + words.len();
        debug_assert!(bytes <= EVENT_RECORD_MAX);
        self.words = words;
        Ok(complete.then_some((kind, bytes)))
    }

    /// A version 2 event record lying whole in the input's buffer, decoded from there: the
    /// common case, with no copy of its header and words and no read call per part. Its bytes
    /// in the file, or `None` for anything else (another kind, a record straddling the
    /// buffer's end, a bad header, a read error or the end of the input), which `read_v2`
    /// then reads part by part, so errors and truncation are reported as before.
    fn buffered_event(&mut self) -> Option<usize> {
        let buf = self.input.fill_buf().ok()?;
        let WholeEvent {
            context,
            mask,
            bytes,
        } = WholeEvent::at_start_of(buf)?;
        if self.decode_events {
            self.payload.resize(EVENT_SIZE, 0);
            let event: &mut [u8; EVENT_SIZE] = (&mut self.payload[..])
                .try_into()
                .expect("EVENT_SIZE bytes");
            let words = &buf[EVENT_HEADER_LEN..bytes];
            self.contexts.decode(context, mask, words, event);
        } else {
            self.payload.clear();
        }
        self.input.consume(bytes);
        Some(bytes)
    }

    /// A non-event record's length must be at most [`MAX_PAYLOAD`], a version 1 event's
    /// exactly [`EVENT_SIZE`].
    fn check_length(
        &self,
        kind: RecordKind,
        len: u32,
        start: u64,
        number: u64,
    ) -> Result<(), CaptureError> {
        let valid = match kind {
            RecordKind::Event => len == EVENT_SIZE as u32,
            _ => len <= MAX_PAYLOAD,
        };
        if valid {
            return Ok(());
        }
        Err(self.record_error(
            start,
            number,
            kind.name(),
            format!("field `length`: {len} bytes is not a valid length for this kind"),
        ))
    }

    fn read_error(&self, source: io::Error) -> CaptureError {
        CaptureError::Read {
            file: self.file.clone(),
            offset: self.offset,
            source,
        }
    }
}

/// A version 2 event record lying whole at the start of a buffer: what the buffered paths
/// ([`CaptureReader::buffered_event`], [`CaptureReader::skip_buffered_events`]) may take
/// without the part-by-part reads of `read_v2`.
struct WholeEvent {
    context: u8,
    mask: u64,
    /// Header and words.
    bytes: usize,
}

impl WholeEvent {
    /// `None` for anything else: another kind, a bad header (left for `read_v2` to report),
    /// or a record that goes on past the buffer's end.
    fn at_start_of(buf: &[u8]) -> Option<Self> {
        let header = buf.first_chunk::<EVENT_HEADER_LEN>()?;
        if u32::from(header[0]) != RecordKind::Event as u32 {
            return None;
        }
        let (context, mask) = compact::parse_header(header).ok()?;
        let bytes = EVENT_HEADER_LEN + 4 * mask.count_ones() as usize;
        (buf.len() >= bytes).then_some(Self {
            context,
            mask,
            bytes,
        })
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::writer::CaptureWriter;
    use crate::schema::{Drops, Record};

    /// A capture of events of varied compact sizes with a drops record after every 97th.
    fn capture() -> Vec<u8> {
        let meta = Meta {
            node: "A".into(),
            dev_names: Default::default(),
        };
        let mut w = CaptureWriter::new(Vec::new(), &meta).unwrap();
        let mut event = [0u8; EVENT_SIZE];
        for i in 0..2000u32 {
            for (k, b) in event.iter_mut().enumerate() {
                // Some bytes change every event, some every few: compact records of many sizes.
                *b = (i.wrapping_mul(k as u32 + 1) >> (k % 5)) as u8;
            }
            w.write_event(&event).unwrap();
            if i % 97 == 0 {
                let drops = Drops {
                    node: "A".into(),
                    ts_ns: u64::from(i),
                    per_hook: Default::default(),
                    per_cpu: vec![0],
                    total: u64::from(i),
                };
                w.write_record(&Record::Drops(drops)).unwrap();
            }
        }
        w.into_inner().unwrap()
    }

    /// (kind, offset, number) of every record that is not an event, and where the capture
    /// was cut, read with a `buffer`-byte buffer, decoding events or skipping them.
    fn non_events(
        bytes: &[u8],
        buffer: usize,
        skip: bool,
    ) -> (Vec<(RecordKind, u64, u64)>, Option<u64>) {
        let input = std::io::BufReader::with_capacity(buffer, bytes);
        let mut r = CaptureReader::new("t.capture".into(), input).unwrap();
        if skip {
            r.skip_events();
        }
        let mut out = Vec::new();
        while let Some(raw) = r.next_raw().unwrap() {
            // Skipping, next_raw returns no event at all (non_event_records relies on it).
            assert!(!(skip && raw.kind == RecordKind::Event), "{raw:?}");
            if raw.kind != RecordKind::Event {
                out.push((raw.kind, raw.offset, raw.number));
            }
        }
        (out, r.truncated_at())
    }

    /// Skipping events in bulk finds the same records at the same offsets and numbers as
    /// reading every event, with records straddling the buffer's end and a capture cut
    /// inside its last event.
    #[test]
    fn skipping_events_finds_the_records_reading_them_finds() {
        let whole = capture();
        let cut = &whole[..whole.len() - 3];
        for bytes in [&whole[..], cut] {
            let expected = non_events(bytes, 1 << 20, false);
            assert_eq!(expected.0.len(), 2000 / 97 + 1);
            assert_eq!(expected.1.is_some(), bytes.len() < whole.len());
            for buffer in [64, 101, 4096, 1 << 20] {
                assert_eq!(non_events(bytes, buffer, true), expected, "buffer {buffer}");
            }
        }
    }

    /// The first error of a capture whose reading fails, decoding events or skipping them.
    fn first_error(bytes: &[u8], buffer: usize, skip: bool) -> String {
        let input = std::io::BufReader::with_capacity(buffer, bytes);
        let mut r = CaptureReader::new("t.capture".into(), input).unwrap();
        if skip {
            r.skip_events();
        }
        loop {
            match r.next_raw() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("no error"),
                Err(e) => return e.to_string(),
            }
        }
    }

    /// An event header with bits above the event's words, in the middle of the capture:
    /// skipping reports it as reading does (same record, offset and message).
    #[test]
    fn skipping_events_reports_a_bad_header_as_reading_does() {
        let mut bytes = capture();
        let input = std::io::BufReader::new(&bytes[..]);
        let mut r = CaptureReader::new("t.capture".into(), input).unwrap();
        let mut at = None;
        while let Some(raw) = r.next_raw().unwrap() {
            if raw.kind == RecordKind::Event && raw.number == 1000 {
                at = Some(raw.offset as usize);
            }
        }
        let at = at.expect("record 1000 is an event");
        bytes[at + EVENT_HEADER_LEN - 1] = 0xff; // the mask's top byte
        let expected = first_error(&bytes, 1 << 20, false);
        assert!(expected.contains("changed"), "{expected}");
        for buffer in [64, 101, 4096, 1 << 20] {
            assert_eq!(
                first_error(&bytes, buffer, true),
                expected,
                "buffer {buffer}"
            );
        }
    }
}
