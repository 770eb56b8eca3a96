//! Reading and writing NDJSON streams of [`Record`]s with errors that name file, line and field.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::schema::{KernelEvent, ProbeEvent, Record, SCHEMA_VERSION};

/// Schema versions this build reads. A `startup` (recording) or `merge_info` (merged file)
/// naming another one is refused with both in the message: the format has no compatibility
/// rules across versions, so guessing would misattribute time silently.
pub const READABLE_SCHEMA_VERSIONS: &[u32] = &[SCHEMA_VERSION];

/// A line that could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum NdjsonError {
    #[error("{file}: cannot open: {source}")]
    Open { file: PathBuf, source: io::Error },
    #[error(
        "{file}: neither a meshlab capture (it would start with \"{}\") nor NDJSON (its first line would start with `{{`); it starts with \"{head}\"",
        crate::capture::MAGIC.escape_ascii()
    )]
    Format { file: PathBuf, head: String },
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
    /// A binary capture read as a recording (crate::records).
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
    #[error(
        "{file}:{line}: in a `{record}` record: field `{field}` is {read}, but this meshlab ({}) reads schema version {}; use a meshlab release that reads version {read}, or record again with this one",
        env!("CARGO_PKG_VERSION"),
        list(READABLE_SCHEMA_VERSIONS)
    )]
    Version {
        file: PathBuf,
        line: u64,
        record: &'static str,
        field: String,
        read: u64,
    },
}

fn list(versions: &[u32]) -> String {
    let names: Vec<String> = versions.iter().map(u32::to_string).collect();
    names.join(", ")
}

/// Bytes read per read(2) by [`Lines`]; a longer line grows the buffer.
const LINES_BLOCK: usize = 1 << 18;

/// The lines of a stream, read in large blocks and handed out in place: no copy and no
/// UTF-8 check per line (callers check the bytes they use). Lines end at `\n`, which is not
/// part of the line; a last line without one is a line too.
pub struct Lines<R> {
    input: R,
    buf: Vec<u8>,
    /// `buf[start..end]` is read and not yet handed out.
    start: usize,
    end: usize,
    eof: bool,
    number: u64,
}

impl<R: io::Read> Lines<R> {
    pub fn new(input: R) -> Self {
        Self {
            input,
            buf: vec![0; LINES_BLOCK],
            start: 0,
            end: 0,
            eof: false,
            number: 0,
        }
    }

    /// 1-based number of the line returned last (0 before the first).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The next line and its 1-based number, or `None` at the end of the stream.
    pub fn next_line(&mut self) -> io::Result<Option<(u64, &[u8])>> {
        loop {
            let pending = &self.buf[self.start..self.end];
            let cut = match memchr::memchr(b'\n', pending) {
                Some(i) => Some((i, i + 1)),
                None if self.eof && !pending.is_empty() => Some((pending.len(), pending.len())),
                None if self.eof => return Ok(None),
                None => None,
            };
            if let Some((len, used)) = cut {
                let line = self.start..self.start + len;
                self.start += used;
                self.number += 1;
                return Ok(Some((self.number, &self.buf[line])));
            }
            self.refill()?;
        }
    }

    /// Moves the unfinished line to the front (growing the buffer when it fills it) and reads
    /// the next block after it.
    fn refill(&mut self) -> io::Result<()> {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        if self.end == self.buf.len() {
            self.buf.resize(2 * self.buf.len(), 0);
        }
        let read = loop {
            match self.input.read(&mut self.buf[self.end..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => break other?,
            }
        };
        self.eof = read == 0;
        self.end += read;
        Ok(())
    }
}

/// What `BufRead::read_line` reports for a line that is not UTF-8, for readers of [`Lines`]
/// that check the bytes themselves.
pub fn invalid_utf8() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "stream did not contain valid UTF-8",
    )
}

/// Iterates over the records of one NDJSON file, skipping blank lines. Lines are taken in
/// place from [`Lines`]' block buffer: `read_line` copied each into a String, found its end
/// with the standard library's scalar memchr, and was about 2.6 % of a merge's instructions.
pub struct RecordReader<R> {
    file: PathBuf,
    line: u64,
    input: Lines<R>,
    /// Reused for [`parse_bulk`]'s copy of a line without its tag.
    scratch: String,
}

impl RecordReader<File> {
    pub fn open(path: &Path) -> Result<Self, NdjsonError> {
        let f = File::open(path).map_err(|source| NdjsonError::Open {
            file: path.into(),
            source,
        })?;
        Ok(Self::new(path.into(), f))
    }
}

impl<R: io::Read> RecordReader<R> {
    pub fn new(file: PathBuf, input: R) -> Self {
        Self {
            file,
            line: 0,
            input: Lines::new(input),
            scratch: String::new(),
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

impl<R: io::Read> Iterator for RecordReader<R> {
    type Item = Result<Record, NdjsonError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.line += 1;
            // As read_line: an I/O error or a line that is not UTF-8 is a read error of this
            // line (the line is consumed, so reading could go on after it).
            let text = match self.input.next_line() {
                Ok(None) => return None,
                Ok(Some((_, bytes))) => std::str::from_utf8(bytes).map_err(|_| invalid_utf8()),
                Err(source) => Err(source),
            };
            let text = match text {
                Ok(text) => text.trim(),
                Err(source) => {
                    return Some(Err(NdjsonError::Read {
                        file: self.file.clone(),
                        line: self.line,
                        source,
                    }));
                }
            };
            if text.is_empty() {
                continue;
            }
            if let Some(record) = parse_bulk(text, &mut self.scratch) {
                return Some(Ok(record));
            }
            let parsed = serde_json::from_str(text);
            let version = match &parsed {
                Ok(record) => versions_of(record),
                // A newer version may add fields: name the version rather than the field.
                Err(_) => versions_in_text(text),
            };
            if let Some((record, field, read)) = version
                .into_iter()
                .find(|(_, _, v)| !READABLE_SCHEMA_VERSIONS.iter().any(|r| u64::from(*r) == *v))
            {
                return Some(Err(NdjsonError::Version {
                    file: self.file.clone(),
                    line: self.line,
                    record,
                    field,
                    read,
                }));
            }
            return Some(parsed.map_err(|e| NdjsonError::Parse {
                file: self.file.clone(),
                line: self.line,
                message: describe_json_error(text, &e),
            }));
        }
    }
}

/// The two records that make up the bulk of a recording, parsed straight into their structs.
/// serde's internally tagged [`Record`] first buffers every field of a line into a tree (an
/// allocation per field): about a tenth of the merge's CPU when probe lines were read that
/// way. The struct sees exactly the fields the enum would hand it (everything but the tag),
/// so its deny_unknown_fields still applies. `None` (another record, the tag not first, or any
/// error) sends the line down the general path, which then gives the same record or the same
/// error message as always.
fn parse_bulk(text: &str, scratch: &mut String) -> Option<Record> {
    const PROBE: &str = "{\"type\":\"probe\",";
    const KERNEL: &str = "{\"type\":\"kernel\",";
    let untagged = |rest: &str, scratch: &mut String| {
        scratch.clear();
        scratch.push('{');
        scratch.push_str(rest);
    };
    if let Some(rest) = text.strip_prefix(PROBE) {
        if let Some(line) = crate::probe_line::parse(text) {
            return Some(Record::Probe(line.to_event()));
        }
        untagged(rest, scratch);
        serde_json::from_str::<ProbeEvent>(scratch)
            .ok()
            .map(Record::Probe)
    } else if let Some(rest) = text.strip_prefix(KERNEL) {
        untagged(rest, scratch);
        serde_json::from_str::<KernelEvent>(scratch)
            .ok()
            .map(Record::Kernel)
    } else {
        None
    }
}

/// (record type, field, version) of every schema version a record carries: a recording's
/// `startup`, and a merged file's `merge_info` with the startups of its nodes.
fn versions_of(record: &Record) -> Vec<(&'static str, String, u64)> {
    match record {
        Record::Startup(s) => vec![("startup", "schema_version".into(), s.schema_version.into())],
        Record::MergeInfo(m) => {
            let nodes = m.nodes.iter().enumerate().map(|(i, s)| {
                let field = format!("nodes[{i}].schema_version");
                ("merge_info", field, u64::from(s.schema_version))
            });
            std::iter::once((
                "merge_info",
                "schema_version".into(),
                m.schema_version.into(),
            ))
            .chain(nodes)
            .collect()
        }
        _ => Vec::new(),
    }
}

/// The same for a line that did not parse, read from its JSON as far as it goes.
fn versions_in_text(text: &str) -> Vec<(&'static str, String, u64)> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let record = match value.get("type").and_then(|t| t.as_str()) {
        Some("startup") => "startup",
        Some("merge_info") => "merge_info",
        _ => return Vec::new(),
    };
    let version = |v: &serde_json::Value| v.get("schema_version").and_then(|n| n.as_u64());
    let mut found: Vec<_> = version(&value)
        .map(|v| (record, "schema_version".to_string(), v))
        .into_iter()
        .collect();
    let nodes = value.get("nodes").and_then(|n| n.as_array());
    for (i, node) in nodes.into_iter().flatten().enumerate() {
        if let Some(v) = version(node) {
            found.push((record, format!("nodes[{i}].schema_version"), v));
        }
    }
    found
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
    /// A request line being written by [`crate::request_json`].
    line: Vec<u8>,
}

impl<W: Write> RecordWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out: BufWriter::with_capacity(1 << 16, out),
            line: Vec::new(),
        }
    }

    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        if let Record::Request(r) = record {
            // The bulk of a merged file: written by hand, byte-identical to serde's form.
            self.line.clear();
            crate::request_json::write_request(&mut self.line, r);
            self.line.push(b'\n');
            return self.out.write_all(&self.line);
        }
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
    use std::io::{BufRead, BufReader};

    /// The fast path for probe and kernel lines gives what the general path gives: the same
    /// records, and for a line it cannot take (unknown field) the same error.
    #[test]
    fn bulk_lines_parse_as_the_general_path_does() {
        let probe = r#"{"type":"probe","node":"A","process":"client","pid":1,"tid":2,"ts_ns":3,"clock":"monotonic","trace_id":"t\u0031","point":"client.write_begin","offset":5,"len":6}"#;
        let kernel = r#"{"type":"kernel","node":"B","hook":"tcp_sendmsg","ts_ns":7,"cpu":0,"pid":1,"tid":2,"cookie":9,"len":4,"offset":8,"dir":"tx"}"#;
        let mut scratch = String::new();
        for line in [probe, kernel] {
            let general: Record = serde_json::from_str(line).unwrap();
            assert_eq!(parse_bulk(line, &mut scratch), Some(general));
        }
        let unknown = probe.replace("\"pid\"", "\"pidd\"");
        assert_eq!(parse_bulk(&unknown, &mut scratch), None);
        let input = format!("{probe}\n{unknown}\n");
        let mut r = RecordReader::new("p.ndjson".into(), input.as_bytes());
        assert!(matches!(r.next(), Some(Ok(Record::Probe(_)))));
        let err = r.next().unwrap().unwrap_err().to_string();
        assert!(err.starts_with("p.ndjson:2: "), "{err}");
        assert!(err.contains("unknown field `pidd`"), "{err}");
    }

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

    const RECORDING: &str = include_str!("../tests/fixtures/merge/plain/A.kernel.ndjson");

    fn startup_line() -> String {
        let line = RECORDING.lines().next().unwrap().to_owned();
        assert!(line.contains("\"schema_version\":1,"), "{line}");
        line
    }

    fn first_error(text: &str) -> String {
        let mut r = RecordReader::new("in.ndjson".into(), text.as_bytes());
        r.next().unwrap().unwrap_err().to_string()
    }

    #[test]
    fn an_unknown_schema_version_names_the_version_read_and_the_ones_supported() {
        let future = startup_line().replace("\"schema_version\":1,", "\"schema_version\":999,");
        let err = first_error(&future);
        assert!(
            err.starts_with("in.ndjson:1: in a `startup` record: field `schema_version` is 999"),
            "{err}"
        );
        assert!(err.contains("reads schema version 1;"), "{err}");
        // A newer version with fields this build does not know: still the version is named.
        let newer = future.replacen("{", "{\"new_field\":true,", 1);
        assert!(first_error(&newer).contains("is 999"), "{newer}");
        let merged = format!(
            "{{\"type\":\"merge_info\",\"schema_version\":1,\"nodes\":[{}]}}",
            future
        );
        let err = first_error(&merged);
        assert!(
            err.contains("`merge_info` record: field `nodes[0].schema_version` is 999"),
            "{err}"
        );
        let mut ok = RecordReader::new("in.ndjson".into(), RECORDING.as_bytes());
        assert!(ok.all(|r| r.is_ok()));
    }

    #[test]
    fn lines_are_split_at_newlines_across_blocks_and_grow_for_long_lines() {
        let long = "x".repeat(3 * LINES_BLOCK);
        let text = format!("a\r\n\n{long}\nb");
        let mut lines = Lines::new(text.as_bytes());
        let mut got = Vec::new();
        while let Some((n, l)) = lines.next_line().unwrap() {
            got.push((n, l.to_vec()));
        }
        let want: Vec<(u64, Vec<u8>)> = vec![
            (1, b"a\r".to_vec()),
            (2, Vec::new()),
            (3, long.into_bytes()),
            (4, b"b".to_vec()),
        ];
        assert_eq!(got, want);
        assert!(Lines::new(&b""[..]).next_line().unwrap().is_none());
        // The error a line reader gives for bytes that are not UTF-8.
        let mut s = String::new();
        let err = BufReader::new(&b"\xff\n"[..])
            .read_line(&mut s)
            .unwrap_err();
        assert_eq!(err.to_string(), invalid_utf8().to_string());
    }

    /// What the reader gave when it read with `read_line` (its code before it took lines from
    /// [`Lines`]): each record or error as a string, for comparing the two.
    fn read_line_oracle(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let (mut r, mut line, mut buf) = (BufReader::new(input), 0, String::new());
        loop {
            buf.clear();
            line += 1;
            match r.read_line(&mut buf) {
                Ok(0) => return out,
                Err(e) => out.push(format!("f:{line}: read error: {e}")),
                Ok(_) if buf.trim().is_empty() => {}
                Ok(_) => out.push(match serde_json::from_str::<Record>(buf.trim()) {
                    Ok(record) => format!("{record:?}"),
                    Err(e) => format!("f:{line}: {}", describe_json_error(buf.trim(), &e)),
                }),
            }
        }
    }

    #[test]
    fn records_are_read_as_read_line_read_them() {
        let good = RECORDING.lines().nth(1).unwrap();
        let inputs: Vec<Vec<u8>> = vec![
            format!("{good}\n{good}\n").into_bytes(),
            format!("\n  \r\n{good}\r\n\t{good}  \n\n").into_bytes(),
            format!("{good}\n{good}").into_bytes(),
            [good.as_bytes(), b"\n\xff\xfe\n", good.as_bytes(), b"\n"].concat(),
            [b"\xc3\n", good.as_bytes()].concat(),
            format!("{good}\n42\n{{\"type\":\"probe\"}}\n").into_bytes(),
            Vec::new(),
            b"\n\n".to_vec(),
        ];
        for input in &inputs {
            let ours: Vec<String> = RecordReader::new("f".into(), &input[..])
                .map(|r| match r {
                    Ok(record) => format!("{record:?}"),
                    Err(e) => e.to_string(),
                })
                .collect();
            assert_eq!(ours, read_line_oracle(input), "{input:?}");
        }
    }

    #[test]
    fn non_object_lines_are_explained() {
        let mut r = RecordReader::new("f".into(), "42\n".as_bytes());
        let err = r.next().unwrap().unwrap_err().to_string();
        assert!(err.starts_with("f:1: expected a JSON object"), "{err}");
    }
}
