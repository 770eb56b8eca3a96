//! A binary capture as [`Record`]s: events decoded without JSON, the other records parsed from
//! their JSON payloads. crate::records reads either format through this.

use std::io::BufRead;
use std::path::Path;

use crate::decode::Decoder;
use crate::incoming::Incoming;
use crate::schema::Record;

use super::reader::{CaptureReader, RawRecord};
use super::{CaptureError, RecordKind};

/// A capture's records in order, events decoded into `kernel` records.
pub struct CaptureRecords<R> {
    file: std::path::PathBuf,
    reader: CaptureReader<R>,
    decoder: Decoder,
    warned_truncated: bool,
}

impl<R: BufRead> CaptureRecords<R> {
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
        self.with_next(|_, r| r.into_owned())
    }

    /// Hands the next record with its number ([`Self::number`]) to `each`, a kernel event as
    /// a line borrowed for the call; `None` at the end, as [`Self::next_record`].
    ///
    /// A callback, not a returned value: the line (320 bytes) stays where the decoder built it
    /// and `each` reads it there. Returned, it was copied into every layer that wrapped it
    /// (three copies per event: -3.6 % of a one-node merge's instructions without them,
    /// callgrind, docs/benchmarks-merge-ab.md round 39).
    pub fn with_next<T>(
        &mut self,
        each: impl FnOnce(u64, Incoming<'_>) -> T,
    ) -> Result<Option<T>, CaptureError> {
        let (event, hook) = loop {
            let Some(raw) = self.reader.next_raw()? else {
                self.warn_truncated();
                return Ok(None);
            };
            if raw.kind == RecordKind::Event {
                let event = raw.event();
                match self.decoder.count(&event) {
                    Some(hook) => break (event, hook),
                    None => continue, // unknown hook id: skipped, as in NDJSON
                }
            }
            let record = parse_json_record(&raw).map_err(|m| {
                CaptureError::record(&self.file, raw.offset, raw.number, raw.kind.name(), m)
            })?;
            return Ok(Some(each(raw.number, Incoming::Owned(record))));
        };
        let number = self.reader.number();
        let line = self.decoder.line(hook, &event);
        Ok(Some(each(number, Incoming::Kernel(&line))))
    }

    fn warn_truncated(&mut self) {
        if let (Some(at), false) = (self.reader.truncated_at(), self.warned_truncated) {
            self.warned_truncated = true;
            log::warn!(
                "{}: byte {at}: the last record is incomplete (the recorder stopped mid-write); using the records before it",
                self.file.display()
            );
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
            | (RecordKind::HotHooks, Record::HotHooks(_))
    );
    if !matches {
        return Err(format!(
            "field `type`: the JSON is not a `{}` record",
            raw.kind.name()
        ));
    }
    Ok(record)
}

/// The non-event records of a capture (startup, clock, drops, summary, hot_hooks) with their
/// numbers,
/// read without decoding a single event: a few records per second of recording.
pub fn non_event_records(path: &Path) -> Result<Vec<(u64, Record)>, CaptureError> {
    let mut reader = CaptureReader::open(path)?;
    reader.skip_events();
    let mut out = Vec::new();
    while let Some(raw) = reader.next_raw()? {
        let record = parse_json_record(&raw)
            .map_err(|m| CaptureError::record(path, raw.offset, raw.number, raw.kind.name(), m))?;
        out.push((raw.number, record));
    }
    Ok(out)
}
