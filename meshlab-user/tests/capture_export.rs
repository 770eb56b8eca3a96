//! The binary capture: both output paths of `record` turn the same ring records into the same
//! NDJSON lines (byte for byte, through `meshlab export`), the merge reads a capture as it reads
//! its NDJSON, a capture cut short stays valid up to its last complete record, and damaged
//! captures are refused with file, byte offset, record and field.

mod capture_common;
mod merge_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use capture_common::{DEVICES, SharedBuf, event_bytes, ndjson_to_capture};
use meshlab_common::{
    EVENT_FLAG_ACTIVE_OPEN, EVENT_FLAG_TUPLE, EVENT_FLAG_UNIX, EVENT_LAYOUT_VERSION, Event, Hook,
};
use meshlab_testkit::synth::GenConfig;
use meshlab_user::capture::compact::EVENT_HEADER_LEN;
use meshlab_user::capture::export::export;
use meshlab_user::capture::reader::CaptureReader;
use meshlab_user::capture::{
    FILE_HEADER_LEN, FORMAT_VERSION_1, RECORD_HEADER_LEN, RecordKind, V1_RECORD_HEADER_LEN,
    file_header_of, json_record_bytes,
};
use meshlab_user::kernel::output::{OutputFormat, RecordingOutput};
use meshlab_user::records::RecordSource;
use meshlab_user::schema::{
    BpfStatsState, ClockSample, Drops, ProgramRuns, Record, SelfCost, StopReason, Summary,
};

fn v4(a: [u8; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[10] = 0xff;
    b[11] = 0xff;
    b[12..].copy_from_slice(&a);
    b
}

/// Ring records of every hook, a connection with bases, retransmissions, unix sockets, an
/// IPv6 tuple, devices known and unknown, and one event with a hook id this build lacks.
fn ring_events() -> Vec<Event> {
    let mut out = Vec::new();
    let established = Event {
        ts_ns: 10,
        cookie: 7,
        hook: Hook::SockEstablished as u16,
        seq: u32::MAX - 100,
        aux: 5_000,
        flags: EVENT_FLAG_TUPLE | EVENT_FLAG_ACTIVE_OPEN,
        saddr: v4([10, 0, 0, 1]),
        daddr: v4([10, 0, 0, 2]),
        sport: 40_000,
        dport: 9_000,
        queue: u32::MAX,
        ..Event::default()
    };
    out.push(established);
    for round in 0..40u32 {
        for (i, hook) in Hook::ALL.iter().enumerate() {
            let mut ev = Event {
                ts_ns: 1_000 + u64::from(round) * 100 + i as u64,
                cookie: if round % 7 == 3 { 99 } else { 7 },
                skb: 0xffff_8880_0000_0000 + u64::from(round),
                irq_entry_ns: u64::from(round % 2) * 900,
                softirq_raise_ns: u64::from(round % 3) * 950,
                softirq_entry_ns: u64::from(round % 2) * 960,
                aux: u64::from(round) * 3,
                pid: 100 + round,
                tid: 200 + round,
                // Wraps past u32::MAX: offsets must keep growing.
                seq: (u32::MAX - 100).wrapping_add(round * 64 % 1_000),
                len: 64,
                ifindex: round % 5,
                value: round as i32 - 3,
                hook: *hook as u16,
                cpu: round % 2,
                irq: 40 + round % 2,
                queue: if round % 4 == 0 { u32::MAX } else { round % 4 },
                ..Event::default()
            };
            if round % 5 == 1 {
                ev.flags = EVENT_FLAG_TUPLE;
                ev.saddr = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
                ev.daddr = v4([192, 168, 1, round as u8]);
            }
            if round % 9 == 2 {
                ev.flags = EVENT_FLAG_UNIX;
                ev.value = 128;
            }
            out.push(ev);
        }
    }
    let mut unknown = out[1];
    unknown.hook = 999;
    out.push(unknown);
    out
}

fn clock(ts: u64) -> Record {
    Record::Clock(ClockSample {
        node: Some("A".into()),
        realtime_ns: 1_700_000_000_000_000_000 + ts,
        monotonic_ns: ts,
        tai_ns: 1_700_000_037_000_000_000 + ts,
        boottime_ns: ts + 5,
        bracket_ns: 700,
        nic_clocks: Vec::new(),
    })
}

/// The non-event records of a recording, in the order a session writes them.
fn startup_record() -> Record {
    let cfg = GenConfig::default();
    let dir = tempfile::tempdir().unwrap();
    let files = merge_common::generate_into(&cfg, dir.path());
    let first = RecordSource::open(&files[0])
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    match first {
        Record::Startup(mut s) => {
            s.node = "A".into();
            Record::Startup(s)
        }
        other => panic!("generator's first record: {other:?}"),
    }
}

fn end_records() -> Vec<Record> {
    vec![
        Record::Drops(Drops {
            node: "A".into(),
            ts_ns: 9_000,
            per_hook: [("tcp_probe".to_owned(), 3)].into_iter().collect(),
            per_cpu: vec![1, 2],
            total: 3,
        }),
        clock(10_000),
        Record::Summary(Summary {
            node: "A".into(),
            ts_ns: 10_001,
            duration_ns: 9_991,
            per_hook: Default::default(),
            received: 861,
            dropped: 3,
            reason: StopReason::Sigint,
            // The summary's self-accounting goes through the capture and export unchanged.
            self_cost: Some(SelfCost {
                bpf_stats: BpfStatsState::Measured,
                programs: [(
                    "tcp_probe_btf".to_owned(),
                    ProgramRuns {
                        hook: "tcp_probe".into(),
                        run_cnt: 3,
                        run_time_ns: 1_200,
                        events: 3,
                    },
                )]
                .into_iter()
                .collect(),
                user_cpu_ns: 4_000_000,
                sys_cpu_ns: 2_000_000,
                events: 861,
                missed_runs: [("tcp_probe_btf".to_owned(), 2)].into_iter().collect(),
            }),
        }),
    ]
}

/// Runs one output format over the same ring records and records; returns the bytes written
/// and the per-hook counts.
fn record_with(format: OutputFormat, events: &[Event]) -> (Vec<u8>, Vec<u64>) {
    record_many(format, events, 1)
}

/// [`record_with`] with the events sent `times` times over.
fn record_many(format: OutputFormat, events: &[Event], times: usize) -> (Vec<u8>, Vec<u64>) {
    let sink = SharedBuf::default();
    let devs: HashMap<u32, String> = DEVICES.iter().map(|(i, n)| (*i, (*n).into())).collect();
    let mut out = RecordingOutput::new(format, "A".into(), devs, Box::new(sink.clone())).unwrap();
    out.write_record(&startup_record()).unwrap();
    let many = std::iter::repeat_n(events, times).flatten();
    for (i, ev) in many.enumerate() {
        out.write_ring_record(event_bytes(ev)).unwrap();
        if i == events.len() / 2 {
            out.write_record(&clock(5_000)).unwrap();
        }
    }
    for r in end_records() {
        out.write_record(&r).unwrap();
    }
    out.flush().unwrap();
    assert_eq!(out.unknown_hooks(), times as u64);
    (sink.bytes(), out.received().to_vec())
}

fn export_bytes(capture: &[u8]) -> Vec<u8> {
    let mut reader = CaptureReader::new("mem.capture".into(), capture).unwrap();
    let mut ndjson = Vec::new();
    export(&mut reader, &mut ndjson).unwrap();
    ndjson
}

#[test]
fn binary_and_ndjson_paths_write_the_same_lines() {
    let events = ring_events();
    let (ndjson, received_ndjson) = record_with(OutputFormat::Ndjson, &events);
    let (capture, received_capture) = record_with(OutputFormat::Capture, &events);
    assert_eq!(received_capture, received_ndjson);
    let exported = export_bytes(&capture);
    let lines = ndjson.iter().filter(|b| **b == b'\n').count();
    // startup + events (minus the unknown hook) + mid clock + drops, clock, summary.
    assert_eq!(lines, 1 + events.len() - 1 + 1 + 3);
    assert!(exported == ndjson, "export differs from the NDJSON path");
    // An event costs the words it changed plus a 7-byte header, not a JSON line.
    assert!(capture.len() < ndjson.len());
}

/// The reader decodes an event lying whole in its input's buffer in place and reads any other
/// part by part: through buffers of every small size (records straddling their ends at every
/// cut) the export is the one read from a single slice.
#[test]
fn records_straddling_the_read_buffer_export_the_same_lines() {
    let (capture, _) = record_with(OutputFormat::Capture, &ring_events());
    let whole = export_bytes(&capture);
    for capacity in 1..=64 {
        let input = std::io::BufReader::with_capacity(capacity, &capture[..]);
        let mut reader = CaptureReader::new("small.capture".into(), input).unwrap();
        let mut ndjson = Vec::new();
        export(&mut reader, &mut ndjson).unwrap();
        assert!(ndjson == whole, "buffer of {capacity} bytes");
    }
}

/// The same recording in format version 1 (raw events, `kind:u32 length:u32` headers), as
/// a build before version 2 wrote it.
fn version_1_capture(events: &[Event]) -> Vec<u8> {
    let (v2, _) = record_with(OutputFormat::Capture, events);
    let mut reader = CaptureReader::new("v2.capture".into(), &v2[..]).unwrap();
    let v1_record = |kind: RecordKind, payload: &[u8]| {
        let mut r = (kind as u32).to_le_bytes().to_vec();
        r.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        r.extend_from_slice(payload);
        r
    };
    let mut v1 = file_header_of(FORMAT_VERSION_1).to_vec();
    let meta = serde_json::to_vec(reader.meta()).unwrap();
    v1.extend(v1_record(RecordKind::Meta, &meta));
    let mut kinds = Vec::new();
    while let Some(raw) = reader.next_raw().unwrap() {
        v1.extend(v1_record(raw.kind, raw.payload));
        kinds.push(raw.kind);
    }
    // Every event record of version 2 came back as its raw bytes.
    let event_records = kinds.iter().filter(|k| **k == RecordKind::Event).count();
    assert_eq!(event_records, events.len());
    v1
}

#[test]
fn a_version_1_capture_exports_the_same_lines() {
    let events = ring_events();
    let (ndjson, _) = record_with(OutputFormat::Ndjson, &events);
    let v1 = version_1_capture(&events);
    assert_eq!(u32::from_le_bytes(v1[8..12].try_into().unwrap()), 1);
    assert!(export_bytes(&v1) == ndjson, "version 1 export differs");
    // Version 2 stores fewer bytes for the same events (these change most of their words
    // from one event of a hook to the next; a real recording's events change few).
    let (v2, _) = record_with(OutputFormat::Capture, &events);
    assert!(v2.len() < v1.len(), "{} vs {}", v2.len(), v1.len());
}

/// The merge's first pass (`capture::source::non_event_records`) skips events; on a version
/// 1 capture (no bulk skip) it must find the records, numbered as a reader that reads every
/// record numbers them.
#[test]
fn the_first_pass_over_a_version_1_capture_finds_every_non_event_record() {
    let v1 = version_1_capture(&ring_events());
    let mut reader = CaptureReader::new("v1.capture".into(), &v1[..]).unwrap();
    let mut expected = Vec::new();
    while let Some(raw) = reader.next_raw().unwrap() {
        if raw.kind != RecordKind::Event {
            let record: Record = serde_json::from_slice(raw.payload).unwrap();
            expected.push((raw.number, record));
        }
    }
    assert!(expected.len() >= 2, "{expected:?}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.capture");
    std::fs::write(&path, &v1).unwrap();
    let found = meshlab_user::capture::source::non_event_records(&path).unwrap();
    assert_eq!(found, expected);
}

#[test]
fn a_capture_larger_than_the_writers_buffer_exports_the_same_lines() {
    // ~60 k events: several 1 MiB buffers of records, events split across two writes.
    let events = ring_events();
    let (ndjson, _) = record_many(OutputFormat::Ndjson, &events, 60);
    let (capture, _) = record_many(OutputFormat::Capture, &events, 60);
    assert!(capture.len() > 3 << 20, "{} bytes", capture.len());
    assert!(
        export_bytes(&capture) == ndjson,
        "export differs from the NDJSON path"
    );
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn the_merge_reads_a_capture_as_the_records_its_ndjson_parses_to() {
    let events = ring_events();
    let dir = tempfile::tempdir().unwrap();
    let ndjson = write_temp(
        dir.path(),
        "a.ndjson",
        &record_with(OutputFormat::Ndjson, &events).0,
    );
    let capture = write_temp(
        dir.path(),
        "a.capture",
        &record_with(OutputFormat::Capture, &events).0,
    );
    let from_ndjson: Vec<Record> = RecordSource::open(&ndjson)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut source = RecordSource::open(&capture).unwrap();
    let mut from_capture = Vec::new();
    let mut positions = Vec::new();
    while let Some(r) = source.next() {
        from_capture.push(r.unwrap());
        positions.push(source.position());
    }
    // Record N of a capture is line N of its export, up to the event with an unknown hook
    // (the last event: skipped, as the NDJSON path skips it).
    let events_end = 1 + ring_events().len() - 1 + 1;
    for (i, p) in positions.iter().enumerate() {
        let line = i as u64 + 1;
        assert_eq!(*p, if i < events_end { line } else { line + 1 });
    }
    assert_eq!(from_capture.len(), from_ndjson.len());
    for (i, (c, n)) in from_capture.iter().zip(&from_ndjson).enumerate() {
        assert_eq!(c, n, "record {}", i + 1);
    }
}

#[test]
fn merged_output_is_the_same_from_captures_and_from_ndjson() {
    let scenarios = merge_common::scenarios();
    let total = scenarios.len();
    let mut compared = 0;
    for (name, cfg) in scenarios {
        // Its lines come before their connection's sock_established: a recorder decodes in
        // arrival order, so such events would have no stream offsets in any recording.
        if name == "out_of_order" {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let files = merge_common::generate_into(&cfg, dir.path());
        let captures = as_captures(&files, |f| f.to_string_lossy().contains(".kernel."));
        let from_ndjson = merge_common::merge(&files, &[]);
        let from_capture = merge_common::merge(&captures, &[]);
        assert!(!from_ndjson.requests.is_empty(), "{name}");
        assert_eq!(from_capture.requests, from_ndjson.requests, "{name}");
        assert_eq!(from_capture.timeline, from_ndjson.timeline, "{name}");
        compared += 1;
    }
    assert_eq!(compared, total - 1);
}

/// `files` with each one `convert` picks (a kernel NDJSON recording) replaced by its
/// capture, written next to it.
fn as_captures(files: &[PathBuf], convert: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let capture = |f: &PathBuf| {
        let out = f.with_extension("capture");
        ndjson_to_capture(f, &out).unwrap();
        out
    };
    let pick = |f: &PathBuf| if convert(f) { capture(f) } else { f.clone() };
    files.iter().map(pick).collect()
}

const MS: u64 = 1_000_000;

fn ts_ns(line: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(line).unwrap()["ts_ns"].as_u64()
}

/// A sched_switch of another thread at `ts`.
fn other_thread_at(ts: u64) -> String {
    format!(
        "{{\"type\":\"kernel\",\"node\":\"A\",\"hook\":\"sched_switch\",\"ts_ns\":{ts},\"cpu\":1,\"pid\":77,\"tid\":77,\"value\":1}}"
    )
}

/// `fixture` with A's kernel lines edited, merged as NDJSON and with A's recording as a
/// capture: the errors of each merge that report events out of order beyond a read-ahead.
fn read_ahead_errors(
    dir: &Path,
    fixture: &str,
    edit: impl FnOnce(&mut Vec<String>),
) -> (Vec<String>, Vec<String>) {
    let files = merge_common::edit::with_kernel_lines(dir, fixture, "A", edit);
    // Only A's edited copy: the other recordings are the repository's fixtures.
    let captures = as_captures(&files, |f| f.starts_with(dir));
    let errors = |files: &[PathBuf]| {
        let errors = merge_common::merge(files, &[]).summary.errors;
        errors
            .into_iter()
            .filter(|e| e.contains("read-ahead"))
            .collect()
    };
    (errors(&files), errors(&captures))
}

/// The latest event time of a recording's lines.
fn last_ts(lines: &[String]) -> u64 {
    lines.iter().filter_map(|l| ts_ns(l)).max().unwrap()
}

/// `appended` written after the recording's events, before its final clock and summary
/// records, in the order given.
fn append_events(lines: &mut Vec<String>, appended: impl IntoIterator<Item = String>) {
    let at = lines.len() - 2;
    lines.splice(at..at, appended);
}

/// Events of another thread written after A's last event, each `after_ns` after it (in the
/// order given, so not in time order).
fn append_after_last(lines: &mut Vec<String>, after_ns: &[u64]) {
    let last = last_ts(lines);
    append_events(
        lines,
        after_ns.iter().map(|after| other_thread_at(last + after)),
    );
}

/// `record` writes a capture in time order, so the merge reads a capture only 10 ms ahead
/// (stream.rs `CAPTURE_READ_AHEAD_NS`), not a `--window`: an event more out of order than that
/// is still merged, and counted and reported as out of order with its file and line; NDJSON
/// keeps the window.
#[test]
fn a_capture_is_read_10_ms_ahead_and_a_later_event_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    // The event at +50 ms comes after one at +200 ms: the one at +100 ms has left the buffer.
    let (ndjson, capture) = read_ahead_errors(dir.path(), "kernel_only", |lines| {
        append_after_last(lines, &[100 * MS, 200 * MS, 50 * MS])
    });
    assert!(ndjson.is_empty(), "{ndjson:?}");
    assert_eq!(capture.len(), 1, "{capture:?}");
    assert!(
        capture[0].starts_with("node A: 1 events were out of order by more than their read-ahead")
            && capture[0].contains("A.kernel.capture:")
            && capture[0].contains("is 50000000 ns earlier than an event already merged")
            && capture[0].contains("its file's read-ahead of 10000000 ns allows"),
        "{capture:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (ndjson, capture) = read_ahead_errors(dir.path(), "kernel_only", |lines| {
        append_after_last(lines, &[100 * MS, 95 * MS])
    });
    assert!(
        ndjson.is_empty() && capture.is_empty(),
        "{ndjson:?} {capture:?}"
    );
}

/// A hardware TX stamp is merged at its wire time (through the NIC clock), earlier than the
/// stamp `record` ordered it by, by a completion delay nothing bounds: a node whose clock
/// records sample a NIC clock keeps the window for its capture too. Here the stamp's wire
/// time is 50 ms after A's last event but it is written after events at +100 and +200 ms.
#[test]
fn a_capture_with_a_nic_clock_keeps_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let (ndjson, capture) = read_ahead_errors(dir.path(), "tx_hw_timestamp_nic_clock", |lines| {
        let hw = lines
            .iter()
            .position(|l| l.contains("\"tx_tstamp_hw\""))
            .unwrap();
        let stamp = lines.remove(hw);
        let last = last_ts(lines);
        let mut v: serde_json::Value = serde_json::from_str(&stamp).unwrap();
        let aux = v["aux"].as_u64().unwrap();
        // Its wire time (aux on the NIC clock) moves as far as its own stamp does.
        let shift = last + 50 * MS - v["ts_ns"].as_u64().unwrap();
        v["aux"] = (aux + shift).into();
        v["ts_ns"] = (last + 250 * MS).into();
        let moved = [
            other_thread_at(last + 100 * MS),
            other_thread_at(last + 200 * MS),
            v.to_string(),
        ];
        append_events(lines, moved);
    });
    assert!(
        ndjson.is_empty() && capture.is_empty(),
        "{ndjson:?} {capture:?}"
    );
}

#[test]
fn a_capture_cut_short_is_valid_up_to_its_last_complete_record() {
    let events = ring_events();
    let (ndjson, _) = record_with(OutputFormat::Ndjson, &events);
    let (capture, _) = record_with(OutputFormat::Capture, &events);
    let full: Vec<&[u8]> = ndjson.split_inclusive(|b| *b == b'\n').collect();
    // Cuts inside the summary's JSON, inside an event's changed words, inside an event's
    // header and inside a JSON record's header.
    let event = record_offset(&capture, 20);
    assert_eq!(capture[event], RecordKind::Event as u8);
    let event_len = record_offset(&capture, 21) - event;
    assert!(
        event_len > EVENT_HEADER_LEN + 4,
        "record 20 changed no word"
    );
    let summary = record_offset(&capture, record_count(&capture) - 1);
    assert_eq!(capture[summary], RecordKind::Summary as u8);
    for cut in [
        capture.len() - 3,
        event + event_len - 2,
        event + 3,
        summary + 2,
    ] {
        let mut reader = CaptureReader::new("cut.capture".into(), &capture[..cut]).unwrap();
        let mut out = Vec::new();
        export(&mut reader, &mut out).unwrap();
        assert!(reader.truncated_at().is_some(), "cut at {cut}");
        assert!(
            ndjson.starts_with(&out),
            "cut at {cut}: a prefix of the full export"
        );
        let lines = out.iter().filter(|b| **b == b'\n').count();
        assert!(
            lines > 0 && lines < full.len(),
            "cut at {cut}: {lines} lines"
        );
    }
}

/// Bytes of the (version 2) record at `at`: an event's header and changed words, or a JSON
/// record's header and payload.
fn record_len(capture: &[u8], at: usize) -> usize {
    if capture[at] == RecordKind::Event as u8 {
        let mut mask = [0u8; 8];
        mask[..5].copy_from_slice(&capture[at + 2..at + EVENT_HEADER_LEN]);
        EVENT_HEADER_LEN + 4 * u64::from_le_bytes(mask).count_ones() as usize
    } else {
        let len = u32::from_le_bytes(capture[at + 1..at + 5].try_into().unwrap());
        RECORD_HEADER_LEN + len as usize
    }
}

/// Offset of the record with the given number (meta = 0) in a capture.
fn record_offset(capture: &[u8], number: u64) -> usize {
    let mut at = FILE_HEADER_LEN;
    for _ in 0..number {
        at += record_len(capture, at);
    }
    at
}

fn record_count(capture: &[u8]) -> u64 {
    let (mut at, mut n) = (FILE_HEADER_LEN, 0);
    while at < capture.len() {
        at += record_len(capture, at);
        n += 1;
    }
    assert_eq!(at, capture.len());
    n
}

fn read_all(bytes: &[u8]) -> String {
    let mut reader = match CaptureReader::new("bad.capture".into(), bytes) {
        Ok(r) => r,
        Err(e) => return e.to_string(),
    };
    let mut out = Vec::new();
    match export(&mut reader, &mut out) {
        Ok(()) => panic!("a damaged capture was accepted"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn damaged_captures_are_refused_naming_file_offset_record_and_field() {
    let (capture, _) = record_with(OutputFormat::Capture, &ring_events());

    let mut layout = capture.clone();
    layout[16..20].copy_from_slice(&(EVENT_LAYOUT_VERSION + 1).to_le_bytes());
    let err = read_all(&layout);
    assert!(
        err.contains("bad.capture: file header: field `event_layout`"),
        "{err}"
    );

    let err = read_all(b"{\"type\":\"startup\"}\n");
    assert!(err.contains("field `magic`"), "{err}");

    let mut version = capture.clone();
    version[8..12].copy_from_slice(&3u32.to_le_bytes());
    let err = read_all(&version);
    assert!(
        err.contains("field `format_version`: 3, but this meshlab reads versions 1 and 2"),
        "{err}"
    );

    // Record 3 is the second event: its kind becomes 77.
    let mut kind = capture.clone();
    let at = record_offset(&capture, 3);
    assert_eq!(capture[at], RecordKind::Event as u8);
    kind[at] = 77;
    let err = read_all(&kind);
    assert!(
        err.contains(&format!(
            "bad.capture: byte {at}: record 3 (?): field `kind`: 77"
        )),
        "{err}"
    );

    // Its changed-word mask names a word beyond the event's 34.
    let mut mask = capture.clone();
    mask[at + EVENT_HEADER_LEN - 1] |= 0x80;
    let err = read_all(&mask);
    assert!(
        err.contains(&format!("byte {at}: record 3 (event): field `changed`")),
        "{err}"
    );

    // The startup record (1): a length beyond 64 MiB, then a field of the wrong type.
    let at = record_offset(&capture, 1);
    let mut length = capture.clone();
    length[at + 1..at + 5].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = read_all(&length);
    assert!(
        err.contains(&format!(
            "byte {at}: record 1 (startup): field `length`: {} bytes",
            u32::MAX
        )),
        "{err}"
    );
    let len = record_len(&capture, at) - RECORD_HEADER_LEN;
    let json = std::str::from_utf8(&capture[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + len])
        .unwrap();
    let bad_json = json.replacen("\"pid\":1", "\"pid\":\"one\"", 1);
    assert_ne!(bad_json, json, "the generator's startup has pid 1");
    let mut startup = capture[..at].to_vec();
    startup.extend(json_record_bytes(RecordKind::Startup, bad_json.as_bytes()).unwrap());
    startup.extend_from_slice(&capture[at + RECORD_HEADER_LEN + len..]);
    let err = read_all(&startup);
    assert!(
        err.contains(&format!(
            "byte {at}: record 1 (startup): invalid type: string \"one\""
        )),
        "{err}"
    );

    // A version 1 event record of the wrong length (version 2 events have none).
    let v1 = version_1_capture(&ring_events());
    let mut at = FILE_HEADER_LEN;
    for _ in 0..3 {
        at += V1_RECORD_HEADER_LEN
            + u32::from_le_bytes(v1[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    let mut length = v1.clone();
    length[at + 4..at + 8].copy_from_slice(&100u32.to_le_bytes());
    let err = read_all(&length);
    assert!(
        err.contains(&format!("byte {at}: record 3 (event): field `length`: 100")),
        "{err}"
    );
}
