//! Kitex TTHeader framing (CloudWeGo), written from the published layout:
//!
//! ```text
//! 0      4            6       8             12          14
//! | LENGTH | MAGIC 0x1000 | FLAGS | SEQUENCE ID | HEADER SIZE/4 | header info | payload |
//! header info: PROTOCOL ID u8, NUM TRANSFORMS u8, TRANSFORM IDs u8*,
//!              then info blocks: 0x01 string KV (u16 count, (u16 len, key, u16 len, value)*),
//!              0x10 int KV (u16 count, (u16 key, u16 len, value)*), 0x11 ACL token
//!              (u16 len, token), 0x00 padding up to a multiple of 4.
//! ```
//! LENGTH counts everything after itself. Unlike Apache THeader (magic 0x0FFF, varints), every
//! integer here is fixed width and big-endian: the two formats are incompatible.

use std::collections::BTreeMap;
use std::ops::Range;

use super::{CodecError, Cursor, MAX_FRAME_BYTES};

pub const MAGIC: u16 = 0x1000;
/// Bytes before the header info: length, magic, flags, sequence id, header size.
pub const META_SIZE: usize = 14;
pub const PROTOCOL_ID_THRIFT_BINARY: u8 = 0x00;
pub const PROTOCOL_ID_THRIFT_COMPACT: u8 = 0x02;
pub const PROTOCOL_ID_PROTOBUF_KITEX: u8 = 0x03;

const INFO_PADDING: u8 = 0x00;
const INFO_KEY_VALUE: u8 = 0x01;
const INFO_INT_KEY_VALUE: u8 = 0x10;
const INFO_ACL_TOKEN: u8 = 0x11;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TtHeader {
    pub flags: u16,
    pub seq_id: i32,
    pub protocol_id: u8,
    pub transform_ids: Vec<u8>,
    pub str_info: BTreeMap<String, String>,
    pub int_info: BTreeMap<u16, String>,
}

/// A decoded frame: header, payload range in the input, and bytes used.
#[derive(Debug, PartialEq, Eq)]
pub struct TtFrame {
    pub header: TtHeader,
    pub payload: Range<usize>,
    pub used: usize,
}

fn put_string16(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).expect("TTHeader strings are at most 65535 bytes");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl TtHeader {
    /// Appends the whole frame (meta, header info, `payload`) to `out`.
    pub fn encode(&self, payload: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]); // length, patched below
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.seq_id.to_be_bytes());
        out.extend_from_slice(&[0; 2]); // header size, patched below
        let info_start = out.len();
        out.push(self.protocol_id);
        out.push(u8::try_from(self.transform_ids.len()).expect("at most 255 transforms"));
        out.extend_from_slice(&self.transform_ids);
        let count = |n: usize| u16::try_from(n).expect("at most 65535 info entries");
        if !self.str_info.is_empty() {
            out.push(INFO_KEY_VALUE);
            out.extend_from_slice(&count(self.str_info.len()).to_be_bytes());
            for (k, v) in &self.str_info {
                put_string16(out, k);
                put_string16(out, v);
            }
        }
        if !self.int_info.is_empty() {
            out.push(INFO_INT_KEY_VALUE);
            out.extend_from_slice(&count(self.int_info.len()).to_be_bytes());
            for (k, v) in &self.int_info {
                out.extend_from_slice(&k.to_be_bytes());
                put_string16(out, v);
            }
        }
        while !(out.len() - info_start).is_multiple_of(4) {
            out.push(INFO_PADDING);
        }
        let info_words = u16::try_from((out.len() - info_start) / 4).expect("header too large");
        out[start + 12..start + 14].copy_from_slice(&info_words.to_be_bytes());
        out.extend_from_slice(payload);
        let total = u32::try_from(out.len() - start - 4).expect("frame too large");
        out[start..start + 4].copy_from_slice(&total.to_be_bytes());
    }
}

/// True when the bytes at 4..6 carry the TTHeader magic (how Kitex tells it from Framed).
pub fn is_ttheader(buf: &[u8]) -> bool {
    buf.len() >= 6 && u16::from_be_bytes([buf[4], buf[5]]) == MAGIC
}

/// `Ok(None)`: need more bytes; otherwise the decoded frame.
pub fn decode(buf: &[u8]) -> Result<Option<TtFrame>, CodecError> {
    if buf.len() < META_SIZE {
        return Ok(None);
    }
    let mut meta = Cursor::new(&buf[..META_SIZE]);
    let total = meta.u32("length")?;
    let magic = meta.u16("magic")?;
    if magic != MAGIC {
        return Err(CodecError::NotTtHeader { found: magic });
    }
    let flags = meta.u16("flags")?;
    let seq_id = meta.u32("sequence id")? as i32;
    // Computed in u32: a size field above 16383 must not wrap (Kitex fixed that overflow).
    let header_size = u32::from(meta.u16("header size")?) * 4;
    if total > MAX_FRAME_BYTES {
        return Err(CodecError::FrameTooLarge(total));
    }
    let frame_end = 4 + total as usize;
    if header_size < 2 || META_SIZE + header_size as usize > frame_end {
        return Err(CodecError::InvalidHeaderSize(header_size));
    }
    if buf.len() < frame_end {
        return Ok(None);
    }
    let info_end = META_SIZE + header_size as usize;
    let mut info = Cursor::new(&buf[META_SIZE..info_end]);
    let protocol_id = info.u8("protocol id")?;
    if ![
        PROTOCOL_ID_THRIFT_BINARY,
        PROTOCOL_ID_THRIFT_COMPACT,
        PROTOCOL_ID_PROTOBUF_KITEX,
    ]
    .contains(&protocol_id)
    {
        return Err(CodecError::UnsupportedProtocolId(protocol_id));
    }
    let n_transforms = info.u8("transform count")? as usize;
    let transform_ids = info.take(n_transforms, "transform ids")?.to_vec();
    let mut header = TtHeader {
        flags,
        seq_id,
        protocol_id,
        transform_ids,
        ..TtHeader::default()
    };
    while info.remaining() > 0 {
        match info.u8("info id")? {
            INFO_PADDING => {}
            INFO_KEY_VALUE => {
                for _ in 0..info.u16("string info count")? {
                    let k = info.string16("string info key")?;
                    let v = info.string16("string info value")?;
                    header.str_info.insert(k, v);
                }
            }
            INFO_INT_KEY_VALUE => {
                for _ in 0..info.u16("int info count")? {
                    let k = info.u16("int info key")?;
                    let v = info.string16("int info value")?;
                    header.int_info.insert(k, v);
                }
            }
            INFO_ACL_TOKEN => {
                info.string16("ACL token")?;
            }
            other => return Err(CodecError::InvalidInfoId(other)),
        }
    }
    Ok(Some(TtFrame {
        header,
        payload: info_end..frame_end,
        used: frame_end,
    }))
}
