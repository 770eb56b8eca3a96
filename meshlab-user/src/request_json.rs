//! The merged output's `request` line written by hand: byte for byte what serde_json writes
//! for [`Record::Request`](crate::schema::Record) (a unit test compares the two on every
//! field, escapes included), at a fraction of the cost. serde's generic serializer was a sixth
//! of the merge's CPU: a request has about forty segments of eight fields each.

use std::borrow::Cow;

use crate::schema::{Derivation, MergedRequest, Placement, Segment};

/// Appends `r` as `{"type":"request",...}` (no newline) to `out`.
pub fn write_request(out: &mut Vec<u8>, r: &MergedRequest) {
    out.extend_from_slice(b"{\"type\":\"request\",\"trace_id\":");
    string(out, &r.trace_id);
    out.extend_from_slice(b",\"client_node\":");
    string(out, &r.client_node);
    if let Some(s) = &r.server_node {
        out.extend_from_slice(b",\"server_node\":");
        string(out, s);
    }
    out.extend_from_slice(b",\"join\":\"");
    out.extend_from_slice(r.join.as_str().as_bytes());
    out.extend_from_slice(b"\",\"start_ns\":");
    number(out, r.start_ns);
    out.extend_from_slice(b",\"e2e_ns\":");
    number(out, r.e2e_ns);
    out.extend_from_slice(if r.complete {
        b",\"complete\":true,\"missing\":"
    } else {
        b",\"complete\":false,\"missing\":"
    });
    strings(out, &r.missing);
    out.extend_from_slice(b",\"segments\":[");
    for (i, s) in r.segments.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        segment(out, s);
    }
    out.push(b']');
    if !r.notes.is_empty() {
        out.extend_from_slice(b",\"notes\":");
        strings(out, &r.notes);
    }
    out.push(b'}');
}

fn segment(out: &mut Vec<u8>, s: &Segment) {
    out.extend_from_slice(b"{\"name\":");
    name(out, &s.name);
    if let Some(n) = &s.node {
        out.extend_from_slice(b",\"node\":");
        string(out, n);
    }
    out.extend_from_slice(b",\"layer\":\"");
    out.extend_from_slice(s.layer.as_str().as_bytes());
    out.extend_from_slice(b"\",\"unit\":");
    name(out, &s.unit);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(s.kind.as_str().as_bytes());
    out.push(b'"');
    if let Some(v) = s.start_ns {
        out.extend_from_slice(b",\"start_ns\":");
        number(out, v);
    }
    out.extend_from_slice(b",\"dur_ns\":");
    number(out, s.dur_ns);
    if let Some(v) = s.error_ns {
        out.extend_from_slice(b",\"error_ns\":");
        number(out, v);
    }
    if let Some(d) = &s.derived {
        out.extend_from_slice(b",\"derived\":");
        derivation(out, d);
    }
    if let Some(p) = &s.place {
        out.extend_from_slice(b",\"place\":");
        placement(out, p);
    }
    out.push(b'}');
}

fn derivation(out: &mut Vec<u8>, d: &Derivation) {
    out.extend_from_slice(b"{\"method\":");
    string(out, &d.method);
    out.extend_from_slice(b",\"outer_node\":");
    string(out, &d.outer_node);
    out.extend_from_slice(b",\"outer\":");
    strings(out, &d.outer);
    out.extend_from_slice(b",\"inner_node\":");
    string(out, &d.inner_node);
    out.extend_from_slice(b",\"inner\":");
    strings(out, &d.inner);
    out.push(b'}');
}

fn placement(out: &mut Vec<u8>, p: &Placement) {
    out.extend_from_slice(b"{\"cpu\":");
    number(out, u64::from(p.cpu));
    if let Some(d) = &p.dev {
        out.extend_from_slice(b",\"dev\":");
        string(out, d);
    }
    if let Some(q) = p.queue {
        out.extend_from_slice(b",\"queue\":");
        number(out, u64::from(q));
    }
    if let Some(i) = p.irq {
        out.extend_from_slice(b",\"irq\":");
        number(out, u64::from(i));
    }
    out.push(b'}');
}

fn strings(out: &mut Vec<u8>, v: &[String]) {
    out.push(b'[');
    for (i, s) in v.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, s);
    }
    out.push(b']');
}

/// A segment's name or unit. A borrowed one is a catalog name or fixed unit
/// (merge::segments' tables), none of which needs escaping (a unit test checks them all), so
/// it is written without the byte scan: most of the strings of a request are these.
#[expect(clippy::ptr_arg, reason = "whether the Cow borrows is what is tested")]
fn name(out: &mut Vec<u8>, s: &Cow<'static, str>) {
    match s {
        Cow::Borrowed(s) => {
            debug_assert!(!needs_escape(s), "{s}");
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(s) => string(out, s),
    }
}

fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| NEEDS_ESCAPE[usize::from(b)])
}

fn number(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// The bytes [`string`] escapes.
static NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// A JSON string as serde_json escapes it: `"`, `\` and the control characters below 0x20
/// (\b \t \n \f \r by name, the others as \u00XX); everything else, UTF-8 included, as is.
fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    if !needs_escape(s) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0..0x20 => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{JoinMethod, Kind, Layer, Record};

    fn serde_line(r: &MergedRequest) -> String {
        serde_json::to_string(&Record::Request(r.clone())).unwrap()
    }

    fn ours(r: &MergedRequest) -> String {
        let mut out = Vec::new();
        write_request(&mut out, r);
        String::from_utf8(out).unwrap()
    }

    fn segment(name: &str) -> Segment {
        Segment {
            name: name.to_owned().into(),
            node: None,
            layer: Layer::Network,
            unit: "network".into(),
            kind: Kind::Network,
            start_ns: None,
            dur_ns: 0,
            error_ns: None,
            derived: None,
            place: None,
        }
    }

    fn request(segments: Vec<Segment>) -> MergedRequest {
        MergedRequest {
            trace_id: "t1".into(),
            client_node: "A".into(),
            server_node: None,
            join: JoinMethod::Offset,
            start_ns: 0,
            e2e_ns: u64::MAX,
            complete: false,
            missing: Vec::new(),
            segments,
            notes: Vec::new(),
        }
    }

    #[test]
    fn every_optional_field_and_enum_value_writes_as_serde_does() {
        let full = Segment {
            node: Some("B".into()),
            layer: Layer::Kernel,
            kind: Kind::Queue,
            start_ns: Some(7_000_001_020_150),
            dur_ns: 1161,
            error_ns: Some(50),
            derived: Some(Box::new(Derivation {
                method: "difference".into(),
                outer_node: "A".into(),
                outer: vec!["net_dev_xmit".into(), "irq_entry".into()],
                inner_node: "B".into(),
                inner: vec![],
            })),
            place: Some(Placement {
                cpu: 1,
                dev: Some("eth0".into()),
                queue: Some(0),
                irq: Some(40),
            }),
            ..segment("rx_softirq_delay")
        };
        let bare_place = Segment {
            place: Some(Placement {
                cpu: u32::MAX,
                dev: None,
                queue: None,
                irq: None,
            }),
            ..segment("tx_qdisc")
        };
        let mut r = request(vec![full, bare_place, segment("network_round_trip")]);
        assert_eq!(ours(&r), serde_line(&r));
        r.server_node = Some("B".into());
        r.complete = true;
        r.missing = vec!["A:tx_complete".into(), "server".into()];
        r.notes = vec!["retransmitted: 0..100".into()];
        for join in JoinMethod::ALL {
            r.join = *join;
            assert_eq!(ours(&r), serde_line(&r));
        }
        for (layer, kind) in Layer::ALL.iter().zip(Kind::ALL.iter().cycle()) {
            r.segments[2].layer = *layer;
            r.segments[2].kind = *kind;
            assert_eq!(ours(&r), serde_line(&r));
        }
        r.segments[2].kind = Kind::Wait;
        assert_eq!(ours(&r), serde_line(&r));
        r.segments.clear();
        assert_eq!(ours(&r), serde_line(&r));
    }

    #[test]
    fn strings_escape_as_serde_does() {
        let mut all: String = (0u8..0x80).map(char::from).collect();
        all.push_str("é → 𝄞 \u{2028} \u{7f} end");
        for s in [all.as_str(), "", "\"", "\\", "plain", "a\"b\\c\nd"] {
            let mut r = request(vec![segment(s)]);
            r.trace_id = s.into();
            r.missing = vec![s.into(), s.into()];
            assert_eq!(ours(&r), serde_line(&r), "{s:?}");
        }
    }
}
