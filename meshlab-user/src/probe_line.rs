//! A `probe` line read without serde: the merge reads every probe line twice (its nodes and
//! clocks before the streaming pass, then the events), and serde's generic deserializer was
//! a quarter of the merge's CPU for it.
//!
//! Only the compact form a probe writer emits is taken: `{"type":"probe",` then known fields
//! in any order, each at most once, no whitespace, strings without escapes or control
//! characters, integers without sign, fraction or exponent. Anything else is `None` and
//! goes down the serde path, so a line this parser takes is one serde takes too, with the
//! same values, and every error message stays serde's (unit tests compare the two).

use crate::schema::{ClockId, ConnRef, Direction, ProbeEvent};

/// A probe line's fields, borrowed from the line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProbeLine<'a> {
    pub node: Option<&'a str>,
    pub process: &'a str,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub clock: Option<ClockId>,
    pub trace_id: &'a str,
    pub point: &'a str,
    pub conn: Option<ConnLine<'a>>,
    pub dir: Option<Direction>,
    pub offset: Option<u64>,
    pub len: Option<u64>,
}

/// A probe line's `conn` object, borrowed from the line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ConnLine<'a> {
    pub cookie: Option<u64>,
    pub laddr: Option<&'a str>,
    pub lport: Option<u16>,
    pub raddr: Option<&'a str>,
    pub rport: Option<u16>,
    pub unix_path: Option<&'a str>,
}

impl ProbeLine<'_> {
    pub fn to_event(&self) -> ProbeEvent {
        ProbeEvent {
            node: self.node.map(str::to_owned),
            process: self.process.to_owned(),
            pid: self.pid,
            tid: self.tid,
            ts_ns: self.ts_ns,
            clock: self.clock.expect("parse() requires a clock"),
            trace_id: self.trace_id.to_owned(),
            point: self.point.to_owned(),
            conn: self.conn.as_ref().map(|c| ConnRef {
                cookie: c.cookie,
                laddr: c.laddr.map(str::to_owned),
                lport: c.lport,
                raddr: c.raddr.map(str::to_owned),
                rport: c.rport,
                unix_path: c.unix_path.map(str::to_owned),
            }),
            dir: self.dir,
            offset: self.offset,
            len: self.len,
        }
    }
}

/// The line (already trimmed) if it has the compact form, else `None` (see the module doc).
pub fn parse(text: &str) -> Option<ProbeLine<'_>> {
    let mut c = Cursor {
        rest: text.strip_prefix("{\"type\":\"probe\",")?,
    };
    let mut p = ProbeLine::default();
    // Bit per field seen: a duplicate is serde's error, and so are missing required fields.
    let mut seen = 0u16;
    let mut next = 0;
    loop {
        // Indices into PROBE_KEYS, which are also the fields' bits.
        let key = c.known_key(&PROBE_KEYS, next)?;
        next = key + 1;
        let bit = match key {
            0 => set(&mut p.node, Some(c.string()?), 0),
            1 => set(&mut p.process, c.string()?, 1),
            2 => set(&mut p.pid, u32::try_from(c.integer()?).ok()?, 2),
            3 => set(&mut p.tid, u32::try_from(c.integer()?).ok()?, 3),
            4 => set(&mut p.ts_ns, c.integer()?, 4),
            5 => set(&mut p.clock, Some(clock_name(c.string()?)?), 5),
            6 => set(&mut p.trace_id, c.string()?, 6),
            7 => set(&mut p.point, c.string()?, 7),
            8 => set(&mut p.conn, Some(c.conn()?), 8),
            9 => set(&mut p.dir, Some(direction(c.string()?)?), 9),
            10 => set(&mut p.offset, Some(c.integer()?), 10),
            _ => set(&mut p.len, Some(c.integer()?), 11),
        };
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        if !c.next_member()? {
            break;
        }
    }
    const REQUIRED: u16 = 0b1111_1110;
    (c.rest.is_empty() && seen & REQUIRED == REQUIRED).then_some(p)
}

/// The `node` (if any) and `clock` of a probe line (already trimmed) found by a byte scan,
/// for the merge's pass that only lists nodes and clocks; `None` when the scan cannot be sure
/// (then the line is parsed). Sure means: the compact prefix, no backslash in the line (so
/// every `"` is structural and `"clock":` can only be a key: a probe line has no other object
/// that could hold one), `node` first (or nowhere) and a string, and a clock name. Whatever
/// else is wrong with the line (a second `clock`, an unknown field) the streaming pass finds
/// when it parses the line in full, and reports.
pub fn scan_node_and_clock(line: &[u8]) -> Option<(Option<&str>, ClockId)> {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    const PREFIX: &[u8] = b"{\"type\":\"probe\",";
    // Built once: a finder's set-up costs more than a search of one line.
    static NODE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"node\":"));
    static CLOCK_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"clock\":\""));
    let rest = line.strip_prefix(PREFIX)?;
    if memchr::memchr(b'\\', rest).is_some() {
        return None;
    }
    let (node, after_node) = match rest.strip_prefix(b"\"node\":\"") {
        Some(value) => {
            let end = memchr::memchr(b'"', value)?;
            let node = std::str::from_utf8(&value[..end]).ok()?;
            (Some(node), &value[end + 1..])
        }
        None if NODE_KEY.find(rest).is_some() => return None,
        None => (None, rest),
    };
    let at = CLOCK_KEY.find(after_node)?;
    let value = &after_node[at + CLOCK_KEY.needle().len()..];
    let clock = ClockId::ALL.iter().copied().find(|c| {
        let name = c.as_str().as_bytes();
        value.len() > name.len() && value.starts_with(name) && value[name.len()] == b'"'
    })?;
    Some((node, clock))
}

/// The keys as they appear in a compact line, quotes and colon included, so that one
/// comparison per candidate tells whether the line's next member has that key.
const PROBE_KEYS: [&str; 12] = [
    "\"node\":",
    "\"process\":",
    "\"pid\":",
    "\"tid\":",
    "\"ts_ns\":",
    "\"clock\":",
    "\"trace_id\":",
    "\"point\":",
    "\"conn\":",
    "\"dir\":",
    "\"offset\":",
    "\"len\":",
];

fn set<T>(field: &mut T, value: T, bit: u32) -> u16 {
    *field = value;
    1 << bit
}

fn clock_name(name: &str) -> Option<ClockId> {
    ClockId::ALL.iter().copied().find(|c| c.as_str() == name)
}

fn direction(name: &str) -> Option<Direction> {
    [Direction::Tx, Direction::Rx]
        .into_iter()
        .find(|d| d.as_str() == name)
}

/// The unread part of a line; every cut is next to an ASCII byte, so each piece stays a str.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn eat(&mut self, b: u8) -> Option<()> {
        (self.rest.as_bytes().first() == Some(&b)).then(|| self.rest = &self.rest[1..])
    }

    /// `"name":`, the name free of escapes.
    fn key(&mut self) -> Option<&'a [u8]> {
        let k = self.string()?;
        self.eat(b':')?;
        Some(k.as_bytes())
    }

    /// One of `keys` (each `"name":`), trying `keys[from]` first (a probe writer's field
    /// order makes that the one): its index, else `None`. Keys without a string scan each.
    /// A value must follow the key, as before.
    fn known_key(&mut self, keys: &[&'static str], from: usize) -> Option<usize> {
        let bytes = self.rest.as_bytes();
        let i = (from..keys.len()).chain(0..from).find(|&i| {
            let k = keys[i].as_bytes();
            bytes.len() > k.len() && bytes.starts_with(k)
        })?;
        self.rest = &self.rest[keys[i].len()..];
        Some(i)
    }

    /// `,` (another member follows: true) or `}` (the object ends: false).
    fn next_member(&mut self) -> Option<bool> {
        let more = match self.rest.as_bytes().first()? {
            b',' => true,
            b'}' => false,
            _ => return None,
        };
        self.rest = &self.rest[1..];
        Some(more)
    }

    /// A string without escapes or control characters (serde refuses those unescaped).
    fn string(&mut self) -> Option<&'a str> {
        self.eat(QUOTE)?;
        let end = string_end(self.rest.as_bytes())?;
        let s = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        Some(s)
    }

    /// An unsigned integer as JSON writes it: `0` or digits without a leading zero, not
    /// followed by a fraction or exponent.
    // Always inlined: with the word reads the compiler put it out of line, and the calls
    // cost about what the words saved (docs/benchmarks-merge-ab.md, round 24).
    #[inline(always)]
    fn integer(&mut self) -> Option<u64> {
        let bytes = self.rest.as_bytes();
        let (mut v, mut n) = eight_digit_words(bytes);
        while let Some(d) = bytes
            .get(n)
            .map(|b| b.wrapping_sub(b'0'))
            .filter(|d| *d <= 9)
        {
            // 19 digits cannot overflow a u64; a 20th is checked.
            v = if n < 19 {
                v * 10 + u64::from(d)
            } else {
                v.checked_mul(10)?.checked_add(u64::from(d))?
            };
            n += 1;
        }
        if n == 0 || (n > 1 && bytes[0] == b'0') {
            return None;
        }
        if matches!(bytes.get(n), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        self.rest = &self.rest[n..];
        Some(v)
    }

    fn port(&mut self) -> Option<u16> {
        u16::try_from(self.integer()?).ok()
    }

    /// A `conn` object (every field optional, each at most once; `{}` is allowed).
    fn conn(&mut self) -> Option<ConnLine<'a>> {
        self.eat(b'{')?;
        let mut c = ConnLine::default();
        if self.eat(b'}').is_some() {
            return Some(c);
        }
        let mut seen = 0u16;
        loop {
            let bit = match self.key()? {
                b"cookie" => set(&mut c.cookie, Some(self.integer()?), 0),
                b"laddr" => set(&mut c.laddr, Some(self.string()?), 1),
                b"lport" => set(&mut c.lport, Some(self.port()?), 2),
                b"raddr" => set(&mut c.raddr, Some(self.string()?), 3),
                b"rport" => set(&mut c.rport, Some(self.port()?), 4),
                b"unix_path" => set(&mut c.unix_path, Some(self.string()?), 5),
                _ => return None,
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            if !self.next_member()? {
                return Some(c);
            }
        }
    }
}

// By value, not as byte literals: tests/structure.rs reads a quote or backslash byte literal
// as opening a string (its scan of quotes and char literals is simple), then finds no end
// of this file's functions.
const QUOTE: u8 = 0x22;
const BACKSLASH: u8 = 0x5c;

/// The value and count of the digits at the start of `bytes` read in whole words of eight
/// (at most two: 16 digits cannot overflow), for [`Cursor::integer`] to go on from byte by
/// byte. A digit per loop turn was a fifth of this parser's cost, most of it in `ts_ns`'s
/// nineteen digits.
fn eight_digit_words(bytes: &[u8]) -> (u64, usize) {
    const ZEROS: u64 = u64::from_ne_bytes([b'0'; 8]);
    const HIGH_NIBBLES: u64 = u64::from_ne_bytes([0xf0; 8]);
    const SIXES: u64 = u64::from_ne_bytes([0x06; 8]);
    let (mut v, mut n) = (0, 0);
    while n < 16 {
        let Some(word) = bytes.get(n..n + 8) else {
            break;
        };
        let x = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // Each byte is 0x30..=0x39: high nibble 3, and still 3 after adding 6 (0x3a..
        // becomes 0x40..). A carry can only come out of a byte that is not a digit.
        if x & HIGH_NIBBLES != ZEROS || x.wrapping_add(SIXES) & HIGH_NIBBLES != ZEROS {
            break;
        }
        // Pairs, then fours, then all eight (the first byte is the most significant digit).
        let d = x - ZEROS;
        let d = (d * 10 + (d >> 8)) & 0x00ff_00ff_00ff_00ff;
        let d = (d * 100 + (d >> 16)) & 0x0000_ffff_0000_ffff;
        let d = (d * 10_000 + (d >> 32)) & 0xffff_ffff;
        v = v * 100_000_000 + d;
        n += 8;
    }
    (v, n)
}

/// Where the string starting at `bytes[0]` ends: the index of its closing `"`, or `None` if
/// a backslash or control byte comes first (serde's territory) or there is no quote. Eight
/// bytes at a time: testing each byte for three cases was a third of this parser's cost, and
/// most strings of a probe line (node, clock, trace id, point) fit in one or two words.
fn string_end(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // High bit of each byte that is 0, lowest one exact (a borrow can only flag bytes above).
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut at = 0;
    while let Some(word) = bytes.get(at..at + 8) {
        let x = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let stops = zero(x ^ (ONES * u64::from(QUOTE)))
            | zero(x ^ (ONES * u64::from(BACKSLASH)))
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGHS); // bytes below 0x20, lowest exact
        if stops != 0 {
            let end = at + stops.trailing_zeros() as usize / 8;
            return (bytes[end] == QUOTE).then_some(end);
        }
        at += 8;
    }
    let end = at
        + bytes[at..]
            .iter()
            .position(|&b| b == QUOTE || b == BACKSLASH || b < 0x20)?;
    (bytes[end] == QUOTE).then_some(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Record;

    #[test]
    fn string_end_stops_where_a_byte_loop_does() {
        let naive = |b: &[u8]| {
            let end = b
                .iter()
                .position(|&c| c == QUOTE || c == BACKSLASH || c < 0x20)?;
            (b[end] == QUOTE).then_some(end)
        };
        let specials = [
            QUOTE, BACKSLASH, 0x00, 0x1f, 0x20, b'!', b'#', 0x5b, 0x5d, 0x7f, 0x80, 0xff,
        ];
        for len in 0..20 {
            for at in 0..len {
                for &c in &specials {
                    for &d in &specials {
                        let mut v = vec![b'a'; len];
                        v[at] = c;
                        v[len - 1] = d;
                        assert_eq!(string_end(&v), naive(&v), "{v:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn integers_read_by_the_word_are_what_a_digit_loop_reads() {
        // The digit loop `Cursor::integer` had before it read whole words of digits.
        let naive = |b: &[u8]| -> Option<(u64, usize)> {
            let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
            let mut v: u64 = 0;
            for &c in &b[..n] {
                v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            }
            let refused = n == 0 || (n > 1 && b[0] == b'0');
            (!refused && !matches!(b.get(n), Some(b'.' | b'e' | b'E'))).then_some((v, n))
        };
        let mut cases: Vec<String> = Vec::new();
        for len in 0..=22 {
            for first in ["1", "0", "9"] {
                let digits = format!("{first}{}", "9876543210".repeat(3))[..len].to_owned();
                for end in ["", ",", "}", ".5", "e3", "E", "/", ":", "a", "\u{ff}"] {
                    cases.push(format!("{digits}{end}"));
                }
            }
        }
        let limits = [
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999",
        ];
        cases.extend(limits.iter().map(|s| format!("{s},")));
        cases.extend(["0000000000000000,", "00000000", "12345678/", "1234567:8"].map(String::from));
        for case in &cases {
            let mut c = Cursor { rest: case };
            let ours = c.integer().map(|v| (v, case.len() - c.rest.len()));
            assert_eq!(ours, naive(case.as_bytes()), "{case}");
        }
    }

    /// What serde makes of the line, as parse_bulk's general path reads it.
    fn serde(line: &str) -> Option<ProbeEvent> {
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Probe(p)) => Some(p),
            _ => None,
        }
    }

    const FULL: &str = r#"{"type":"probe","node":"A","process":"client","pid":1000,"tid":1001,"ts_ns":1700001000001002731,"clock":"realtime","trace_id":"t000000","point":"client.write_begin","conn":{"cookie":1000,"laddr":"10.0.0.1","lport":40000,"raddr":"::1","rport":80,"unix_path":"/run/s"},"dir":"tx","offset":0,"len":100}"#;

    #[test]
    fn compact_lines_parse_as_serde_parses_them() {
        let lines = [
            FULL,
            r#"{"type":"probe","process":"p","pid":0,"tid":4294967295,"ts_ns":18446744073709551615,"clock":"boottime","trace_id":"","point":"x.y"}"#,
            r#"{"type":"probe","point":"server.read_end","trace_id":"é𝄞","clock":"tai","ts_ns":5,"tid":2,"pid":1,"process":"s","dir":"rx","conn":{}}"#,
            r#"{"type":"probe","process":"p","pid":1,"tid":1,"ts_ns":1,"clock":"monotonic","trace_id":"t","point":"a.b","conn":{"rport":1}}"#,
        ];
        for line in lines {
            let ours = parse(line).map(|p| p.to_event());
            assert!(ours.is_some(), "{line}");
            assert_eq!(ours, serde(line), "{line}");
        }
    }

    #[test]
    fn the_node_and_clock_scan_agrees_with_the_parser_or_declines() {
        let nameless = FULL.replace("\"node\":\"A\",", "");
        let node_later = nameless.replacen("\"pid\"", "\"node\":\"B\",\"pid\"", 1);
        for line in [FULL, &nameless] {
            let parsed = parse(line).unwrap();
            let scanned = scan_node_and_clock(line.as_bytes());
            assert_eq!(
                scanned,
                Some((parsed.node, parsed.clock.unwrap())),
                "{line}"
            );
        }
        // Not sure: escapes anywhere, a node not first or not a string, a clock that is not
        // one of the names, not the compact prefix.
        let declined = [
            node_later,
            FULL.replace("\"t000000\"", "\"t\\u0030\""),
            nameless.replace("\"pid\"", "\"node\":null,\"pid\""),
            FULL.replace("\"node\":\"A\"", "\"node\":null"),
            FULL.replace("\"realtime\"", "\"utc\""),
            FULL.replace("\"realtime\"", "\"realtimes\""),
            FULL.replace(",\"clock\":\"realtime\"", ""),
            FULL.replace("{\"type\":\"probe\",", "{ \"type\":\"probe\","),
        ];
        for line in &declined {
            assert_eq!(scan_node_and_clock(line.as_bytes()), None, "{line}");
        }
    }

    /// Each variation is refused here; serde may take it (whitespace, escapes, null) or
    /// refuse it, and the serde path decides.
    #[test]
    fn anything_else_is_left_to_serde() {
        let variations = [
            FULL.replace("\"pid\":1000", "\"pid\": 1000"),
            FULL.replace("\"t000000\"", "\"t\\u0030\""),
            FULL.replace("\"node\":\"A\"", "\"node\":null"),
            FULL.replace("\"pid\":1000", "\"pid\":4294967296"),
            FULL.replace("\"pid\":1000", "\"pid\":-1"),
            FULL.replace("\"pid\":1000", "\"pid\":01"),
            FULL.replace("\"pid\":1000", "\"pid\":1000.0"),
            FULL.replace("\"pid\":1000", "\"pid\":1e3"),
            FULL.replace("\"pid\":1000", "\"pid\":\"1000\""),
            FULL.replace("\"lport\":40000", "\"lport\":65536"),
            FULL.replace("\"realtime\"", "\"utc\""),
            FULL.replace("\"realtime\"", "\"realtimes\""),
            FULL.replace("\"tx\"", "\"up\""),
            FULL.replace("\"len\":100", "\"len\":100,\"pid\":1"),
            FULL.replace("\"len\":100", "\"len\":100,\"extra\":1"),
            FULL.replace("\"cookie\":1000", "\"cookie\":1000,\"cookie\":1"),
            FULL.replace("\"cookie\":1000", "\"port\":1"),
            FULL.replace(",\"trace_id\":\"t000000\"", ""),
            FULL.replace("\"t000000\"", "\"t\u{1}\""),
            format!("{FULL} "),
            format!("{FULL}}}"),
            FULL.trim_end_matches('}').to_owned(),
            FULL.replace("{\"type\":\"probe\",", "{\"type\":\"probe\" ,"),
            "{\"type\":\"probe\",}".to_owned(),
        ];
        for line in &variations {
            assert_eq!(parse(line), None, "{line}");
        }
        // The first three are lines serde takes: the fallback is what reads them.
        for line in &variations[..3] {
            assert!(serde(line).is_some(), "{line}");
        }
    }
}
