//! The binary capture `meshlab record` writes by default (docs/capture-format.md): a fixed
//! file header, then typed records. Events are the ring buffer's raw [`Event`] bytes, stored
//! (format version 2) as the words that differ from the previous event of the same hook
//! ([`compact`]), so recording costs a few word compares instead of a JSON encoding, and few
//! bytes; the rare records (startup, clock, drops, summary) carry the exact JSON of their
//! NDJSON line, so [`export`] reproduces `record --format ndjson` byte for byte. Every record
//! is complete or absent: a capture cut short by a crash is valid up to its last complete
//! record. Version 1 captures (raw 136-byte events) are still read.

pub mod compact;
pub mod export;
pub mod reader;
pub mod source;
pub mod writer;

use std::collections::HashMap;
use std::path::PathBuf;

use meshlab_common::{EVENT_LAYOUT_VERSION, Event};
use serde::{Deserialize, Serialize};

/// First 8 bytes of every capture; no NDJSON line can start with them.
pub const MAGIC: [u8; 8] = *b"MESHCAP\0";
/// Version of the framing (file header, record headers, record kinds) this build writes.
pub const FORMAT_VERSION: u32 = 2;
/// The first version, still read: every record `kind:u32 length:u32 payload`, events raw.
pub const FORMAT_VERSION_1: u32 = 1;
/// Bytes of the file header: magic, format version, event size, event layout version, reserved.
pub const FILE_HEADER_LEN: usize = 24;
/// Bytes of a non-event record's header (version 2): kind (u8), payload length (u32 LE).
/// Event records have their own ([`compact::EVENT_HEADER_LEN`]).
pub const RECORD_HEADER_LEN: usize = 5;
/// Bytes of every record's header in version 1: kind (u32 LE), payload length (u32 LE).
pub const V1_RECORD_HEADER_LEN: usize = 8;
/// Size of one raw event, as the ring buffer gives it.
pub const EVENT_SIZE: usize = std::mem::size_of::<Event>();
/// Payloads larger than this are corruption, not data (the largest real one, the startup
/// record, is a few KiB).
pub const MAX_PAYLOAD: u32 = 64 << 20;

/// What a record holds. The numbers are the on-disk kind field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RecordKind {
    /// JSON [`Meta`]: what decoding events needs beyond the events themselves.
    Meta = 1,
    /// The JSON of the `startup` NDJSON line.
    Startup = 2,
    /// One [`Event`]: its changed words ([`compact`]; version 1: the raw [`EVENT_SIZE`] bytes).
    Event = 3,
    /// The JSON of a `clock` NDJSON line.
    Clock = 4,
    /// The JSON of a `drops` NDJSON line.
    Drops = 5,
    /// The JSON of the final `summary` NDJSON line.
    Summary = 6,
    /// The JSON of a `hot_hooks` NDJSON line (only `record --attach on-demand` writes them).
    HotHooks = 7,
}

impl RecordKind {
    pub fn from_u32(v: u32) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Meta,
            2 => RecordKind::Startup,
            3 => RecordKind::Event,
            4 => RecordKind::Clock,
            5 => RecordKind::Drops,
            6 => RecordKind::Summary,
            7 => RecordKind::HotHooks,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RecordKind::Meta => "meta",
            RecordKind::Startup => "startup",
            RecordKind::Event => "event",
            RecordKind::Clock => "clock",
            RecordKind::Drops => "drops",
            RecordKind::Summary => "summary",
            RecordKind::HotHooks => "hot_hooks",
        }
    }
}

/// The first record of a capture: the node name and device names the NDJSON decoder puts
/// into every kernel line (they are not in the raw events).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub node: String,
    /// Interface index -> name in the traced network namespace.
    pub dev_names: HashMap<u32, String>,
}

/// A capture that cannot be read: names file, byte offset, record number and field.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{file}: cannot open: {source}")]
    Open {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: byte {offset}: read error: {source}")]
    Read {
        file: PathBuf,
        offset: u64,
        source: std::io::Error,
    },
    #[error("{file}: file header: field `{field}`: {message}")]
    Header {
        file: PathBuf,
        field: &'static str,
        message: String,
    },
    /// `record` counts records after the file header from 0 (the meta record), so record N
    /// of a capture is line N of its export.
    #[error("{file}: byte {offset}: record {record} ({kind}): {message}")]
    Record {
        file: PathBuf,
        offset: u64,
        record: u64,
        kind: String,
        message: String,
    },
}

impl CaptureError {
    pub fn record(
        file: &std::path::Path,
        offset: u64,
        record: u64,
        kind: &str,
        message: String,
    ) -> CaptureError {
        CaptureError::Record {
            file: file.into(),
            offset,
            record,
            kind: kind.to_owned(),
            message,
        }
    }
}

/// The file header as bytes (of this build's format version).
pub fn file_header() -> [u8; FILE_HEADER_LEN] {
    file_header_of(FORMAT_VERSION)
}

/// The file header of format `version` (tests write version 1 captures with it).
pub fn file_header_of(version: u32) -> [u8; FILE_HEADER_LEN] {
    let mut h = [0u8; FILE_HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..16].copy_from_slice(&(EVENT_SIZE as u32).to_le_bytes());
    h[16..20].copy_from_slice(&EVENT_LAYOUT_VERSION.to_le_bytes());
    h
}

/// One non-event record as bytes (version 2 framing): kind, payload length, payload.
pub fn json_record_bytes(kind: RecordKind, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_PAYLOAD)
        .ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "record over 64 MiB")
        })?;
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    out.push(kind as u8);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Checks a file header; returns its format version (1 or 2). The error names the field that
/// does not match this build.
pub fn check_file_header(file: &std::path::Path, h: &[u8]) -> Result<u32, CaptureError> {
    let bad = |field: &'static str, message: String| CaptureError::Header {
        file: file.into(),
        field,
        message,
    };
    if h.len() < FILE_HEADER_LEN {
        return Err(bad(
            "magic",
            format!(
                "file is {} bytes, shorter than a capture header ({FILE_HEADER_LEN})",
                h.len()
            ),
        ));
    }
    if h[..8] != MAGIC {
        return Err(bad("magic", "not a meshlab capture".into()));
    }
    let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let version = word(8);
    if version != FORMAT_VERSION && version != FORMAT_VERSION_1 {
        return Err(bad(
            "format_version",
            format!(
                "{version}, but this meshlab reads versions {FORMAT_VERSION_1} and {FORMAT_VERSION} (read it with the meshlab that recorded it)"
            ),
        ));
    }
    let expect = [
        ("event_size", word(12), EVENT_SIZE as u32),
        ("event_layout", word(16), EVENT_LAYOUT_VERSION),
    ];
    for (field, found, wanted) in expect {
        if found != wanted {
            return Err(bad(
                field,
                format!(
                    "{found}, but this meshlab reads {wanted} (record and read with the same version)"
                ),
            ));
        }
    }
    Ok(version)
}

/// True when `head` (the first bytes of a file) starts with the capture magic.
pub fn is_capture(head: &[u8]) -> bool {
    head.starts_with(&MAGIC)
}
