//! A recording in either format as a stream of [`Record`]s: NDJSON lines, or a binary capture
//! whose events are decoded without JSON. The format is detected from the file's first bytes;
//! either is read on a second thread, so reading overlaps with whatever consumes the records.
//! (A module of its own so that crate::capture and crate::ndjson each stay independent of it.)

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::capture::reader::CaptureReader;
use crate::capture::source::CaptureRecords;
use crate::capture::{MAGIC, is_capture};
use crate::incoming::Incoming;
use crate::ndjson::{NdjsonError, RecordReader};
use crate::schema::Record;

/// Records per message between the decoding thread and the consumer.
const BATCH: usize = 1024;
/// Batches in flight: bounds the memory the decoding thread may run ahead by.
const BATCHES_IN_FLIGHT: usize = 4;

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
        spawn_parser(path, tx, |n, record| Ok(Some((n, record.into_owned()))))?;
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

/// The records of either format turned into `T` by `reduce` on the reading thread (`None`:
/// skipped), so the consumer receives only what it keeps, in its own (smaller) form.
pub struct ReducedSource<T, E> {
    batches: Receiver<Vec<Result<T, E>>>,
    current: std::vec::IntoIter<Result<T, E>>,
}

impl<T: Send + 'static, E: From<NdjsonError> + Send + 'static> ReducedSource<T, E> {
    /// `reduce` gets each record with its line (NDJSON) or record number (capture); a
    /// capture's kernel events are borrowed (the decoder refills one event in place).
    pub fn open(
        path: &Path,
        reduce: impl FnMut(u64, Incoming<'_>) -> Result<Option<T>, E> + Send + 'static,
    ) -> Result<Self, NdjsonError> {
        let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
        spawn_parser(path, tx, reduce)?;
        Ok(ReducedSource {
            batches: rx,
            current: Vec::new().into_iter(),
        })
    }
}

impl<T, E> Iterator for ReducedSource<T, E> {
    type Item = Result<T, E>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.current.next() {
                return Some(item);
            }
            // A closed channel after the last batch is the end.
            self.current = self.batches.recv().ok()?.into_iter();
        }
    }
}

/// Starts the thread that parses or decodes `path` (format detected) and sends what `reduce`
/// keeps of each record, stopping after the first error.
fn spawn_parser<T: Send + 'static, E: From<NdjsonError> + Send + 'static>(
    path: &Path,
    tx: SyncSender<Vec<Result<T, E>>>,
    mut reduce: impl FnMut(u64, Incoming<'_>) -> Result<Option<T>, E> + Send + 'static,
) -> Result<(), NdjsonError> {
    let spawned = if file_is_capture(path)? {
        let mut records = CaptureRecords::new(CaptureReader::open(path)?);
        let next = move || {
            loop {
                let kept = match records.with_next(&mut reduce) {
                    Ok(Some(kept)) => kept,
                    Ok(None) => return None,
                    Err(e) => Err(E::from(NdjsonError::from(e))),
                };
                if let Some(item) = kept.transpose() {
                    return Some(item);
                }
            }
        };
        spawn_reader(path, next, tx)
    } else {
        let mut reader = RecordReader::open(path)?;
        let next = move || {
            loop {
                let kept = match reader.next()? {
                    Ok(r) => reduce(reader.line(), Incoming::Owned(r)),
                    Err(e) => Err(E::from(e)),
                };
                if let Some(item) = kept.transpose() {
                    return Some(item);
                }
            }
        };
        spawn_reader(path, next, tx)
    };
    spawned.map_err(|source| NdjsonError::Open {
        file: path.into(),
        source,
    })
}

/// The reading thread: sends batches until the end, the first error, or the consumer is gone.
fn spawn_reader<T: Send + 'static, E: Send + 'static>(
    path: &Path,
    mut next: impl FnMut() -> Option<Result<T, E>> + Send + 'static,
    tx: SyncSender<Vec<Result<T, E>>>,
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

/// The first record of `path` (either format) with its line or record number, read on the
/// calling thread: what [`RecordSource`] would yield first, without a reading thread that
/// runs batches ahead only to be dropped (a merge's plan looks at every input's first record).
pub fn first_record(path: &Path) -> Result<Option<(u64, Record)>, NdjsonError> {
    if file_is_capture(path)? {
        let mut records = CaptureRecords::new(CaptureReader::open(path)?);
        let first = records.next_record()?;
        return Ok(first.map(|r| (records.number(), r)));
    }
    let mut reader = RecordReader::open(path)?;
    let first = reader.next().transpose()?;
    Ok(first.map(|r| (reader.line(), r)))
}

/// True when the file at `path` starts with the capture magic, false when it can be NDJSON
/// (its first byte other than white space is `{`, or it has none); neither is an error that
/// shows the first bytes, not a JSON parse error about line 1 of a binary file.
pub fn file_is_capture(path: &Path) -> Result<bool, NdjsonError> {
    let mut head = [0u8; MAGIC.len()];
    let got = File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|source| NdjsonError::Open {
            file: path.into(),
            source,
        })?;
    let head = &head[..got];
    if is_capture(head) {
        return Ok(true);
    }
    match head.iter().find(|b| !b.is_ascii_whitespace()) {
        None | Some(b'{') => Ok(false),
        Some(_) => Err(NdjsonError::Format {
            file: path.into(),
            head: head.escape_ascii().to_string(),
        }),
    }
}
