//! Reading and writing NDJSON streams of [`Record`]s with errors that name file, line and field.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::schema::Record;

/// A line that could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum NdjsonError {
    #[error("{file}: cannot open: {source}")]
    Open { file: PathBuf, source: io::Error },
    #[error("{file}:{line}: read error: {source}")]
    Read {
        file: PathBuf,
        line: u64,
        source: io::Error,
    },
    /// serde's message names the field and what was expected
    /// (e.g. "missing field `ts_ns`", "invalid type: string \"x\", expected u64").
    #[error("{file}:{line}: {message}")]
    Parse {
        file: PathBuf,
        line: u64,
        message: String,
    },
    /// A binary capture read as a recording (crate::capture::source).
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
}

/// Iterates over the records of one NDJSON file, skipping blank lines.
pub struct RecordReader<R> {
    file: PathBuf,
    line: u64,
    input: R,
    buf: String,
}

impl RecordReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, NdjsonError> {
        let f = File::open(path).map_err(|source| NdjsonError::Open {
            file: path.into(),
            source,
        })?;
        Ok(Self::new(path.into(), BufReader::with_capacity(1 << 16, f)))
    }
}

impl<R: BufRead> RecordReader<R> {
    pub fn new(file: PathBuf, input: R) -> Self {
        Self {
            file,
            line: 0,
            input,
            buf: String::new(),
        }
    }

    /// Line number of the record returned last (1-based).
    pub fn line(&self) -> u64 {
        self.line
    }

    pub fn file(&self) -> &Path {
        &self.file
    }
}

impl<R: BufRead> Iterator for RecordReader<R> {
    type Item = Result<Record, NdjsonError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            self.line += 1;
            match self.input.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(source) => {
                    return Some(Err(NdjsonError::Read {
                        file: self.file.clone(),
                        line: self.line,
                        source,
                    }));
                }
            }
            let text = self.buf.trim();
            if text.is_empty() {
                continue;
            }
            return Some(serde_json::from_str(text).map_err(|e| NdjsonError::Parse {
                file: self.file.clone(),
                line: self.line,
                message: describe_json_error(text, &e),
            }));
        }
    }
}

/// serde_json reports "unknown variant" for a bad `type` tag and names fields for the rest;
/// add the record type so "missing field `ts_ns`" says in which kind of record.
fn describe_json_error(text: &str, e: &serde_json::Error) -> String {
    let kind = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
    match kind {
        Some(kind) => format!("in a `{kind}` record: {e}"),
        None => format!("expected a JSON object with a \"type\" field: {e}"),
    }
}

/// Buffered NDJSON writer. A closed pipe (e.g. `| head`) is reported as
/// [`io::ErrorKind::BrokenPipe`] so callers can treat it as success.
pub struct RecordWriter<W: Write> {
    out: BufWriter<W>,
}

impl<W: Write> RecordWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out: BufWriter::with_capacity(1 << 16, out),
        }
    }

    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> io::Result<W> {
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

/// True for the error a closed downstream pipe produces: that ends output successfully.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_file_line_and_field() {
        let input = "\n{\"type\":\"clock\",\"realtime_ns\":1,\"monotonic_ns\":2,\"tai_ns\":3,\"boottime_ns\":4,\"bracket_ns\":5}\n{\"type\":\"clock\",\"realtime_ns\":\"x\"}\n";
        let mut r = RecordReader::new("in.ndjson".into(), input.as_bytes());
        assert!(r.next().unwrap().is_ok());
        let err = r.next().unwrap().unwrap_err().to_string();
        assert!(
            err.starts_with("in.ndjson:3: in a `clock` record:"),
            "{err}"
        );
        assert!(err.contains("expected u64"), "{err}");
        assert!(r.next().is_none());
    }

    #[test]
    fn non_object_lines_are_explained() {
        let mut r = RecordReader::new("f".into(), "42\n".as_bytes());
        let err = r.next().unwrap().unwrap_err().to_string();
        assert!(err.starts_with("f:1: expected a JSON object"), "{err}");
    }
}
