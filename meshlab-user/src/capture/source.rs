//! A recording in either format as a stream of [`Record`]s: NDJSON lines, or a binary capture
//! whose events are decoded without JSON. The format is detected from the file's first bytes;
//! either is read on a second thread, so reading overlaps with whatever consumes the records.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::kernel::decode::Decoder;
use crate::ndjson::{NdjsonError, RecordReader};
use crate::schema::Record;

use super::reader::{CaptureReader, RawRecord};
use super::{CaptureError, MAGIC, RecordKind, is_capture};

/// Records per message between the decoding thread and the consumer.
const BATCH: usize = 1024;
/// Batches in flight: bounds the memory the decoding thread may run ahead by.
const BATCHES_IN_FLIGHT: usize = 4;

/// A capture's records in order, events decoded into `kernel` records.
pub struct CaptureRecords<R> {
    file: std::path::PathBuf,
    reader: CaptureReader<R>,
    decoder: Decoder,
    warned_truncated: bool,
}

impl<R: Read> CaptureRecords<R> {
    pub fn new(reader: CaptureReader<R>) -> Self {
        let meta = reader.meta().clone();
        Self {
            file: reader.file().to_owned(),
            reader,
            decoder: Decoder::new(meta.node, meta.dev_names),
            warned_truncated: false,
        }
    }

    /// Number of the record returned last: record N is line N of the export.
    pub fn number(&self) -> u64 {
        self.reader.number()
    }

    /// The next record, or `None` at the end (an incomplete last record is reported once as a
    /// warning: everything before it is valid).
    pub fn next_record(&mut self) -> Result<Option<Record>, CaptureError> {
        loop {
            let Some(raw) = self.reader.next_raw()? else {
                if let (Some(at), false) = (self.reader.truncated_at(), self.warned_truncated) {
                    self.warned_truncated = true;
                    log::warn!(
                        "{}: byte {at}: the last record is incomplete (the recorder stopped mid-write); using the records before it",
                        self.file.display()
                    );
                }
                return Ok(None);
            };
            if raw.kind == RecordKind::Event {
                match self.decoder.decode(&raw.event()) {
                    Some(k) => return Ok(Some(Record::Kernel(k))),
                    None => continue, // unknown hook id: skipped, as in NDJSON
                }
            }
            let record = parse_json_record(&raw).map_err(|m| {
                CaptureError::record(&self.file, raw.offset, raw.number, raw.kind.name(), m)
            })?;
            return Ok(Some(record));
        }
    }
}

/// Parses a JSON record and checks that its `type` is the one its kind promises.
pub fn parse_json_record(raw: &RawRecord<'_>) -> Result<Record, String> {
    let record: Record = serde_json::from_slice(raw.payload).map_err(|e| e.to_string())?;
    let matches = matches!(
        (raw.kind, &record),
        (RecordKind::Startup, Record::Startup(_))
            | (RecordKind::Clock, Record::Clock(_))
            | (RecordKind::Drops, Record::Drops(_))
            | (RecordKind::Summary, Record::Summary(_))
    );
    if !matches {
        return Err(format!(
            "field `type`: the JSON is not a `{}` record",
            raw.kind.name()
        ));
    }
    Ok(record)
}

type Numbered = Result<(u64, Record), NdjsonError>;

/// Either format, detected from the first bytes; yields records with their line (NDJSON) or
/// record number (capture). Parsing or decoding runs on its own thread, a bounded number of
/// batches ahead of the consumer: the merge joins on one core while the input is read on the
/// other.
pub struct RecordSource {
    batches: Receiver<Vec<Numbered>>,
    current: std::vec::IntoIter<Numbered>,
    position: u64,
}

impl RecordSource {
    pub fn open(path: &Path) -> Result<Self, NdjsonError> {
        let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
        let spawned = if file_is_capture(path)? {
            let mut records = CaptureRecords::new(CaptureReader::open(path)?);
            let next = move || match records.next_record() {
                Ok(r) => r.map(|r| Ok((records.number(), r))),
                Err(e) => Some(Err(e.into())),
            };
            spawn_reader(path, next, tx)
        } else {
            let mut reader = RecordReader::open(path)?;
            let next = move || {
                let r = reader.next()?;
                Some(r.map(|r| (reader.line(), r)))
            };
            spawn_reader(path, next, tx)
        };
        spawned.map_err(|source| NdjsonError::Open {
            file: path.into(),
            source,
        })?;
        Ok(RecordSource {
            batches: rx,
            current: Vec::new().into_iter(),
            position: 0,
        })
    }

    /// Line (NDJSON) or record number (capture) of the record returned last.
    pub fn position(&self) -> u64 {
        self.position
    }
}

/// The reading thread: sends batches until the end, the first error, or the consumer is gone.
fn spawn_reader(
    path: &Path,
    mut next: impl FnMut() -> Option<Numbered> + Send + 'static,
    tx: SyncSender<Vec<Numbered>>,
) -> std::io::Result<()> {
    let name = format!("read {}", path.display());
    let body = move || {
        loop {
            let mut batch = Vec::with_capacity(BATCH);
            let mut finished = false;
            while batch.len() < BATCH {
                match next() {
                    Some(item) => {
                        finished = item.is_err();
                        batch.push(item);
                        if finished {
                            break;
                        }
                    }
                    None => {
                        finished = true;
                        break;
                    }
                }
            }
            if tx.send(batch).is_err() || finished {
                return;
            }
        }
    };
    // Thread names are limited to 15 bytes by the kernel; std truncates, keep it readable.
    std::thread::Builder::new()
        .name(name.chars().take(15).collect())
        .spawn(body)
        .map(drop)
}

impl Iterator for RecordSource {
    type Item = Result<Record, NdjsonError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.current.next() {
                return Some(item.map(|(n, record)| {
                    self.position = n;
                    record
                }));
            }
            // A closed channel after the last batch is the end.
            self.current = self.batches.recv().ok()?.into_iter();
        }
    }
}

/// The non-event records of a capture (startup, clock, drops, summary) with their numbers,
/// read without decoding a single event: a few records per second of recording.
pub fn non_event_records(path: &Path) -> Result<Vec<(u64, Record)>, CaptureError> {
    let mut reader = CaptureReader::open(path)?;
    let mut out = Vec::new();
    while let Some(raw) = reader.next_raw()? {
        if raw.kind == RecordKind::Event {
            continue;
        }
        let record = parse_json_record(&raw)
            .map_err(|m| CaptureError::record(path, raw.offset, raw.number, raw.kind.name(), m))?;
        out.push((raw.number, record));
    }
    Ok(out)
}

/// True when the file at `path` starts with the capture magic.
pub fn file_is_capture(path: &Path) -> Result<bool, NdjsonError> {
    let mut head = [0u8; MAGIC.len()];
    let got = File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|source| NdjsonError::Open {
            file: path.into(),
            source,
        })?;
    Ok(is_capture(&head[..got]))
}
