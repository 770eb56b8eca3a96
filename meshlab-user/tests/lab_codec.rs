//! TTHeader and Framed codecs: vectors from the CloudWeGo (Kitex) tests, round trips, and
//! fuzzing that malformed frames give errors, never panics.

use std::collections::BTreeMap;

use meshlab_user::lab::codec::thrift::{MessageKind, ThriftMessage};
use meshlab_user::lab::codec::ttheader::{self, TtHeader};
use meshlab_user::lab::codec::{self, CodecError, Envelope, Proto, TRACE_ID_KEY};
use proptest::prelude::*;

/// cloudwego/gopkg protocol/ttheader/decode_test.go `TestDecodeNonTTHeader`: these 14 bytes
/// are not TTHeader and must be rejected as such.
#[test]
fn kitex_vector_non_ttheader_is_rejected() {
    let bytes = [
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x10, 0x11, 0x12, 0x13,
    ];
    let err = ttheader::decode(&bytes).unwrap_err();
    assert_eq!(err, CodecError::NotTtHeader { found: 0x0405 });
    assert!(err.to_string().contains("not TTHeader protocol"), "{err}");
}

/// cloudwego/gopkg `TestDecodeHeaderSizeCheck`: the header size field counts 32-bit words and
/// must be computed without 16-bit overflow; 0 is an invalid header length.
#[test]
fn kitex_vectors_header_size_field() {
    let cases: [(u16, u32, bool); 6] = [
        (16, 64, true),
        (16384, 65536, true),
        (16385, 65540, true),
        (32768, 131072, true),
        (65535, 262140, true),
        (0, 0, false),
    ];
    for (field, actual, ok) in cases {
        let mut buf = vec![0u8; ttheader::META_SIZE + actual as usize];
        let total = (buf.len() - 4) as u32;
        buf[0..4].copy_from_slice(&total.to_be_bytes());
        buf[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
        buf[8..12].copy_from_slice(&1u32.to_be_bytes());
        buf[12..14].copy_from_slice(&field.to_be_bytes());
        // buf[14] = protocol id thrift binary (0), buf[15] = no transforms: already zero.
        match ttheader::decode(&buf) {
            Ok(Some(frame)) if ok => {
                assert_eq!(frame.header.seq_id, 1, "field {field}");
                assert_eq!(frame.payload.start, actual as usize + ttheader::META_SIZE);
                assert_eq!(frame.used, buf.len());
            }
            Err(e) if !ok => assert!(e.to_string().contains("invalid header length"), "{e}"),
            other => panic!("field {field}: unexpected {other:?}"),
        }
    }
}

/// A frame laid out by hand from the Kitex header_codec.go diagram: string info {k: v},
/// seq id 1, payload "abc".
const HAND_FRAME: [u8; 29] = [
    0x00, 0x00, 0x00, 0x19, // length: 25 bytes follow
    0x10, 0x00, 0x00, 0x00, // magic 0x1000, flags 0
    0x00, 0x00, 0x00, 0x01, // sequence id 1
    0x00, 0x03, // header info: 3 words = 12 bytes
    0x00, 0x00, // protocol id thrift binary, 0 transforms
    0x01, 0x00, 0x01, // string KV block, 1 entry
    0x00, 0x01, b'k', 0x00, 0x01, b'v', // "k" -> "v"
    0x00, // padding to 4
    b'a', b'b', b'c', // payload
];

#[test]
fn hand_laid_frame_decodes_and_encodes_byte_for_byte() {
    let frame = ttheader::decode(&HAND_FRAME).unwrap().unwrap();
    let expected = TtHeader {
        seq_id: 1,
        str_info: BTreeMap::from([("k".to_owned(), "v".to_owned())]),
        ..TtHeader::default()
    };
    assert_eq!(frame.header, expected);
    assert_eq!(&HAND_FRAME[frame.payload], b"abc");
    let mut out = Vec::new();
    expected.encode(b"abc", &mut out);
    assert_eq!(out, HAND_FRAME);
}

#[test]
fn apache_theader_magic_is_not_ttheader() {
    let mut frame = HAND_FRAME;
    frame[4] = 0x0f;
    frame[5] = 0xff;
    assert_eq!(
        ttheader::decode(&frame),
        Err(CodecError::NotTtHeader { found: 0x0fff })
    );
}

#[test]
fn unknown_info_id_is_an_error() {
    let mut frame = HAND_FRAME;
    frame[16] = 0x42;
    assert_eq!(
        ttheader::decode(&frame),
        Err(CodecError::InvalidInfoId(0x42))
    );
}

#[test]
fn trace_id_travels_in_the_string_info() {
    let env = Envelope {
        trace_id: Some("abc-1".into()),
        message: ThriftMessage {
            name: "echo".into(),
            kind: MessageKind::Call,
            seq_id: 3,
            body: b"payload".to_vec(),
        },
    };
    let mut out = Vec::new();
    codec::encode(Proto::Ttheader, &env, &mut out);
    let frame = ttheader::decode(&out).unwrap().unwrap();
    assert_eq!(
        frame.header.str_info.get(TRACE_ID_KEY).map(String::as_str),
        Some("abc-1")
    );
    assert_eq!(
        frame.header.seq_id, 3,
        "TTHeader seq id mirrors the Thrift seq id"
    );
}

fn arb_header() -> impl Strategy<Value = TtHeader> {
    (
        any::<u16>(),
        any::<i32>(),
        prop::collection::vec(any::<u8>(), 0..4),
        prop::collection::btree_map("[a-z-]{0,12}", "\\PC{0,20}", 0..4),
        prop::collection::btree_map(any::<u16>(), "[ -~]{0,20}", 0..4),
    )
        .prop_map(
            |(flags, seq_id, transform_ids, str_info, int_info)| TtHeader {
                flags,
                seq_id,
                protocol_id: ttheader::PROTOCOL_ID_THRIFT_BINARY,
                transform_ids,
                str_info,
                int_info,
            },
        )
}

proptest! {
    #[test]
    fn ttheader_round_trips(header in arb_header(), payload in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut out = Vec::new();
        header.encode(&payload, &mut out);
        prop_assert_eq!((out.len() - ttheader::META_SIZE - payload.len()) % 4, 0);
        let frame = ttheader::decode(&out).unwrap().unwrap();
        prop_assert_eq!(&frame.header, &header);
        prop_assert_eq!(&out[frame.payload], &payload[..]);
        prop_assert_eq!(frame.used, out.len());
    }

    #[test]
    fn envelope_round_trips(proto in prop_oneof![Just(Proto::Ttheader), Just(Proto::Framed)],
                            seq_id in any::<i32>(), body in prop::collection::vec(any::<u8>(), 0..300)) {
        let env = Envelope {
            trace_id: (proto == Proto::Ttheader).then(|| format!("t-{seq_id}")),
            message: ThriftMessage { name: "echo".into(), kind: MessageKind::Reply, seq_id, body },
        };
        let mut out = Vec::new();
        let n = codec::encode(proto, &env, &mut out);
        prop_assert_eq!(codec::decode(proto, &out).unwrap(), Some((env, n)));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = codec::decode(Proto::Ttheader, &bytes);
        let _ = codec::decode(Proto::Framed, &bytes);
        let _ = ThriftMessage::decode(&bytes);
    }

    #[test]
    fn corrupted_frames_give_errors_not_panics(
        header in arb_header(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut out = Vec::new();
        header.encode(b"payload", &mut out);
        for (index, value) in flips {
            let i = index.index(out.len());
            out[i] = value;
        }
        // Whatever the damage: an error, "need more", or a frame, but never a panic or a
        // range outside the input.
        if let Ok(Some(frame)) = ttheader::decode(&out) {
            prop_assert!(frame.payload.end <= out.len() && frame.used <= out.len());
        }
    }
}
