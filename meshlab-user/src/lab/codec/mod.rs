//! Wire formats of the lab's echo RPC: Thrift Framed and Kitex TTHeader around a Thrift
//! binary message. Decoders take whatever bytes have arrived and answer "need more", a
//! frame and how many bytes it used, or an error; they never panic on malformed input.

pub mod framed;
pub mod thrift;
pub mod ttheader;

use std::collections::BTreeMap;

use thrift::ThriftMessage;
use ttheader::TtHeader;

/// TTHeader string info key carrying the request's trace id (client -> server).
pub const TRACE_ID_KEY: &str = "meshlab-trace-id";

/// Largest frame the lab accepts (Kitex allows up to 0x3FFFFFFF; the lab never needs more
/// than this, and a bound keeps a corrupt length from allocating gigabytes).
pub const MAX_FRAME_BYTES: u32 = 16 << 20;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("not TTHeader protocol: magic {found:#06x}, expected 0x1000")]
    NotTtHeader { found: u16 },
    #[error("frame length {0} exceeds the limit {MAX_FRAME_BYTES}")]
    FrameTooLarge(u32),
    #[error("invalid header length {0} (header size field * 4 must be >= 2 and fit the frame)")]
    InvalidHeaderSize(u32),
    #[error("unsupported TTHeader protocol id {0:#04x}")]
    UnsupportedProtocolId(u8),
    #[error("invalid TTHeader info id {0:#04x}")]
    InvalidInfoId(u8),
    #[error("truncated {what}: need {need} bytes, {have} left")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{what} is not UTF-8")]
    NotUtf8 { what: &'static str },
    #[error("bad Thrift message: {0}")]
    Thrift(String),
}

/// Framing of the echo RPC (`--proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    /// Kitex TTHeader (magic 0x1000) around Thrift binary; carries the trace id.
    Ttheader,
    /// Thrift Framed: 4-byte length, then Thrift binary.
    Framed,
}

/// One RPC message as it travels: optional TTHeader metadata plus the Thrift message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub trace_id: Option<String>,
    pub message: ThriftMessage,
}

/// Encodes `env` with `proto` into `out` (appended); returns the frame's length.
pub fn encode(proto: Proto, env: &Envelope, out: &mut Vec<u8>) -> usize {
    let start = out.len();
    let mut body = Vec::with_capacity(env.message.body.len() + 64);
    env.message.encode(&mut body);
    match proto {
        Proto::Framed => framed::encode(&body, out),
        Proto::Ttheader => {
            let mut str_info = BTreeMap::new();
            if let Some(id) = &env.trace_id {
                str_info.insert(TRACE_ID_KEY.to_owned(), id.clone());
            }
            let header = TtHeader {
                flags: 0,
                seq_id: env.message.seq_id,
                protocol_id: ttheader::PROTOCOL_ID_THRIFT_BINARY,
                transform_ids: Vec::new(),
                str_info,
                int_info: BTreeMap::new(),
            };
            header.encode(&body, out);
        }
    }
    out.len() - start
}

/// Length of the frame at the front of `buf` once its length field has arrived (`Ok(None)`
/// before that), without decoding it: lets a reader timestamp "whole message read" apart
/// from "message decoded".
pub fn frame_len(proto: Proto, buf: &[u8]) -> Result<Option<usize>, CodecError> {
    let Some(total) = buf.first_chunk::<4>().map(|b| u32::from_be_bytes(*b)) else {
        return Ok(None);
    };
    if proto == Proto::Ttheader && buf.len() >= 6 && !ttheader::is_ttheader(buf) {
        return Err(CodecError::NotTtHeader {
            found: u16::from_be_bytes([buf[4], buf[5]]),
        });
    }
    if total > MAX_FRAME_BYTES {
        return Err(CodecError::FrameTooLarge(total));
    }
    Ok(Some(4 + total as usize))
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// otherwise the envelope and the number of bytes it occupied.
pub fn decode(proto: Proto, buf: &[u8]) -> Result<Option<(Envelope, usize)>, CodecError> {
    let (trace_id, body, used) = match proto {
        Proto::Framed => match framed::decode(buf)? {
            None => return Ok(None),
            Some((body, used)) => (None, body, used),
        },
        Proto::Ttheader => match ttheader::decode(buf)? {
            None => return Ok(None),
            Some(mut frame) => (
                frame.header.str_info.remove(TRACE_ID_KEY),
                frame.payload,
                frame.used,
            ),
        },
    };
    let message = ThriftMessage::decode(&buf[body])?;
    Ok(Some((Envelope { trace_id, message }, used)))
}

/// Big-endian reader over a byte slice that reports truncation instead of panicking.
pub(crate) struct Cursor<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CodecError> {
        if self.remaining() < n {
            return Err(CodecError::Truncated {
                what,
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, CodecError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, CodecError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A TTHeader string: u16 length, then UTF-8 bytes.
    pub fn string16(&mut self, what: &'static str) -> Result<String, CodecError> {
        let len = self.u16(what)? as usize;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| CodecError::NotUtf8 { what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(trace: Option<&str>) -> Envelope {
        Envelope {
            trace_id: trace.map(str::to_owned),
            message: ThriftMessage {
                name: "echo".into(),
                kind: thrift::MessageKind::Call,
                seq_id: 7,
                body: vec![0xab; 64],
            },
        }
    }

    #[test]
    fn both_protocols_round_trip_and_report_length() {
        for (proto, trace) in [(Proto::Ttheader, Some("t-1")), (Proto::Framed, None)] {
            let env = sample(trace);
            let mut out = Vec::new();
            let n = encode(proto, &env, &mut out);
            assert_eq!(n, out.len());
            out.extend_from_slice(b"next frame");
            let (back, used) = decode(proto, &out).unwrap().unwrap();
            assert_eq!((back, used), (env, n), "{proto:?}");
            for cut in 0..n {
                assert_eq!(decode(proto, &out[..cut]), Ok(None), "{proto:?} cut {cut}");
            }
        }
    }
}
