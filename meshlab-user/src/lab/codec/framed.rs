//! Thrift Framed transport: a 4-byte big-endian length, then that many bytes.

use std::ops::Range;

use super::{CodecError, MAX_FRAME_BYTES};

pub fn encode(body: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(body.len()).expect("lab frames are far below 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
}

/// `Ok(None)`: need more bytes; otherwise the body's range in `buf` and the bytes used.
pub fn decode(buf: &[u8]) -> Result<Option<(Range<usize>, usize)>, CodecError> {
    let Some(len) = buf.first_chunk::<4>().map(|b| u32::from_be_bytes(*b)) else {
        return Ok(None);
    };
    if len > MAX_FRAME_BYTES {
        return Err(CodecError::FrameTooLarge(len));
    }
    let end = 4 + len as usize;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((4..end, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefix_is_big_endian() {
        let mut out = Vec::new();
        encode(b"abc", &mut out);
        assert_eq!(out, [0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(decode(&out), Ok(Some((4..7, 7))));
        assert_eq!(decode(&out[..6]), Ok(None));
    }

    #[test]
    fn oversized_length_is_an_error_not_an_allocation() {
        assert_eq!(
            decode(&[0x7f, 0xff, 0xff, 0xff]),
            Err(CodecError::FrameTooLarge(0x7fff_ffff))
        );
    }
}
