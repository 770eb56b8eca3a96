//! Reading a capture record by record. A record cut short at the end of the file (a recorder
//! that crashed or was killed mid-write) ends the capture; everything before it is valid.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use meshlab_common::Event;

use super::{
    CaptureError, EVENT_SIZE, FILE_HEADER_LEN, MAX_PAYLOAD, Meta, RECORD_HEADER_LEN, RecordKind,
    check_file_header,
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
    /// The raw event of an [`RecordKind::Event`] record (length checked by the reader).
    pub fn event(&self) -> Event {
        debug_assert_eq!(self.payload.len(), EVENT_SIZE);
        // SAFETY: the reader only yields Event records of exactly EVENT_SIZE bytes, and Event
        // is a repr(C) struct of integers, valid for any bit pattern; read_unaligned makes no
        // alignment assumption about the buffer.
        unsafe { std::ptr::read_unaligned(self.payload.as_ptr().cast()) }
    }
}

pub struct CaptureReader<R> {
    file: PathBuf,
    input: R,
    offset: u64,
    /// Number of the next record: the meta record is 0, so record N is line N of the export.
    next_number: u64,
    payload: Vec<u8>,
    meta: Meta,
    /// Byte offset of an incomplete last record, once the reader has reached it.
    truncated_at: Option<u64>,
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

impl<R: Read> CaptureReader<R> {
    /// Checks the file header and reads the [`Meta`] record.
    pub fn new(file: PathBuf, mut input: R) -> Result<Self, CaptureError> {
        let mut header = [0u8; FILE_HEADER_LEN];
        let got = read_full(&mut input, &mut header).map_err(|source| CaptureError::Read {
            file: file.clone(),
            offset: 0,
            source,
        })?;
        check_file_header(&file, &header[..got])?;
        let mut reader = Self {
            file,
            input,
            offset: FILE_HEADER_LEN as u64,
            next_number: 0,
            payload: Vec::with_capacity(EVENT_SIZE),
            meta: Meta::default(),
            truncated_at: None,
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
        let start = self.offset;
        let number = self.next_number;
        let mut header = [0u8; RECORD_HEADER_LEN];
        let got = read_full(&mut self.input, &mut header).map_err(|e| self.read_error(e))?;
        if got < RECORD_HEADER_LEN {
            if got > 0 {
                self.truncated_at = Some(start);
            }
            return Ok(None);
        }
        let kind_id = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let kind = RecordKind::from_u32(kind_id).ok_or_else(|| {
            self.record_error(
                start,
                number,
                "?",
                format!("field `kind`: {kind_id} is not a record kind (1-6)"),
            )
        })?;
        let wanted = match kind {
            RecordKind::Event => len == EVENT_SIZE as u32,
            _ => len <= MAX_PAYLOAD,
        };
        if !wanted {
            return Err(self.record_error(
                start,
                number,
                kind.name(),
                format!("field `length`: {len} bytes is not a valid length for this kind"),
            ));
        }
        self.payload.resize(len as usize, 0);
        let got = read_full(&mut self.input, &mut self.payload).map_err(|e| self.read_error(e))?;
        if got < len as usize {
            self.truncated_at = Some(start);
            return Ok(None);
        }
        self.offset += (RECORD_HEADER_LEN + len as usize) as u64;
        self.next_number = number + 1;
        Ok(Some(RawRecord {
            kind,
            offset: start,
            number,
            payload: &self.payload,
        }))
    }

    fn read_error(&self, source: io::Error) -> CaptureError {
        CaptureError::Read {
            file: self.file.clone(),
            offset: self.offset,
            source,
        }
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
